"""Query-KN mapping (QL §3.1, Fig. 4): enhance / suppress a query's own KNs vs its neighbors' KNs.

For query q_i: ``N_i`` ("self") against the neighbor sets of eq. 3 (union, intersection, refine of
N_j, j ≠ i); enhance multiplies their activations at the last position by ``factor``, suppress
sets them to 0; ``ΔProb = ±(P_a − P_b)/P_b`` ("+" for enhance, "−" for suppress).

Example:
    >>> from tlcap.data import load_pararel
    >>> from tlcap.experiments.ql import localize_facts
    >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
    >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
    >>> from tlcap.experiments.ql import groups_for
    >>> groups, _ = groups_for(locs, split="otsu")
    >>> qkm = query_kn_mapping(model, locs, groups, progress=False)
    >>> len(qkm.rows)
    48
    >>> table, fig = qkm.table(), qkm.figure()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go
import torch
from tqdm.auto import tqdm

from tlcap.experiments.ql.config import EXCLUDED, MappingConfig
from tlcap.experiments.ql.facts import FactKNs
from tlcap.metrics.set_probs import scaled_next_token_probs_many, scaled_target_probs
from tlcap.metrics.stats import relative_change
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import RowFields, frame, row_dict
from tlcap.runtime import device as runtime_device
from tlcap.viz.ql import enh_sup_bars, enh_sup_table

SET_ORDER = ["self", "union", "intersection", "refine"]


@dataclass(frozen=True)
class MappingRow:
    """One (fact, query, KN set, operation) row of :class:`MappingResult`.

    ``empty_set`` is true when the set has no neuron (``n_neurons == 0``; with 3 or more queries the
    neighbor intersection often is): nothing is enhanced or suppressed, ``p_after = p_before``
    and ``dprob = 0`` by construction, so a contrast with such a row says nothing.
    """

    fact: int
    relation: str
    subject: str
    group: str
    query: int
    set: str
    op: str
    n_neurons: int
    p_before: float
    p_after: float
    dprob: float
    empty_set: bool = False


@dataclass(frozen=True)
class MappingResult(RowFields, Result):
    """ΔProb of enhancing / suppressing N_i vs the neighbor sets (QL §3.1).

    Attributes:
        rows: One :class:`MappingRow` per (fact, query, set, operation).
        factor: Enhancement factor.
        groups: K_I / K_II of each fact.
        method: Localization method of the KNs.
    """

    _row_types: ClassVar[dict[str, type]] = {"rows": MappingRow}

    rows: tuple[MappingRow, ...] = ()
    factor: float = 2.0
    groups: tuple[str, ...] = ()
    method: str = "ig"

    def to_frame(self) -> pd.DataFrame:
        """One :class:`MappingRow` per (fact, query, set, operation).

        Returns:
            A DataFrame of :class:`MappingRow`.
        """
        return frame(self.rows, MappingRow)

    def table(self) -> pd.DataFrame:
        """Mean ΔProb by (group, set) with Enh, Sup and Avg columns (Fig. 4 numbers).

        Returns:
            A DataFrame, one row per (group, set).
        """
        return enh_sup_table(self.to_frame(), "set", "dprob", order=SET_ORDER)

    def figure(self) -> go.Figure:
        """QL Fig. 4: Enh / Sup / Avg ΔProb of N_i vs neighbor KNs, per group.

        Returns:
            The Plotly bar chart of :meth:`table`.
        """
        return enh_sup_bars(self.table(), "set", "ΔProb", "Query-KN mapping: ΔProb of N_i vs neighbor KNs (QL Fig. 4)")

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` of ``tlcap ql mapping``.

        Returns:
            A JSON-safe dict: method, facts, groups, factor, :meth:`table` and every row.
        """
        return {"method": self.method, "n_facts": len(self.groups), "groups": list(self.groups), "factor": self.factor,
                "table": self.table().to_dict("records"), "rows": [row_dict(r) for r in self.rows]}


@torch.no_grad()
def query_kn_mapping(
    model: Model,
    locs: Sequence[FactKNs],
    groups: Sequence[str],
    *,
    config: MappingConfig | None = None,
    progress: bool = True,
    **overrides: Any,
) -> MappingResult:
    """Enhance (×factor) / suppress (×0) N_i or its neighbor sets; ΔProb = ±(P_a − P_b)/P_b.

    Args:
        model: The model.
        locs: Per-fact localizations.
        groups: ``"K_I"``/``"K_II"`` per fact; facts labelled ``"excluded"`` (fewer than 3 queries,
            :func:`groups_for`) are skipped.
        config: A :class:`MappingConfig`.
        progress: Show a progress bar.
        **overrides: :class:`MappingConfig` fields (``factor=3``).

    Returns:
        A :class:`MappingResult` with provenance; rows of an empty set carry ``empty_set=True``.

    Example:
        >>> from tlcap.data import load_pararel
        >>> from tlcap.experiments.ql import localize_facts
        >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
        >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
        >>> from tlcap.experiments.ql import groups_for
        >>> groups, _ = groups_for(locs, split="otsu")
        >>> query_kn_mapping(model, locs, groups, progress=False).table().round(4)
          group           set     Enh     Sup     Avg
        0   K_I          self  0.4466  0.3738  0.4102
        1   K_I         union  0.4217  0.3529  0.3873
        2   K_I  intersection  0.2796  0.2579  0.2687
        3   K_I        refine  0.2796  0.2579  0.2687
        4  K_II          self  0.3384  0.3085  0.3235
        5  K_II         union  0.2301  0.2266  0.2284
        6  K_II  intersection  0.1250  0.1360  0.1305
        7  K_II        refine  0.1250  0.1360  0.1305
    """
    cfg = MappingConfig.resolve(config, **overrides)
    rows: list[MappingRow] = []
    bar = tqdm(total=sum(fk.k for fk in locs), desc="query-KN mapping", disable=not progress)
    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        if grp == EXCLUDED:  # fewer than 3 queries (CS1 ≡ CS2): neither K_I nor K_II
            bar.update(fk.k)
            continue
        sets_i = fk.sets()
        tids = [model.target_ids(q, fk.target)[0] for q in fk.queries]
        cands = [{"self": sets_i[i], **fk.neighbor_sets(i)} for i in range(len(fk.queries))]
        fulls = [[sname for sname, ns in cand.items() if len(ns)] for cand in cands]
        if runtime_device.one_pass_default(model):  # on an accelerator: every query of the fact as rows of one pass
            runs = scaled_next_token_probs_many(model, fk.queries, tids, [[c[sn] for sn in f] for c, f in zip(cands, fulls)],
                                                (cfg.factor, 0.0))
        else:  # per query one pass: the clean row and every edit (a cached prefix)
            runs = [scaled_target_probs(model, q, [tid], [c[sn] for sn in f], (cfg.factor, 0.0))
                    for q, tid, c, f in zip(fk.queries, tids, cands, fulls)]
        for i in range(len(fk.queries)):
            cand, full, (p_b, probs) = cands[i], fulls[i], runs[i]
            p_run = {(sn, op): float(probs[r, c]) for r, op in enumerate(("enh", "sup")) for c, sn in enumerate(full)}
            for sname, ns in cand.items():
                for op, sign in (("enh", 1.0), ("sup", -1.0)):
                    p_a = p_run.get((sname, op), p_b)  # an empty set: nothing to intervene on, the clean probability
                    rows.append(MappingRow(
                        fact=fi, relation=fk.fact.relation, subject=fk.fact.subject, group=grp, query=i, set=sname,
                        op=op, n_neurons=len(ns), p_before=p_b, p_after=p_a, dprob=relative_change(p_a, p_b, sign),
                        empty_set=len(ns) == 0))
            bar.update(1)
    bar.close()
    method = locs[0].method if locs else "ig"
    prov = Provenance.collect(model, config={**cfg.to_dict(), "method": method})
    return MappingResult(tuple(rows), cfg.factor, tuple(groups), method, provenance=prov)


__all__ = ["MappingResult", "MappingRow", "query_kn_mapping"]
