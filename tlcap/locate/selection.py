"""Selection rules: pure functions from scores to located neuron sets.

Reference defaults: Dai et al. threshold t = 0.2 (of the max over all layers), EleutherAI
knowledge-neurons t = 0.3; refinement keeps neurons found for more than a share p of the
paraphrases (Dai: p tuned in 0.3–0.7 so each fact keeps 2–5 neurons; default 0.5 here);
CNL σ-mask with σ ∈ {3, 6, 12} and spread = std (default) or var (the paper's literal text).

Per-method knowledge-neuron rules of the QL paper (:func:`method_select`, Table 1): each
localization method's own published rule by default (``selection="own"``), or the shared
``score > t · max`` rule for every method (``selection="relative"``):

=========  ==========================================================================
method     own rule
=========  ==========================================================================
``ig``     ``score > t · max`` (Dai et al.'s coarse threshold, t = 0.2)
``sig``    ``score > t · max`` (neither Enguehard nor the QL paper prints a neuron rule)
``amig``   ``score > τ`` on eq. 18's normalised scores (QL eq. 19; τ = 0.01 here)
=========  ==========================================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice, check_float
from tlcap.errors import EmptyDatasetError
from tlcap.metrics.sets import NeuronSet

SELECTIONS: tuple[str, ...] = ("own", "relative")
OWN_RULE: dict[str, str] = {"ig": "relative", "sig": "relative", "amig": "absolute"}
AMIG_TAU = 0.01
"""τ of QL eq. 19 (the paper prints no value): 1 % of the query's total (eq. 18-normalised) attribution."""


def threshold_select(scores: Float[Tensor, "layer d_mlp"], t: float = 0.2) -> NeuronSet:
    """Neurons with ``score > t · max(score)`` (max over all layers); empty if max ≤ 0.

    Args:
        scores: ``[layer, d_mlp]`` neuron scores.
        t: Fraction of the maximum score.

    Returns:
        The selected :class:`NeuronSet`.
    """
    mx = scores.max()
    if mx <= 0:
        return NeuronSet((), tuple(scores.shape))
    return NeuronSet.from_mask(scores > t * mx)


def absolute_select(scores: Float[Tensor, "layer d_mlp"], tau: float) -> NeuronSet:
    """QL eq. 19: the neurons whose (eq. 18-normalised) score exceeds ``τ``.

    Args:
        scores: Normalised attribution scores (:func:`tlcap.attribution.amig.amig`).
        tau: The threshold τ, ``> 0``.

    Returns:
        The neurons with ``score > τ``.

    Raises:
        InvalidConfigError: ``τ ≤ 0``.
    """
    check_float("tau", tau, gt=0, cli="--amig-tau")
    return NeuronSet.from_mask(scores > tau)


def method_select(
    scores: Float[Tensor, "layer d_mlp"], method: str, selection: str = "own", t: float = 0.2, tau: float = AMIG_TAU
) -> NeuronSet:
    """The knowledge neurons of one query under ``method``'s rule (module table).

    Args:
        scores: The query's attribution scores.
        method: ``"ig"``, ``"sig"`` or ``"amig"``.
        selection: ``"own"`` (each method's published rule) or ``"relative"`` (``score > t · max``
            for every method).
        t: The relative threshold.
        tau: τ of the absolute rule (AMIG, eq. 19).

    Returns:
        The selected neurons.

    Raises:
        UnknownNameError: unknown method or selection.
    """
    check_choice("selection", selection, SELECTIONS, cli="--selection")
    check_choice("method", method, tuple(OWN_RULE))
    if selection == "own" and OWN_RULE[method] == "absolute":
        return absolute_select(scores, tau)
    return threshold_select(scores, t)


def top_k_select(scores: Float[Tensor, "layer d_mlp"], k: int) -> NeuronSet:
    """The ``k`` highest-scoring neurons.

    Args:
        scores: ``[layer, d_mlp]`` neuron scores.
        k: How many neurons (all when ``k`` exceeds their number).

    Returns:
        The :class:`NeuronSet` in decreasing score order.
    """
    flat = scores.flatten()
    idx = flat.topk(min(k, flat.numel())).indices
    d = scores.shape[1]
    return NeuronSet(tuple((int(i) // d, int(i) % d) for i in idx), tuple(scores.shape))


def refine(sets: Sequence[NeuronSet], p: float = 0.5) -> NeuronSet:
    """Neurons present in more than ``p · k`` of the ``k`` sets (Dai et al.'s refinement).

    Args:
        sets: One located set per prompt (same shape).
        p: Fraction of the sets a neuron must be in (strictly more than).

    Returns:
        The refined :class:`NeuronSet`, shaped like ``sets[0]``.

    Raises:
        EmptyDatasetError: ``sets`` is empty.
    """
    if not sets:
        raise EmptyDatasetError("refine needs at least one neuron set; pass the located set of each prompt")
    counts = Counter(n for s in sets for n in s)
    k = len(sets)
    return NeuronSet(tuple(n for n, c in counts.items() if c > p * k), sets[0].shape)


def sigma_mask(scores: Float[Tensor, "layer d_mlp"], sigma: float = 3.0, spread: Literal["std", "var"] = "std") -> NeuronSet:
    """CNL mask: ``|score − mean| > σ · spread`` with spread the std (default) or variance.

    Args:
        scores: ``[layer, d_mlp]`` neuron scores.
        sigma: The σ multiplier.
        spread: ``"std"`` or ``"var"`` (the mean and spread are over all neurons).

    Returns:
        The :class:`NeuronSet` of outlying neurons (either sign).
    """
    s = scores.double()
    mu = s.mean()
    sp = s.std() if spread == "std" else s.var()
    return NeuronSet.from_mask((s - mu).abs() > sigma * sp)
