"""AMIG — Architecture-adapted Multilingual Integrated Gradients (Chen et al. 2024; QL app. A.4).

Integrated gradients on the MLP neurons whose baseline is not zero but the neurons' activation
on a *baseline sentence* of the same length made only of ``<eos>`` tokens (QL eqs. 16–17),
summed over the query's words and normalised over all neurons (QL eq. 18)::

    b_{l,i}    = activation of layer l at position i of "<eos> <eos> ... <eos>" (m tokens)
    Attr_i(w)  = (w̄_i − b_i) · Σ_k ∂P(w_i = b_i + α_k (w̄_i − b_i)) / ∂w_i · 1/N
                 (word i of one layer moves; every other position and layer is clean)
    Attr(w)    = Σ_{i=1..m} Attr_i(w) / Σ_{all neurons} Σ_i Attr_i          (eq. 18)

``words="all"`` (default) is eq. 18. ``words="last"`` scores only the last word (the position
that predicts the answer; one IG run, what tlcap did before). ``"all"`` costs one IG run per word
whose rows recompute the positions from that word on (the prefix before it is cached and the
layers below a batch's lowest scaled layer run once): about ``(m + 1) / 2`` times SIG's cost.

Knowledge neurons of eq. 19 are those with ``Attr > τ`` on these normalised scores
(:func:`tlcap.locate.selection.absolute_select`); the shared ``score > t · max`` rule stays available.

Normalisation: eq. 18 divides by the signed sum over neurons. When that sum is ≤ 0 (the baseline
sentence already predicts the target better than the prompt) the sign of every score would flip,
so the sum of absolute values is used instead and ``meta["normaliser"]`` says which was used.
For a multi-token target the scores are the mean over its tokens (teacher forcing), as in IG;
the words are then every position of the context (prompt + earlier target tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.attribution.batched import fact_tokens, layer_chunks
from tlcap.attribution.config import IGConfig
from tlcap.attribution.ig import NeuronAttribution, integrated_gradients
from tlcap.attribution.quadrature import quadrature
from tlcap.config import check_choice
from tlcap.errors import InvalidConfigError
from tlcap.models.adapter import Model
from tlcap.runtime import hooks as H
from tlcap.runtime.batching import auto_batch_rows, ig_row_bytes, run_auto_batched
from tlcap.runtime.sites import get_site

WORDS: tuple[str, ...] = ("all", "last")


def _eos_id(model: Model, token_id: int | None) -> int:
    if token_id is not None:
        return int(token_id)
    eos = model.special_token_id("eos")
    if eos is None:
        raise InvalidConfigError("The model's tokenizer has no <eos> token; pass baseline_token_id= for the AMIG baseline.")
    return int(eos)


def _record_all(model: Model, toks: Tensor, names: list[str]) -> Tensor:
    """``[pos, n_hooks, d]`` activations of one row at every position."""
    store: dict[str, Tensor] = {}
    with torch.no_grad():
        model.logits(toks, hooks=[(n, H.record(store, n)) for n in names])
    return torch.stack([store[n][0] for n in names], dim=1)


def eos_baselines(
    model: Model, n_tokens: int, site: str = "mlp_post", token_id: int | None = None
) -> Float[Tensor, "word layer d_mlp"]:
    """Neuron activations at every position of an all-``<eos>`` sentence of ``n_tokens`` tokens.

    Args:
        model: The model.
        n_tokens: Length of the baseline sentence (the query's length).
        site: Neuron site.
        token_id: Baseline token (default ``<eos>``).

    Returns:
        ``[n_tokens, n_layers, d_mlp]``: row ``i`` is the baseline of word ``i`` (eq. 16's ``w'``).
    """
    s = get_site(site)
    names = [s.hook_name(l) for l in range(model.n_layers)]
    toks = torch.full((1, max(1, n_tokens)), _eos_id(model, token_id), dtype=torch.long, device=model.device)
    return _record_all(model, toks, names).float()


def eos_baseline(
    model: Model, n_tokens: int, site: str = "mlp_post", token_id: int | None = None
) -> Float[Tensor, "layer d_mlp"]:
    """Neuron activations at the last position of an all-``<eos>`` sentence of ``n_tokens`` tokens."""
    return eos_baselines(model, n_tokens, site, token_id)[-1]


def _word_ig(model: Model, context: list[int], tid: int, pos: int, clean: Tensor, base: Tensor, names: list[str],
             layers: list[int], cfg: IGConfig) -> tuple[Tensor, Tensor]:
    """IG of word ``pos``'s neurons, one layer at a time: ``(attr [L_sel, d], P(word at baseline) [L_sel])``."""
    toks = torch.tensor([context], device=model.device)
    prefix = model.prefix_cache(toks[:, :pos]) if pos > 0 else None
    run = toks[:, pos:] if prefix is not None else toks
    at = 0 if prefix is not None else pos
    alphas, weights = quadrature(cfg.steps, cfg.rule)
    per = len(alphas) + 1  # the quadrature points, then one baseline row (α = 0) for completeness
    n, d = len(names), clean.shape[-1]
    row_layer = torch.arange(n).repeat_interleave(per)
    row_alpha = torch.cat([alphas, torch.zeros(1, dtype=torch.float64)]).repeat(n)
    row_w = torch.cat([weights, torch.zeros(1, dtype=torch.float64)]).repeat(n)
    diff = clean - base
    grad_acc = torch.zeros(n, d, dtype=torch.float64)
    p_base = torch.zeros(n, dtype=torch.float64)
    for lo, hi in layer_chunks(n, per, int(cfg.batch_rows), cfg.layer_chunks):
        rl = row_layer[lo:hi]
        vals = (base[rl].float() + row_alpha[lo:hi].float().to(base.device)[:, None] * diff[rl].float()).to(clean.dtype)
        leaf = vals.detach().clone().requires_grad_(True)
        fwd = [(names[int(i)], H.replace_rows((rl == i).nonzero().flatten(), at, leaf[rl == i])) for i in rl.unique()]
        lowest = min(layers[int(i)] for i in rl.unique())
        expand = lowest if (prefix is not None and cfg.late_expand) else None
        with torch.enable_grad():
            logits = model.last_logits(run, hooks=fwd, prefix=prefix, expand_at=expand, batch=len(rl))
            probs = logits.float().softmax(-1)[:, tid]
            grad = torch.autograd.grad(probs.sum(), leaf)[0]
        grad_acc.index_add_(0, rl, grad.double().cpu() * row_w[lo:hi, None])
        last = torch.arange(lo, hi) % per == per - 1
        p_base[rl[last]] = probs.detach()[last.to(probs.device)].double().cpu()
    return diff.double().cpu() * grad_acc, p_base


def word_attributions(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    baseline_token_id: int | None = None,
    **overrides: Any,
) -> tuple[Float[Tensor, "target word layer d_mlp"], Float[Tensor, "target word layer"], Float[Tensor, " target"]]:
    """Un-normalised ``Attr_i`` of eq. 17 for every word ``i`` (and target token), QL app. A.4.

    Args:
        model: The model.
        prompt: The query.
        target: The answer or its token ids.
        config: Attribution settings (``steps`` = N quadrature steps per word and layer; exact
            ``method="ig"`` only).
        baseline_token_id: Token of the baseline sentence (default ``<eos>``).
        **overrides: Fields of ``config`` to override.

    Returns:
        ``(attr, p_base, p_clean)``: ``attr[t, i, l, j]`` = Attr_i of neuron ``(l, j)`` for target
        token ``t``; ``p_base[t, i, l]`` = P(target) with word ``i`` of layer ``l`` at its baseline;
        ``p_clean[t]`` = clean P(target token t). Per word and layer, ``Σ_j attr ≈ p_clean − p_base``.

    Raises:
        InvalidConfigError: an estimator other than ``method="ig"``, or a layer beyond the model.
    """
    cfg = IGConfig.resolve(config, **overrides)
    if cfg.method != "ig":
        raise InvalidConfigError(f"AMIG over the query's words needs method='ig' (exact), got {cfg.method!r}; "
                                 "use words='last' for the cheaper estimators")
    layers = list(range(model.n_layers)) if cfg.layers is None else [int(l) for l in cfg.layers]
    if any(l >= model.n_layers for l in layers):
        raise InvalidConfigError(f"layers (--layers) must be below {model.n_layers} for {model.name}, got {max(layers)}")
    p_ids, t_ids = fact_tokens(model, prompt, target)
    if cfg.batch_rows == "auto":  # plateau batch within the budget, rerun at half on out-of-memory: same result
        n_rows = len(layers) * (len(quadrature(cfg.steps, cfg.rule)[0]) + 1)
        rows = auto_batch_rows(ig_row_bytes(model, len(p_ids) + len(t_ids)), n_rows, cfg.max_memory, model.device,
                               model=model, kind="ig", context_len=len(p_ids) + len(t_ids))
        return run_auto_batched(lambda b: word_attributions(model, prompt, target, config=cfg.replace(batch_rows=b),
                                                            baseline_token_id=baseline_token_id), rows, model.device,
                                asked=cfg)
    s = get_site(cfg.site)
    names = [s.hook_name(l) for l in layers]
    n_ctx = len(p_ids) + len(t_ids) - 1
    L, d = model.n_layers, model.d_mlp
    attr = torch.zeros(len(t_ids), n_ctx, L, d, dtype=torch.float64)
    p_base = torch.zeros(len(t_ids), n_ctx, L, dtype=torch.float64)
    p_clean = torch.zeros(len(t_ids), dtype=torch.float64)
    bases = eos_baselines(model, n_ctx, cfg.site, baseline_token_id)[:, layers]
    for t, tid in enumerate(t_ids):
        context = p_ids + t_ids[:t]
        toks = torch.tensor([context], device=model.device)
        clean = _record_all(model, toks, names)
        with torch.no_grad():
            p_clean[t] = float(model.last_logits(toks)[0].float().softmax(-1)[tid])
        for i in range(len(context)):
            a, pb = _word_ig(model, context, tid, i, clean[i], bases[i].to(clean), names, layers, cfg)
            attr[t, i, layers] = a
            p_base[t, i, layers] = pb
    return attr.float(), p_base.float(), p_clean.float()


def amig(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    words: str = "all",
    baseline_token_id: int | None = None,
    normalize: bool = True,
    progress: bool = False,
    **overrides: Any,
) -> NeuronAttribution:
    """AMIG attribution of every MLP neuron for ``prompt → target`` (QL eqs. 16–18).

    Args:
        model: The model.
        prompt: The query.
        target: The answer (``" Paris"``) or its token ids.
        config: Attribution settings (:class:`~tlcap.attribution.config.IGConfig`; ``steps`` is
            the number N of quadrature steps per word and layer).
        words: ``"all"``: eq. 18, Attr summed over the query's words (default); ``"last"``: only
            the last word (one IG run).
        baseline_token_id: Token of the baseline sentence (default ``<eos>``).
        normalize: Apply eq. 18's normalisation (divide by the sum over all neurons).
        progress: Progress bar (``words="last"``).
        **overrides: Fields of ``config`` to override.

    Returns:
        A :class:`NeuronAttribution` with ``method="amig"``; ``layer_sums`` keep the
        un-normalised per-layer sums so ``completeness_rel_error`` checks them (for
        ``words="all"`` against Σ_i (P(w̄) − P(word i at baseline))); ``meta["words"]`` the mode.

    Raises:
        InvalidConfigError: unknown ``words``, or a setting ``words="all"`` does not support.

    Example:
        >>> attr = amig(model, "The capital of France is", " Paris", steps=10)
        >>> kns = absolute_select(attr.scores, 0.01)          # eq. 19
    """
    cfg = IGConfig.resolve(config, **overrides)
    check_choice("words", words, WORDS, cli="--amig-words")
    n = len(model.encode(prompt))
    if words == "last":
        base = eos_baseline(model, n, cfg.site, baseline_token_id)
        attr = integrated_gradients(model, prompt, target, config=cfg, baseline=base, progress=progress)
        extra: dict[str, Any] = {"n_words": 1}
    else:
        a, pb, pc = word_attributions(model, prompt, target, config=cfg, baseline_token_id=baseline_token_id)
        ref = integrated_gradients(model, prompt, target, config=cfg.replace(steps=1, rule="midpoint"), progress=False)
        delta = (pc.double()[:, None, None] - pb.double()).sum(1)  # Σ_i (P(w̄) − P_i(b)), [target, layer]
        attr = dataclasses.replace(
            ref, scores=a.double().sum(1).mean(0).float(), layer_sums=a.double().sum((1, 3)).float(),
            prob_baseline=(ref.prob_full.double() - delta).float(), steps=cfg.steps, rule=cfg.rule,
        )
        extra = {"n_words": int(a.shape[1]), "word_totals": a.double().sum((2, 3)).mean(0).tolist()}
    scores = attr.scores
    normaliser, denom = "none", 1.0
    if normalize:
        tot = float(scores.double().sum())
        if tot > 1e-12:
            denom, normaliser = tot, "sum"
        else:
            denom, normaliser = float(scores.double().abs().sum()) or 1.0, "abs_sum"
        scores = (scores.double() / denom).float()
    meta = dict(attr.meta)
    meta.update({"baseline": "eos", "baseline_len": n, "words": words, "normaliser": normaliser, "denominator": denom,
                 **extra})
    return dataclasses.replace(attr, scores=scores, method="amig", meta=meta)


__all__ = ["WORDS", "amig", "eos_baseline", "eos_baselines", "word_attributions"]
