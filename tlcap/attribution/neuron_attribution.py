"""The result of neuron attribution: :class:`NeuronAttribution` (scores, completeness, selection, figures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_float, check_int
from tlcap.locate.selection import threshold_select, top_k_select
from tlcap.metrics.sets import NeuronSet
from tlcap.results import Result
from tlcap.rows import frame
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
        """Per layer: Σ Attr vs P(w̄) − P(baseline), averaged over target tokens (:class:`CompletenessRow`).

        Returns:
            One row per layer: ``layer``, ``sum_attr``, ``delta_prob`` (P(w̄) − P(baseline)) and the relative error.
        """
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

        Args:
            threshold: ``t`` of ``Attr > t · max``, in ``(0, 1]`` (ignored with ``top_k``).
            top_k: Keep the ``top_k`` highest-scoring neurons instead.

        Returns:
            The located :class:`~tlcap.metrics.NeuronSet`.

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

        Returns:
            A JSON-ready dict (the CLI's ``summary.json``).
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
        """One :class:`NeuronScoreRow` per neuron (or the ``top`` best), sorted by score.

        Args:
            top: Keep only the ``top`` highest-scoring neurons (``None``: all).

        Returns:
            A DataFrame with the fields of :class:`NeuronScoreRow` as columns.
        """
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
        """The layer × neuron heatmap, neurons above 0.2 · max ringed.

        Returns:
            A plotly ``Figure``.
        """
        return self.heatmap(highlight=self.select())

    def heatmap(self, **kwargs: Any) -> go.Figure:
        """Layer × neuron heatmap (see :func:`tlcap.viz.neuron_heatmap`).

        Args:
            **kwargs: Options of :func:`tlcap.viz.neuron_heatmap` (``highlight``, ``title``, ...).

        Returns:
            A plotly ``Figure``.
        """
        kwargs.setdefault("title", f"IG attribution: {self.prompt!r} → {self.target!r}")
        return neuron_heatmap(self.scores, **kwargs)


def target_labels(model: Any, target: Any, t_ids: Sequence[int]) -> dict[str, Any]:
    """A result's ``target`` and ``target_tokens`` fields: the answer as given (or decoded from its ids) and its tokens.

    Args:
        model: The model (its tokenizer, when it has one).
        target: The answer as the caller gave it: a string or its token ids.
        t_ids: Its token ids.

    Returns:
        ``{"target": ..., "target_tokens": ...}`` for :class:`NeuronAttribution` (ids as strings without a tokenizer).
    """
    tok = model.has_tokenizer
    return {"target": target if isinstance(target, str) else model.decode(t_ids) if tok else "",
            "target_tokens": tuple(model.to_str_tokens(t_ids)) if tok else tuple(str(i) for i in t_ids)}


__all__ = ["CompletenessRow", "Method", "NeuronAttribution", "NeuronScoreRow", "Rule", "SUMMARY_TOP", "target_labels"]
