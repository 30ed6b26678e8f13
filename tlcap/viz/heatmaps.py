"""Neuron heatmaps (layer × neuron) and activation heatmaps (QL paper, Figure 1 style).

Functions take values: scores as tensors and neuron sets as collections of ``(layer, index)``
pairs (a :class:`tlcap.metrics.NeuronSet` is one), so this module imports no result type.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

Neurons = Collection[tuple[int, int]]


def neuron_heatmap(
    scores: Float[Tensor, "layer d_mlp"],
    highlight: Neurons | None = None,
    title: str = "Neuron attribution",
    colorscale: str = "RdBu_r",
    zmid: float | None = 0.0,
    score_name: str = "score",
) -> go.Figure:
    """Layer × neuron heatmap readable at 30 × 1536 and 12 × 3072.

    Each layer is one row; hovering shows layer, neuron and score. Located neurons
    (``highlight``) are ringed so that isolated neurons stay visible at full width.

    Args:
        scores: ``[layer, d_mlp]`` scores, one per neuron.
        highlight: ``(layer, index)`` pairs to ring (e.g. a :class:`tlcap.metrics.NeuronSet`), or ``None``.
        title: Figure title.
        colorscale: Plotly colour scale.
        zmid: Value at the colour scale's middle; the range is then symmetric, ``±max|score|`` (``None``: plotly's).
        score_name: Name of the score in the colour bar and hover text.

    Returns:
        A plotly heatmap figure, 1200 px wide and taller with more layers.
    """
    z = scores.detach().float().cpu().numpy()
    n_layers, d = z.shape
    lim = float(abs(z).max()) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(d)),
            y=list(range(n_layers)),
            colorscale=colorscale,
            zmid=zmid,
            zmin=-lim if zmid is not None else None,
            zmax=lim if zmid is not None else None,
            colorbar=dict(title=score_name),
            hovertemplate="layer %{y}<br>neuron %{x}<br>" + score_name + " %{z:.4g}<extra></extra>",
        )
    )
    if highlight is not None and len(highlight):
        ls, js = zip(*sorted(highlight))
        fig.add_trace(
            go.Scatter(
                x=list(js), y=list(ls), mode="markers", name=f"located ({len(highlight)})",
                marker=dict(symbol="circle-open", size=9, color="black", line=dict(width=1.5)),
                hovertemplate="located: layer %{y}, neuron %{x}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title, xaxis_title="neuron", yaxis_title="layer", template="plotly_white",
        width=1200, height=max(320, 22 * n_layers + 160), legend=dict(orientation="h", y=-0.2),
    )
    fig.update_yaxes(range=[-0.5, n_layers - 0.5], dtick=1 if n_layers <= 32 else None)
    fig.update_xaxes(range=[-0.5, d - 0.5])
    return fig


def located_heatmap(
    sets: Mapping[str, Neurons], title: str = "Located neurons", shape: tuple[int, int] | None = None
) -> go.Figure:
    """Located neurons of several sets (e.g. datasets, CNL Fig. 3): one scatter per set.

    Args:
        sets: Name → ``(layer, index)`` pairs.
        title: Figure title.
        shape: ``(n_layers, d_mlp)`` of the model (default: the first set's ``.shape``).

    Returns:
        A plotly figure with one marker trace per non-empty set (neuron on x, layer on y).
    """
    fig = go.Figure()
    if shape is None:
        shape = getattr(next(iter(sets.values())), "shape", (1, 1)) if sets else (1, 1)
    for name, s in sets.items():
        if not len(s):
            continue
        ls, js = zip(*sorted(s))
        fig.add_trace(go.Scattergl(x=list(js), y=list(ls), mode="markers", name=f"{name} ({len(s)})", marker=dict(size=5),
                                   hovertemplate=name + ": layer %{y}, neuron %{x}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="neuron", yaxis_title="layer", template="plotly_white",
                      width=1200, height=max(320, 18 * shape[0] + 160), xaxis=dict(range=[0, shape[1]]),
                      yaxis=dict(range=[-0.5, shape[0] - 0.5], dtick=1 if shape[0] <= 32 else None))
    return fig


def activation_heatmap(
    values: Float[Tensor, "rows cols"],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str = "Neuron activations",
    colorscale: str = "Viridis",
) -> go.Figure:
    """Rows (queries) × columns (neurons, labelled ``L{layer}.{index}``), QL Figure 1 style.

    Args:
        values: ``[rows, cols]`` activations (e.g. from :func:`activations_for`).
        row_labels: One label per row (the queries).
        col_labels: One label per column (e.g. from :func:`neuron_labels`).
        title: Figure title.
        colorscale: Plotly colour scale.

    Returns:
        A plotly heatmap figure, rows top to bottom in the given order.
    """
    z = values.detach().float().cpu().numpy()
    fig = go.Figure(
        go.Heatmap(
            z=z, x=list(col_labels), y=list(row_labels), colorscale=colorscale,
            hovertemplate="%{y}<br>%{x}<br>activation %{z:.4g}<extra></extra>",
        )
    )
    fig.update_layout(title=title, template="plotly_white", width=max(600, 28 * len(col_labels) + 300),
                      height=max(300, 40 * len(row_labels) + 160), xaxis=dict(type="category", tickangle=-60),
                      yaxis=dict(type="category", autorange="reversed"))
    return fig


def neuron_labels(neurons: Neurons) -> list[str]:
    """``L{layer}.{index}`` labels for a set of neurons.

    Args:
        neurons: ``(layer, index)`` pairs.

    Returns:
        One label per neuron, sorted by layer then index (the column order of :func:`activations_for`).
    """
    return [f"L{l}.{j}" for l, j in sorted(neurons)]


def activations_for(acts: Float[Tensor, "rows layer d_mlp"], neurons: Neurons) -> Float[Tensor, "rows n"]:
    """Pick the set's neurons out of ``[rows, layer, d_mlp]`` activations → ``[rows, |set|]``.

    Args:
        acts: ``[rows, layer, d_mlp]`` activations.
        neurons: ``(layer, index)`` pairs.

    Returns:
        ``[rows, len(neurons)]`` activations, columns sorted by layer then index (``[rows, 0]`` for an empty set).
    """
    if not len(neurons):
        return torch.zeros(acts.shape[0], 0)
    ls, js = zip(*sorted(neurons))
    return acts[:, list(ls), list(js)]
