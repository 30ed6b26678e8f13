"""Figures of the statistics results: intervals, rate tables, pair matrices, null distributions.

Functions take values (floats, sequences, labels), never result types, so the statistics layer
(:mod:`tlcap.metrics`) can call them from its ``figure()`` methods without an import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

_BLUE = "rgb(31,119,180)"
_RED = "rgb(214,39,40)"


def _nan_to_none(x: float) -> float | None:
    return None if x is None or math.isnan(float(x)) else float(x)


def interval_figure(
    labels: Sequence[str],
    values: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    title: str = "Estimates",
    value_name: str = "value",
) -> go.Figure:
    """Point values with their confidence intervals, one row per label (forest-plot style).

    An estimate without an interval (NaN ends) is drawn as a point alone.

    Args:
        labels: One label per estimate.
        values: Point values.
        lows: Lower ends (NaN = no interval).
        highs: Upper ends (NaN = no interval).
        title: Figure title.
        value_name: Axis title of the values.

    Returns:
        A plotly figure with one scatter trace (``error_x`` holds the interval).
    """
    v = [float(x) for x in values]
    lo = [_nan_to_none(x) for x in lows]
    hi = [_nan_to_none(x) for x in highs]
    plus = [h - x if h is not None else 0.0 for x, h in zip(v, hi)]
    minus = [x - low if low is not None else 0.0 for x, low in zip(v, lo)]
    fig = go.Figure(
        go.Scatter(
            x=v, y=list(labels), mode="markers", marker=dict(size=10, color=_BLUE),
            error_x=dict(type="data", symmetric=False, array=plus, arrayminus=minus, thickness=2, width=6),
            customdata=[[a if a is not None else float("nan"), b if b is not None else float("nan")] for a, b in zip(lo, hi)],
            hovertemplate="%{y}: %{x:.4g} [%{customdata[0]:.4g}, %{customdata[1]:.4g}]<extra></extra>",
            name=value_name,
        )
    )
    fig.update_layout(title=title, xaxis_title=value_name, template="plotly_white", width=700,
                      height=max(260, 60 * len(v) + 160), yaxis=dict(type="category", autorange="reversed"))
    return fig


def grouped_bars(
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    title: str = "",
    value_name: str = "value",
    percent: bool = False,
) -> go.Figure:
    """Grouped bar chart: one bar per series in each group, the value printed on each bar.

    Args:
        groups: Group labels on the x axis.
        series: Series name → one value per group.
        title: Figure title.
        value_name: Axis title of the values.
        percent: Show the values as percentages.

    Returns:
        A plotly figure with one bar trace per series.
    """
    fmt = (lambda x: f"{100 * x:.3g} %") if percent else (lambda x: f"{x:.3g}")
    fig = go.Figure(
        [
            go.Bar(name=name, x=list(groups), y=[float(v) for v in vals], text=[fmt(float(v)) for v in vals],
                   textposition="outside")
            for name, vals in series.items()
        ]
    )
    fig.update_layout(title=title, barmode="group", yaxis_title=value_name, template="plotly_white", width=750,
                      height=450, yaxis=dict(tickformat=".1%" if percent else None))
    return fig


def pair_matrix(
    k: int,
    pairs: Sequence[tuple[int, int]],
    values: Sequence[float],
    title: str = "Pairwise values",
    value_name: str = "value",
    labels: Sequence[str] | None = None,
) -> go.Figure:
    """Symmetric ``k × k`` heatmap of values given for unordered pairs ``(i, j)``, ``i < j``.

    The diagonal (a set with itself) is left empty.

    Args:
        k: Number of items.
        pairs: The pairs.
        values: One value per pair.
        title: Figure title.
        value_name: Colour-bar title.
        labels: Item labels (default ``0..k-1``).

    Returns:
        A plotly heatmap figure.
    """
    z = np.full((k, k), np.nan)
    for (i, j), v in zip(pairs, values):
        z[i, j] = z[j, i] = float(v)
    names = list(labels) if labels is not None else [str(i) for i in range(k)]
    fig = go.Figure(
        go.Heatmap(z=z, x=names, y=names, colorscale="Viridis", zmin=0.0, zmax=1.0, colorbar=dict(title=value_name),
                   text=[["" if np.isnan(x) else f"{x:.2f}" for x in row] for row in z], texttemplate="%{text}",
                   hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>")
    )
    fig.update_layout(title=title, template="plotly_white", width=max(420, 60 * k + 220), height=max(380, 60 * k + 160),
                      xaxis=dict(type="category"), yaxis=dict(type="category", autorange="reversed"))
    return fig


def null_histogram(
    observed: float,
    null_values: Sequence[float],
    title: str = "Located vs random",
    value_name: str = "statistic",
) -> go.Figure:
    """Histogram of the random sets' statistic with the located set's value as a vertical line.

    Args:
        observed: The located set's statistic.
        null_values: The statistic of each random set.
        title: Figure title.
        value_name: Axis title of the statistic.

    Returns:
        A plotly figure: one histogram trace and one line trace (``observed``).
    """
    nulls = [float(v) for v in null_values]
    top = max(1, len(nulls))
    fig = go.Figure(
        [
            go.Histogram(x=nulls, name=f"random sets ({len(nulls)})", marker_color=_BLUE, opacity=0.75),
            go.Scatter(x=[float(observed), float(observed)], y=[0, top], mode="lines", name="located",
                       line=dict(color=_RED, width=3), hovertemplate="located: %{x:.4g}<extra></extra>"),
        ]
    )
    fig.update_layout(title=title, xaxis_title=value_name, yaxis_title="random sets", template="plotly_white",
                      width=700, height=420, bargap=0.05)
    return fig


__all__ = ["interval_figure", "grouped_bars", "pair_matrix", "null_histogram"]
