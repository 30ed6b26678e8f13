"""Logit-lens and direct-logit-attribution figures (functions of values)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from jaxtyping import Float, Int
from torch import Tensor


def lens_figure(
    z: Float[Tensor, "layer pos"],
    ranks: Int[Tensor, "layer pos"],
    probs: Float[Tensor, "layer pos"],
    layer_labels: Sequence[str],
    tokens: Sequence[str],
    top_tokens: Sequence[Sequence[str]],
    top_probs: Float[Tensor, "layer pos"],
    metric: str,
    title: str,
) -> go.Figure:
    """Layers (rows, embeddings at the bottom) × prompt positions; hover: target rank/prob and the top token.

    Args:
        z: The coloured values (probability, log10 rank or logit).
        ranks, probs: The target's rank and probability (hover).
        layer_labels: Row labels (``embed``, ``0``, ...).
        tokens: Column labels (the prompt's tokens).
        top_tokens, top_probs: The top token and its probability per cell (hover and cell text).
        metric: ``prob``, ``rank`` or ``logit`` (colour scale and bar title).
        title: Figure title.

    Returns:
        A plotly heatmap figure, sized to the number of layers and positions.
    """
    zz = z.detach().float().cpu().numpy()
    n_l, n_p = zz.shape
    xs = [f"{i}: {t!r}" for i, t in enumerate(tokens)]
    custom = np.stack([ranks.cpu().numpy(), probs.detach().float().cpu().numpy(), top_probs.detach().float().cpu().numpy()],
                      -1)
    text = [[str(top_tokens[i][j]) for j in range(n_p)] for i in range(n_l)]
    scale = {"prob": ("Viridis", "P(target)"), "rank": ("Viridis_r", "log10 rank"), "logit": ("RdBu_r", "logit")}[metric]
    fig = go.Figure(go.Heatmap(
        z=zz, x=xs, y=list(layer_labels), colorscale=scale[0], colorbar=dict(title=scale[1]), customdata=custom,
        text=text, texttemplate="%{text}" if n_l * n_p <= 400 else None, textfont=dict(size=9),
        zmin=0.0 if metric == "prob" else None, zmax=1.0 if metric == "prob" else None,
        hovertemplate="layer %{y}<br>position %{x}<br>target rank %{customdata[0]:.0f}, P %{customdata[1]:.3g}"
                      "<br>top token %{text} (P %{customdata[2]:.3g})<extra></extra>",
    ))
    fig.update_layout(title=title, xaxis_title="position (token)", yaxis_title="layer (residual read-out)",
                      template="plotly_white", width=max(600, 90 * n_p + 200), height=max(360, 18 * n_l + 160))
    return fig


def dla_figure(labels: Sequence[str], values: Sequence[float], total: float, title: str) -> go.Figure:
    """Bars of per-neuron direct contributions to the target logit (largest magnitude first) and their sum.

    Args:
        labels: One label per neuron (e.g. ``"L3/N10"``).
        values: Each neuron's direct effect on the target logit.
        total: The sum over the set, shown in the subtitle.
        title: Figure title.

    Returns:
        A plotly bar figure, positive bars red and negative blue.
    """
    order = sorted(range(len(values)), key=lambda i: -abs(values[i]))
    fig = go.Figure(go.Bar(
        x=[labels[i] for i in order], y=[values[i] for i in order],
        marker_color=["#c0392b" if values[i] >= 0 else "#2e5cb8" for i in order],
        hovertemplate="%{x}<br>direct effect %{y:.4g}<extra></extra>",
    ))
    fig.add_hline(y=0, line_color="#999")
    fig.update_layout(title=f"{title}<br><sup>sum over the set = {total:.4g} (the set's direct effect)</sup>",
                      xaxis_title="neuron", yaxis_title="direct effect on the target logit", template="plotly_white",
                      width=max(500, 28 * len(values) + 200), height=420)
    return fig


__all__ = ["lens_figure", "dla_figure"]
