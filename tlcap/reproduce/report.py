"""The reproduction report: one row per compared number, the figures, what was not reproduced.

A :class:`ReportRow` holds the paper's value (with its model and source line), ours with its
95 % CI and n, the p-value of an effect, and the verdict (:func:`tlcap.reproduce.verdict.verdict`)
with its reason. :class:`RowBuilder` collects rows and figures while the per-paper builders
(:mod:`.report_cnl`, :mod:`.report_ql`) walk the stage outputs; :class:`Report` is the saved
result, rendered by :mod:`.render` as ``report.md`` and ``report.html``.

Example:
    >>> rb = RowBuilder(our_model="SmolLM2-135M", reference={"cnl": "LLaMA2-7B", "ql": "GPT-2"})
    >>> rb.value("CNL Table 1", "GSM8K overlap", est, paper_value("cnl.table-1.llama2-7b.gsm8k.overlap"))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from tlcap.metrics.estimate import Estimate
from tlcap.reproduce.paper_values import PaperClaim, PaperValue
from tlcap.reproduce.registry import paper_values
from tlcap.reproduce.verdict import NOT_COMPARABLE, WORDS, verdict
from tlcap.results import Result, frame


@dataclass(frozen=True)
class ReportRow:
    """One compared number (columns of the report tables)."""

    item: str
    row: str
    kind: str
    paper: float | None
    paper_text: str
    paper_source: str
    ours: float | None
    low: float | None
    high: float | None
    n: int | None
    n_groups: int | None
    p_value: float | None
    test: str
    verdict: str
    reason: str
    unit: str = "fraction"


@dataclass(frozen=True)
class FigureRef:
    """A figure of the report: its item, file stem and title."""

    item: str
    stem: str
    title: str


@dataclass(frozen=True)
class NotReproduced:
    """An item of either paper that the report does not reproduce, and why."""

    paper: str
    item: str
    why: str


def _nan_to_none(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


class RowBuilder:
    """Collects report rows and figures.

    Args:
        our_model: Our model's name (for the "model differs" reason).
        reference: The paper model each paper's values are compared with (``{"cnl": "LLaMA2-7B"}``).
    """

    def __init__(self, our_model: str, reference: dict[str, str]) -> None:
        self.our_model = our_model
        self.reference = reference
        self.rows: list[ReportRow] = []
        self.figures: list[tuple[FigureRef, go.Figure]] = []
        self.not_reproduced: list[NotReproduced] = []

    def model_difference(self, paper: str) -> str:
        return f"model: {self.our_model} vs {self.reference[paper]}"

    def paper_value(self, paper: str, item: str, quantity: str, **coords: str) -> PaperValue | None:
        """The reference model's value (``None`` when the paper prints none for it)."""
        hits = paper_values(paper=paper, item=item, model=self.reference[paper], quantity=quantity, **coords)
        return hits[0] if hits else None

    def others(self, v: PaperValue | None) -> str:
        """The same number for the paper's other models (``"94.26 % (LLaMA2-13B); ..."``)."""
        if v is None:
            return ""
        same = paper_values(paper=v.paper, item=v.item, quantity=v.quantity, **dict(v.coords))
        return "; ".join(o.text() for o in same if o.model != v.model)

    def add(self, item: str, row: str, kind: str, ours: Estimate | None, paper: float | None, paper_text: str,
            source: str, *, sign: int | None = None, p_value: float | None = None, test: str = "",
            differences: Sequence[str] = (), rounding: float = 0.0, missing: str = "not computed",
            margin: float | None = None, unit: str = "fraction") -> ReportRow:
        v = verdict(ours, paper, kind=kind, sign=sign, p_value=p_value, differences=differences, paper_rounding=rounding,
                    missing=missing, margin=margin)
        r = ReportRow(item, row, kind, _nan_to_none(paper), paper_text, source,
                      None if ours is None else _nan_to_none(ours.value), None if ours is None else _nan_to_none(ours.low),
                      None if ours is None else _nan_to_none(ours.high), None if ours is None else ours.n,
                      None if ours is None else ours.n_groups, _nan_to_none(p_value), test, v.word, v.reason, unit)
        self.rows.append(r)
        return r

    def value(self, item: str, row: str, ours: Estimate | None, pv: PaperValue | None, *, differences: Sequence[str] = (),
              missing: str = "not computed", scale: float | None = None) -> ReportRow:
        """A value row against the registry value ``pv`` (percentages are compared as fractions)."""
        s = scale if scale is not None else (0.01 if pv is not None and pv.unit == "%" else 1.0)
        paper = None if pv is None else pv.value * s
        text = "" if pv is None else pv.text() + (f" | {self.others(pv)}" if self.others(pv) else "")
        return self.add(item, row, "value", ours, paper, text, "" if pv is None else pv.source, differences=differences,
                        rounding=0.0 if pv is None else pv.rounding * s, missing=missing)

    def effect(self, item: str, row: str, claim: PaperClaim, ours: Estimate | None, p_value: float | None, test: str, *,
               paper: float | None = None, paper_text: str = "", differences: Sequence[str] = (),
               missing: str = "not computed", margin: float | None = None) -> ReportRow:
        """An effect row for ``claim`` (``paper``: the effect's size from printed numbers, on our scale)."""
        text = paper_text or f"sign {'+' if claim.sign > 0 else '−' if claim.sign < 0 else '0'}: {claim.statement}"
        return self.add(item, row, "effect", ours, paper, text, claim.source, sign=claim.sign, p_value=p_value, test=test,
                        differences=differences, missing=missing, margin=margin)

    def missing(self, item: str, row: str, why: str, pv: PaperValue | None = None, claim: PaperClaim | None = None) -> None:
        """A row we have no number for (pending stage, not run at this scale)."""
        if claim is not None:
            self.effect(item, row, claim, None, None, "", missing=why)
        else:
            self.value(item, row, None, pv, missing=why)

    def figure(self, item: str, stem: str, fig: go.Figure, title: str = "") -> None:
        self.figures.append((FigureRef(item, stem, title or str(fig.layout.title.text or stem)), fig))

    def skip(self, paper: str, item: str, why: str) -> None:
        self.not_reproduced.append(NotReproduced(paper, item, why))


@dataclass(frozen=True)
class StageRow:
    """A stage's predicted and measured cost."""

    name: str
    status: str
    predicted_s: float | None
    measured_s: float | None
    predicted_bytes: int | None
    measured_bytes: int | None
    note: str = ""


@dataclass(frozen=True)
class Report(Result):
    """The reproduction report (rows, figures, what was not reproduced, the stages' costs).

    Attributes:
        papers: ``("cnl", "ql")`` or one of them.
        model: Our model.
        scale: ``smoke`` / ``cpu`` / ``full``.
        reference: The paper model compared with, per paper.
        rows: :class:`ReportRow` fields per row.
        figures: :class:`FigureRef` fields per figure.
        not_reproduced: :class:`NotReproduced` fields per item.
        stages: :class:`StageRow` fields per stage.
        calibration: The probe's :meth:`Calibration.to_dict`.
    """

    papers: tuple[str, ...] = ()
    model: str = ""
    scale: str = ""
    reference: dict = field(default_factory=dict)
    rows: tuple[dict, ...] = ()
    figures: tuple[dict, ...] = ()
    not_reproduced: tuple[dict, ...] = ()
    stages: tuple[dict, ...] = ()
    calibration: dict = field(default_factory=dict)

    @classmethod
    def build(cls, rb: RowBuilder, *, papers: Sequence[str], model: str, scale: str, stages: Sequence[StageRow],
              calibration: dict[str, Any]) -> Report:
        return cls(tuple(papers), model, scale, dict(rb.reference), tuple(dataclasses.asdict(r) for r in rb.rows),
                   tuple(dataclasses.asdict(f) for f, _ in rb.figures), tuple(dataclasses.asdict(n) for n in rb.not_reproduced),
                   tuple(dataclasses.asdict(s) for s in stages), dict(calibration))

    def report_rows(self) -> list[ReportRow]:
        return [ReportRow(**r) for r in self.rows]

    def items(self) -> list[str]:
        """The report's items (tables, figures) in order of first appearance."""
        return list(dict.fromkeys(r["item"] for r in self.rows))

    def verdict_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for r in self.rows:
            out.setdefault(r["item"], dict.fromkeys(WORDS, 0))[r["verdict"]] += 1
        return out

    def summary(self) -> dict[str, Any]:
        counts = self.verdict_counts()
        total = dict.fromkeys(WORDS, 0)
        for c in counts.values():
            for k, v in c.items():
                total[k] += v
        return {"papers": list(self.papers), "model": self.model, "scale": self.scale, "reference": dict(self.reference),
                "n_rows": len(self.rows), "verdicts": total, "verdicts_by_item": counts,
                "not_reproduced": [f"{n['paper'].upper()} {n['item']}: {n['why']}" for n in self.not_reproduced],
                "stages": list(self.stages), "calibration": dict(self.calibration)}

    def to_frame(self) -> pd.DataFrame:
        return frame(self.report_rows(), ReportRow)

    def stage_frame(self) -> pd.DataFrame:
        return frame([StageRow(**s) for s in self.stages], StageRow)

    def figure(self) -> go.Figure:
        """Verdicts per item (stacked bars)."""
        counts = self.verdict_counts()
        items = list(counts)
        colours = {"agrees": "#2ca02c", "disagrees": "#d62728", NOT_COMPARABLE: "#9e9e9e"}
        fig = go.Figure([go.Bar(name=w, x=items, y=[counts[i][w] for i in items], marker_color=colours[w]) for w in WORDS])
        fig.update_layout(barmode="stack", title=f"Verdicts per item: {self.model}, scale {self.scale}",
                          yaxis_title="rows", template="plotly_white", width=900, height=480)
        return fig


__all__ = ["ReportRow", "FigureRef", "NotReproduced", "RowBuilder", "StageRow", "Report"]
