"""The QL paper's report rows and figures, from the outputs of :mod:`.ql_stages`.

Statistics (see ``docs/reproduce.md``): facts are the unit, and facts with fewer than 3 queries
(where CS1 ≡ CS2, ``docs/deviations.md``) are left out of every K_I/K_II analysis. Shares
(R:I, R:II, ∩:II) carry Wilson intervals; means (S:I, S:II, Rel/Gen/Loc/Avg/ΔPPL, ΔProb, ΔValue)
a bootstrap over facts (the edits or queries of one fact resampled together); Welch's t and Otsu's
threshold a bootstrap over facts (one Otsu threshold per method: the one that splits the facts).

Table 1's S:I − S:II splits CS2 at a threshold and compares the two sides of the split: true by
construction, so it is a *descriptive* row. The claim behind it — consistency is a property of
the fact, not noise — is tested **out of sample**: each fact's neighbor queries are split in two
seeded halves, K_I/K_II is read from the CS2 of half A and the CS2 of half B is compared between
the groups (Welch's t on facts, two-sided). Effects elsewhere: K_I vs K_II by Welch's t-test,
paired contrasts (N_g vs N_i of the same edit, self vs intersection of the same query) by a paired
t-test, both of the mean over every query or edit with the facts as clusters (the cluster-robust
standard error of :mod:`tlcap.metrics.effects`: the test is of the mean the row reports); contrasts
with an empty KN set (an empty intersection has ΔProb 0 by construction) are left out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.data.pararel import MIN_CONSISTENCY_QUERIES as MIN_QUERIES
from tlcap.experiments.ql import FactKNs, MappingResult, ModificationResult, SynapseResult, consistency_analysis
from tlcap.metrics import bootstrap_ci, share_ci, threshold_curve
from tlcap.metrics.effects import NO_EFFECT, paired_effect, share_effect, two_group_effect
from tlcap.metrics.estimate import Estimate, TooFewSamplesError
from tlcap.metrics.stats import cs2, otsu_threshold, welch_t_test
from tlcap.reproduce.registry import paper_claim
from tlcap.reproduce.report import RowBuilder
from tlcap.reproduce.scales import ScaleConfig
from tlcap.results import Result

Get = Callable[[str], "dict[str, Result] | None"]
LABEL = {"ig": "IG", "sig": "SIG", "amig": "AMIG"}
SPLITS = (("static", "static"), ("otsu", "Otsu"))
SET = {"local": "N_i", "global": "N_g", "cas": "CAS"}
METRICS = (("rel", "Rel"), ("gen", "Gen"), ("loc", "Loc"), ("avg", "Avg"), ("dppl", "ΔPPL"))
STATIC = 0.1
HALF_MIN = 2
"""Queries per half in the out-of-sample consistency test (CS2 needs two sets)."""


def _locs(get: Get, method: str) -> list[FactKNs] | None:
    out = get(f"ql.localize.{method}")
    if out is None:
        return None
    return [out[k] for k in sorted(out) if isinstance(out[k], FactKNs)]  # type: ignore[misc]


def _enough(locs: list[FactKNs]) -> set[int]:
    """Indices of the facts with at least :data:`MIN_QUERIES` queries (the K_I/K_II analyses' facts)."""
    return {i for i, fk in enumerate(locs) if fk.k >= MIN_QUERIES}


def _boot(x: np.ndarray, n_boot: int, seed: int, groups: list | None = None) -> Estimate | None:
    x = np.asarray(x, dtype=float)
    keep = np.isfinite(x)
    if not keep.any():
        return None
    g = None if groups is None else [gg for gg, k in zip(groups, keep) if k]
    return bootstrap_ci(x[keep], n_boot=n_boot, seed=seed, groups=g)


def _stat_boot(x: np.ndarray, fn: Callable[[np.ndarray], float], n_boot: int, seed: int) -> Estimate:
    rng = np.random.default_rng(seed)
    reps = [fn(x[rng.integers(0, len(x), len(x))]) for _ in range(min(n_boot, 2000))]
    r = np.asarray(reps, dtype=float)
    r = r[np.isfinite(r)]
    lo, hi = (float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))) if len(r) > 1 else (np.nan, np.nan)
    return Estimate(fn(x), lo, hi, n=len(x), method="percentile", n_boot=len(reps), seed=seed)


def _welch_t(x: np.ndarray, t: float) -> float:
    return welch_t_test(x[x > t], x[x <= t])[0]


def split_halves_cs2(fk: FactKNs, seed: int) -> tuple[float, float] | None:
    """CS2 of two seeded halves of a fact's queries (``None`` below 2 × :data:`HALF_MIN` queries).

    Args:
        fk: One fact's knowledge neurons per query.
        seed: Seed of the random split of the queries.

    Returns:
        ``(CS2 of half A, CS2 of half B)``, or ``None`` for a fact with too few queries.
    """
    if fk.k < 2 * HALF_MIN:
        return None
    order = np.random.default_rng(seed).permutation(fk.k)
    sets = fk.sets()
    h = fk.k // 2
    return cs2([sets[i] for i in order[:h]]), cs2([sets[i] for i in order[h:]])


def out_of_sample(rb: RowBuilder, locs: list[FactKNs], seed: int, diff: list[str]) -> None:
    """K_I/K_II from half A's CS2, CS2 compared on half B (module doc).

    Args:
        rb: The report's row builder; rows and figures are added to it.
        locs: The IG knowledge neurons of each fact.
        seed: Seed of the first fact's split (fact ``i`` uses ``seed + i``).
        diff: How our setting differs from the paper's (the rows' ``differences``).
    """
    claim = paper_claim("ql.table1.k1-vs-k2")
    halves = [split_halves_cs2(fk, seed + i) for i, fk in enumerate(locs)]
    pairs = np.array([h for h in halves if h is not None], dtype=float).reshape(-1, 2)
    row = "IG · out of sample: CS2 on half B of K_I − of K_II, groups from half A ({} facts, {} split)"
    if len(pairs) < 4:
        for _, tl in SPLITS:
            rb.missing("QL Table 1", row.format(len(pairs), tl),
                       f"needs facts with ≥ {2 * HALF_MIN} queries (have {len(pairs)}): raise ql_max_queries", claim=claim)
        return
    a, b = pairs[:, 0], pairs[:, 1]
    for split, tl in SPLITS:
        t = STATIC if split == "static" else otsu_threshold(a)
        try:
            eff = two_group_effect(b[a > t], b[a <= t])
        except TooFewSamplesError:
            eff = NO_EFFECT
        rb.effect("QL Table 1", row.format(len(pairs), f"{tl} t={t:.3g}"), claim, eff.estimate, eff.p_value, eff.test,
                  p_floor=eff.p_floor, differences=diff, n_unit="facts",
                  missing="one of K_I / K_II (from half A) is empty at this threshold",
                  control=f"{int((a > t).sum())} K_I / {int((a <= t).sum())} K_II by half A")


def table1(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """QL Table 1 (with Table 4's thresholds), Fig. 3 and Figs. 8–9, the threshold curves.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        scale: The scale's sizes (``ql_thresholds``).
        n_boot: Bootstrap resamples of the CIs.
        seed: Seed of the bootstraps and of the query splits.
    """
    item, diff = "QL Table 1", rb.model_difference("ql")
    locs = {m: _locs(get, m) for m in LABEL}
    share_curves, sep_curves = go.Figure(), go.Figure()
    for m, lab in LABEL.items():
        ls = locs[m]
        if not ls:
            for _, tl in SPLITS:
                for q in ("R:I", "S:I", "R:II", "S:II"):
                    rb.missing(item, f"{lab} · {tl} · {q}", why(f"ql.localize.{m}"),
                               rb.paper_value("ql", "Table 1", q, threshold=tl, method=lab))
            continue
        cons = consistency_analysis({m: ls}, static_threshold=STATIC)
        keep = _enough(ls)
        x = np.array([r.cs2 for r in cons.rows], dtype=float)[sorted(keep)]
        few = len(ls) - len(keep)
        for split, tl in SPLITS:
            t = cons.threshold(m, split)
            k1, k2 = x[x > t], x[x <= t]
            tag = f"{lab} · {tl} (t={t:.3g}, {len(x)} facts" + (f"; {few} with < {MIN_QUERIES} queries left out)" if few
                                                                 else ")")
            pv = lambda q, tl=tl, lab=lab: rb.paper_value("ql", "Table 1", q, threshold=tl, method=lab)  # noqa: E731
            rb.value(item, f"{tag} · R:I", share_ci(x > t), pv("R:I"), differences=diff, n_unit="facts")
            rb.value(item, f"{tag} · R:II", share_ci(x <= t), pv("R:II"), differences=diff, n_unit="facts")
            rb.value(item, f"{tag} · S:I", _boot(k1, n_boot, seed), pv("S:I"), differences=diff,
                     missing="no K_I facts at this threshold", n_unit="facts")
            rb.value(item, f"{tag} · S:II", _boot(k2, n_boot, seed), pv("S:II"), differences=diff,
                     missing="no K_II facts at this threshold", n_unit="facts")
            if m != "amig":
                rb.value(item, f"{tag} · Welch t", _stat_boot(x, lambda v, t=t: _welch_t(v, t), n_boot, seed), pv("t"),
                         differences=[*diff, "n: t grows with √n"], n_unit="facts")
            if split == "static":
                sv = rb.paper_value("ql", "Table 4", "threshold", threshold="static", method=lab)
                rb.descriptive("QL Table 4", f"{lab} · static threshold", Estimate(t, np.nan, np.nan, n=len(x)),
                               "a setting: the paper's static threshold, used as printed",
                               paper_text=sv.text() if sv else "", source=sv.source if sv else "", n_unit="facts",
                               key=sv.key if sv else "")
            if split == "otsu":
                th = _stat_boot(x, otsu_threshold, n_boot, seed)
                th = Estimate(t, th.low, th.high, n=th.n, method=th.method, n_boot=th.n_boot, seed=th.seed)
                rb.value("QL Table 4", f"{lab} · Otsu threshold ({len(x)} facts)", th,
                         rb.paper_value("ql", "Table 4", "threshold", threshold="Otsu", method=lab), differences=diff,
                         n_unit="facts")
            s1, s2 = pv("S:I"), pv("S:II")
            d = Estimate(float(k1.mean() - k2.mean()), np.nan, np.nan, n=len(x)) if len(k1) and len(k2) else None
            rb.descriptive(item, f"{tag} · S:I − S:II (in sample)", d,
                           "true by construction: K_I and K_II are the facts above / below the threshold of this same "
                           "CS2; the out-of-sample row below tests the claim",
                           paper_text=f"{s1.printed} − {s2.printed} ({s1.model})" if s1 and s2 else "",
                           source=s1.source if s1 else "", n_unit="facts", missing="one of K_I / K_II is empty")
        th_grid = list(scale.ql_thresholds)
        c1 = threshold_curve(x, th_grid, "share_at_or_below", n_boot=min(n_boot, 2000), seed=seed)
        c2 = threshold_curve(x, th_grid, "separation", n_boot=min(n_boot, 2000), seed=seed)
        for fig, c in ((share_curves, c1), (sep_curves, c2)):
            fig.add_trace(go.Scatter(x=list(c.x), y=list(c.value), mode="lines+markers", name=lab,
                                     error_y=dict(type="data", symmetric=False, array=[h - v for h, v in zip(c.high, c.value)],
                                                  arrayminus=[v - lo for v, lo in zip(c.value, c.low)])))
        fig_no = {"ig": "Fig. 3", "sig": "Fig. 8", "amig": "Fig. 9"}[m]
        rb.figure(f"QL {fig_no}", f"ql_{fig_no.lower().replace('. ', '')}_cs2_violin_{m}", cons.violin(m))
        if m == "ig":
            out_of_sample(rb, ls, seed, diff)
            eff = share_effect(x <= 0.3, 0.5)
            rb.effect("QL Fig. 3", f"IG · share of facts with CS2 ≤ 0.3 − 0.5 ({len(x)} facts)",
                      paper_claim("ql.fig3.majority-below"), eff.estimate, eff.p_value, eff.test, p_floor=eff.p_floor,
                      differences=diff, n_unit="facts")
    for fig, name, ylab in ((share_curves, "k2_share", "K_II share (CS2 ≤ t)"),
                            (sep_curves, "cs2_separation", "mean CS2 of K_I − of K_II")):
        if fig.data:
            fig.update_layout(title=f"QL threshold sensitivity: {ylab} (95 % CI)", xaxis_title="CS2 threshold t",
                              yaxis_title=ylab, template="plotly_white", width=800, height=480)
            rb.figure(item, f"ql_threshold_{name}", fig)
    have = [m for m in LABEL if locs[m]]
    if len(have) == len(LABEL):
        k = min(len(locs[m]) for m in have)  # type: ignore[arg-type]
        cons = consistency_analysis({m: locs[m][:k] for m in have}, static_threshold=STATIC)  # type: ignore[index]
        idx = sorted(set.intersection(*(_enough(locs[m][:k]) for m in have)))  # type: ignore[index]
        for split, tl in SPLITS:
            per = [cons.groups(m, split) for m in have]
            events = [all(p[i] == "K_II" for p in per) for i in idx]
            rb.value(item, f"∩:II · {tl} ({len(idx)} facts with all three methods)", share_ci(events) if idx else None,
                     rb.paper_value("ql", "Table 1", "∩:II", threshold=tl, method="all"), differences=diff, n_unit="facts",
                     missing=f"no fact with ≥ {MIN_QUERIES} queries under all three methods")
    else:
        for _, tl in SPLITS:
            rb.missing(item, f"∩:II · {tl}", "needs the IG, SIG and AMIG localizations",
                       rb.paper_value("ql", "Table 1", "∩:II", threshold=tl, method="all"))


def _frame(res: Result | None, get: Get | None = None) -> pd.DataFrame | None:
    """The result's rows, without facts that have fewer than :data:`MIN_QUERIES` queries (left out of K_I/K_II)."""
    if not isinstance(res, (ModificationResult, MappingResult, SynapseResult)):
        return None
    df = res.to_frame()
    locs = _locs(get, "ig") if get is not None else None
    if locs and len(df) and "fact" in df:
        df = df[df.fact.isin(_enough(locs))]
    if "group" in df:
        df = df[df.group.isin(("K_I", "K_II"))]
    return df if len(df) else None


def _two(a: pd.DataFrame, b: pd.DataFrame, col: str, n_boot: int, seed: int):  # noqa: ANN202
    a, b = a.dropna(subset=[col]), b.dropna(subset=[col])
    try:
        return two_group_effect(a[col].to_numpy(), b[col].to_numpy(), groups_a=list(a.fact), groups_b=list(b.fact),
                                n_boot=n_boot, seed=seed)
    except TooFewSamplesError:
        return NO_EFFECT


def modification(rb: RowBuilder, get: Get, why: Callable[[str], str], *, n_boot: int, seed: int, table3: bool) -> None:
    """QL Table 2 (N_i, N_g) or Table 3 (the CAS rows), with their claims.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        n_boot: Bootstrap resamples of the CIs.
        seed: Seed of the bootstraps.
        table3: Build Table 3 (``ql.table3``, the CAS rows) instead of Table 2 (``ql.table2``).
    """
    item = "QL Table 3" if table3 else "QL Table 2"
    stage = "ql.table3" if table3 else "ql.table2"
    out = get(stage)
    df = _frame(out.get("modification") if out else None, get)
    diff = rb.model_difference("ql")
    sets = ("cas",) if table3 else ("local", "global")
    claims = (("ql.table3.cas-avg", "avg", "cas", "local"), ("ql.table3.cas-ppl", "dppl", "cas", "global")) if table3 else \
        (("ql.table2.global-gen", "gen", "global", "local"), ("ql.table2.global-ppl", "dppl", "global", "local"))
    if df is None:
        for op in ("erasure", "update"):
            for key, *_ in claims:
                rb.missing(item, f"{op} · {key.split('.')[-1]}", why(stage), claim=paper_claim(key))
        return
    for op in ("erasure", "update"):
        for s in sets:
            for grp in ("K_I", "K_II"):
                sub = df[(df.operation == op) & (df.set == s) & (df.group == grp)]
                for col, q in METRICS:
                    pv = rb.paper_value("ql", item.split(" ", 1)[1], q, operation=op, set=SET[s], group=grp)
                    est = _boot(sub[col].to_numpy(), n_boot, seed, list(sub.fact)) if len(sub) else None
                    rb.value(item, f"{op} · {SET[s]} · {grp} · {q}", est, pv, differences=diff, n_unit="edits",
                             missing=f"no {grp} edits ({op}, {SET[s]})")
        if not table3:
            a = df[(df.operation == op) & (df.set == "local")]
            p1 = rb.paper_value("ql", "Table 2", "Gen", operation=op, set="N_i", group="K_I")
            p2 = rb.paper_value("ql", "Table 2", "Gen", operation=op, set="N_i", group="K_II")
            eff = _two(a[a.group == "K_I"], a[a.group == "K_II"], "gen", n_boot, seed)
            rb.effect(item, f"{op} · Gen of N_i: K_I − K_II", paper_claim("ql.table2.gen-k1-vs-k2"), eff.estimate,
                      eff.p_value, eff.test, p_floor=eff.p_floor, paper=p1.value - p2.value if p1 and p2 else None,
                      differences=diff, missing="K_I or K_II has no edits", n_unit="edits")
        for key, col, s_a, s_b in claims:
            both = df[(df.operation == op) & (df.group == "K_II") & df.set.isin([s_a, s_b])]
            wide = both.pivot_table(index=["fact", "query"], columns="set", values=col, aggfunc="first").dropna()
            q = dict(METRICS)[col]
            tab = "Table 3" if table3 else "Table 2"
            pa = rb.paper_value("ql", tab, q, operation=op, set=SET[s_a], group="K_II")
            pb = rb.paper_value("ql", tab, q, operation=op, set=SET[s_b], group="K_II")
            eff = paired_effect(wide[s_a].to_numpy(), wide[s_b].to_numpy(), groups=[f for f, _ in wide.index],
                                n_boot=n_boot, seed=seed) if s_a in wide and s_b in wide and len(wide) > 1 else NO_EFFECT
            rb.effect(item, f"{op} · K_II · {q}: {SET[s_a]} − {SET[s_b]}", paper_claim(key), eff.estimate, eff.p_value,
                      eff.test, p_floor=eff.p_floor, paper=pa.value - pb.value if pa and pb else None, differences=diff,
                      missing=f"needs ≥ 2 K_II edits with both {SET[s_a]} and {SET[s_b]}", n_unit="edits")
    res = out.get("cas" if table3 else "modification") if out else None
    if isinstance(res, ModificationResult):
        rb.figure(item, "ql_table3_cas" if table3 else "ql_table2_modification",
                  res.figure("Consistency-Aware KN modification (QL Table 3)" if table3
                             else "Knowledge modification (QL Table 2)"))


def _avg_ops(df: pd.DataFrame, key: str, value: str) -> pd.DataFrame:
    """Mean over enhance / suppress per (fact, query, key) — the paper's "Avg"."""
    return df.groupby(["fact", "query", "group", key])[value].mean().unstack(key)


def fig4(rb: RowBuilder, get: Get, why: Callable[[str], str], *, n_boot: int, seed: int) -> None:
    """QL Fig. 4 (query-KN mapping): ΔProb of a query's own vs neighbor KNs, with its two claims.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        n_boot: Bootstrap resamples of the CIs.
        seed: Seed of the bootstraps.
    """
    item, diff = "QL Fig. 4", rb.model_difference("ql")
    out = get("ql.fig4")
    df = _frame(out.get("mapping") if out else None, get)
    c1, c2 = paper_claim("ql.fig4.self-vs-intersection"), paper_claim("ql.fig4.k2-drops-more")
    if df is None:
        rb.missing(item, "K_II · ΔProb Avg: self − intersection", why("ql.fig4"), claim=c1)
        rb.missing(item, "(self − intersection): K_II − K_I", why("ql.fig4"), claim=c2)
        return
    df = df[np.isfinite(df.dprob)]
    w = _avg_ops(df, "set", "dprob").dropna(subset=["self", "intersection"])
    if "n_neurons" in df:  # an empty intersection changes nothing by construction: no contrast on it
        empty = df[(df.set == "intersection") & (df.n_neurons == 0)].set_index(["fact", "query"]).index.unique()
        w = w[~w.index.droplevel("group").isin(empty)]
        n_empty = len(empty)
    else:
        n_empty = 0
    note = f" ({n_empty} queries with an empty intersection left out)" if n_empty else ""
    for grp in ("K_I", "K_II"):
        sub = w.xs(grp, level="group") if grp in w.index.get_level_values("group") else None
        for s in ("self", "union", "intersection", "refine"):
            est = _boot(sub[s].to_numpy(), n_boot, seed, [f for f, _ in sub.index]) if sub is not None and s in sub else None
            rb.descriptive(item, f"{grp} · ΔProb Avg · {s}{note}", est, "the paper prints this as a figure, no number",
                           n_unit="queries", missing=f"no {grp} queries with a non-empty intersection")
    k2 = w.xs("K_II", level="group") if "K_II" in w.index.get_level_values("group") else None
    eff = paired_effect(k2["self"].to_numpy(), k2["intersection"].to_numpy(), groups=[f for f, _ in k2.index],
                        n_boot=n_boot, seed=seed) if k2 is not None and len(k2) > 1 else NO_EFFECT
    rb.effect(item, f"K_II · ΔProb Avg: self − intersection{note}", c1, eff.estimate, eff.p_value, eff.test,
              p_floor=eff.p_floor, differences=diff, missing="fewer than 2 K_II queries with a non-empty intersection",
              n_unit="queries")
    d = (w["self"] - w["intersection"]).rename("diff").reset_index()
    a, b = d[d.group == "K_II"], d[d.group == "K_I"]
    eff = _two(a, b, "diff", n_boot, seed)
    rb.effect(item, f"(self − intersection): K_II − K_I{note}", c2, eff.estimate, eff.p_value, eff.test, p_floor=eff.p_floor,
              differences=diff, missing="K_I or K_II has no query with a non-empty intersection", n_unit="queries")
    if isinstance(out.get("mapping"), MappingResult):  # type: ignore[union-attr]
        rb.figure(item, "ql_fig4_query_kn_mapping", out["mapping"].figure())  # type: ignore[index]


def figs567(rb: RowBuilder, get: Get, why: Callable[[str], str], *, n_boot: int, seed: int) -> None:
    """QL Figs. 5–7: predominance, knowledge synapses and KN activations after suppressing them, with their claims.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        n_boot: Bootstrap resamples of the CIs.
        seed: Seed of the bootstraps.
    """
    diff = rb.model_difference("ql")
    out = get("ql.fig5-7")
    res = out.get("synapses") if out else None
    df = _frame(res, get)
    claims = (paper_claim("ql.fig6.self-vs-irrelevant"), paper_claim("ql.fig6.k2-relies-more"),
              paper_claim("ql.fig7.suppress-lowers"))
    if df is None or not isinstance(res, SynapseResult):
        for c in claims:
            rb.missing(f"QL {c.item}", c.effect, why("ql.fig5-7"), claim=c)
        rb.missing("QL Fig. 5", "mean predominance P", why("ql.fig5-7"))
        return
    pdf = res.predominance_frame()
    locs = _locs(get, "ig")
    if locs and "fact" in pdf:
        pdf = pdf[pdf.fact.isin(_enough(locs))]
    for grp in ("K_I", "K_II"):
        sub = pdf[pdf.group == grp]
        rb.descriptive("QL Fig. 5", f"{grp} · mean predominance P ({len(sub)} facts)",
                       _boot(sub.predominance.to_numpy(), n_boot, seed) if len(sub) else None,
                       "the paper shows P as a distribution (Fig. 5), no number or claim", n_unit="facts",
                       missing=f"no {grp} facts")
    rb.figure("QL Fig. 5", "ql_fig5_predominance", res.predominance_figure())
    d = df[np.isfinite(df.dprob)]
    w = _avg_ops(d, "synapses", "dprob").dropna()
    eff = paired_effect(w["self"].to_numpy(), w["irrelevant"].to_numpy(), groups=[i[0] for i in w.index], n_boot=n_boot,
                        seed=seed) if len(w) > 1 else NO_EFFECT
    rb.effect("QL Fig. 6", "ΔProb Avg: own synapses − irrelevant synapses", claims[0], eff.estimate, eff.p_value, eff.test,
              p_floor=eff.p_floor, differences=diff, missing="fewer than 2 queries", n_unit="queries")
    s = w["self"].reset_index()
    eff = _two(s[s.group == "K_II"], s[s.group == "K_I"], "self", n_boot, seed)
    rb.effect("QL Fig. 6", "ΔProb Avg of own synapses: K_II − K_I", claims[1], eff.estimate, eff.p_value, eff.test,
              p_floor=eff.p_floor, differences=diff, missing="K_I or K_II is empty", n_unit="queries")
    sup = df[(df.synapses == "self") & (df.op == "sup")].dropna(subset=["value_after", "value_before"])
    eff = paired_effect(sup.value_after.to_numpy(), sup.value_before.to_numpy(), groups=list(sup.fact), n_boot=n_boot,
                        seed=seed) if len(sup) > 1 else NO_EFFECT
    rb.effect("QL Fig. 7", "mean |KN activation| after − before suppressing own synapses (activation units)", claims[2],
              eff.estimate, eff.p_value, eff.test, p_floor=eff.p_floor, differences=diff,
              missing="fewer than 2 queries", n_unit="queries")
    rb.figure("QL Fig. 6", "ql_fig6_synapses", res.figure())
    if res.heatmap_values is not None:
        rb.figure("QL Fig. 7", "ql_fig7_kn_activations", res.heatmap())
        rb.figure("QL Fig. 1", "ql_fig1_kn_activations", res.heatmap(),
                  "KN activations of one fact's queries: the 'none' rows are QL Fig. 1 (each query activates its own KNs)")
        rb.figure("QL Fig. 10", "ql_fig10_kn_activations", res.heatmap(),
                  "KN activations: no manipulation / suppressed / enhanced knowledge synapses (QL Fig. 10)")


def ql_report(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """Every QL row and figure (see the module docstring).

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        scale: The scale's sizes.
        n_boot: Bootstrap resamples of the CIs.
        seed: Seed of the bootstraps and of the query splits.
    """
    table1(rb, get, why, scale, n_boot=n_boot, seed=seed)
    modification(rb, get, why, n_boot=n_boot, seed=seed, table3=False)
    modification(rb, get, why, n_boot=n_boot, seed=seed, table3=True)
    fig4(rb, get, why, n_boot=n_boot, seed=seed)
    figs567(rb, get, why, n_boot=n_boot, seed=seed)


__all__ = ["ql_report", "table1", "modification", "fig4", "figs567", "out_of_sample", "split_halves_cs2"]
