"""KN-consistency (QL §2.1, Table 1, Fig. 3): CS1/CS2 per fact, K_I/K_II splits, Welch's t-test.

Example:
    >>> from tlcap.data import load_pararel
    >>> from tlcap.experiments.ql import localize_facts
    >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
    >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
    >>> cons = consistency_analysis({"ig": locs})
    >>> cons.summary()["k2_ratio"], cons.summary()["n_facts"]
    (0.0, 2)
    >>> table, fig = cons.table1(), cons.figure()
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.data.pararel import MIN_CONSISTENCY_QUERIES as MIN_QUERIES
from tlcap.data.sample import DataWarning
from tlcap.experiments.ql.config import EXCLUDED, STATIC_THRESHOLD, QLConfig
from tlcap.experiments.ql.facts import FactKNs, intersection_of, union_of
from tlcap.metrics.stats import cs1, cs2, otsu_threshold, split_groups, welch_t_test
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import RowFields, frame, row_dict
from tlcap.viz.ql import cs2_violin, table1_frame


@dataclass(frozen=True)
class ConsistencyRow:
    """One (method, fact) row of :class:`ConsistencyResult`."""

    method: str
    relation: str
    subject: str
    object: str
    n_queries: int
    cs1: float
    cs2: float
    kn_sizes: tuple[int, ...]
    union: int
    intersection: int
    mean_prob: float
    group_static: str
    group_otsu: str


@dataclass(frozen=True)
class ConsistencyResult(RowFields, Result):
    """KN-consistency of every fact under one or more localization methods.

    Attributes:
        rows: One :class:`ConsistencyRow` per (method, fact).
        methods: Methods in order (the first one is the headline).
        static_threshold: The static CS2 threshold.
        otsu_thresholds: Otsu's threshold per method.
        split: Which threshold defines ``group`` (``"static"`` or ``"otsu"``).
    """

    _row_types: ClassVar[dict[str, type]] = {"rows": ConsistencyRow}

    rows: tuple[ConsistencyRow, ...] = ()
    methods: tuple[str, ...] = ("ig",)
    static_threshold: float = STATIC_THRESHOLD
    otsu_thresholds: dict = field(default_factory=dict)
    split: str = "static"

    def to_frame(self) -> pd.DataFrame:
        """One :class:`ConsistencyRow` per (method, fact).

        Returns:
            A DataFrame of :class:`ConsistencyRow`.
        """
        return frame(self.rows, ConsistencyRow)

    def threshold(self, method: str | None = None, split: str | None = None) -> float:
        """The CS2 threshold of ``split`` (default the result's) for ``method`` (default the first).

        Args:
            method: The attribution method (default the first of :attr:`methods`).
            split: ``"static"`` or ``"otsu"`` (default the result's).

        Returns:
            The static threshold, or ``method``'s Otsu threshold.
        """
        split = split or self.split
        m = method or self.methods[0]
        return self.static_threshold if split == "static" else float(self.otsu_thresholds[m])

    def groups(self, method: str | None = None, split: str | None = None) -> list[str]:
        """K_I / K_II per fact (in fact order) under ``method`` and ``split``; ``"excluded"`` for a fact
        with fewer than 3 queries (CS1 ≡ CS2), which every analysis skips.

        Args:
            method: The attribution method (default the first of :attr:`methods`).
            split: ``"static"`` or ``"otsu"`` (default the result's).

        Returns:
            ``"K_I"``, ``"K_II"`` or ``"excluded"`` per fact.
        """
        m = method or self.methods[0]
        col = f"group_{split or self.split}"
        return [getattr(r, col) for r in self.rows if r.method == m]

    def stats(self, method: str | None = None, split: str | None = None) -> dict[str, float]:
        """R/S of K_I and K_II, Welch's t and p (one cell block of Table 1).

        Facts with fewer than 3 queries (where CS1 ≡ CS2) are left out and counted in
        ``n_few_queries`` / ``mean_cs2_few_queries``.

        Args:
            method: The attribution method (default the first of :attr:`methods`).
            split: ``"static"`` or ``"otsu"`` (default the result's).

        Returns:
            ``threshold``, ``k1_ratio`` / ``k2_ratio``, ``mean_cs2_k1`` / ``mean_cs2_k2``, ``mean_cs1`` / ``mean_cs2``,
            ``welch_t`` / ``welch_p``, ``n_few_queries`` and ``mean_cs2_few_queries`` (NaN where a group is empty).
        """
        m = method or self.methods[0]
        df = self.to_frame()
        df = df[df.method == m]
        few = df[df.n_queries < MIN_QUERIES]
        df = df[df.n_queries >= MIN_QUERIES]
        g = df[f"group_{split or self.split}"]
        c1, c2 = df.cs2[g == "K_I"], df.cs2[g == "K_II"]
        t, p = welch_t_test(c1, c2)
        n = max(len(df), 1)
        return {
            "threshold": self.threshold(m, split),
            "k1_ratio": len(c1) / n, "k2_ratio": len(c2) / n,
            "mean_cs2_k1": float(c1.mean()) if len(c1) else math.nan,
            "mean_cs2_k2": float(c2.mean()) if len(c2) else math.nan,
            "mean_cs1": float(df.cs1.mean()) if len(df) else math.nan,
            "mean_cs2": float(df.cs2.mean()) if len(df) else math.nan,
            "welch_t": t, "welch_p": p,
            "n_few_queries": len(few), "mean_cs2_few_queries": float(few.cs2.mean()) if len(few) else math.nan,
        }

    def k2_all_methods(self, split: str | None = None) -> float:
        """Share of facts (with ≥ 3 queries) that are K_II under every method (Table 1's ∩:II).

        Args:
            split: ``"static"`` or ``"otsu"`` (default the result's).

        Returns:
            The share in ``[0, 1]``; NaN when no fact has 3 queries or there is no method.
        """
        per = [self.groups(m, split) for m in self.methods]
        m0 = self.methods[0] if self.methods else None
        ok = [r.n_queries >= MIN_QUERIES for r in self.rows if r.method == m0]
        idx = [i for i, o in enumerate(ok) if o]
        if not per or not idx:
            return math.nan
        return sum(all(p[i] == "K_II" for p in per) for i in idx) / len(idx)

    def table1(self) -> pd.DataFrame:
        """Table 1 layout: rows St/Ot, columns (method, R:I, S:I, R:II, S:II, t) and ∩:II.

        Returns:
            The DataFrame of :meth:`stats` for every method and both splits, with :meth:`k2_all_methods`.
        """
        stats = {(m, s): self.stats(m, s) for m in self.methods for s in ("static", "otsu")}
        return table1_frame(stats, {s: self.k2_all_methods(s) for s in ("static", "otsu")})

    def violin(self, method: str | None = None) -> go.Figure:
        """CS2 per relation (QL Fig. 3) with the static and Otsu thresholds drawn.

        Args:
            method: The attribution method (default the first of :attr:`methods`).

        Returns:
            The Plotly violin figure.
        """
        m = method or self.methods[0]
        df = self.to_frame()
        return cs2_violin(df[df.method == m], self.static_threshold, self.otsu_thresholds.get(m), m)

    def figure(self) -> go.Figure:
        """:meth:`violin` of the headline method.

        Returns:
            The Plotly violin figure.
        """
        return self.violin()

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` of ``tlcap ql consistency``.

        Returns:
            A JSON-safe dict: facts, methods and split, the headline method's :meth:`stats`, both thresholds,
            :meth:`k2_all_methods`, :meth:`stats` per method and split, and per fact its CS1 / CS2 and group.
        """
        m0 = self.methods[0]
        head = self.stats(m0)
        facts = []
        for r in self.rows:
            if r.method != m0:
                continue
            d = row_dict(r)
            facts.append({k: d[k] for k in ("relation", "subject", "object", "cs1", "cs2")} | {
                "group": d[f"group_{self.split}"], "n_queries": r.n_queries, "kn_sizes": d["kn_sizes"],
                "union": r.union, "intersection": r.intersection})
        per_method = {m: {s: self.stats(m, s) for s in ("static", "otsu")} for m in self.methods}
        return {
            "n_facts": len(facts), "method": m0, "methods": list(self.methods), "split": self.split,
            **head,
            "static_threshold": self.static_threshold, "otsu_threshold": self.otsu_thresholds.get(m0),
            "k2_all_methods": {s: self.k2_all_methods(s) for s in ("static", "otsu")},
            "per_method": per_method,
            "facts": facts,
        }


def consistency_analysis(
    locs: Mapping[str, Sequence[FactKNs]],
    *,
    config: QLConfig | None = None,
    **overrides: Any,
) -> ConsistencyResult:
    """CS1/CS2 for every fact and method, K_I/K_II splits and Welch's t-test (QL §2.1).

    Args:
        locs: ``{method: [FactKNs per fact]}`` (same facts, same order for every method).
        config: A :class:`QLConfig` (``static_threshold``, ``split``).
        **overrides: :class:`QLConfig` fields (``split="otsu"``, ``static_threshold=0.2``).

    Returns:
        A :class:`ConsistencyResult` with provenance.

    Raises:
        InvalidConfigError: an invalid threshold or split.

    Example:
        >>> from tlcap.data import load_pararel
        >>> from tlcap.experiments.ql import localize_facts
        >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
        >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
        >>> cons = consistency_analysis({"ig": locs}, split="otsu")
        >>> cons.summary()["k2_ratio"]
        0.5
    """
    cfg = QLConfig.resolve(config, **overrides)
    few = sorted({(fk.fact.relation, fk.fact.subject) for fl in locs.values() for fk in fl if fk.k < MIN_QUERIES})
    if few:
        warnings.warn(f"{len(few)} fact(s) have fewer than {MIN_QUERIES} queries (CS1 ≡ CS2 for them), e.g. "
                      f"{few[0][1]!r} of {few[0][0]}: they are reported separately (n_few_queries), left out of "
                      f"K_I/K_II, Welch and Otsu (group {EXCLUDED!r}) and skipped by every analysis", DataWarning,
                      stacklevel=2)
    rows: list[ConsistencyRow] = []
    otsu: dict[str, float] = {}
    for m, fl in locs.items():
        vals = []
        block = []
        for fk in fl:
            sets = fk.sets()
            c1, c2 = cs1(sets), cs2(sets)
            vals.append(c2)
            block.append(dict(
                method=m, relation=fk.fact.relation, subject=fk.fact.subject, object=fk.fact.object,
                n_queries=fk.k, cs1=c1, cs2=c2, kn_sizes=tuple(len(s) for s in sets),
                union=len(union_of(sets, fk.shape)), intersection=len(intersection_of(sets, fk.shape)),
                mean_prob=float(np.mean(fk.probs)) if fk.probs else math.nan,
            ))
        enough = [v for v, fk in zip(vals, fl) if fk.k >= MIN_QUERIES]
        th = otsu_threshold(enough) if enough else math.nan
        otsu[m] = th
        for r, gs, go_ in zip(block, split_groups(vals, cfg.static_threshold), split_groups(vals, th)):
            if r["n_queries"] < MIN_QUERIES:  # CS1 ≡ CS2: neither K_I nor K_II (docs/deviations.md)
                gs = go_ = EXCLUDED
            rows.append(ConsistencyRow(**r, group_static=gs, group_otsu=go_))
    first = next(iter(locs.values()), [])
    model_prov = first[0].provenance if first else None
    split_cfg = {"static_threshold": cfg.static_threshold, "split": cfg.split, "methods": list(locs)}
    prov = (Provenance.collect(None, split_cfg) if model_prov is None
            else dataclasses.replace(model_prov, config={**model_prov.config, **split_cfg}))
    return ConsistencyResult(tuple(rows), tuple(locs), cfg.static_threshold, otsu, cfg.split, provenance=prov)


def groups_for(
    locs: Sequence[FactKNs], *, config: QLConfig | None = None, **overrides: Any
) -> tuple[list[str], ConsistencyResult]:
    """K_I / K_II of each fact from its own KN sets (static threshold or Otsu).

    A fact with fewer than 3 queries (CS1 ≡ CS2) gets the label ``"excluded"``
    (:data:`~tlcap.experiments.ql.config.EXCLUDED`): the modification, mapping and synapse
    experiments skip it, as ``docs/deviations.md`` says.

    Args:
        locs: Per-fact localizations of one method.
        config: A :class:`QLConfig` (``static_threshold``, ``split``).
        **overrides: :class:`QLConfig` fields.

    Returns:
        ``(groups, consistency result)``: ``"K_I"``, ``"K_II"`` or ``"excluded"`` per fact.

    Example:
        >>> from tlcap.data import load_pararel
        >>> from tlcap.experiments.ql import localize_facts
        >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
        >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
        >>> groups, cons = groups_for(locs, static_threshold=0.1)
        >>> groups, groups.count("excluded")              # "excluded": facts with 2 queries
        (['K_I', 'K_I'], 0)
    """
    method = locs[0].method if locs else "ig"
    cons = consistency_analysis({method: locs}, config=config, **overrides)
    return cons.groups(method), cons


__all__ = ["ConsistencyResult", "ConsistencyRow", "consistency_analysis", "groups_for"]
