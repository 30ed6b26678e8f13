"""Figures of the CNL evaluation experiments: ours (with 95 % CIs) beside the paper's numbers.

Functions of values (labels, numbers, interval ends); no result type is imported. NaN values are
drawn as missing bars.

Example:
    >>> fig = paper_bars(["KN", "ROME", "KC"], [0.41, 0.28, 0.05], [0.35, 0.22, 0.03], [0.47, 0.34, 0.08],
    ...                  paper=[0.373, 0.327, 0.072], title="Fidelity")
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

OURS, PAPER, CHANCE = "#1f77b4", "#bbbbbb", "#d62728"


def _err(values: Sequence[float], lows: Sequence[float], highs: Sequence[float], scale: float) -> dict:
    up = [(h - v) * scale if not (math.isnan(h) or math.isnan(v)) else 0.0 for v, h in zip(values, highs)]
    down = [(v - lo) * scale if not (math.isnan(lo) or math.isnan(v)) else 0.0 for v, lo in zip(values, lows)]
    return dict(type="data", symmetric=False, array=up, arrayminus=down, thickness=1.5)


def _bar_traces(labels: Sequence[str], values: Sequence[float], lows: Sequence[float], highs: Sequence[float],
                paper: Sequence[float | None] | None, extra: Mapping[str, Sequence[float]] | None, scale: float,
                legend: bool) -> list[go.BaseTraceType]:
    s = [v * scale for v in values]
    traces: list[go.BaseTraceType] = [go.Bar(
        x=list(labels), y=s, name="tlcap (95 % CI)", marker_color=OURS, error_y=_err(values, lows, highs, scale),
        text=[f"{v:.1f}" if not math.isnan(v) else "n/a" for v in s], textposition="outside", showlegend=legend,
        legendgroup="ours",
    )]
    if paper is not None:
        p = [v * scale if v is not None else float("nan") for v in paper]
        traces.append(go.Bar(x=list(labels), y=p, name="paper", marker_color=PAPER,
                             text=[f"{v:.1f}" if not math.isnan(v) else "" for v in p], textposition="outside",
                             showlegend=legend, legendgroup="paper"))
    for i, (name, vals) in enumerate((extra or {}).items()):
        traces.append(go.Scatter(x=list(labels), y=[v * scale for v in vals], mode="markers", name=name,
                                 marker=dict(symbol="line-ew-open", size=28, color=CHANCE if i == 0 else None,
                                             line=dict(width=3)),
                                 showlegend=legend, legendgroup=name))
    return traces


def paper_bars(
    labels: Sequence[str],
    values: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    paper: Sequence[float | None] | None = None,
    extra: Mapping[str, Sequence[float]] | None = None,
    title: str = "",
    yaxis_title: str = "%",
    scale: float = 100.0,
) -> go.Figure:
    """Grouped bars: ours with CI error bars, the paper's value beside, ``extra`` series as ticks.

    Args:
        labels: One label per bar group (method, rate).
        values, lows, highs: Our estimates and their interval ends (shares, scaled by ``scale``).
        paper: The paper's value per label (``None`` for none).
        extra: Named series drawn as horizontal ticks (e.g. ``{"chance": [...]}``).
        title: Figure title.
        yaxis_title: Y axis title.
        scale: Multiplier for display (100: shares as percent).

    Returns:
        A plotly figure of grouped bars (ours, the paper's) with the ``extra`` ticks.
    """
    fig = go.Figure(_bar_traces(labels, values, lows, highs, paper, extra, scale, True))  # type: ignore[arg-type]
    fig.update_layout(title=title, yaxis_title=yaxis_title, barmode="group", template="plotly_white",
                      width=820, height=480, legend=dict(orientation="h", y=-0.15))
    return fig


def paper_panels(
    panels: Mapping[str, tuple[Sequence[str], Sequence[float], Sequence[float], Sequence[float], Sequence[float | None]]],
    title: str = "",
    scale: float = 100.0,
) -> go.Figure:
    """One :func:`paper_bars` panel per entry ``name → (labels, values, lows, highs, paper)`` side by side.

    Args:
        panels: ``{panel title: (labels, values, lows, highs, paper)}``, as the arguments of :func:`paper_bars`.
        title: Figure title.
        scale: Multiplier for display (100: shares as percent).

    Returns:
        A plotly figure of one subplot per panel, the legend shown once.
    """
    names = list(panels)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names)
    for c, name in enumerate(names, start=1):
        labels, v, lo, hi, paper = panels[name]
        for tr in _bar_traces(labels, v, lo, hi, paper, None, scale, c == 1):  # type: ignore[arg-type]
            fig.add_trace(tr, row=1, col=c)
    fig.update_layout(title=title, barmode="group", template="plotly_white", width=420 * len(names), height=500,
                      legend=dict(orientation="h", y=-0.15))
    return fig


def layer_curves(
    layers: Sequence[int],
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
    marks: Sequence[int] | None = None,
    marks_name: str = "facts whose traced layer it is",
    title: str = "",
    yaxis_title: str = "share",
) -> go.Figure:
    """Per-layer means with CI bands (``name → (values, lows, highs)``), and counts per layer as bars.

    Args:
        layers: The x axis.
        series: Curves with their interval ends.
        marks: A count per layer (e.g. how many facts were traced to each layer), on a second axis.
        marks_name: Legend name of the counts.
        title: Figure title.
        yaxis_title: Title of the curves' axis.

    Returns:
        A plotly figure of the curves on ``[0, 1.05]``, and the counts on a second axis when ``marks`` is given.
    """
    fig = make_subplots(specs=[[{"secondary_y": marks is not None}]])
    x = list(layers)
    palette = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e")
    if marks is not None:
        fig.add_trace(go.Bar(x=x, y=list(marks), name=marks_name, marker_color="rgba(214,39,40,0.35)"), secondary_y=True)
    for i, (name, (v, lo, hi)) in enumerate(series.items()):
        col = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=list(hi) + list(lo)[::-1], fill="toself", line=dict(width=0),
                                 fillcolor=col, opacity=0.15, hoverinfo="skip", showlegend=False), secondary_y=False)
        fig.add_trace(go.Scatter(x=x, y=list(v), mode="lines+markers", name=name, line=dict(color=col)), secondary_y=False)
    fig.update_layout(title=title, template="plotly_white", width=900, height=480, xaxis_title="edited layer",
                      legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(title_text=yaxis_title, range=[0, 1.05], secondary_y=False)
    if marks is not None:
        fig.update_yaxes(title_text="facts", secondary_y=True, showgrid=False)
    return fig


def null_histogram(observed: float, null: Sequence[float], title: str = "", xaxis_title: str = "") -> go.Figure:
    """Histogram of random-set values with the located value as a vertical line.

    Args:
        observed: The located set's value (the vertical line).
        null: One value per matched random set.
        title: Figure title.
        xaxis_title: X axis title.

    Returns:
        A plotly histogram figure.
    """
    fig = go.Figure(go.Histogram(x=list(null), name=f"matched random sets ({len(null)})", marker_color=PAPER))
    fig.add_vline(x=observed, line=dict(color=OURS, width=3), annotation_text="located")
    fig.update_layout(title=title, xaxis_title=xaxis_title, yaxis_title="random sets", template="plotly_white",
                      width=700, height=420)
    return fig


__all__ = ["layer_curves", "null_histogram", "paper_bars", "paper_panels"]
