"""Causal-tracing and ROME figures: ROME-style three-panel heatmaps, average effects, edit metrics.

Functions take values (arrays keyed by kind, token strings, layer lists, per-layer metric lists),
so this module imports no result type; the results' ``figure()`` methods call them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

_COLORS = {"resid": "Purples", "mlp": "Greens", "attn": "Reds"}
_LINE_COLORS = {"resid": "purple", "mlp": "green", "attn": "red"}
_TITLES = {"resid": "single restored layer (residual)", "mlp": "restored MLP (window)", "attn": "restored attention (window)"}


def _colorbar_x(fig: go.Figure, col: int) -> float:
    """Just right of subplot ``col``'s x-domain (1-based)."""
    axis = fig.layout["xaxis" if col == 1 else f"xaxis{col}"]
    return float(axis.domain[1]) + 0.005


def trace_heatmap(
    scores: Mapping[str, np.ndarray],
    effects: Mapping[str, np.ndarray],
    tokens: Sequence[str],
    layers: Sequence[int],
    subject_range: tuple[int, int],
    corrupted_prob: float,
    title: str = "Causal trace",
) -> go.Figure:
    """Tokens × layers heatmap of the restored probability, one panel per kind (ROME Fig. 1).

    Args:
        scores: Kind → ``[token, layer]`` restored probabilities.
        effects: Kind → ``[token, layer]`` indirect effects (shown on hover).
        tokens: The prompt's tokens; those in ``subject_range`` are starred.
        layers: The layer axis.
        subject_range: ``[start, end)`` of the subject tokens.
        corrupted_prob: The colour scale starts at or below it.
        title: Figure title.

    Returns:
        The plotly figure.
    """
    kinds = list(scores)
    s0, s1 = subject_range
    labels = [f"{i}: {t!r}" + (" *" if s0 <= i < s1 else "") for i, t in enumerate(tokens)]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[_TITLES.get(k, k) for k in kinds],
                        shared_yaxes=True, horizontal_spacing=0.08)
    for i, kind in enumerate(kinds):
        z = np.asarray(scores[kind], dtype=float)
        fig.add_trace(
            go.Heatmap(
                z=z, x=list(layers), y=labels, colorscale=_COLORS.get(kind, "Viridis"),
                zmin=min(float(corrupted_prob), float(np.nanmin(z))), zmax=float(np.nanmax(z)),
                customdata=np.asarray(effects[kind], dtype=float),
                colorbar=dict(x=_colorbar_x(fig, i + 1), len=0.9, thickness=10, title="p"),
                hovertemplate=("layer %{x}<br>token %{y}<br>p(target) %{z:.4f}<br>effect %{customdata:.4f}"
                               f"<extra>{kind}</extra>"),
            ),
            row=1, col=i + 1,
        )
        fig.update_xaxes(title_text="layer", row=1, col=i + 1)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(title=title, template="plotly_white", width=max(900, 380 * len(kinds)),
                      height=max(320, 28 * len(labels) + 200))
    return fig


def average_effect_heatmap(
    effects: Mapping[str, np.ndarray],
    classes: Sequence[str],
    counts: Sequence[int],
    layers: Sequence[int],
    title: str = "Average indirect effect",
) -> go.Figure:
    """Token class × layer average indirect effect, one panel per kind (ROME Fig. 2).

    Args:
        effects: Kind → ``[class, layer]`` average indirect effects.
        classes: The token classes.
        counts: Facts contributing to each class (shown in the labels).
        layers: The layer axis.
        title: Figure title.

    Returns:
        The plotly figure.
    """
    kinds = list(effects)
    labels = [f"{c} (n={int(n)})" for c, n in zip(classes, counts)]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[f"AIE: {k}" for k in kinds], shared_yaxes=True,
                        horizontal_spacing=0.08)
    for i, kind in enumerate(kinds):
        fig.add_trace(
            go.Heatmap(z=np.asarray(effects[kind], dtype=float), x=list(layers), y=labels,
                       colorscale=_COLORS.get(kind, "Viridis"),
                       colorbar=dict(x=_colorbar_x(fig, i + 1), len=0.9, thickness=10, title="AIE"),
                       hovertemplate="layer %{x}<br>%{y}<br>AIE %{z:.4f}<extra>" + kind + "</extra>"),
            row=1, col=i + 1,
        )
        fig.update_xaxes(title_text="layer", row=1, col=i + 1)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(title=title, template="plotly_white", width=max(900, 380 * len(kinds)), height=420)
    return fig


def average_effect_lines(effects: Mapping[str, Sequence[float]], layers: Sequence[int], title: str) -> go.Figure:
    """Average indirect effect by layer at one token class, one line per kind.

    Args:
        effects: Kind → per-layer average indirect effect at the class.
        layers: The layer axis.
        title: Figure title.

    Returns:
        The plotly figure.
    """
    fig = go.Figure()
    for kind, ys in effects.items():
        fig.add_trace(go.Scatter(x=list(layers), y=list(ys), mode="lines+markers", name=kind,
                                 line=dict(color=_LINE_COLORS.get(kind))))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="AIE", template="plotly_white", width=800, height=420)
    return fig


def edit_sweep_figure(
    layers: Sequence[int],
    efficacy: Sequence[bool],
    paraphrase: Sequence[float],
    specificity: Sequence[float],
    new_prob_before: Sequence[float],
    new_prob_after: Sequence[float],
    title: str = "ROME edit at each layer",
) -> go.Figure:
    """ROME at every layer: efficacy, paraphrase, specificity and P(new) by edited layer.

    Args:
        layers: The edited layers.
        efficacy, paraphrase, specificity: Metrics per layer.
        new_prob_before, new_prob_after: P(new object) before / after each edit.
        title: Figure title.

    Returns:
        The plotly figure.
    """
    xs = list(layers)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=[float(bool(e)) for e in efficacy], mode="markers+lines",
                             name="efficacy (new > old)"))
    fig.add_trace(go.Scatter(x=xs, y=list(paraphrase), mode="markers+lines", name="paraphrase"))
    fig.add_trace(go.Scatter(x=xs, y=list(specificity), mode="markers+lines", name="specificity"))
    fig.add_trace(go.Scatter(x=xs, y=list(new_prob_after), mode="markers+lines", name="P(new) after"))
    fig.add_trace(go.Scatter(x=xs, y=list(new_prob_before), mode="lines", name="P(new) before",
                             line=dict(dash="dot", color="gray")))
    fig.update_layout(title=title, xaxis_title="edited layer", yaxis_title="rate / probability",
                      yaxis=dict(range=[-0.05, 1.05]), template="plotly_white", width=900, height=450)
    return fig


def edit_result_figure(
    probs: Mapping[str, tuple[float, float]],
    losses: Sequence[float],
    title: str = "ROME edit",
) -> go.Figure:
    """One ROME edit: probabilities before/after (bars) and the value optimisation's loss by step.

    Args:
        probs: Label (e.g. ``"P(new)"``) → ``(before, after)``.
        losses: The optimisation's loss at each step.
        title: Figure title.

    Returns:
        The plotly figure.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=["probability before / after", "value optimisation loss"],
                        horizontal_spacing=0.12)
    labels = list(probs)
    fig.add_trace(go.Bar(x=labels, y=[probs[k][0] for k in labels], name="before", marker_color="lightgray"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[probs[k][1] for k in labels], name="after", marker_color="seagreen"), row=1, col=1)
    fig.add_trace(go.Scatter(x=list(range(len(losses))), y=list(losses), mode="lines+markers", name="loss"),
                  row=1, col=2)
    fig.update_yaxes(range=[0, 1.05], title_text="probability", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", barmode="group", width=1000, height=420)
    return fig


__all__ = ["average_effect_heatmap", "average_effect_lines", "edit_result_figure", "edit_sweep_figure", "trace_heatmap"]
