"""Figures of the CNL experiments: located sets, convergence, erase, σ sweeps, enhance, cross-dataset.

Every function takes values (frames, arrays, numbers), never an experiment type, and returns a
plotly figure.

Example:
    >>> fig = erase_figure(0.52, 0.31, [0.5, 0.52, 0.51], title="CNL erase: imdb")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.viz.heatmaps import Neurons, located_heatmap

_LAYOUT = dict(template="plotly_white")


def located_sets_figure(sets: Mapping[str, Neurons], title: str = "CNL located neurons per dataset",
                        shape: tuple[int, int] | None = None) -> go.Figure:
    """CNL Fig. 3: the located neurons of every set on one layer × neuron canvas.

    Args:
        sets: Name → ``(layer, index)`` pairs (e.g. a ``NeuronSet`` per dataset).
        title: Figure title.
        shape: ``(n_layers, d_mlp)`` (default: the first set's ``.shape``).

    Returns:
        The figure.
    """
    return located_heatmap(sets, title=title, shape=shape)


def convergence_figure(df: pd.DataFrame, title: str = "CNL convergence") -> go.Figure:
    """Split-half overlap, IoU and overlap with the final set vs samples per half.

    Args:
        df: Columns ``n_half``, ``overlap``, ``iou``, ``overlap_with_final``.
        title: Figure title.

    Returns:
        The figure.
    """
    fig = go.Figure()
    if len(df):
        for col, name in (("overlap", "split-half overlap"), ("iou", "split-half IoU"),
                          ("overlap_with_final", "overlap with final set")):
            fig.add_trace(go.Scatter(x=df["n_half"], y=df[col], mode="lines+markers", name=name))
    fig.update_layout(title=title, xaxis_title="samples per half", yaxis_title="overlap", yaxis=dict(range=[0, 1.02]),
                      width=800, height=480, **_LAYOUT)
    return fig


def erase_figure(base: float, located: float, random: Sequence[float], title: str = "CNL erase",
                 metric: str = "accuracy") -> go.Figure:
    """Accuracy with nothing, the located neurons and random neurons erased (random: mean ± sd of draws).

    Args:
        base: Accuracy of the unchanged model.
        located: Accuracy with the located neurons erased.
        random: Accuracies with each random draw erased (may be empty: no random bar).
        title: Figure title.
        metric: The accuracy metric (axis label).

    Returns:
        The figure.
    """
    xs, ys, err = ["base", "located erased"], [base, located], [0.0, 0.0]
    if len(random):
        xs.append(f"random erased (mean of {len(random)})")
        ys.append(float(np.mean(random)))
        err.append(float(np.std(random, ddof=1)) if len(random) > 1 else 0.0)
    fig = go.Figure(go.Bar(x=xs, y=ys, error_y=dict(type="data", array=err)))
    fig.update_layout(title=title, yaxis_title=f"accuracy ({metric})", width=700, height=450, **_LAYOUT)
    return fig


def erase_sweep_figure(df: pd.DataFrame, base: float, title: str = "CNL erase, σ sweep",
                       metric: str = "accuracy") -> go.Figure:
    """CNL Table 3 as bars: located vs random erased accuracy per σ, the base accuracy as a line.

    Args:
        df: Columns ``sigma``, ``n_neurons``, ``located_accuracy``, ``random_accuracy``.
        base: Accuracy of the unchanged model.
        title: Figure title.
        metric: The accuracy metric (axis label).

    Returns:
        The figure.
    """
    labels = [f"σ={s:g} ({n} neurons)" for s, n in zip(df["sigma"], df["n_neurons"])] if len(df) else []
    fig = go.Figure([
        go.Bar(x=labels, y=list(df["located_accuracy"]) if len(df) else [], name="located erased"),
        go.Bar(x=labels, y=list(df["random_accuracy"]) if len(df) else [], name="random erased (mean)"),
    ])
    fig.add_hline(y=base, line_dash="dash", annotation_text=f"base {base:.3f}")
    fig.update_layout(title=title, barmode="group", yaxis_title=f"accuracy ({metric})", width=800, height=480, **_LAYOUT)
    return fig


def enhance_figure(df: pd.DataFrame, base: float, title: str = "CNL enhance", metric: str = "accuracy",
                   random_draws: Mapping[int, Sequence[float]] | None = None) -> go.Figure:
    """Held-out accuracy vs fine-tuning epoch, one line per mode, starting at the base accuracy.

    Args:
        df: Columns ``mode``, ``epoch``, ``accuracy``.
        base: Accuracy before fine-tuning (epoch 0).
        title: Figure title.
        metric: The accuracy metric (axis label).
        random_draws: Optional epoch → accuracy of every random set fine-tuned (draw 0 is the ``random``
            line). With two or more draws, each further draw is a thin dotted line and their mean a dashed one.

    Returns:
        The figure.

    Example:
        >>> df = pd.DataFrame({"mode": ["located", "random"], "epoch": [1, 1], "accuracy": [0.6, 0.5]})
        >>> fig = enhance_figure(df, 0.4, random_draws={1: [0.5, 0.45, 0.55]})
        >>> [t.name for t in fig.data]
        ['located', 'random', 'random set 1', 'random set 2', 'random, mean of 3 sets']
    """
    fig = go.Figure()
    for mode in dict.fromkeys(df["mode"]) if len(df) else []:
        d = df[df["mode"] == mode]
        fig.add_trace(go.Scatter(x=[0, *d["epoch"]], y=[base, *d["accuracy"]], mode="lines+markers", name=str(mode)))
    epochs = sorted(random_draws or {})
    n = len(random_draws[epochs[0]]) if epochs else 0
    if n >= 2:
        acc = np.array([list(random_draws[e]) for e in epochs], dtype=float)  # [epoch, draw]
        for k in range(1, n):
            fig.add_trace(go.Scatter(x=[0, *epochs], y=[base, *acc[:, k]], mode="lines", name=f"random set {k}",
                                     line=dict(width=1, dash="dot", color="gray"), legendgroup="random sets"))
        fig.add_trace(go.Scatter(x=[0, *epochs], y=[base, *acc.mean(1)], mode="lines+markers",
                                 name=f"random, mean of {n} sets", line=dict(dash="dash", color="black")))
    fig.update_layout(title=title, xaxis_title="epoch", yaxis_title=f"accuracy ({metric})", width=800, height=480,
                      **_LAYOUT)
    return fig


def cross_matrix_figure(z: Any, names: Sequence[str], which: str, title: str | None = None) -> go.Figure:
    """A dataset × dataset matrix (overlap, IoU, or an accuracy change) as an annotated heatmap.

    Args:
        z: ``[k, k]`` values (rows: neurons of / dataset; columns: evaluated on / dataset).
        names: The datasets.
        which: What ``z`` is (``overlap``, ``iou``, ``erase_delta``, ...): deltas get a diverging scale.
        title: Figure title.

    Returns:
        The figure.
    """
    z = np.asarray(z, dtype=float)
    delta = "delta" in which or "enhance" in which
    symmetric = which in ("overlap", "iou")
    fig = go.Figure(go.Heatmap(
        z=z, x=list(names), y=list(names), colorscale="RdBu_r" if delta else "Blues", zmid=0 if delta else None,
        text=[[("" if np.isnan(v) else f"{v:.3f}") for v in row] for row in z], texttemplate="%{text}",
        colorbar=dict(title=which),
    ))
    fig.update_layout(title=title or f"CNL cross-dataset: {which}", xaxis_title="dataset" if symmetric else "evaluated on",
                      yaxis_title="dataset" if symmetric else "neurons of", width=620, height=540,
                      yaxis=dict(autorange="reversed"), **_LAYOUT)
    return fig


def accuracy_figure(predictions: Mapping[str, int], golds: Mapping[str, int], title: str = "Task accuracy") -> go.Figure:
    """What the model answered vs the gold labels (counts per label): shows a constant predictor at once.

    Args:
        predictions: Label → times predicted.
        golds: Label → times it is the gold answer.
        title: Figure title.

    Returns:
        The figure.
    """
    labels = list(dict.fromkeys([*golds, *predictions]))
    fig = go.Figure([
        go.Bar(x=labels, y=[golds.get(l, 0) for l in labels], name="gold"),
        go.Bar(x=labels, y=[predictions.get(l, 0) for l in labels], name="predicted"),
    ])
    fig.update_layout(title=title, barmode="group", yaxis_title="samples", width=700, height=450, **_LAYOUT)
    return fig


__all__ = [
    "located_sets_figure", "convergence_figure", "erase_figure", "erase_sweep_figure", "enhance_figure",
    "cross_matrix_figure", "accuracy_figure",
]
