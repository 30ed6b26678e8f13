"""AMIG's words one at a time: the path for backends without rows after padded prefixes (TL 3.9).

:func:`tlcap.attribution.amig.word_attributions_facts` runs the words of many facts as units of
:mod:`tlcap.attribution.grouped` (rows after padded prefixes, a TransformerBridge). A TL 3.9
``HookedTransformer`` has no such rows; there each word's IG runs on its own: the prefix before the
word is cached (:meth:`tlcap.models.Model.prefix_cache`), the rows scale the word's neurons and recompute
the positions from the word on, in layer chunks with late expansion (:meth:`Model.last_logits`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.attribution.batched import layer_chunks
from tlcap.attribution.config import IGConfig
from tlcap.attribution.quadrature import quadrature
from tlcap.models.adapter import Model
from tlcap.runtime import hooks as H


def _record_all(model: Model, toks: Tensor, names: Sequence[str]) -> Tensor:
    """``[pos, n_hooks, d]`` activations of one row at every position."""
    store: dict[str, Tensor] = {}
    with torch.no_grad():
        model.logits(toks, hooks=[(n, H.record(store, n)) for n in names])
    return torch.stack([store[n][0] for n in names], dim=1)


def _word_ig(model: Model, context: list[int], tid: int, pos: int, clean: Tensor, base: Tensor, names: Sequence[str],
             layers: Sequence[int], cfg: IGConfig) -> tuple[Tensor, Tensor]:
    """IG of word ``pos``'s neurons, one layer at a time: ``(attr [L_sel, d], P(word at baseline) [L_sel])``."""
    toks = torch.tensor([context], device=model.device)
    prefix = model.prefix_cache(toks[:, :pos]) if pos > 0 else None
    run = toks[:, pos:] if prefix is not None else toks
    at = 0 if prefix is not None else pos
    alphas, weights = quadrature(int(cfg.steps), cfg.rule)
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


def words_one_fact(
    model: Model, p_ids: list[int], t_ids: list[int], bases: Float[Tensor, "word layer d"], names: Sequence[str],
    layers: Sequence[int], cfg: IGConfig,
) -> tuple[Float[Tensor, "target word layer d_mlp"], Float[Tensor, "target word layer"], Float[Tensor, " target"],
           Float[Tensor, "target layer d_mlp"]]:
    """``(attr, p_base, p_clean, acts)`` of :func:`tlcap.attribution.amig.word_attributions` for one fact, word by word
    (``bases``: the all-``<eos>`` sentence's activations of the scored layers, per word).

    Args:
        model: The model.
        p_ids: The prompt's token ids.
        t_ids: The target's token ids.
        bases: ``[words, layers, d]`` baseline activations per word.
        names: The neuron site's hook of each scored layer.
        layers: The scored layers.
        cfg: The settings (exact IG, ``steps`` nodes per word and layer).

    Returns:
        ``(attr, p_base, p_clean, acts)``: ``[target, word, n_layers, d_mlp]`` attribution, ``[target, word, n_layers]``
        P(target) at the baseline (zero outside ``layers``), ``[target]`` clean probability and ``[target, n_layers,
        d_mlp]`` clean activations at each target's scored position (its context's last word), float32.
    """
    n_ctx = len(p_ids) + len(t_ids) - 1
    L, d = model.n_layers, model.d_mlp
    li = list(layers)
    attr = torch.zeros(len(t_ids), n_ctx, L, d, dtype=torch.float64)
    p_base = torch.zeros(len(t_ids), n_ctx, L, dtype=torch.float64)
    p_clean = torch.zeros(len(t_ids), dtype=torch.float64)
    acts = torch.zeros(len(t_ids), L, d)
    for t, tid in enumerate(t_ids):
        context = p_ids + t_ids[:t]
        toks = torch.tensor([context], device=model.device)
        clean = _record_all(model, toks, names)
        acts[t, li] = clean[len(context) - 1].float().cpu()
        with torch.no_grad():
            p_clean[t] = float(model.last_logits(toks)[0].float().softmax(-1)[tid])
        for i in range(len(context)):
            a, pb = _word_ig(model, context, tid, i, clean[i], bases[i].to(clean), names, li, cfg)
            attr[t, i, li] = a
            p_base[t, i, li] = pb
    return attr.float(), p_base.float(), p_clean.float(), acts


__all__ = ["words_one_fact"]
