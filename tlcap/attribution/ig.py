"""Integrated gradients on MLP neurons (knowledge-neuron attribution, Dai et al. 2022).

For a prompt x and gold token y, ``P(w) = p(y | x, neuron activations at the last position of
one layer set to w)``; ``Attr_j = (w̄_j - b_j) · ∫₀¹ ∂P(b + α(w̄ - b))/∂w_j dα`` with baseline
``b = 0`` (Dai) or a given baseline (AMIG). One layer is scaled at a time; the others keep their
clean values. The integral is a quadrature rule (:mod:`tlcap.attribution.quadrature`), computed
with the exact batched runs of :mod:`tlcap.attribution.batched`.

Cheaper estimators, labelled as such: ``method="joint"`` scales all layers at once (one batch
of ``steps`` rows; completeness holds jointly, not per layer) and ``method="grad_x_act"``
(gradient × activation, one backward pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.batched import clean_last, fact_tokens, layer_chunks, scaled_batch
from tlcap.attribution.config import IGConfig
from tlcap.attribution.grouped import ig_units, make_units
from tlcap.attribution.quadrature import RULES, quadrature
from tlcap.config import check_float, check_int
from tlcap.errors import InvalidConfigError
from tlcap.locate.selection import threshold_select, top_k_select
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result, frame
from tlcap.runtime.batching import auto_batch_rows, ig_row_bytes, run_auto_batched
from tlcap.runtime.sites import get_site
from tlcap.viz.heatmaps import neuron_heatmap
from tlcap.viz.html import attribution_html

Rule = Literal["midpoint", "left", "right", "linspace", "trapezoid", "cnl", "gauss_legendre"]
Method = Literal["ig", "joint", "grad_x_act"]
SUMMARY_TOP = 10
"""Neurons listed in :meth:`NeuronAttribution.summary`."""


@dataclass(frozen=True)
class NeuronScoreRow:
    """One row of :meth:`NeuronAttribution.to_frame`: a neuron's score and clean activation."""

    layer: int
    neuron: int
    score: float
    activation: float


@dataclass(frozen=True)
class CompletenessRow:
    """One row of :meth:`NeuronAttribution.completeness`: a layer's Σ Attr vs its ΔP."""

    layer: int
    sum_attr: float
    delta_p: float
    abs_error: float


@dataclass(frozen=True)
class NeuronAttribution(Result):
    """Attribution scores of every MLP neuron for one prompt and target.

    Attributes:
        scores: ``[n_layers, d_mlp]`` attribution (mean over target tokens).
        prob_full: ``[n_target, n_layers]`` P(y_t) with the layer's neurons at their clean value.
        prob_baseline: ``[n_target, n_layers]`` P(y_t) with the layer's neurons at the baseline.
        layer_sums: ``[n_target, n_layers]`` Σ_j Attr for each target token and layer.
        activations: ``[n_target, n_layers, d_mlp]`` clean activations at the scored positions.
        prompt: The prompt.
        target: The target string (decoded from its ids when ids were given).
        target_tokens: The target's tokens as the model splits them.
        model_name: ``Model.name``.
        site: The neuron site.
        method: ``ig``, ``joint``, ``grad_x_act`` (or ``sig``/``amig`` for those methods).
        steps: The quadrature size m.
        rule: The quadrature rule.
        layers: The scored layers.
        meta: Method-specific extras (SIG, AMIG).
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
        """Per layer: Σ Attr vs P(w̄) − P(baseline), averaged over target tokens (:class:`CompletenessRow`)."""
        delta = (self.prob_full - self.prob_baseline).mean(0)
        sums = self.layer_sums.mean(0)
        rows = [CompletenessRow(l, float(sums[l]), float(delta[l]), float((sums[l] - delta[l]).abs())) for l in self.layers]
        return frame(rows, CompletenessRow)

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
        """Located neurons: ``Attr > threshold · max`` (Dai: 0.2), or the ``top_k`` best.

        Raises:
            InvalidConfigError: ``threshold`` outside (0, 1) (at 1 no neuron is kept) or ``top_k < 1``.
        """
        if top_k is not None:
            return top_k_select(self.scores, check_int("top_k", top_k, min=1))
        return threshold_select(self.scores, check_float("threshold", 0.2 if threshold is None else threshold, gt=0, lt=1))

    def summary(self) -> dict[str, Any]:
        """Headline numbers: the fact, the settings, P(target), completeness, the top neurons.

        ``n_located`` counts the neurons above 0.2 · max (Dai's threshold); ``top_neurons``
        lists the :data:`SUMMARY_TOP` highest scores as ``[layer, neuron, score]``.
        """
        top = self.to_frame(top=SUMMARY_TOP)
        return {
            "model": self.model_name,
            "prompt": self.prompt,
            "target": self.target,
            "target_tokens": list(self.target_tokens),
            "method": self.method,
            "rule": self.rule,
            "steps": self.steps,
            "site": self.site,
            "layers": list(self.layers),
            "target_prob": self.target_prob,
            "completeness_rel_error": self.completeness_rel_error,
            "max_score": float(self.scores.max()),
            "n_located": len(self.select()),
            "top_neurons": [[int(r.layer), int(r.neuron), float(r.score)] for r in top.itertuples()],
            "meta": dict(self.meta),
        }

    def to_frame(self, top: int | None = None) -> pd.DataFrame:
        """One :class:`NeuronScoreRow` per neuron (or the ``top`` best), sorted by score."""
        flat = self.scores.flatten()
        order = flat.argsort(descending=True)
        if top is not None:
            order = order[:top]
        d = self.scores.shape[1]
        act = self.activations.mean(0).flatten()
        rows = [NeuronScoreRow(i // d, i % d, float(flat[i]), float(act[i])) for i in order.tolist()]
        return frame(rows, NeuronScoreRow)

    def _repr_html_(self) -> str:
        """Jupyter: the fact, P(target), completeness and the top neurons."""
        return attribution_html(self.summary())

    def figure(self) -> go.Figure:
        """The layer × neuron heatmap, neurons above 0.2 · max ringed."""
        return self.heatmap(highlight=self.select())

    def heatmap(self, **kwargs: Any) -> go.Figure:
        """Layer × neuron heatmap (see :func:`tlcap.viz.neuron_heatmap`)."""
        kwargs.setdefault("title", f"IG attribution: {self.prompt!r} → {self.target!r}")
        return neuron_heatmap(self.scores, **kwargs)


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
        A :class:`NeuronAttribution` with provenance (the model and ``config``) attached.

    Raises:
        InvalidConfigError: an invalid setting (before any forward pass), or a layer beyond
            the model.
        TargetTokenizationError: a token-boundary problem between prompt and target (see
            :meth:`tlcap.models.Model.target_ids`).
        PromptTooLongError: prompt + target do not fit the context window.

    Example:
        >>> attr = integrated_gradients(model, "The capital of France is", " Paris")
        >>> neurons = attr.select(threshold=0.2)
    """
    cfg = IGConfig.resolve(config, **overrides)
    p_ids, t_ids = fact_tokens(model, prompt, target)
    layer_list = list(range(model.n_layers)) if cfg.layers is None else [int(l) for l in cfg.layers]
    if any(l >= model.n_layers for l in layer_list):
        raise InvalidConfigError(
            f"layers (--layers) must be below {model.n_layers} for {model.name}, got {max(layer_list)}"
        )
    if cfg.batch_rows == "auto":  # plateau batch within the budget, rerun at half on out-of-memory: same result
        n_rows = len(layer_list) * (len(quadrature(cfg.max_steps if cfg.steps == "auto" else cfg.steps, cfg.rule)[0]) + 1)
        rows = auto_batch_rows(ig_row_bytes(model, len(p_ids) + len(t_ids)), n_rows, cfg.max_memory, model.device,
                               model=model, kind="ig", context_len=len(p_ids) + len(t_ids))
        # the provenance keeps the settings asked for ("auto"), not the size it resolved to
        return run_auto_batched(lambda b: integrated_gradients(model, prompt, target, config=cfg.replace(batch_rows=b),
                                                               baseline=baseline, progress=progress), rows, model.device,
                                asked=cfg)
    s = get_site(cfg.site)
    hook_names = [s.hook_name(l) for l in layer_list]
    if cfg.steps == "auto":
        return _auto_steps(model, prompt, target, p_ids, t_ids, hook_names, layer_list, cfg, baseline)
    alphas, weights = quadrature(cfg.steps, cfg.rule)
    L, d, nT = model.n_layers, model.d_mlp, len(t_ids)
    scores = torch.zeros(nT, L, d, dtype=torch.float64)
    p_full = torch.zeros(nT, L, dtype=torch.float64)
    p_base = torch.zeros(nT, L, dtype=torch.float64)
    sums = torch.zeros(nT, L, dtype=torch.float64)
    acts_all = torch.zeros(nT, L, d)
    rows_per_layer = len(alphas) + 1  # the quadrature points, then one baseline row (α = 0)
    per_token = len(layer_chunks(len(layer_list), rows_per_layer, cfg.batch_rows, cfg.layer_chunks)) if cfg.method == "ig" else 1
    bar = tqdm(total=nT * per_token, desc=f"IG {prompt[:30]!r}", disable=not progress, leave=False)
    for t in range(nT):
        run = _Run(model, p_ids + t_ids[:t], t_ids[t], hook_names, layer_list, cfg)
        acts_all[t, layer_list] = run.w_bar.float().cpu()
        base = torch.zeros_like(run.w_bar) if baseline is None else baseline[layer_list].to(run.w_bar)
        p_full[t, layer_list] = run.p_clean
        if cfg.method == "ig":
            attr, pb = run.per_layer(base, alphas, weights, bar)
        elif cfg.method == "joint":
            attr, pb = run.joint(base, alphas, weights)
        else:  # grad_x_act (IGConfig admits no other method)
            attr, pb = run.grad_x_act(base)
        p_base[t, layer_list] = pb
        scores[t, layer_list] = attr
        sums[t, layer_list] = attr.sum(-1)
        bar.update(0 if cfg.method == "ig" else 1)
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
        site=cfg.site,
        method=cfg.method,
        steps=cfg.steps,
        rule=cfg.rule,
        layers=tuple(layer_list),
        provenance=Provenance.collect(model, cfg),
    )


def _auto_steps(model: Model, prompt: str, target: str | Sequence[int], p_ids: list[int], t_ids: list[int],
                hook_names: list[str], layer_list: list[int], cfg: IGConfig, baseline: Tensor | None) -> NeuronAttribution:
    """``steps="auto"``: every answer token's rows in one batched run (:func:`ig_units`)."""
    units, prefix = make_units(model, [(p_ids, t_ids)], hook_names, layer_list, baseline)
    res = ig_units(model, units, prefix, hook_names, layer_list, cfg, int(cfg.batch_rows))
    L, d, nT = model.n_layers, model.d_mlp, len(t_ids)
    scores = torch.zeros(nT, L, d, dtype=torch.float64)
    p_full = torch.zeros(nT, L, dtype=torch.float64)
    p_base = torch.zeros(nT, L, dtype=torch.float64)
    acts = torch.zeros(nT, L, d)
    steps_used = torch.zeros(nT, L, dtype=torch.long)
    scores[:, layer_list] = res.attr
    p_base[:, layer_list] = res.p_base
    steps_used[:, layer_list] = res.steps_used
    for t, u in enumerate(units):
        p_full[t, layer_list] = u.p_clean
        acts[t, layer_list] = u.w_bar.float().cpu()
    return NeuronAttribution(
        scores=scores.mean(0).float(), prob_full=p_full.float(), prob_baseline=p_base.float(),
        layer_sums=scores.sum(-1).float(), activations=acts, prompt=prompt,
        target=target if isinstance(target, str) else model.decode(t_ids) if model.has_tokenizer else "",
        target_tokens=tuple(model.to_str_tokens(t_ids)) if model.has_tokenizer else tuple(str(i) for i in t_ids),
        model_name=model.name, site=cfg.site, method=cfg.method, steps=int(res.steps_used.max()), rule=cfg.rule,
        layers=tuple(layer_list), provenance=Provenance.collect(model, cfg),
        meta={"steps": "auto", "tol": cfg.tol, "steps_used": steps_used.tolist(),
              "evaluations": int(res.evaluations.sum())},
    )


class _Run:
    """One teacher-forced position of :func:`integrated_gradients`: its clean run and estimators."""

    def __init__(self, model: Model, context: list[int], target_id: int, hook_names: list[str], layers: list[int],
                 cfg: IGConfig) -> None:
        self.model, self.context, self.tid, self.hook_names, self.layers, self.cfg = (
            model, context, target_id, hook_names, layers, cfg)
        self.w_bar, logits, self.prefix = clean_last(model, context, hook_names, cfg.prefix_reuse)
        self.p_clean = float(logits.float().softmax(-1)[target_id])

    def _batch(self, row_layer: Tensor, values: Tensor, need_grad: bool = True,
               late_expand: bool = True) -> tuple[Tensor, Tensor | None]:
        return scaled_batch(self.model, self.context, self.prefix, self.hook_names, row_layer, values, self.tid,
                            need_grad=need_grad, layer_ids=self.layers, late_expand=late_expand)

    def per_layer(self, base: Tensor, alphas: Tensor, weights: Tensor, bar: Any) -> tuple[Tensor, Tensor]:
        """Exact IG, one layer scaled at a time; the steps of all layers batched together."""
        n_li, d = len(self.layers), self.w_bar.shape[-1]
        diff = self.w_bar - base
        m = len(alphas)
        a_row = torch.cat([alphas, torch.zeros(1, dtype=torch.float64)])
        w_row = torch.cat([weights, torch.zeros(1, dtype=torch.float64)])
        row_layer = torch.arange(n_li).repeat_interleave(m + 1)
        row_alpha, row_w = a_row.repeat(n_li), w_row.repeat(n_li)
        dev = self.w_bar.device  # accumulate in float64 on the model's device; one copy to the CPU per token
        grad_acc = torch.zeros(n_li, d, dtype=torch.float64, device=dev)
        row_w = row_w.to(dev)
        p_base = torch.zeros(n_li, dtype=torch.float64)
        for start, stop in layer_chunks(n_li, m + 1, self.cfg.batch_rows, self.cfg.layer_chunks):
            rl = row_layer[start:stop]
            ra = row_alpha[start:stop].to(self.w_bar.device, torch.float32)  # path points in float32, then model dtype
            vals = (base[rl].float() + ra[:, None] * diff[rl].float()).to(self.w_bar.dtype)
            probs, grad = self._batch(rl, vals, late_expand=self.cfg.late_expand)
            assert grad is not None
            grad_acc.index_add_(0, rl.to(dev), grad.double() * row_w[start:stop, None])
            is_base = torch.arange(start, stop) % (m + 1) == m  # each layer's last row: the baseline
            idx = is_base.nonzero().flatten()  # one device-to-host copy per batch, not one per layer
            p_base[rl[idx]] = probs[idx.to(probs.device)].double().cpu()
            bar.update(1)
        return (diff.double() * grad_acc).cpu(), p_base

    def joint(self, base: Tensor, alphas: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        """All layers scaled together (completeness holds jointly)."""
        diff = self.w_bar - base
        a32 = alphas.to(self.w_bar.device, torch.float32)
        vals = (base[None].float() + a32[:, None, None] * diff[None].float()).to(self.w_bar.dtype)
        vals = torch.cat([vals, base[None]])  # last row: all layers at baseline
        probs, grad = self._batch(torch.full((len(alphas) + 1,), -1), vals, late_expand=self.cfg.late_expand)
        assert grad is not None
        w_row = torch.cat([weights, torch.zeros(1, dtype=torch.float64)])
        attr = diff.double().cpu() * (grad.double().cpu() * w_row[:, None, None]).sum(0)
        return attr, probs[-1].double().cpu().expand(len(self.layers))

    def grad_x_act(self, base: Tensor) -> tuple[Tensor, Tensor]:
        """Gradient × (activation − baseline), one backward pass."""
        diff = self.w_bar - base
        _, grad = self._batch(torch.full((1,), -1), self.w_bar[None])
        assert grad is not None
        pb, _ = self._batch(torch.full((1,), -1), base[None], need_grad=False)
        return diff.double().cpu() * grad[0].double().cpu(), pb[0].double().cpu().expand(len(self.layers))


__all__ = ["NeuronAttribution", "NeuronScoreRow", "CompletenessRow", "integrated_gradients", "quadrature", "RULES",
           "Rule", "Method"]
