"""Integrated gradients on MLP neurons (knowledge-neuron attribution, Dai et al. 2022).

For a prompt x and gold token y, ``P(w) = p(y | x, neuron activations at the last position of
one layer set to w)``; ``Attr_j = (w̄_j - b_j) · ∫₀¹ ∂P(b + α(w̄ - b))/∂w_j dα`` with baseline
``b = 0`` (Dai) or a given baseline (AMIG). One layer is scaled at a time; the others keep their
clean values.

How it is made fast (exact, not approximate):
- Only the last position is scaled and attention is causal, so every earlier position is
  identical to the clean run: the prefix's keys/values are computed once
  (:meth:`Model.prefix_cache`) and each step recomputes only the last token.
- Steps of *all* layers go into the same batch: row r scales layer ``l(r)`` by ``α(r)``; the
  rows are independent, so one backward pass gives every row's gradient.
- Rows that scale layer l are identical to the clean run below l: a batch runs as a single row
  up to its lowest scaled layer and is expanded there (``Model.logits(expand_at=...)``).
- Parameters are frozen; the only leaf with a gradient is the batch of scaled activations.

Quadrature rules (``rule=``; all use ``steps`` gradient evaluations):
- ``"midpoint"`` (default): α_k = (k + ½)/m — second-order accurate, the best completeness.
- ``"left"``: α_k = k/m, k = 0..m-1 — Dai et al.'s reference code.
- ``"linspace"``: α = linspace(0, 1, m), weights 1/m — EleutherAI knowledge-neurons.
- ``"trapezoid"``: α = linspace(0, 1, m), trapezoid weights.

Cheaper estimators, labelled as such: ``method="joint"`` scales all layers at once (one batch
of ``steps`` rows; completeness holds jointly, not per layer) and ``method="grad_x_act"``
(gradient × activation, one backward pass).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.config import IGConfig
from tlcap.errors import InvalidConfigError
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.results import Result
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site

Rule = Literal["midpoint", "left", "linspace", "trapezoid"]
Method = Literal["ig", "joint", "grad_x_act"]


def quadrature(steps: int, rule: Rule = "midpoint") -> tuple[Tensor, Tensor]:
    """Points α and weights for ∫₀¹ f(α) dα with ``steps`` evaluations."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    k = torch.arange(steps, dtype=torch.float64)
    if rule == "midpoint":
        return (k + 0.5) / steps, torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    if rule == "left":
        return k / steps, torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    if rule == "linspace":
        return torch.linspace(0, 1, steps, dtype=torch.float64), torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    if rule == "trapezoid":
        if steps == 1:
            return torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
        w = torch.full((steps,), 1.0 / (steps - 1), dtype=torch.float64)
        w[0] = w[-1] = 0.5 / (steps - 1)
        return torch.linspace(0, 1, steps, dtype=torch.float64), w
    raise ValueError(f"unknown rule {rule!r}; use midpoint, left, linspace or trapezoid")


@dataclass(frozen=True)
class NeuronAttribution(Result):
    """Attribution scores of every MLP neuron for one prompt and target.

    Attributes:
        scores: ``[n_layers, d_mlp]`` attribution (mean over target tokens).
        prob_full: ``[n_target, n_layers]`` P(y_t) with the layer's neurons at their clean value.
        prob_baseline: ``[n_target, n_layers]`` P(y_t) with the layer's neurons at the baseline.
        layer_sums: ``[n_target, n_layers]`` Σ_j Attr for each target token and layer.
        activations: ``[n_target, n_layers, d_mlp]`` clean activations at the scored positions.
    """

    scores: Float[Tensor, "layer d_mlp"]
    prob_full: Float[Tensor, "target layer"]
    prob_baseline: Float[Tensor, "target layer"]
    layer_sums: Float[Tensor, "target layer"]
    activations: Float[Tensor, "target layer d_mlp"]
    prompt: str = ""
    target: str = ""
    target_tokens: tuple[str, ...] = ()
    model_name: str = ""
    site: str = "mlp_post"
    method: str = "ig"
    steps: int = 20
    rule: str = "midpoint"
    layers: tuple[int, ...] = ()
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.scores.shape[0]), int(self.scores.shape[1]))

    @property
    def target_prob(self) -> float:
        """Clean probability of the target (geometric mean over its tokens)."""
        p = self.prob_full[:, self.layers[0] if self.layers else 0].double()
        return float(p.log().mean().exp())

    def completeness(self) -> pd.DataFrame:
        """Per layer: Σ Attr vs P(w̄) − P(baseline), averaged over target tokens."""
        delta = (self.prob_full - self.prob_baseline).mean(0)
        sums = self.layer_sums.mean(0)
        rows = [
            {"layer": l, "sum_attr": float(sums[l]), "delta_p": float(delta[l]), "abs_error": float((sums[l] - delta[l]).abs())}
            for l in self.layers
        ]
        return pd.DataFrame(rows)

    @property
    def completeness_rel_error(self) -> float:
        """Σ_l |Σ_j Attr − ΔP_l| / Σ_l |ΔP_l| over the scored layers and target tokens.

        For ``method="joint"`` the check is joint (Σ over all layers vs P(all) − P(none)).
        """
        li = list(self.layers)
        if self.method == "joint":
            err = (self.layer_sums[:, li].sum(1) - (self.prob_full[:, 0] - self.prob_baseline[:, 0])).abs().sum()
            den = (self.prob_full[:, 0] - self.prob_baseline[:, 0]).abs().sum()
        else:
            err = (self.layer_sums[:, li] - (self.prob_full[:, li] - self.prob_baseline[:, li])).abs().sum()
            den = (self.prob_full[:, li] - self.prob_baseline[:, li]).abs().sum()
        return float(err / den.clamp_min(1e-12))

    def select(self, threshold: float | None = 0.2, top_k: int | None = None) -> NeuronSet:
        """Located neurons: ``Attr > threshold · max`` (Dai: 0.2), or the ``top_k`` best."""
        from tlcap.locate.selection import threshold_select, top_k_select

        if top_k is not None:
            return top_k_select(self.scores, top_k)
        return threshold_select(self.scores, threshold if threshold is not None else 0.2)

    def to_frame(self, top: int | None = None) -> pd.DataFrame:
        """Long table (layer, neuron, score, activation), sorted by score."""
        s = self.scores
        flat = s.flatten()
        order = flat.argsort(descending=True)
        if top is not None:
            order = order[:top]
        d = s.shape[1]
        act = self.activations.mean(0).flatten()
        return pd.DataFrame(
            {
                "layer": (order // d).numpy(),
                "neuron": (order % d).numpy(),
                "score": flat[order].numpy(),
                "activation": act[order].numpy(),
            }
        )

    def heatmap(self, **kwargs):  # noqa: ANN201 - plotly figure
        """Layer × neuron heatmap (see :func:`tlcap.viz.neuron_heatmap`)."""
        from tlcap.viz.heatmaps import neuron_heatmap

        kwargs.setdefault("title", f"IG attribution: {self.prompt!r} → {self.target!r}")
        return neuron_heatmap(self.scores, **kwargs)


def _chunks(n_layers: int, rows_per_layer: int, batch_rows: int, layer_chunks: int) -> list[tuple[int, int]]:
    """Row ranges of the batches: whole layers, consecutive, ≤ ``batch_rows`` rows when possible."""
    per = max(1, min(math.ceil(n_layers / max(layer_chunks, 1)), batch_rows // rows_per_layer or 1))
    out = []
    for first in range(0, n_layers, per):
        last = min(first + per, n_layers)
        lo, hi = first * rows_per_layer, last * rows_per_layer
        # a single layer with more rows than batch_rows is split further
        step = batch_rows if per == 1 and rows_per_layer > batch_rows else hi - lo
        out.extend((s, min(s + step, hi)) for s in range(lo, hi, step))
    return out


def _tokens_for_target(model: Model, prompt: str, target: str | Sequence[int]) -> tuple[list[int], list[int]]:
    p_ids = model.encode(prompt)
    if isinstance(target, str):
        t_ids = model.target_ids(prompt, target)
    else:
        t_ids = [int(t) for t in target]
    if len(p_ids) + len(t_ids) - 1 > model.n_ctx:
        from tlcap.errors import PromptTooLongError

        raise PromptTooLongError(
            f"Prompt + target is {len(p_ids) + len(t_ids)} tokens; {model.name} has a context of {model.n_ctx}."
        )
    return p_ids, t_ids


def _clean_last(model: Model, context: list[int], hook_names: list[str], prefix_reuse: bool) -> tuple[Tensor, Tensor, "object"]:
    """Clean activations at the last position for the given hooks, last-position logits, prefix."""
    toks = torch.tensor([context], device=model.device)
    prefix = model.prefix_cache(toks[:, :-1]) if prefix_reuse else None
    run = toks[:, -1:] if prefix_reuse else toks
    acts, logits = model.last_position_activations(run, hook_names, prefix=prefix)
    return acts[0], logits[0], prefix


def _scaled_batch(
    model: Model,
    context: list[int],
    prefix,  # PrefixCache | None
    hook_names: Sequence[str],
    row_layer: Tensor,
    values: Tensor,
    target_id: int,
    need_grad: bool = True,
    layer_ids: Sequence[int] = (),
    late_expand: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Run rows where row r's activations at hook ``row_layer[r]`` (last pos) are ``values[r]``.

    ``row_layer[r] == -1`` means "set every hook" (joint scaling: values is [rows, n_hooks, d]).
    ``layer_ids[i]`` is the model layer of ``hook_names[i]``; with ``late_expand`` the rows
    share one row below the lowest layer they scale (exact, cheaper).
    Returns the target probability per row and, if ``need_grad``, d prob / d values.
    """
    rows = values.shape[0]
    leaf = values.detach().clone().requires_grad_(need_grad)
    fwd = []
    for i, name in enumerate(hook_names):
        if leaf.ndim == 3:
            fwd.append((name, H.replace_rows(slice(None), -1, leaf[:, i])))
        else:
            sel = (row_layer == i).nonzero().flatten()
            if len(sel) == 0:
                continue
            fwd.append((name, H.replace_rows(sel, -1, leaf[sel])))
    toks = torch.tensor([context], device=model.device)
    run = toks[:, -1:] if prefix is not None else toks
    # rows differ only from their lowest scaled layer on: share the layers below it
    lowest = min(layer_ids) if leaf.ndim == 3 else min(layer_ids[int(i)] for i in row_layer.unique())
    with torch.set_grad_enabled(need_grad):
        logits = model.last_logits(run, hooks=fwd, prefix=prefix, expand_at=lowest if late_expand else None, batch=rows)
        probs = logits.float().softmax(-1)[:, target_id]
        grad = torch.autograd.grad(probs.sum(), leaf)[0] if need_grad else None
    return probs.detach(), grad


def integrated_gradients(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    baseline: Float[Tensor, "layer d_mlp"] | None = None,
    progress: bool = False,
    **overrides: Any,
) -> NeuronAttribution:
    """Integrated-gradient attribution of every MLP neuron for ``prompt → target``.

    Args:
        model: A :class:`tlcap.models.Model`.
        prompt: The query, e.g. ``"The capital of France is"``.
        target: The answer string (``" Paris"``) or its token ids. Multi-token targets are scored
            by teacher forcing and averaged over their tokens (CNL eq. 7).
        config: The attribution settings (:class:`~tlcap.attribution.config.IGConfig`: steps,
            quadrature rule, estimator ``method``, neuron ``site``, ``layers`` and the exact speed
            knobs ``batch_rows``/``prefix_reuse``/``late_expand``/``layer_chunks``); default
            ``IGConfig()``.
        baseline: ``[n_layers, d]`` baseline activations (default zeros); AMIG passes the
            activations of an all-<eos> prompt.
        progress: Show a progress bar.
        **overrides: Fields of ``config`` to override (``steps=10``, ``rule="left"``, ...).

    Returns:
        A :class:`NeuronAttribution`.

    Raises:
        InvalidConfigError: an invalid setting (before any forward pass).

    Example:
        >>> attr = integrated_gradients(model, "The capital of France is", " Paris")
        >>> neurons = attr.select(threshold=0.2)
    """
    cfg = IGConfig.resolve(config, **overrides)
    steps, rule, method, site = cfg.steps, cfg.rule, cfg.method, cfg.site
    layers, batch_rows, prefix_reuse = cfg.layers, cfg.batch_rows, cfg.prefix_reuse
    late_expand, layer_chunks = cfg.late_expand, cfg.layer_chunks
    p_ids, t_ids = _tokens_for_target(model, prompt, target)
    layer_list = list(range(model.n_layers)) if layers is None else [int(l) for l in layers]
    if any(l >= model.n_layers for l in layer_list):
        raise InvalidConfigError(
            f"layers (--layers) must be below {model.n_layers} for {model.name}, got {max(layer_list)}"
        )
    s = get_site(site)
    hook_names = [s.hook_name(l) for l in layer_list]
    alphas, weights = quadrature(steps, rule)
    L, d = model.n_layers, model.d_mlp
    nT = len(t_ids)
    scores = torch.zeros(nT, L, d, dtype=torch.float64)
    p_full = torch.zeros(nT, L, dtype=torch.float64)
    p_base = torch.zeros(nT, L, dtype=torch.float64)
    sums = torch.zeros(nT, L, dtype=torch.float64)
    acts_all = torch.zeros(nT, L, d)
    n_li = len(layer_list)
    if method == "ig":
        total = nT * len(_chunks(n_li, steps + 1, batch_rows, layer_chunks))
    else:
        total = nT
    bar = tqdm(total=total, desc=f"IG {prompt[:30]!r}", disable=not progress, leave=False)
    for t in range(nT):
        context = p_ids + t_ids[:t]
        tid = t_ids[t]
        w_bar, clean_logits, prefix = _clean_last(model, context, hook_names, prefix_reuse)
        acts_all[t, layer_list] = w_bar.float()
        p_clean = float(clean_logits.float().softmax(-1)[tid])
        base = torch.zeros_like(w_bar) if baseline is None else baseline[layer_list].to(w_bar)
        diff = w_bar - base
        p_full[t, layer_list] = p_clean
        if method == "ig":
            # rows: for each layer, the m steps then one baseline row (α = 0) for completeness
            a_row = torch.cat([alphas, torch.zeros(1, dtype=torch.float64)])
            w_row = torch.cat([weights, torch.zeros(1, dtype=torch.float64)])
            row_layer = torch.arange(n_li).repeat_interleave(steps + 1)
            row_alpha = a_row.repeat(n_li)
            row_w = w_row.repeat(n_li)
            grad_acc = torch.zeros(n_li, d, dtype=torch.float64)
            for start, stop in _chunks(n_li, steps + 1, batch_rows, layer_chunks):
                rl = row_layer[start:stop]
                ra = row_alpha[start:stop].to(w_bar.dtype)
                vals = base[rl] + ra[:, None] * diff[rl]
                # group rows by layer within the chunk (row_layer is indices into hook_names)
                probs, grad = _scaled_batch(model, context, prefix, hook_names, rl, vals, tid, layer_ids=layer_list, late_expand=late_expand)
                grad_acc.index_add_(0, rl, grad.double() * row_w[start:stop, None])
                is_base = torch.arange(start, stop) % (steps + 1) == steps  # each layer's last row
                for r in is_base.nonzero().flatten().tolist():
                    p_base[t, layer_list[int(rl[r])]] = float(probs[r])
                bar.update(1)
            attr = diff.double() * grad_acc
        elif method == "joint":
            vals = base[None] + alphas.to(w_bar.dtype)[:, None, None] * diff[None]
            vals = torch.cat([vals, base[None]])  # last row: all layers at baseline
            probs, grad = _scaled_batch(model, context, prefix, hook_names, torch.full((steps + 1,), -1), vals, tid, layer_ids=layer_list, late_expand=late_expand)
            w_row = torch.cat([weights, torch.zeros(1, dtype=torch.float64)])
            attr = diff.double() * (grad.double() * w_row[:, None, None]).sum(0)
            p_base[t, layer_list] = float(probs[-1])
            bar.update(1)
        elif method == "grad_x_act":
            probs, grad = _scaled_batch(model, context, prefix, hook_names, torch.full((1,), -1), w_bar[None], tid, layer_ids=layer_list)
            attr = diff.double() * grad[0].double()
            vals0 = base[None]
            pb, _ = _scaled_batch(model, context, prefix, hook_names, torch.full((1,), -1), vals0, tid, need_grad=False, layer_ids=layer_list)
            p_base[t, layer_list] = float(pb[0])
            bar.update(1)
        else:
            raise ValueError(f"unknown method {method!r}; use 'ig', 'joint' or 'grad_x_act'")
        scores[t, layer_list] = attr
        sums[t, layer_list] = attr.sum(-1)
    bar.close()
    return NeuronAttribution(
        scores=scores.mean(0).float(),
        prob_full=p_full.float(),
        prob_baseline=p_base.float(),
        layer_sums=sums.float(),
        activations=acts_all,
        prompt=prompt,
        target=target if isinstance(target, str) else model.decode(t_ids) if model.has_tokenizer else "",
        target_tokens=tuple(model.to_str_tokens(t_ids)) if model.has_tokenizer else tuple(str(i) for i in t_ids),
        model_name=model.name,
        site=site,
        method=method,
        steps=steps,
        rule=rule,
        layers=tuple(layer_list),
    )
