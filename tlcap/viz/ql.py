"""Figures and table layouts of the Query Localization paper (plotly figures, pandas tables).

Every function takes values (data frames, arrays, thresholds), never a result or experiment type.

- :func:`cs2_violin` — CS2 per relation with the threshold lines (QL Fig. 3, 8, 9).
- :func:`table1_frame` — Table 1 layout (St/Ot rows; R:I, S:I, R:II, S:II, t per method; ∩:II).
- :func:`synapse_count_heatmap` — knowledge synapses per (layer, token).
- :func:`modification_table` / :func:`modification_bars` — Table 2 / 3 layout.
- :func:`enh_sup_table` / :func:`enh_sup_bars` — Fig. 4 (query-KN mapping) layout.
- :func:`synapse_bars` — Fig. 6 (ΔValue, ΔProb of self vs irrelevant synapses).
- :func:`predominance_violin` — Fig. 5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float, Int
from plotly.subplots import make_subplots
from torch import Tensor

GROUP_COLORS = {"K_I": "#1f77b4", "K_II": "#d62728"}


def cs2_violin(
    df: pd.DataFrame, static_threshold: float, otsu_threshold: float | None = None, method: str = "ig"
) -> go.Figure:
    """Violin of CS2 per relation (x) for one method, with the static (and Otsu) threshold lines.

    Args:
        df: One row per fact with columns ``relation``, ``cs2``, ``subject``.
        static_threshold: The static CS2 threshold (dashed line).
        otsu_threshold: Otsu's threshold (dotted line; ``None``/NaN: not drawn).
        method: Method name for the title.
    """
    fig = go.Figure()
    rels = sorted(df.relation.unique(), key=lambda r: int(str(r)[1:]) if str(r)[1:].isdigit() else 0) if len(df) else []
    for rel in rels:
        sub = df[df.relation == rel]
        fig.add_trace(go.Violin(x=[rel] * len(sub), y=sub.cs2, name=rel, box_visible=True, meanline_visible=True,
                                points="all", text=sub.subject, hovertemplate="%{text}<br>CS2 %{y:.3f}<extra></extra>"))
    fig.add_hline(y=static_threshold, line_dash="dash", line_color="black",
                  annotation_text=f"static threshold {static_threshold:g}")
    if otsu_threshold is not None and not math.isnan(otsu_threshold):
        fig.add_hline(y=otsu_threshold, line_dash="dot", line_color="gray",
                      annotation_text=f"Otsu {otsu_threshold:.3f}", annotation_position="bottom right")
    fig.update_layout(title=f"KN-consistency CS2 per relation ({method}; below the line: K_II)", xaxis_title="relation",
                      yaxis_title="CS2", template="plotly_white", showlegend=False, width=max(500, 120 * len(rels) + 200),
                      height=450, yaxis=dict(range=[-0.05, 1.05]))
    return fig


def table1_frame(stats: Mapping[tuple[str, str], Mapping[str, float]], k2_all: Mapping[str, float]) -> pd.DataFrame:
    """Table 1 layout: one row per threshold type, columns ``(method, stat)`` plus ``∩:II``.

    Args:
        stats: ``{(method, split): {"k1_ratio", "mean_cs2_k1", "k2_ratio", "mean_cs2_k2", "welch_t",
            "welch_p", "threshold"}}`` with split ``"static"`` or ``"otsu"``.
        k2_all: ``{split: share of facts that are K_II under every method}``.
    """
    methods = list(dict.fromkeys(m for m, _ in stats))
    rows = []
    for split, label in (("static", "St"), ("otsu", "Ot")):
        row: dict = {("T", ""): label}
        for m in methods:
            s = stats[(m, split)]
            row.update({(m, "R: I"): s["k1_ratio"], (m, "S: I"): s["mean_cs2_k1"], (m, "R: II"): s["k2_ratio"],
                        (m, "S: II"): s["mean_cs2_k2"], (m, "t"): s["welch_t"], (m, "p"): s["welch_p"],
                        (m, "threshold"): s["threshold"]})
        row[("∩", "II")] = k2_all.get(split, math.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    df.columns = pd.MultiIndex.from_tuples(df.columns)
    return df


def modification_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean Rel, Gen, Loc, Avg, ΔPPL by (operation, set, group) — QL Table 2 / 3 layout."""
    if df.empty:
        return pd.DataFrame(columns=["operation", "set", "group", "Rel", "Gen", "Loc", "Avg", "ΔPPL", "n"])
    g = df.groupby(["operation", "set", "group"], sort=False)
    out = g.agg(Rel=("rel", "mean"), Gen=("gen", "mean"), Loc=("loc", "mean"), Avg=("avg", "mean"), dppl=("dppl", "mean"),
                n=("rel", "size"), kns=("n_neurons", "mean")).reset_index()
    return out.rename(columns={"dppl": "ΔPPL", "kns": "mean |KN|"})


def modification_bars(df: pd.DataFrame, title: str = "Knowledge modification") -> go.Figure:
    """Bars of Rel/Gen/Loc/Avg per (set, group), one panel per operation."""
    t = modification_table(df)
    ops = list(t.operation.unique()) if len(t) else ["erasure"]
    fig = make_subplots(rows=1, cols=len(ops), subplot_titles=[o.capitalize() for o in ops], shared_yaxes=True)
    for c, op in enumerate(ops, start=1):
        sub = t[t.operation == op]
        x = [f"{s} · {g}" for s, g in zip(sub["set"], sub["group"])]
        for metric in ("Rel", "Gen", "Loc", "Avg"):
            fig.add_trace(go.Bar(x=x, y=sub[metric], name=metric, legendgroup=metric, showlegend=c == 1), row=1, col=c)
    fig.update_layout(title=title, barmode="group", template="plotly_white", width=450 * len(ops) + 200, height=450,
                      yaxis=dict(range=[0, 1.05]))
    return fig


def enh_sup_table(df: pd.DataFrame, by: str, value: str, order: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean ``value`` by (group, ``by``) with columns Enh, Sup and Avg (their mean)."""
    if df.empty:
        return pd.DataFrame(columns=["group", by, "Enh", "Sup", "Avg"])
    p = df.pivot_table(index=["group", by], columns="op", values=value, aggfunc="mean").reset_index()
    p = p.rename(columns={"enh": "Enh", "sup": "Sup"})
    for c in ("Enh", "Sup"):
        if c not in p:
            p[c] = math.nan
    p["Avg"] = p[["Enh", "Sup"]].mean(axis=1)
    if order:
        p["_o"] = p[by].map({k: i for i, k in enumerate(order)})
        p = p.sort_values(["group", "_o"]).drop(columns="_o")
    p.columns.name = None
    return p[["group", by, "Enh", "Sup", "Avg"]].reset_index(drop=True)


def enh_sup_bars(table: pd.DataFrame, by: str, ylabel: str, title: str) -> go.Figure:
    """One panel per group (K_I, K_II); bars Enh / Sup / Avg per ``by`` category (QL Fig. 4)."""
    groups = [g for g in ("K_I", "K_II") if g in set(table.group)] or ["K_I"]
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=groups, shared_yaxes=True)
    for c, g in enumerate(groups, start=1):
        sub = table[table.group == g]
        for col, color in (("Enh", "#2ca02c"), ("Sup", "#d62728"), ("Avg", "#7f7f7f")):
            fig.add_trace(go.Bar(x=list(sub[by]), y=list(sub[col]), name=col, marker_color=color, legendgroup=col,
                                 showlegend=c == 1, hovertemplate="%{x}: %{y:.3f}<extra>" + col + "</extra>"), row=1, col=c)
    fig.update_layout(title=title, barmode="group", template="plotly_white", yaxis_title=ylabel,
                      width=420 * len(groups) + 200, height=450)
    return fig


def synapse_bars(table: pd.DataFrame) -> go.Figure:
    """QL Fig. 6: ΔValue and ΔProb of self vs irrelevant synapses, per group (Enh, Sup, Avg)."""
    metrics = ["ΔValue", "ΔProb"]
    groups = [g for g in ("K_I", "K_II") if g in set(table.group)] or ["K_I"]
    titles = [f"{m} · {g}" for m in metrics for g in groups]
    fig = make_subplots(rows=len(metrics), cols=len(groups), subplot_titles=titles)
    for r, m in enumerate(metrics, start=1):
        for c, g in enumerate(groups, start=1):
            sub = table[(table.metric == m) & (table.group == g)]
            for col, color in (("Enh", "#2ca02c"), ("Sup", "#d62728"), ("Avg", "#7f7f7f")):
                fig.add_trace(go.Bar(x=list(sub["synapses"]), y=list(sub[col]), name=col, marker_color=color, legendgroup=col,
                                     showlegend=(r == 1 and c == 1)), row=r, col=c)
    fig.update_layout(title="Dynamic KN selection: manipulating knowledge synapses (QL Fig. 6)", barmode="group",
                      template="plotly_white", width=420 * len(groups) + 200, height=700)
    return fig


def predominance_violin(df: pd.DataFrame) -> go.Figure:
    """QL Fig. 5: distribution of the predominance score P per group."""
    fig = go.Figure()
    for g in ("K_I", "K_II"):
        sub = df[df.group == g] if len(df) else df
        if len(sub):
            fig.add_trace(go.Violin(y=sub.predominance, name=g, box_visible=True, points="all", line_color=GROUP_COLORS[g],
                                    text=sub.subject, hovertemplate="%{text}: P=%{y:.2f}<extra></extra>"))
    fig.update_layout(title="Predominance score P of the most-attended token (QL Fig. 5)", yaxis_title="P",
                      template="plotly_white", width=500, height=450, yaxis=dict(range=[0, 1.05]))
    return fig


def synapse_count_heatmap(
    counts: Int[Tensor, "layer key"] | Float[Tensor, "layer key"], tokens: Sequence[str], title: str = "Knowledge synapses"
) -> go.Figure:
    """Heatmap of synapse counts per (layer, token column) — e.g. a mask summed over heads.

    Args:
        counts: ``[n_layers, n_tokens]``.
        tokens: Token strings labelling the columns.
        title: Figure title.
    """
    z = counts.detach().float().cpu().numpy()
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)] if len(tokens) == z.shape[1] else [str(i) for i in range(z.shape[1])]
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=list(range(z.shape[0])), colorscale="Blues", colorbar=dict(title="heads"),
                               hovertemplate="layer %{y}<br>%{x}<br>%{z} heads<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="token", yaxis_title="layer", template="plotly_white",
                      width=max(500, 60 * z.shape[1] + 200), height=max(320, 18 * z.shape[0] + 160))
    return fig
