"""The result of the QL modification experiments (Table 2, Table 3): one typed row per edit and per skip.

:func:`~tlcap.experiments.ql.modification.modification_experiment` and
:func:`~tlcap.experiments.ql.modification.cas_experiment` return a :class:`ModificationResult`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go

from tlcap.results import Result
from tlcap.rows import RowFields, frame, row_dict
from tlcap.viz.ql import modification_bars, modification_table


@dataclass(frozen=True)
class EditRow:
    """One edit of :class:`ModificationResult`: (fact, edited query, operation, KN set) and its metrics.

    ``p_*``: the edited query's P(o) and P(o') (``p_new_*``); ``gap_new_*``: its top logit minus the logit
    of o' before / after the edit (0 when o' is the argmax; NaN without an o')."""

    fact: int
    relation: str
    subject: str
    object: str
    new_object: str | None
    group: str
    query: int
    operation: str
    set: str
    n_neurons: int
    rel: float
    gen: float
    loc: float
    avg: float
    ppl_before: float
    ppl_after: float
    dppl: float
    p_before: float
    p_after: float
    p_new_before: float
    p_new_after: float
    rule: str
    gap_new_before: float = math.nan
    gap_new_after: float = math.nan


@dataclass(frozen=True)
class SkipRow:
    """One (fact, query, operation) that was not edited, and why."""

    fact: int
    relation: str
    subject: str
    query: int
    operation: str
    reason: str


@dataclass(frozen=True)
class ModificationResult(RowFields, Result):
    """Rows per (fact, edited query, operation, KN set) with Rel/Gen/Loc/Avg/ΔPPL.

    Attributes:
        rows: One :class:`EditRow` per edit.
        lambda1: λ1 of the update.
        lambda2: λ2 of the update.
        ppl_before: Perplexity of the unedited model on the ΔPPL texts.
        groups: K_I / K_II of each fact.
        method: Localization method of the KNs.
        title: What the table reproduces (QL Table 2 or 3).
        update_rule: The Update rule (``"activation"`` or ``"paper"``).
        skipped: One :class:`SkipRow` per (fact, query, operation) left out.
        update_size: The activation rule's write size (units of the KNs' own output).
    """

    _row_types: ClassVar[dict[str, type]] = {"rows": EditRow, "skipped": SkipRow}

    rows: tuple[EditRow, ...] = ()
    lambda1: float = 2.0
    lambda2: float = 2.0
    ppl_before: float = math.nan
    groups: tuple[str, ...] = ()
    method: str = "ig"
    title: str = "Knowledge modification (QL Table 2)"
    update_rule: str = "activation"
    skipped: tuple[SkipRow, ...] = ()
    update_size: float = 1.0

    def skipped_frame(self) -> pd.DataFrame:
        """One :class:`SkipRow` per (fact, query, operation) left out, with the reason.

        Returns:
            A DataFrame of :class:`SkipRow`.
        """
        return frame(self.skipped, SkipRow)

    def to_frame(self) -> pd.DataFrame:
        """One :class:`EditRow` per edit.

        Returns:
            A DataFrame of :class:`EditRow`.
        """
        return frame(self.rows, EditRow)

    def table(self) -> pd.DataFrame:
        """Table 2/3 layout: mean Rel, Gen, Loc, Avg, ΔPPL by (operation, set, group); ``rule`` names the Update rule.

        Returns:
            A DataFrame, one row per (operation, set, group).
        """
        t = modification_table(self.to_frame())
        t.insert(1, "rule", ["erasure" if op == "erasure" else self.update_rule for op in t.operation])
        return t

    def figure(self, title: str | None = None) -> go.Figure:
        """Bars of Rel/Gen/Loc/Avg per (set, group), one panel per operation.

        Args:
            title: The figure title (default :attr:`title`).

        Returns:
            The Plotly bar chart.
        """
        return modification_bars(self.to_frame(), title or self.title)

    def own_prob_drop(self) -> float | None:
        """Mean drop of the edited query's own P(o) under local erasure (``None`` without such edits).

        Returns:
            Mean ``p_before − p_after`` of the local erasure edits, or ``None``.
        """
        df = self.to_frame()
        sub = df[(df.operation == "erasure") & (df.set == "local")]
        return float((sub.p_before - sub.p_after).mean()) if len(sub) else None

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` of ``tlcap ql modify`` / ``tlcap ql cas``.

        Returns:
            A JSON-safe dict: title, method, facts, groups and update settings, edit and skip counts with the
            skip reasons, perplexity before, ``lambda1`` / ``lambda2``, :meth:`table`, every edit and :meth:`own_prob_drop`.
        """
        reasons: dict[str, int] = {}
        for r in self.skipped:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
        return {
            "title": self.title, "method": self.method, "n_facts": len(self.groups), "groups": list(self.groups),
            "update_rule": self.update_rule, "update_size": self.update_size, "n_edits": len(self.rows),
            "n_skipped": len(self.skipped),
            "skipped_reasons": reasons, "skipped": [row_dict(r) for r in self.skipped],
            "ppl_before": self.ppl_before, "lambda1": self.lambda1, "lambda2": self.lambda2,
            "table": self.table().to_dict("records"), "edits": [row_dict(r) for r in self.rows],
            "own_prob_drop_local_erasure": self.own_prob_drop(),
        }


__all__ = ["EditRow", "SkipRow", "ModificationResult"]
