"""AMIG — Architecture-adapted Multilingual Integrated Gradients (Chen et al. 2024; QL app. A.4).

Integrated gradients on the MLP neurons whose baseline is not zero but the neurons' activation
on a *baseline sentence* of the same length made only of ``<eos>`` tokens (QL eqs. 16–17), then
normalised over all neurons (QL eq. 18)::

    b_l      = activations of layer l at the last position for "<eos> <eos> ... <eos>" (m tokens)
    Attr(w)  = (w̄ − b) · Σ_k ∂P(b + α_k (w̄ − b)) / ∂w · 1/N        (one layer scaled at a time)
    Attr'(w) = Attr(w) / Σ_{all neurons} Attr

The batched runtime of :func:`tlcap.attribution.integrated_gradients` does the work (it accepts
``baseline=``); the prefix of the *real* prompt is reused, only the last position's neurons move.

Normalisation: eq. 18 divides by the signed sum over neurons. When that sum is ≤ 0 (the baseline
sentence already predicts the target better than the prompt) the sign of every score would flip,
so the sum of absolute values is used instead and ``meta["normaliser"]`` says which was used.
For a multi-token target the scores are the mean over its tokens (teacher forcing), as in IG.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.attribution.config import IGConfig
from tlcap.attribution.ig import NeuronAttribution, integrated_gradients
from tlcap.errors import InvalidConfigError
from tlcap.models.adapter import Model
from tlcap.runtime.sites import get_site


def eos_baseline(
    model: Model, n_tokens: int, site: str = "mlp_post", token_id: int | None = None
) -> Float[Tensor, "layer d_mlp"]:
    """Neuron activations at the last position of an all-``<eos>`` sentence of ``n_tokens`` tokens."""
    if token_id is None:
        token_id = model.special_token_id("eos")
        if token_id is None:
            raise InvalidConfigError("The model's tokenizer has no <eos> token; pass token_id= for the AMIG baseline.")
    s = get_site(site)
    names = [s.hook_name(l) for l in range(model.n_layers)]
    toks = torch.full((1, max(1, n_tokens)), int(token_id), dtype=torch.long, device=model.device)
    return model.last_position_activations(toks, names)[0][0].float()


def amig(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    baseline_token_id: int | None = None,
    normalize: bool = True,
    progress: bool = False,
    **overrides: Any,
) -> NeuronAttribution:
    """AMIG attribution of every MLP neuron for ``prompt → target``.

    Args:
        model: The model.
        prompt: The query.
        target: The answer (``" Paris"``) or its token ids.
        config: Attribution settings (:class:`~tlcap.attribution.config.IGConfig`; ``steps`` is
            the number N of Riemann steps per layer).
        baseline_token_id: Token of the baseline sentence (default ``<eos>``).
        normalize: Apply eq. 18 (divide by the sum over all neurons).
        progress: Progress bar.
        **overrides: Fields of ``config`` to override.

    Returns:
        A :class:`NeuronAttribution` with ``method="amig"``; ``layer_sums`` keep the
        un-normalised per-layer sums so ``completeness_rel_error`` checks them against
        P(w̄) − P(b) exactly as for IG.

    Example:
        >>> attr = amig(model, "The capital of France is", " Paris")
        >>> attr.select(0.2)
    """
    cfg = IGConfig.resolve(config, **overrides)
    n = len(model.encode(prompt))
    base = eos_baseline(model, n, cfg.site, baseline_token_id)
    attr = integrated_gradients(model, prompt, target, config=cfg, baseline=base, progress=progress)
    scores = attr.scores
    normaliser = "none"
    denom = 1.0
    if normalize:
        tot = float(scores.double().sum())
        if tot > 1e-12:
            denom, normaliser = tot, "sum"
        else:
            denom, normaliser = float(scores.double().abs().sum()) or 1.0, "abs_sum"
        scores = (scores.double() / denom).float()
    meta = dict(attr.meta)
    meta.update({"baseline": "eos", "baseline_len": n, "normaliser": normaliser, "denominator": denom})
    return dataclasses.replace(attr, scores=scores, method="amig", meta=meta)
