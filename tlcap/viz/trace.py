"""Causal-tracing and ROME figures: ROME-style three-panel heatmaps, average effects, edit sweeps."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

_COLORS = {"resid": "Purples", "mlp": "Greens", "attn": "Reds"}
def _colorbar_x(fig: go.Figure, col: int) -> float:
    """Just right of subplot ``col``'s x-domain (1-based)."""
    axis = fig.layout["xaxis" if col == 1 else f"xaxis{col}"]
    return float(axis.domain[1]) + 0.005


_TITLES = {"resid": "single restored layer (residual)", "mlp": "restored MLP (window)", "attn": "restored attention (window)"}


def trace_heatmap(trace: Any, title: str | None = None) -> go.Figure:
    """Tokens × layers heatmap of the restored probability, one panel per kind (ROME Fig. 1).

    Subject tokens are starred; hovering shows the probability and the indirect effect.
    """
    kinds = list(trace.kinds)
    s0, s1 = trace.subject_range
    labels = [f"{i}: {t!r}" + (" *" if s0 <= i < s1 else "") for i, t in enumerate(trace.tokens)]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[_TITLES.get(k, k) for k in kinds],
                        shared_yaxes=True, horizontal_spacing=0.08)
    n = len(kinds)
    for i, kind in enumerate(kinds):
        z = trace.score(kind).float().numpy()
        eff = trace.effect(kind).float().numpy()
        fig.add_trace(
            go.Heatmap(
                z=z, x=list(trace.layers), y=labels, colorscale=_COLORS.get(kind, "Viridis"),
                zmin=min(float(trace.corrupted_prob), float(z.min())), zmax=float(z.max()),
                customdata=eff, colorbar=dict(x=_colorbar_x(fig, i + 1), len=0.9, thickness=10, title="p"),
                hovertemplate="layer %{x}<br>token %{y}<br>p(target) %{z:.4f}<br>effect %{customdata:.4f}<extra>" + kind + "</extra>",
            ),
            row=1, col=i + 1,
        )
        fig.update_xaxes(title_text="layer", row=1, col=i + 1)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(
        title=title or (f"Causal trace: {trace.prompt!r} → {trace.target!r}  "
                        f"(clean p={trace.clean_prob:.3f}, corrupted p={trace.corrupted_prob:.3f})"),
        template="plotly_white", width=max(900, 380 * n), height=max(320, 28 * len(labels) + 200),
    )
    return fig


def average_effect_heatmap(ds: Any, title: str | None = None) -> go.Figure:
    """Token class × layer average indirect effect, one panel per kind (ROME Fig. 2)."""
    kinds = list(ds.kinds)
    labels = [f"{c} (n={int(n)})" for c, n in zip(ds.classes, ds.counts.tolist())]
    n = len(kinds)
    fig = make_subplots(rows=1, cols=n, subplot_titles=[f"AIE: {k}" for k in kinds], shared_yaxes=True,
                        horizontal_spacing=0.08)
    for i, kind in enumerate(kinds):
        z = ds.effect(kind).float().numpy()
        fig.add_trace(
            go.Heatmap(z=z, x=list(ds.layers), y=labels, colorscale=_COLORS.get(kind, "Viridis"),
                       colorbar=dict(x=_colorbar_x(fig, i + 1), len=0.9, thickness=10, title="AIE"),
                       hovertemplate="layer %{x}<br>%{y}<br>AIE %{z:.4f}<extra>" + kind + "</extra>"),
            row=1, col=i + 1,
        )
        fig.update_xaxes(title_text="layer", row=1, col=i + 1)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(
        title=title or (f"Average indirect effect over {ds.n_facts} facts "
                        f"(clean p={ds.clean_prob:.3f}, corrupted p={ds.corrupted_prob:.3f})"),
        template="plotly_white", width=max(900, 380 * n), height=420,
    )
    return fig


def average_effect_lines(ds: Any, token_class: str = "last subject") -> go.Figure:
    """Average indirect effect by layer at one token class, one line per kind."""
    ci = list(ds.classes).index(token_class)
    fig = go.Figure()
    colors = {"resid": "purple", "mlp": "green", "attn": "red"}
    for kind in ds.kinds:
        fig.add_trace(go.Scatter(x=list(ds.layers), y=ds.effect(kind)[ci].tolist(), mode="lines+markers", name=kind,
                                 line=dict(color=colors.get(kind))))
    fig.update_layout(title=f"Average indirect effect at the {token_class} token ({ds.n_facts} facts)",
                      xaxis_title="layer", yaxis_title="AIE", template="plotly_white", width=800, height=420)
    return fig


def edit_sweep_figure(sweep: Any, title: str | None = None) -> go.Figure:
    """ROME at every layer: efficacy, paraphrase, specificity and P(new) by edited layer."""
    layers = sweep.layers
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=layers, y=[float(bool(e)) for e in sweep.column("efficacy")], mode="markers+lines",
                             name="efficacy (new > old)"))
    fig.add_trace(go.Scatter(x=layers, y=sweep.column("paraphrase"), mode="markers+lines", name="paraphrase"))
    fig.add_trace(go.Scatter(x=layers, y=sweep.column("specificity"), mode="markers+lines", name="specificity"))
    fig.add_trace(go.Scatter(x=layers, y=sweep.column("new_prob_after"), mode="markers+lines", name="P(new) after"))
    fig.add_trace(go.Scatter(x=layers, y=sweep.column("new_prob_before"), mode="lines", name="P(new) before",
                             line=dict(dash="dot", color="gray")))
    fig.update_layout(title=title or f"ROME edit at each layer: {sweep.prompt!r} → {sweep.target_new!r}",
                      xaxis_title="edited layer", yaxis_title="rate / probability", yaxis=dict(range=[-0.05, 1.05]),
                      template="plotly_white", width=900, height=450)
    return fig


__all__ = ["average_effect_heatmap", "average_effect_lines", "edit_sweep_figure", "trace_heatmap"]
