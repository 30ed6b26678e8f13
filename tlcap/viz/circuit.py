"""Figures of knowledge circuits, from plain values (names, scores, arrays, tables).

The circuit graph, the edge-score matrix, the size sweep, the parameters per node and the
circuit-only evaluation. Nothing here knows the circuit types: the results in
:mod:`tlcap.locate.circuits` call these with their numbers.

Node names: ``"input"``, ``"a{l}.h{h}"`` (head ``h`` of layer ``l``), ``"m{l}"`` (MLP), ``"logits"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float
from plotly.subplots import make_subplots

NODE_COLORS = {"input": "#2ca02c", "logits": "#9467bd", "MLP": "#ff7f0e", "head": "#1f77b4"}


def node_kind(node: str) -> str:
    """``"input"``, ``"logits"``, ``"MLP"`` or ``"head"``.

    Args:
        node: A node name (``"input"``, ``"a{l}.h{h}"``, ``"m{l}"`` or ``"logits"``).

    Returns:
        The kind, a key of :data:`NODE_COLORS`.
    """
    if node in ("input", "logits"):
        return node
    return "MLP" if node.startswith("m") else "head"


def node_xy(node: str, n_layers: int, n_heads: int) -> tuple[float, float]:
    """Layer columns: input at 0, attention of layer l at 2l+1, MLP at 2l+2, logits last.

    Args:
        node: A node name (``"input"``, ``"a{l}.h{h}"``, ``"m{l}"`` or ``"logits"``).
        n_layers: The model's layers (places ``logits``).
        n_heads: Heads per layer (input and logits are centred on them).

    Returns:
        ``(x, y)``: the column, and the head index as height (``-1.5`` for an MLP).
    """
    if node == "input":
        return 0.0, (n_heads - 1) / 2
    if node == "logits":
        return 2.0 * n_layers + 1, (n_heads - 1) / 2
    layer, part = node.split(".") if "." in node else (node, "")
    l = int(layer[1:])
    if node.startswith("m"):
        return 2.0 * l + 2, -1.5  # MLPs on their own row below the heads
    return 2.0 * l + 1, float(part[1:])


def circuit_graph(
    edges: Sequence[tuple[str, str, float]],
    targets: Mapping[str, Sequence[str]],
    importance: Mapping[str, float],
    n_layers: int,
    n_heads: int,
    title: str,
    max_edges: int = 2000,
) -> go.Figure:
    """A circuit as a graph: layers as columns, nodes sized by importance, edges by score.

    Attention heads of layer ``l`` are stacked in column ``2l+1`` (head index upwards), the
    MLP in column ``2l+2`` on a row below the heads; input and logits at the ends. Edge width
    grows with ``|score|``; red edges have positive scores, blue negative. An edge whose reader
    feeds several nodes (a GQA key/value reader) is drawn to each of them, dashed. Hovering an
    edge's midpoint shows upstream, reader and score.

    Args:
        edges: ``(upstream, reader, score)`` by decreasing ``|score|``.
        targets: The nodes each reader of ``edges`` feeds.
        importance: The nodes to draw and their importance (marker size).
        n_layers: Layers of the model.
        n_heads: Query heads per layer.
        title: Figure title.
        max_edges: Draw at most this many edges (the first ones).

    Returns:
        The plotly figure.
    """
    edges = list(edges)[:max_edges]
    fig = go.Figure()
    smax = max((abs(s) for _, _, s in edges), default=1.0) or 1.0
    bins = np.linspace(0, 1, 6)
    mid_x, mid_y, mid_t = [], [], []
    groups: dict[tuple[int, bool, bool], tuple[list, list]] = {}
    for u, v, s in edges:
        x0, y0 = node_xy(u, n_layers, n_heads)
        ends = list(targets[v])
        for t in ends:
            x1, y1 = node_xy(t, n_layers, n_heads)
            b = int(np.clip(np.digitize(abs(s) / smax, bins) - 1, 0, 4))
            xs, ys = groups.setdefault((b, s >= 0, len(ends) > 1), ([], []))
            xs += [x0, x1, None]
            ys += [y0, y1, None]
            mid_x.append((x0 + x1) / 2)
            mid_y.append((y0 + y1) / 2)
            mid_t.append(f"{u} → {v}<br>score {s:.4g}")
    for (b, pos, shared), (xs, ys) in sorted(groups.items()):
        color = "rgba(214,39,40,%.2f)" % (0.25 + 0.15 * b) if pos else "rgba(31,119,180,%.2f)" % (0.25 + 0.15 * b)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line=dict(width=0.6 + 1.2 * b, color=color, dash="dot" if shared else "solid")))
    fig.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="markers", marker=dict(size=4, opacity=0.0),
                             hovertext=mid_t, hoverinfo="text", showlegend=False))
    names = list(importance)
    vals = np.array([float(importance[n]) for n in names]) if names else np.zeros(0)
    vmax = float(vals.max()) if len(vals) and vals.max() > 0 else 1.0
    for kind in ("input", "head", "MLP", "logits"):
        sel = [i for i, n in enumerate(names) if node_kind(n) == kind]
        if not sel:
            continue
        xy = [node_xy(names[i], n_layers, n_heads) for i in sel]
        fig.add_trace(go.Scatter(
            x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers+text", name=kind,
            text=[names[i] for i in sel], textposition="top center", textfont=dict(size=8),
            marker=dict(size=[8 + 22 * float(np.sqrt(vals[i] / vmax)) for i in sel], color=NODE_COLORS[kind],
                        line=dict(width=1, color="black")),
            hovertext=[f"{names[i]}<br>importance {vals[i]:.4g}" for i in sel], hoverinfo="text",
        ))
    L = n_layers
    ticks = [0] + [v for l in range(L) for v in (2 * l + 1, 2 * l + 2)] + [2 * L + 1]
    labels = ["input"] + [t for l in range(L) for t in (f"A{l}", f"M{l}")] + ["logits"]
    fig.update_layout(
        title=title, template="plotly_white",
        width=min(2200, max(900, 30 * (2 * L + 2))), height=max(450, 50 * n_heads + 250),
        xaxis=dict(tickvals=ticks, ticktext=labels, tickangle=-60, title="layer"),
        yaxis=dict(title="head", tickvals=[-1.5] + list(range(n_heads)),
                   ticktext=["MLP"] + [str(h) for h in range(n_heads)], zeroline=False),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def edge_score_heatmap(
    z: Float[np.ndarray, "n_upstream n_readers"],
    upstream: Sequence[str],
    readers: Sequence[str],
    title: str,
) -> go.Figure:
    """A dense ``[upstream × reader]`` edge-score matrix (NaN where there is no edge: blank).

    Args:
        z: Scores, NaN for non-edges.
        upstream: Row names.
        readers: Column names.
        title: Figure title.

    Returns:
        The plotly heatmap (diverging colours centred on 0).
    """
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=z, x=list(readers), y=list(upstream), colorscale="RdBu_r", zmid=0,
        zmin=-lim, zmax=lim, colorbar=dict(title="score"),
        hovertemplate="%{y} → %{x}<br>score %{z:.4g}<extra></extra>",
    ))
    n_up, n_r = z.shape
    fig.update_layout(
        title=title, template="plotly_white",
        width=min(2400, max(700, 4 * n_r + 250)), height=min(2400, max(500, 4 * n_up + 200)),
        xaxis=dict(title="reader (downstream)", type="category", showticklabels=n_r <= 120),
        yaxis=dict(title="upstream", type="category", autorange="reversed", showticklabels=n_up <= 120),
    )
    return fig


def size_sweep_figure(table: pd.DataFrame, full_nll: float, ablated_nll: float, title: str) -> go.Figure:
    """MatchNLL and target rank of the circuit alone vs its size, with random circuits.

    Args:
        table: One row per size with columns ``n_edges``, ``nll``, ``random_nll``, ``rank``,
            ``random_rank``.
        full_nll: NLL of the full model (a horizontal line).
        ablated_nll: NLL with every edge ablated (a horizontal line).
        title: Figure title.

    Returns:
        Two panels: NLL and rank (log axes) against the number of edges.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("MatchNLL of the target", "target rank (1 = top)"))
    x = [int(v) for v in table["n_edges"]]
    red, gray = dict(color="#d62728"), dict(color="gray", dash="dot")
    fig.add_trace(go.Scatter(x=x, y=list(table["nll"]), mode="lines+markers", name="circuit (top-n, pruned)",
                             line=red), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=list(table["random_nll"]), mode="lines+markers", name="random circuit",
                             line=gray), row=1, col=1)
    for y, name, dash in ((full_nll, "full model", "dash"), (ablated_nll, "all edges ablated", "dot")):
        fig.add_trace(go.Scatter(x=[min(x or [1]), max(x or [1])], y=[y, y], mode="lines", name=name,
                                 line=dict(color="black", dash=dash, width=1)), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=list(table["rank"]), mode="lines+markers", name="circuit rank", showlegend=False,
                             line=red), row=1, col=2)
    fig.add_trace(go.Scatter(x=x, y=list(table["random_rank"]), mode="lines+markers", name="random rank",
                             showlegend=False, line=gray), row=1, col=2)
    fig.add_hline(y=10, line=dict(color="green", dash="dash", width=1), row=1, col=2)
    fig.update_xaxes(type="log", title="edges in circuit")
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", width=1100, height=450, legend=dict(orientation="h", y=-0.25))
    return fig


def node_parameter_figure(nodes: Sequence[str], params: Sequence[int], title: str) -> go.Figure:
    """Parameters per node (bars in computation order, coloured by kind).

    Args:
        nodes: Node names.
        params: Parameters of each node.
        title: Figure title.

    Returns:
        The plotly bar chart (log y axis).
    """
    kinds = [node_kind(n) for n in nodes]
    fig = go.Figure()
    for kind in ("input", "head", "MLP", "logits"):
        sel = [i for i, k in enumerate(kinds) if k == kind]
        if sel:
            fig.add_trace(go.Bar(x=[nodes[i] for i in sel], y=[params[i] for i in sel], name=kind,
                                 marker_color=NODE_COLORS[kind]))
    fig.update_layout(title=title, template="plotly_white", width=min(2400, max(700, 6 * len(nodes) + 200)),
                      height=450, yaxis=dict(type="log", title="parameters"),
                      xaxis=dict(type="category", categoryorder="array", categoryarray=list(nodes),
                                 showticklabels=len(nodes) <= 120))
    return fig


def evaluation_figure(labels: Sequence[str], nll: Sequence[float], ranks: Sequence[int], title: str) -> go.Figure:
    """NLL of the target per run (bars), with the target's rank written on each bar.

    Args:
        labels: Run names (``"full model"``, ``"circuit alone"``, ...).
        nll: MatchNLL of the target in each run.
        ranks: 1-based rank of the (first) target token in each run.
        title: Figure title.

    Returns:
        The plotly bar chart.
    """
    palette = ["#2ca02c", "#d62728", "gray", "black"]
    fig = go.Figure(go.Bar(x=list(labels), y=list(nll), text=[f"rank {r}" for r in ranks], textposition="outside",
                           marker_color=[palette[i % len(palette)] for i in range(len(labels))]))
    fig.update_layout(title=title, template="plotly_white", width=700, height=450,
                      yaxis=dict(title="MatchNLL of the target"))
    return fig





def faithfulness_figure(table: pd.DataFrame, title: str, unit: str = "edges") -> go.Figure:
    """Normalised faithfulness of circuits and of their complements vs circuit size.

    Args:
        table: One row per size with columns ``fraction`` (share of the graph's edges or nodes),
            ``n`` (their number), ``faithfulness`` and ``complement_faithfulness``.
        title: Figure title (carries the areas).
        unit: What the size counts (``"edges"``, ``"nodes"``).

    Returns:
        One panel: faithfulness (0 = ablated model, 1 = full model) against the fraction kept.
    """
    fig = go.Figure()
    x = [float(v) for v in table["fraction"]]
    text = [f"{int(n)} {unit}" for n in table["n"]]
    fig.add_trace(go.Scatter(x=x, y=list(table["faithfulness"]), mode="lines+markers", name="circuit", text=text,
                             line=dict(color="#d62728")))
    fig.add_trace(go.Scatter(x=x, y=list(table["complement_faithfulness"]), mode="lines+markers",
                             name="complement (everything but the circuit)", text=text,
                             line=dict(color="gray", dash="dot")))
    for y in (0.0, 1.0):
        fig.add_hline(y=y, line=dict(color="black", dash="dash", width=1))
    fig.update_xaxes(title=f"fraction of the graph's {unit} in the circuit")
    fig.update_yaxes(title="normalised faithfulness (circuit − ablated) / (full − ablated)")
    fig.update_layout(title=title, template="plotly_white", width=900, height=500, legend=dict(orientation="h", y=-0.2))
    return fig


__all__ = [
    "circuit_graph", "edge_score_heatmap", "evaluation_figure", "faithfulness_figure", "node_kind",
    "node_parameter_figure", "node_xy", "size_sweep_figure",
]
