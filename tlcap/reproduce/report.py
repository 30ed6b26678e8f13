"""The reproduction report: one row per compared number, the figures, what was not reproduced.

A :class:`ReportRow` holds the paper's value (with its model and source line), ours with its
95 % CI and n, the test of an effect (raw p-value, its floor, its sidedness, the Benjamini–Hochberg
adjusted value over the report and over its paper), the row's power (minimum detectable effect,
power against the paper's effect size) and the verdict (:func:`tlcap.reproduce.verdict.verdict`)
with its reason. :class:`RowBuilder` collects rows and figures while the per-paper builders
(:mod:`.report_cnl`, :mod:`.report_ql`) walk the stage outputs; :meth:`RowBuilder.finalize`
adjusts the p-values of the whole report at once and only then gives verdicts. :class:`Report` is
the saved result, rendered by :mod:`.render` as ``report.md`` and ``report.html``.

Example:
    >>> from tlcap.metrics.bootstrap import bootstrap_ci
    >>> est = bootstrap_ci([0.9, 0.95, 0.97, 0.99], seed=0)       # our overlap, per pair
    >>> rb = RowBuilder("smollm2-135m", papers=("cnl",))
    >>> _ = rb.value("CNL Table 1", "GSM8K overlap", est, rb.paper_value("cnl", "Table 1", "overlap", dataset="GSM8K"))
    >>> rows = rb.finalize()
    >>> rows[0].paper_text, rows[0].verdict, rows[0].reason
    ('96.42 % (LLaMA2-7B) | 94.26 % (LLaMA2-13B); 95.66 % (GPT-J-6B)', 'agrees',
     "the paper's 0.964 lies inside our 95 % CI [0.917, 0.98] (n=4), within ±25 %")
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go
from scipy.stats import norm

from tlcap.metrics.estimate import Estimate
from tlcap.metrics.multiplicity import benjamini_hochberg, bh_critical_level
from tlcap.metrics.power import detectable, mde, power_at, se_from_ci
from tlcap.reproduce.items import comparable_models, is_paper_model, reference_model
from tlcap.reproduce.not_reproduced import NotReproduced, not_reproduced
from tlcap.reproduce.paper_values import PaperClaim, PaperValue
from tlcap.reproduce.registry import paper_values
from tlcap.reproduce.verdict import ALPHA, NOT_COMPARABLE, WORDS, verdict
from tlcap.results import Result
from tlcap.rows import RowFields, frame, row_dict

TWO_SIDED = "two-sided"


@dataclass(frozen=True)
class ReportRow:
    """One compared number (columns of the report tables and of ``report_rows.csv``).

    Attributes:
        p_value: The test's raw p-value (two-sided unless ``sided`` says otherwise).
        p_floor: The smallest p-value the test can give (Monte-Carlo or exact tests; 0 for t-tests).
        sided: ``"two-sided"`` or ``"one-sided: <reason>"``.
        p_adjusted: Benjamini–Hochberg adjusted over every p-value of the report (decides the verdict).
        p_adjusted_paper: The same over the p-values of this row's paper only.
        mde: Minimum detectable effect at 80 % power and the report's adjusted level.
        power: Power against the paper's effect size (when the paper gives one).
        n_unit: What ``n`` counts (``"test items"``, ``"facts"``, ``"samples"``, ...).
        control: The matched random control beside the row, as text.
        key: The registry key of the paper value or claim the row reproduces.
        p_paper_size: On the paper's own setting only: the adjusted p-value of "our effect equals the
            paper's effect size" (normal test from the CI), in the same family as ``p_adjusted``.
    """

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
    p_floor: float | None = None
    sided: str = ""
    p_adjusted: float | None = None
    p_adjusted_paper: float | None = None
    mde: float | None = None
    power: float | None = None
    n_unit: str = ""
    control: str = ""
    key: str = ""
    p_paper_size: float | None = None


@dataclass(frozen=True)
class FigureRef:
    """A figure of the report: its item, file stem and title."""

    item: str
    stem: str
    title: str


def _nan_to_none(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


@dataclass
class _Spec:
    """A row before the report-wide adjustment (the arguments of :func:`verdict` and the row's text)."""

    item: str
    row: str
    kind: str
    ours: Estimate | None
    paper: float | None
    paper_text: str
    source: str
    sign: int | None = None
    p_value: float | None = None
    p_floor: float | None = None
    sided: str = TWO_SIDED
    test: str = ""
    differences: tuple[str, ...] = ()
    rounding: float = 0.0
    missing: str = "not computed"
    margin: float | None = None
    unit: str = "fraction"
    n_unit: str = ""
    control: str = ""
    no_ci: str = ""
    descriptive: str = ""
    key: str = ""
    comparable_on: str = ""

    @property
    def paper_id(self) -> str:
        return self.item.split(" ", 1)[0].lower()


class RowBuilder:
    """Collects report rows and figures; :meth:`finalize` adjusts the p-values and gives verdicts.

    Args:
        our_model: Our model's name.
        papers: The papers of the report.
        reference: The paper model each paper's values are compared with (default: our model when
            the paper reports it, else the paper's main model; :func:`reference_model`).
    """

    def __init__(self, our_model: str, papers: Sequence[str] = ("cnl", "ql"), reference: dict[str, str] | None = None) -> None:
        self.our_model = our_model
        self.papers = tuple(papers)
        self.reference = reference or {p: reference_model(p, our_model) for p in self.papers}
        self.specs: list[_Spec] = []
        self.figures: list[tuple[FigureRef, go.Figure]] = []
        self.skipped: list[NotReproduced] = []
        self.alpha_adjusted: float = math.nan

    def same_model(self, paper: str) -> bool:
        """Whether our model is the paper's reference model (value rows can then be compared).

        Args:
            paper: ``"cnl"`` or ``"ql"``.

        Returns:
            ``True`` when the paper reports our model and compares with it.
        """
        return is_paper_model(paper, self.our_model) and self.reference[paper] == reference_model(paper, self.our_model)

    def model_difference(self, paper: str) -> list[str]:
        """``["model: ours vs theirs"]``, or ``[]`` when our model is the paper's.

        Args:
            paper: ``"cnl"`` or ``"ql"``.

        Returns:
            The difference to pass as a row's ``differences`` (a list of at most one string).
        """
        return [] if self.same_model(paper) else [f"model: {self.our_model} vs {self.reference[paper]}"]

    def comparable_on(self, paper: str) -> str:
        """The paper's models, comma-separated, for a value row's "comparable on" reason.

        Args:
            paper: ``"cnl"`` or ``"ql"``.

        Returns:
            E.g. ``"LLaMA2-7B, LLaMA2-13B, GPT-J-6B"``.
        """
        return ", ".join(comparable_models(paper))

    def paper_value(self, paper: str, item: str, quantity: str, **coords: str) -> PaperValue | None:
        """The reference model's value (``None`` when the paper prints none for it).

        Args:
            paper: ``"cnl"`` or ``"ql"``.
            item: The paper's table or figure, e.g. ``"Table 1"``.
            quantity: The quantity, e.g. ``"overlap"``.
            **coords: Coordinate labels, e.g. ``dataset="GSM8K"``.

        Returns:
            The first matching :class:`PaperValue` of the reference model, or ``None``.
        """
        hits = paper_values(paper=paper, item=item, model=self.reference[paper], quantity=quantity, **coords)
        return hits[0] if hits else None

    def others(self, v: PaperValue | None) -> str:
        """The same number for the paper's other models (``"94.26 % (LLaMA2-13B); ..."``).

        Args:
            v: A paper value (``None`` gives ``""``).

        Returns:
            The other models' values of the same item, quantity and coordinates joined by ``"; "`` (``""`` if none).
        """
        if v is None:
            return ""
        same = paper_values(paper=v.paper, item=v.item, quantity=v.quantity, **dict(v.coords))
        return "; ".join(o.text() for o in same if o.model != v.model)

    # ------------------------------------------------------------------ rows
    def add(self, spec: _Spec) -> _Spec:
        """Append a row spec (a NaN p-value counts as no test).

        Args:
            spec: The row before the report-wide adjustment.

        Returns:
            ``spec`` itself, for the caller to adjust further.
        """
        if spec.p_value is not None and math.isnan(spec.p_value):
            spec.p_value = None
        self.specs.append(spec)
        return spec

    def value(self, item: str, row: str, ours: Estimate | None, pv: PaperValue | None, *, differences: Sequence[str] = (),
              missing: str = "not computed", scale: float | None = None, n_unit: str = "", no_ci: str = "",
              control: str = "") -> _Spec:
        """A value row against the registry value ``pv`` (percentages are compared as fractions).

        Args:
            item: The report item, e.g. ``"CNL Table 1"`` (its first word names the paper).
            row: The row's label.
            ours: Our estimate with its CI (``None``: not computed, see ``missing``).
            pv: The paper's value (:meth:`paper_value`), or ``None`` when the paper prints none.
            differences: How our setting differs from the paper's (each makes the row not comparable).
            missing: Why there is no number of ours, when ``ours`` is ``None``.
            scale: Factor from the paper's unit to ours (default: 0.01 for percentages, else 1).
            n_unit: What the estimate's ``n`` counts.
            no_ci: Why the estimate has no CI, when it has none.
            control: The matched random control, as text.

        Returns:
            The added row spec.
        """
        s = scale if scale is not None else (0.01 if pv is not None and pv.unit == "%" else 1.0)
        paper = None if pv is None else pv.value * s
        text = "" if pv is None else pv.text() + (f" | {self.others(pv)}" if self.others(pv) else "")
        return self.add(_Spec(item, row, "value", ours, paper, text, "" if pv is None else pv.source,
                              differences=tuple(differences), rounding=0.0 if pv is None else pv.rounding * s,
                              missing=missing, n_unit=n_unit, no_ci=no_ci, control=control,
                              key="" if pv is None else pv.key,
                              comparable_on=self.comparable_on(item.split(" ", 1)[0].lower())))

    def effect(self, item: str, row: str, claim: PaperClaim, ours: Estimate | None, p_value: float | None, test: str, *,
               p_floor: float | None = None, sided: str = TWO_SIDED, paper: float | None = None, paper_text: str = "",
               differences: Sequence[str] = (), missing: str = "not computed", margin: float | None = None,
               n_unit: str = "", control: str = "", no_ci: str = "") -> _Spec:
        """An effect row for ``claim`` (``paper``: the effect's size from printed numbers, on our scale).

        Args:
            item: The report item, e.g. ``"QL Fig. 4"``.
            row: The row's label.
            claim: The paper's claim (its sign is what is tested).
            ours: Our estimated effect with its CI (``None``: not computed).
            p_value: The test's raw p-value (``None``: no test).
            test: The test's name, as printed.
            p_floor: The smallest p-value the test can give.
            sided: ``"two-sided"`` or ``"one-sided: <reason>"``.
            paper: The paper's effect size on our scale, or ``None``.
            paper_text: The paper column's text (default: the claim's sign and statement).
            differences: How our setting differs from the paper's.
            missing: Why there is no number of ours, when ``ours`` is ``None``.
            margin: For a claim of no effect (``sign=0``): the largest effect still called "no difference".
            n_unit: What the estimate's ``n`` counts.
            control: The matched random control, as text.
            no_ci: Why the estimate has no CI, when it has none.

        Returns:
            The added row spec.
        """
        text = paper_text or f"sign {'+' if claim.sign > 0 else '−' if claim.sign < 0 else '0'}: {claim.statement}"
        return self.add(_Spec(item, row, "effect", ours, paper, text, claim.source, sign=claim.sign, p_value=p_value,
                              p_floor=p_floor, sided=sided, test=test, differences=tuple(differences), missing=missing,
                              margin=margin, n_unit=n_unit, control=control, no_ci=no_ci, key=claim.key))

    def control(self, item: str, row: str, ours: Estimate | None, p_value: float | None, test: str, *,
                p_floor: float | None = None, sided: str = TWO_SIDED, n_unit: str = "", control: str = "",
                what: str = "") -> _Spec:
        """A matched control the paper does not report (e.g. WikiText-2 perplexity after erasing): tested, no verdict.

        Args:
            item: The report item.
            row: The row's label.
            ours: Our estimate with its CI.
            p_value: The test's raw p-value (``None``: no test).
            test: The test's name, as printed.
            p_floor: The smallest p-value the test can give.
            sided: ``"two-sided"`` or ``"one-sided: <reason>"``.
            n_unit: What the estimate's ``n`` counts.
            control: The matched random control, as text.
            what: The paper column's text (default: a control the paper does not report).

        Returns:
            The added row spec (kind ``"control"``).
        """
        return self.add(_Spec(item, row, "control", ours, None, what or "– (a control the paper does not report)", "",
                              p_value=p_value, p_floor=p_floor, sided=sided, test=test, n_unit=n_unit, control=control))

    def descriptive(self, item: str, row: str, ours: Estimate | None, why: str, *, paper_text: str = "", source: str = "",
                    n_unit: str = "", key: str = "", missing: str = "not computed") -> _Spec:
        """Our number without a test (true by construction, or nothing to compare).

        Args:
            item: The report item.
            row: The row's label.
            ours: Our number (``None``: not computed).
            why: Why the row is descriptive (the verdict's reason).
            paper_text: The paper column's text.
            source: The paper's source line, if any.
            n_unit: What the estimate's ``n`` counts.
            key: The registry key of the paper value, if any.
            missing: Why there is no number of ours, when ``ours`` is ``None``.

        Returns:
            The added row spec (kind ``"descriptive"``).
        """
        return self.add(_Spec(item, row, "descriptive", ours, None, paper_text, source, descriptive=why, n_unit=n_unit,
                              key=key, missing=missing))

    def missing(self, item: str, row: str, why: str, pv: PaperValue | None = None, claim: PaperClaim | None = None) -> None:
        """A row we have no number for (pending stage, not run at this scale).

        Args:
            item: The report item.
            row: The row's label.
            why: Why there is no number (becomes the verdict's reason).
            pv: The paper value, for a value row.
            claim: The paper claim, for an effect row (takes precedence over ``pv``).
        """
        if claim is not None:
            self.effect(item, row, claim, None, None, "", missing=why)
        else:
            self.value(item, row, None, pv, missing=why)

    def figure(self, item: str, stem: str, fig: go.Figure, title: str = "") -> None:
        """Add a figure under ``item``.

        Args:
            item: The report item the figure belongs to.
            stem: File name without extension.
            fig: The plotly figure.
            title: Title for links (default: the figure's own title, else ``stem``).
        """
        self.figures.append((FigureRef(item, stem, title or str(fig.layout.title.text or stem)), fig))

    def skip(self, paper: str, item: str, why: str) -> None:
        """Record an item this run does not reproduce, with why (listed under "Not reproduced").

        Args:
            paper: ``"cnl"`` or ``"ql"``.
            item: The paper's item, e.g. ``"Table 2"``.
            why: The reason, one sentence.
        """
        self.skipped.append(NotReproduced(paper, item, why))

    # ------------------------------------------------------------------ the report-wide adjustment
    def _p_paper_size(self, s: _Spec) -> float | None:
        """Two-sided p of "our effect equals the paper's" (normal, SE from the CI), on the paper's own setting only."""
        o = s.ours
        if s.kind != "effect" or not s.sign or s.paper is None or s.differences or o is None or not o.has_interval:
            return None
        se = se_from_ci(o.low, o.high, o.level)
        if not se > 0:
            return None
        return float(2.0 * norm.sf(abs(o.value - s.paper) / se))

    def finalize(self, alpha: float = ALPHA) -> list[ReportRow]:
        """Benjamini–Hochberg over every p-value of the report (and per paper), then the verdicts.

        Args:
            alpha: The false discovery rate.

        Returns:
            One :class:`ReportRow` per added row, in order; sets :attr:`alpha_adjusted`.
        """
        tested = [i for i, s in enumerate(self.specs) if s.p_value is not None and s.ours is not None]
        size = {i: p for i, s in enumerate(self.specs) if (p := self._p_paper_size(s)) is not None}
        family = [self.specs[i].p_value for i in tested] + list(size.values())
        q_all = benjamini_hochberg(family)
        adj: dict[int, float] = dict(zip(tested, q_all[:len(tested)]))
        adj_size: dict[int, float] = dict(zip(size, q_all[len(tested):]))
        adj_paper: dict[int, float] = {}
        for paper in {self.specs[i].paper_id for i in tested}:  # the same family within one paper: its tests and
            mine = [i for i in tested if self.specs[i].paper_id == paper]  # its paper-size tests
            q_mine = benjamini_hochberg([self.specs[i].p_value for i in mine] +
                                        [size[i] for i in size if self.specs[i].paper_id == paper])
            adj_paper.update(zip(mine, q_mine[:len(mine)]))
        level = bh_critical_level(family, alpha) if family else alpha
        self.alpha_adjusted = level
        rows = []
        for i, s in enumerate(self.specs):
            o = s.ours
            se = se_from_ci(o.low, o.high, o.level) if o is not None and o.has_interval else math.nan
            se = se if se > 0 else math.nan  # a zero-width CI (all values equal) estimates no spread
            row_mde = mde(se, level) if s.kind == "effect" and not math.isnan(se) else math.nan
            row_power = power_at(s.paper, se, level) if s.kind == "effect" and s.paper is not None and s.sign else math.nan
            if s.kind == "effect" and s.p_value is not None and not detectable(s.p_floor, level):
                # its p-value cannot reach the level: no effect is detectable, whatever the CI's width
                row_mde, row_power = math.nan, (0.0 if s.paper is not None and s.sign else math.nan)
            v = verdict(o, s.paper, kind=s.kind, sign=s.sign, p_adjusted=adj.get(i), p_floor=s.p_floor, alpha=alpha,
                        alpha_adjusted=level, differences=s.differences, comparable_on=s.comparable_on,
                        paper_rounding=s.rounding, margin=s.margin, mde=row_mde, power=row_power,
                        p_paper_size=adj_size.get(i), missing=s.missing, no_ci=s.no_ci, descriptive=s.descriptive)
            rows.append(ReportRow(
                s.item, s.row, s.kind, _nan_to_none(s.paper), s.paper_text, s.source,
                None if o is None else _nan_to_none(o.value), None if o is None else _nan_to_none(o.low),
                None if o is None else _nan_to_none(o.high), None if o is None or not o.n else o.n,
                None if o is None else o.n_groups,
                s.p_value if o is not None else None, s.test, v.word, v.reason, s.unit, _nan_to_none(s.p_floor),
                s.sided if s.p_value is not None else "", _nan_to_none(adj.get(i)), _nan_to_none(adj_paper.get(i)),
                _nan_to_none(row_mde), _nan_to_none(row_power), s.n_unit, s.control, s.key,
                _nan_to_none(adj_size.get(i))))
        return rows


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
class Report(RowFields, Result):
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
        alpha: The false discovery rate of the verdicts.
        alpha_adjusted: The raw-p level a discovery needed in this report (BH critical level).
    """

    papers: tuple[str, ...] = ()
    model: str = ""
    scale: str = ""
    _row_types: ClassVar[dict[str, type]] = {"rows": ReportRow, "figures": FigureRef, "not_reproduced": NotReproduced,
                                             "stages": StageRow}

    reference: dict = field(default_factory=dict)
    rows: tuple[ReportRow, ...] = ()
    figures: tuple[FigureRef, ...] = ()
    not_reproduced: tuple[NotReproduced, ...] = ()
    stages: tuple[StageRow, ...] = ()
    calibration: dict = field(default_factory=dict)
    alpha: float = ALPHA
    alpha_adjusted: float = math.nan

    @classmethod
    def build(cls, rb: RowBuilder, *, papers: Sequence[str], model: str, scale: str, stages: Sequence[StageRow],
              calibration: dict[str, Any], alpha: float = ALPHA) -> Report:
        """The report of a :class:`RowBuilder`: finalize its rows, then list what was not reproduced.

        Args:
            rb: The builder holding the rows, figures and skipped items.
            papers: The papers of the report.
            model: Our model's name.
            scale: ``smoke`` / ``cpu`` / ``full``.
            stages: The stages' predicted and measured costs.
            calibration: The probe's :meth:`Calibration.to_dict`.
            alpha: The false discovery rate of the verdicts.

        Returns:
            The :class:`Report`.
        """
        rows = rb.finalize(alpha)
        figs = [f for f, _ in rb.figures]
        nr = not_reproduced(papers, rows, figs, rb.reference, rb.skipped)
        return cls(tuple(papers), model, scale, dict(rb.reference), tuple(rows), tuple(figs), tuple(nr), tuple(stages),
                   dict(calibration), alpha, rb.alpha_adjusted)

    def report_rows(self) -> list[ReportRow]:
        """The rows as a list.

        Returns:
            The :class:`ReportRow` objects, in report order.
        """
        return list(self.rows)

    def items(self) -> list[str]:
        """The report's items (tables, figures) in order of first appearance.

        Returns:
            Item names such as ``"CNL Table 1"``.
        """
        return list(dict.fromkeys(r.item for r in self.rows))

    def verdict_counts(self) -> dict[str, dict[str, int]]:
        """How many rows of each item got each verdict.

        Returns:
            ``{item: {verdict word: count}}``, every word present.
        """
        out: dict[str, dict[str, int]] = {}
        for r in self.rows:
            out.setdefault(r.item, dict.fromkeys(WORDS, 0))[r.verdict] += 1
        return out

    def claim_counts(self) -> dict[str, int]:
        """Verdicts of the effect rows only (the papers' claims): agrees / disagrees / undecided / not comparable.

        Returns:
            ``{verdict word: count}`` over the effect rows.
        """
        out = dict.fromkeys(WORDS, 0)
        for r in self.rows:
            if r.kind == "effect":
                out[r.verdict] += 1
        return out

    def summary(self) -> dict[str, Any]:
        counts = self.verdict_counts()
        total = dict.fromkeys(WORDS, 0)
        for c in counts.values():
            for k, v in c.items():
                total[k] += v
        return {"papers": list(self.papers), "model": self.model, "scale": self.scale, "reference": dict(self.reference),
                "n_rows": len(self.rows), "verdicts": total, "claims": self.claim_counts(), "verdicts_by_item": counts,
                "alpha": self.alpha, "alpha_adjusted": self.alpha_adjusted,
                "n_tests": sum(r.p_value is not None for r in self.rows),
                "not_reproduced": [f"{n.paper.upper()} {n.item}: {n.why}" for n in self.not_reproduced],
                "stages": [row_dict(s) for s in self.stages], "calibration": dict(self.calibration)}

    def to_frame(self) -> pd.DataFrame:
        return frame(self.report_rows(), ReportRow)

    def stage_frame(self) -> pd.DataFrame:
        """The stages' costs as a table (``stages.csv``).

        Returns:
            One row per stage, the columns of :class:`StageRow`.
        """
        return frame(self.stages, StageRow)

    def figure(self) -> go.Figure:
        """Verdicts per item (stacked bars).

        Returns:
            A plotly figure, one stacked bar per item, coloured by verdict.
        """
        counts = self.verdict_counts()
        items = list(counts)
        colours = {"agrees": "#2ca02c", "disagrees": "#d62728", "undecided": "#ffb300", NOT_COMPARABLE: "#9e9e9e",
                   "descriptive": "#90caf9"}
        fig = go.Figure([go.Bar(name=w, x=items, y=[counts[i][w] for i in items], marker_color=colours[w]) for w in WORDS])
        fig.update_layout(barmode="stack", title=f"Verdicts per item: {self.model}, scale {self.scale}",
                          yaxis_title="rows", template="plotly_white", width=900, height=480)
        return fig


__all__ = ["ReportRow", "FigureRef", "NotReproduced", "RowBuilder", "StageRow", "Report", "TWO_SIDED"]
