"""Figures of knowledge circuits: the circuit graph, the edge-score matrix, the size sweep."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

if TYPE_CHECKING:  # pragma: no cover
    from tlcap.locate.circuits import Circuit, EdgeScores, SizeSweep


def _node_xy(graph: Any, node: str) -> tuple[float, float]:
    """Layer columns: input at 0, attention of layer l at 2l+1, MLP at 2l+2, logits last."""
    H = graph.n_heads
    if node == "input":
        return 0.0, (H - 1) / 2
    if node == "logits":
        return 2.0 * graph.n_layers + 1, (H - 1) / 2
    layer, part = node.split(".") if "." in node else (node, "")
    l = int(layer[1:])
    if node.startswith("m"):
        return 2.0 * l + 2, -1.5  # MLPs on their own row below the heads
    return 2.0 * l + 1, float(part[1:])


def circuit_graph(circuit: "Circuit", title: str | None = None, max_edges: int = 2000) -> go.Figure:
    """The circuit as a graph: layers as columns, nodes sized by importance, edges by score.

    Attention heads of layer ``l`` are stacked in column ``2l+1`` (head index upwards), the
    MLP in column ``2l+2`` on a row below the heads; input and logits at the ends. Edge width grows with ``|score|``;
    red edges have positive scores (corrupting them hurts the target under MatchNLL), blue
    negative. A GQA key/value edge is drawn to every head of its kv group (dashed).
    Hovering an edge's midpoint shows upstream, reader and score.
    """
    g = circuit.graph
    edges = circuit.edges[:max_edges]
    imp = circuit.node_importance()
    fig = go.Figure()
    smax = max((abs(s) for _, _, s in edges), default=1.0) or 1.0
    bins = np.linspace(0, 1, 6)
    mid_x, mid_y, mid_t = [], [], []
    groups: dict[tuple[int, bool, bool], tuple[list, list]] = {}
    for u, v, s in edges:
        x0, y0 = _node_xy(g, u)
        targets = g.reader_node_names(v)
        for t in targets:
            x1, y1 = _node_xy(g, t)
            b = int(np.clip(np.digitize(abs(s) / smax, bins) - 1, 0, 4))
            key = (b, s >= 0, len(targets) > 1)
            xs, ys = groups.setdefault(key, ([], []))
            xs += [x0, x1, None]
            ys += [y0, y1, None]
            mid_x.append((x0 + x1) / 2)
            mid_y.append((y0 + y1) / 2)
            mid_t.append(f"{u} → {v}<br>score {s:.4g}")
    for (b, pos, shared), (xs, ys) in sorted(groups.items()):
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
            line=dict(width=0.6 + 1.2 * b, color="rgba(214,39,40,%.2f)" % (0.25 + 0.15 * b) if pos
                      else "rgba(31,119,180,%.2f)" % (0.25 + 0.15 * b), dash="dot" if shared else "solid"),
        ))
    fig.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="markers", marker=dict(size=4, opacity=0.0),
                             hovertext=mid_t, hoverinfo="text", showlegend=False))
    names = list(circuit.nodes)
    xs, ys = zip(*[_node_xy(g, n) for n in names]) if names else ((), ())
    vals = np.array([imp.get(n, 0.0) for n in names]) if names else np.zeros(0)
    vmax = float(vals.max()) if len(vals) and vals.max() > 0 else 1.0
    kinds = ["input" if n == "input" else "logits" if n == "logits" else "MLP" if n.startswith("m") else "head" for n in names]
    colors = {"input": "#2ca02c", "logits": "#9467bd", "MLP": "#ff7f0e", "head": "#1f77b4"}
    for kind in ("input", "head", "MLP", "logits"):
        sel = [i for i, k in enumerate(kinds) if k == kind]
        if not sel:
            continue
        fig.add_trace(go.Scatter(
            x=[xs[i] for i in sel], y=[ys[i] for i in sel], mode="markers+text", name=kind,
            text=[names[i] for i in sel], textposition="top center", textfont=dict(size=8),
            marker=dict(size=[8 + 22 * float(np.sqrt(vals[i] / vmax)) for i in sel], color=colors[kind],
                        line=dict(width=1, color="black")),
            hovertext=[f"{names[i]}<br>importance {vals[i]:.4g}" for i in sel], hoverinfo="text",
        ))
    L = g.n_layers
    ticks = [0] + [v for l in range(L) for v in (2 * l + 1, 2 * l + 2)] + [2 * L + 1]
    labels = ["input"] + [t for l in range(L) for t in (f"A{l}", f"M{l}")] + ["logits"]
    fig.update_layout(
        title=title or f"Knowledge circuit: {circuit.n_edges} edges, {circuit.n_nodes} nodes "
                       f"({100 * circuit.param_fraction:.1f}% of parameters) — {circuit.prompt!r} → {circuit.target!r}",
        template="plotly_white", width=min(2200, max(900, 30 * (2 * L + 2))), height=max(450, 50 * g.n_heads + 250),
        xaxis=dict(tickvals=ticks, ticktext=labels, tickangle=-60, title="layer"),
        yaxis=dict(title="head", tickvals=[-1.5] + list(range(g.n_heads)),
                   ticktext=["MLP"] + [str(h) for h in range(g.n_heads)], zeroline=False),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def edge_score_heatmap(scores: "EdgeScores", title: str | None = None) -> go.Figure:
    """The dense ``[upstream × reader]`` edge-score matrix (non-edges blank)."""
    z = scores.scores.detach().double().numpy().copy()
    z[~scores.valid.numpy()] = np.nan
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=z, x=list(scores.graph.readers), y=list(scores.graph.upstream), colorscale="RdBu_r", zmid=0,
        zmin=-lim, zmax=lim, colorbar=dict(title="score"),
        hovertemplate="%{y} → %{x}<br>score %{z:.4g}<extra></extra>",
    ))
    n_up, n_r = z.shape
    fig.update_layout(
        title=title or f"Edge scores ({scores.method}, {scores.metric}, {scores.direction}) — "
                       f"{scores.prompt!r} → {scores.target!r}",
        template="plotly_white", width=min(2400, max(700, 4 * n_r + 250)), height=min(2400, max(500, 4 * n_up + 200)),
        xaxis=dict(title="reader (downstream)", type="category", showticklabels=n_r <= 120),
        yaxis=dict(title="upstream", type="category", autorange="reversed", showticklabels=n_up <= 120),
    )
    return fig


def size_sweep_figure(sweep: "SizeSweep", title: str | None = None) -> go.Figure:
    """MatchNLL and target rank of the circuit alone vs its size, with random circuits."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("MatchNLL of the target", "target rank (1 = top)"))
    x = list(sweep.n_edges)
    fig.add_trace(go.Scatter(x=x, y=list(sweep.nll), mode="lines+markers", name="circuit (top-n, pruned)",
                             line=dict(color="#d62728")), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=list(sweep.random_nll), mode="lines+markers", name="random circuit",
                             line=dict(color="gray", dash="dot")), row=1, col=1)
    for y, name, dash in ((sweep.full_nll, "full model", "dash"), (sweep.ablated_nll, "all edges ablated", "dot")):
        fig.add_trace(go.Scatter(x=[min(x or [1]), max(x or [1])], y=[y, y], mode="lines", name=name,
                                 line=dict(color="black", dash=dash, width=1)), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=list(sweep.rank), mode="lines+markers", name="circuit rank", showlegend=False,
                             line=dict(color="#d62728")), row=1, col=2)
    fig.add_trace(go.Scatter(x=x, y=list(sweep.random_rank), mode="lines+markers", name="random rank", showlegend=False,
                             line=dict(color="gray", dash="dot")), row=1, col=2)
    fig.add_hline(y=10, line=dict(color="green", dash="dash", width=1), row=1, col=2)
    fig.update_xaxes(type="log", title="edges in circuit")
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(title=title or f"Circuit size vs faithfulness ({sweep.total_edges} edges in the graph)",
                      template="plotly_white", width=1100, height=450, legend=dict(orientation="h", y=-0.25))
    return fig
