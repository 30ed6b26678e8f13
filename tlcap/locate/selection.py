"""Selection rules: pure functions from scores to located neuron sets.

Reference defaults: Dai et al. threshold t = 0.2 (of the max over all layers), EleutherAI
knowledge-neurons t = 0.3; refinement keeps neurons found for more than a share p of the
paraphrases (Dai: p tuned in 0.3–0.7 so each fact keeps 2–5 neurons; default 0.5 here);
CNL σ-mask with σ ∈ {3, 6, 12} and spread = std (default) or var (the paper's literal text).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from jaxtyping import Float
from torch import Tensor

from tlcap.errors import EmptyDatasetError
from tlcap.metrics.sets import NeuronSet


def threshold_select(scores: Float[Tensor, "layer d_mlp"], t: float = 0.2) -> NeuronSet:
    """Neurons with ``score > t · max(score)`` (max over all layers); empty if max ≤ 0."""
    mx = scores.max()
    if mx <= 0:
        return NeuronSet((), tuple(scores.shape))
    return NeuronSet.from_mask(scores > t * mx)


def top_k_select(scores: Float[Tensor, "layer d_mlp"], k: int) -> NeuronSet:
    """The ``k`` highest-scoring neurons."""
    flat = scores.flatten()
    idx = flat.topk(min(k, flat.numel())).indices
    d = scores.shape[1]
    return NeuronSet(tuple((int(i) // d, int(i) % d) for i in idx), tuple(scores.shape))


def refine(sets: Sequence[NeuronSet], p: float = 0.5) -> NeuronSet:
    """Neurons present in more than ``p · k`` of the ``k`` sets (Dai et al.'s refinement)."""
    if not sets:
        raise EmptyDatasetError("refine needs at least one neuron set; pass the located set of each prompt")
    counts = Counter(n for s in sets for n in s)
    k = len(sets)
    return NeuronSet(tuple(n for n, c in counts.items() if c > p * k), sets[0].shape)


def sigma_mask(scores: Float[Tensor, "layer d_mlp"], sigma: float = 3.0, spread: Literal["std", "var"] = "std") -> NeuronSet:
    """CNL mask: ``|score − mean| > σ · spread`` with spread the std (default) or variance."""
    s = scores.double()
    mu = s.mean()
    sp = s.std() if spread == "std" else s.var()
    return NeuronSet.from_mask((s - mu).abs() > sigma * sp)
