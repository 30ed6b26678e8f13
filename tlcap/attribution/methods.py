"""One interface over the three knowledge-localization methods of the QL paper.

=========  ===========================================  ==================================
method     what                                         baseline of the neurons
=========  ===========================================  ==================================
``ig``     Dai et al. 2022 integrated gradients         zero
``sig``    Enguehard 2023 sequential IG (per word)      prompt with word i masked, per i
``amig``   Chen et al. 2024 architecture-adapted IG     all-<eos> sentence, normalised
=========  ===========================================  ==================================

All three run on the batched runtime of :func:`tlcap.attribution.integrated_gradients` and
return a :class:`NeuronAttribution`; select knowledge neurons with each method's own rule
(:func:`tlcap.locate.selection.method_select`: ``score > t · max`` for IG and SIG, QL eq. 19's
``score > τ`` for AMIG) or the shared ``.select(threshold)`` (``score > t · max``).

:func:`localize_prompts` attributes many prompts with their rows in shared batches.

Example:
    >>> from tlcap.locate.selection import method_select
    >>> attr = localize(model, "The capital of France is", " Paris", method="amig", steps=2)
    >>> kns = method_select(attr.scores, "amig")          # eq. 19: normalised score > τ
    >>> attr.method, len(kns)
    ('amig', 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from tlcap.attribution.amig import amig, amig_facts
from tlcap.attribution.config import IGConfig
from tlcap.attribution.ig import NeuronAttribution, integrated_gradients, integrated_gradients_facts
from tlcap.attribution.sig import sig, sig_facts
from tlcap.config import check_choice
from tlcap.models.adapter import Model

LocalizeMethod = Literal["ig", "sig", "amig"]
METHODS: tuple[str, ...] = ("ig", "sig", "amig")


def localize(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    method: str = "ig",
    *,
    config: IGConfig | None = None,
    progress: bool = False,
    amig_words: str = "all",
    **overrides: Any,
) -> NeuronAttribution:
    """Attribute every MLP neuron for ``prompt → target`` with ``method`` (``ig``, ``sig``, ``amig``).

    Args:
        model: The model.
        prompt: The query.
        target: The answer (``" Paris"``) or its token ids.
        method: ``"ig"`` (Dai), ``"sig"`` (Enguehard) or ``"amig"`` (Chen et al.).
        config: Attribution settings (:class:`~tlcap.attribution.config.IGConfig`; ``steps`` are
            per layer, per word for SIG).
        progress: Progress bar.
        amig_words: AMIG only: ``"all"`` sums over the query's words (eq. 18), ``"last"`` scores
            the last word only.
        **overrides: Fields of ``config`` to override (``steps=10``, ...).

    Returns:
        A :class:`NeuronAttribution` whose ``method`` names the localization method.

    Raises:
        UnknownNameError: unknown method.
        InvalidConfigError: an invalid setting.
    """
    check_choice("method", method, METHODS)
    cfg = IGConfig.resolve(config, **overrides)
    if method == "ig":
        return integrated_gradients(model, prompt, target, config=cfg, progress=progress)
    if method == "sig":
        return sig(model, prompt, target, config=cfg, progress=progress)
    return amig(model, prompt, target, config=cfg, words=amig_words, progress=progress)


PROMPT_BATCH = 16
"""Prompts (IG, AMIG) or (prompt, word) pairs (SIG) whose rows share one call of :func:`localize_prompts` by default."""


def localize_prompts(
    model: Model,
    prompts: Sequence[tuple[str, str | Sequence[int]]],
    method: str = "ig",
    *,
    config: IGConfig | None = None,
    progress: bool = False,
    amig_words: str = "all",
    fact_batch: int = PROMPT_BATCH,
    **overrides: Any,
) -> list[NeuronAttribution]:
    """:func:`localize` of every ``(prompt, target)`` pair, the rows of several prompts in shared batches.

    ``ig``: :func:`~tlcap.attribution.ig.integrated_gradients_facts`; ``sig``:
    :func:`~tlcap.attribution.sig.sig_facts`; ``amig``: :func:`~tlcap.attribution.amig.amig_facts`.
    Each result equals :func:`localize` on its prompt alone up to float rounding.

    Args:
        model, method, config, amig_words, **overrides: As for :func:`localize`.
        prompts: ``(prompt, target)`` pairs (e.g. every neighbor query of every fact of a relation).
        progress: A progress bar.
        fact_batch: Prompts whose rows share batches (exact; memory only).

    Returns:
        One :class:`NeuronAttribution` per pair, in order.

    Example:
        >>> queries = ["The capital of France is", "France's capital city is"]
        >>> attrs = localize_prompts(model, [(q, " Paris") for q in queries], method="amig", steps=2)
        >>> [(a.prompt, a.method) for a in attrs]
        [('The capital of France is', 'amig'), ("France's capital city is", 'amig')]
    """
    check_choice("method", method, METHODS)
    cfg = IGConfig.resolve(config, **overrides)
    if method == "ig":
        return integrated_gradients_facts(model, prompts, config=cfg, fact_batch=fact_batch, progress=progress)
    if method == "sig":
        return sig_facts(model, prompts, config=cfg, fact_batch=fact_batch, progress=progress)
    return amig_facts(model, prompts, config=cfg, words=amig_words, fact_batch=fact_batch, progress=progress)
