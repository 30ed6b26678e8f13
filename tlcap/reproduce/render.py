"""Writing a :class:`~tlcap.reproduce.report.Report`: ``report.md``, ``report.html``, figures, CSV.

``report.md`` links each figure's PNG (its HTML when no PNG exporter is installed);
``report.html`` embeds every figure inline (plotly.js once, in the page). Both hold, per item,
a table with the paper's value, ours with its 95 % CI and n, the p-value of effects, the verdict
and its reason; then what was not reproduced and why; then predicted vs measured cost per stage.

Example:
    >>> import tempfile
    >>> from tlcap.reproduce.run import reproduce
    >>> report = reproduce(model, tempfile.mkdtemp(), papers=("ql",), only=["ql.table2"]).report
    >>> figures = []                          # (FigureRef, plotly figure) pairs; the run's own are in its out folder
    >>> [p.name for p in write_report(report, figures, Path(tempfile.mkdtemp()))]
    ['report.md', 'report.html', 'report_rows.csv', 'stages.csv']
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go

from tlcap.atomic import write_text_atomic
from tlcap.reproduce.cost import fmt_bytes, fmt_seconds
from tlcap.reproduce.report import FigureRef, Report, ReportRow
from tlcap.viz.export import save_figures as save_all

VERDICT_MARK = {"agrees": "✅ agrees", "disagrees": "❌ disagrees", "undecided": "❔ undecided",
                "not comparable": "➖ not comparable", "descriptive": "📋 descriptive"}
COLUMNS = ("row", "paper", "ours [95 % CI]", "matched control", "n", "p (floor)", "p adj.", "MDE", "verdict", "reason")


def fmt_num(x: float | None) -> str:
    """A number of a report cell (``–`` for none); fractions with 3 significant digits.

    Args:
        x: The number, or ``None``/NaN for none.

    Returns:
        ``–``, the number to 3 significant digits, or a whole number from ``1e4`` up.
    """
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.0f}"


def ours_text(r: ReportRow) -> str:
    if r.ours is None:
        return "–"
    if r.low is None or r.high is None:
        return f"{fmt_num(r.ours)} (no CI)"
    return f"{fmt_num(r.ours)} [{fmt_num(r.low)}, {fmt_num(r.high)}]"


def n_text(r: ReportRow) -> str:
    if r.n is None:
        return "–"
    unit = f" {r.n_unit}" if r.n_unit else ""
    return f"{r.n}{unit}" + (f" ({r.n_groups} groups)" if r.n_groups else "")


def fmt_p(p: float | None) -> str:
    """A p-value as printed: 2 significant digits, scientific below 1e-4 (never a bare ``<1e-4``).

    Args:
        p: The p-value, or ``None``/NaN for none.

    Returns:
        ``–``, e.g. ``0.031``, or e.g. ``3.2e-06``.
    """
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def p_text(r: ReportRow) -> str:
    if r.p_value is None:
        return "–"
    floor = f", floor {fmt_p(r.p_floor)}" if r.p_floor else ""
    sided = "" if not r.sided or r.sided == "two-sided" else f"; {r.sided}"
    return f"{fmt_p(r.p_value)} ({r.test}{floor}{sided})" if r.test else fmt_p(r.p_value)


def padj_text(r: ReportRow) -> str:
    return fmt_p(r.p_adjusted)


def mde_text(r: ReportRow) -> str:
    if r.mde is None:
        return "–"
    return fmt_num(r.mde) + (f" (power {r.power:.0%})" if r.power is not None else "")


def paper_text(r: ReportRow) -> str:
    if not r.paper_text:
        return "–"
    return r.paper_text + (f" [{r.paper_source}]" if r.paper_source else "")


def cells(r: ReportRow) -> list[str]:
    return [r.row, paper_text(r), ours_text(r), r.control or "–", n_text(r), p_text(r), padj_text(r), mde_text(r),
            VERDICT_MARK.get(r.verdict, r.verdict), r.reason]


def intro(report: Report) -> str:
    """The report's first paragraph: what was compared, the verdict counts and the rule.

    Args:
        report: The assembled report.

    Returns:
        One paragraph of plain text (no Markdown markup), used by both :func:`markdown` and :func:`html_page`.
    """
    s = report.summary()
    v, c = s["verdicts"], s["claims"]
    ref = ", ".join(f"{k.upper()}: {m}" for k, m in report.reference.items())
    alpha_adj = s["alpha_adjusted"]
    adj = f"{alpha_adj:.2g}" if alpha_adj == alpha_adj else "–"
    return (f"Compared with the papers' {ref} numbers. {s['n_rows']} rows: {v['agrees']} agree, {v['disagrees']} disagree, "
            f"{v['undecided']} undecided, {v['not comparable']} not comparable, {v['descriptive']} descriptive. Of the "
            f"papers' claims (effect rows): {c['agrees']} hold, {c['disagrees']} fail, {c['undecided']} cannot be decided "
            f"at this model and size, {c['not comparable']} have no number. {s['n_tests']} p-values, two-sided unless a row "
            f"says why not, adjusted together by Benjamini–Hochberg (false discovery rate {s['alpha']:g}); a discovery needed "
            f"a raw p ≤ {adj}, and MDE (the smallest effect detectable with 80 % power) is stated at that level. Values are "
            "fractions (the papers' percentages divided by 100); CIs are 95 %. Every verdict branch is in docs/reproduce.md.")


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def save_figures(figures: Sequence[tuple[FigureRef, go.Figure]], folder: Path) -> dict[str, list[str]]:
    """Save every figure as HTML (+ PNG when an exporter is installed); returns stem → file names.

    Args:
        figures: ``(reference, figure)`` pairs; the reference's ``stem`` names the files.
        folder: The figure folder (created when missing).

    Returns:
        ``{stem: file names written}`` (names only, not paths).
    """
    written = save_all({ref.stem: fig for ref, fig in figures}, folder)
    return {stem: [p.name for p in paths] for stem, paths in written.items()}


def markdown(report: Report, files: dict[str, list[str]], figures_dir: str = "figures") -> str:
    """The report as Markdown (figures linked, PNG preferred).

    Args:
        report: The assembled report.
        files: ``{stem: file names}`` of the saved figures (from :func:`save_figures`).
        figures_dir: The figure folder, relative to the Markdown file.

    Returns:
        The Markdown text: intro, one section per item (table and figures), power, not-reproduced and stage sections.
    """
    out = [f"# tlcap reproduce: {' + '.join(p.upper() for p in report.papers)} on {report.model} (scale {report.scale})", "",
           intro(report), ""]
    rows = report.report_rows()
    figs = list(report.figures)
    for item in report.items() + [f.item for f in figs if f.item not in report.items()]:
        if any(f.item == item for f in figs) and item not in report.items():
            out += [f"## {item}", ""]
        elif item in report.items():
            out += [f"## {item}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
            out += ["| " + " | ".join(_md_cell(c) for c in cells(r)) + " |" for r in rows if r.item == item]
            out.append("")
        for f in figs:
            if f.item == item:
                names = files.get(f.stem, [])
                png = [n for n in names if n.endswith(".png")]
                link = (png or names or [f"{f.stem}.html"])[0]
                out += [f"![{f.title}]({figures_dir}/{link})" if png else f"[{f.title}]({figures_dir}/{link})", ""]
    out += power_markdown(report)
    out += ["## Not reproduced", ""]
    out += [f"- **{n.paper.upper()} {n.item}**: {n.why}" for n in report.not_reproduced] or \
        ["Every table, figure and printed value of the papers above has a number of ours in this report."]
    out += [""]
    out += stage_markdown(report)
    return "\n".join(out) + "\n"


def underpowered(report: Report) -> list[ReportRow]:
    """Effect rows that could not detect the paper's effect size at this size (power < 80 %, or a p floor
    above the report's adjusted level), and effect rows without a test."""
    out = []
    level = report.alpha_adjusted
    for r in report.report_rows():
        if r.kind != "effect" or r.ours is None or r.verdict in ("agrees", "disagrees"):
            continue
        low_power = r.power is not None and r.power < 0.8
        floor = r.p_floor is not None and level == level and r.p_floor >= level
        if low_power or floor or r.p_value is None:
            out.append(r)
    return out


def power_markdown(report: Report) -> list[str]:
    """The section listing the claims this model and size cannot decide, with why."""
    rows = underpowered(report)
    out = ["## What this size cannot decide", ""]
    if not rows:
        return out + ["Every effect row was either decided or had ≥ 80 % power against the paper's effect size.", ""]
    out += ["Effect rows left undecided that could not have decided: power below 80 % against the paper's effect size, "
            "a p-value floor above the adjusted level, or no test at this size.", "",
            "| item | row | ours | MDE | power vs paper | why |", "|---|---|---|---|---|---|"]
    for r in rows:
        why = "no test: " + (r.reason.split(";")[0] if r.p_value is None else "")
        if r.p_value is not None:
            why = "p floor above the adjusted level" if (r.p_floor or 0) >= report.alpha_adjusted else "underpowered"
        out.append(f"| {r.item} | {_md_cell(r.row)} | {ours_text(r)} | {fmt_num(r.mde)} | "
                   f"{'–' if r.power is None else f'{r.power:.0%}'} | {_md_cell(why)} |")
    return out + [""]


def stage_markdown(report: Report) -> list[str]:
    cal = report.calibration
    load = cal.get("load")
    out = ["## Stages: predicted vs measured", "",
           f"Calibrated on {cal.get('device', '?')} (probe {fmt_seconds(float(cal.get('seconds', 0.0)))}, load average "
           f"{load if load is not None else '?'} at the probe).", "",
           "| stage | status | predicted time | measured time | predicted peak | measured peak | note |",
           "|---|---|---|---|---|---|---|"]
    for st in report.stages:
        pred = st.predicted_s if st.predicted_s is not None else math.nan
        out.append(f"| {st.name} | {st.status} | {fmt_seconds(pred)}"
                   f" | {fmt_seconds(st.measured_s if st.measured_s is not None else math.nan)}"
                   f" | {fmt_bytes(st.predicted_bytes or 0)} | {fmt_bytes(st.measured_bytes or 0)} | "
                   f"{_md_cell(st.note)} |")
    return out + [""]


def html_page(report: Report, figures: Sequence[tuple[FigureRef, go.Figure]]) -> str:
    """The report as one HTML page with every figure inline.

    Args:
        report: The assembled report.
        figures: ``(reference, figure)`` pairs, embedded under their items (plotly.js inlined once).

    Returns:
        A self-contained HTML document.
    """
    md_intro = intro(report)
    esc = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             f"<title>tlcap reproduce: {esc(report.model)} ({esc(report.scale)})</title>",
             "<style>body{font-family:sans-serif;max-width:1400px;margin:auto;padding:1em}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}th{background:#f3f3f3}"
             ".agrees{background:#e8f5e9}.disagrees{background:#ffebee}.undecided{background:#fff8e1}</style></head><body>",
             f"<h1>tlcap reproduce: {esc(' + '.join(p.upper() for p in report.papers))} on {esc(report.model)} "
             f"(scale {esc(report.scale)})</h1>", f"<p>{esc(md_intro)}</p>"]
    rows = report.report_rows()
    first = True
    items = report.items() + [f.item for f, _ in figures if f.item not in report.items()]
    for item in dict.fromkeys(items):
        parts.append(f"<h2>{esc(item)}</h2>")
        mine = [r for r in rows if r.item == item]
        if mine:
            parts.append("<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in COLUMNS) + "</tr>")
            for r in mine:
                cls = r.verdict.replace(" ", "-")
                parts.append(f"<tr class='{cls}'>" + "".join(f"<td>{esc(c)}</td>" for c in cells(r)) + "</tr>")
            parts.append("</table>")
        for ref, fig in figures:
            if ref.item == item:
                parts.append(fig.to_html(full_html=False, include_plotlyjs=True if first else False))
                first = False
    parts.append("<h2>Not reproduced</h2><ul>")
    parts += [f"<li><b>{esc(n.paper.upper())} {esc(n.item)}</b>: {esc(n.why)}</li>" for n in report.not_reproduced] \
        or ["<li>Every table, figure and printed value of the papers above has a number of ours in this report.</li>"]
    parts.append("</ul><h2>Stages: predicted vs measured</h2><table><tr>" + "".join(
        f"<th>{c}</th>" for c in ("stage", "status", "predicted time", "measured time", "predicted peak", "measured peak",
                                  "note")) + "</tr>")
    for st in report.stages:
        vals = [st.name, st.status, fmt_seconds(st.predicted_s if st.predicted_s is not None else math.nan),
                fmt_seconds(st.measured_s if st.measured_s is not None else math.nan),
                fmt_bytes(st.predicted_bytes or 0), fmt_bytes(st.measured_bytes or 0), st.note]
        parts.append("<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in vals) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def write_report(report: Report, figures: Sequence[tuple[FigureRef, go.Figure]], out: Path) -> list[Path]:
    """Write ``report.md``, ``report.html``, ``figures/``, ``report_rows.csv``, ``stages.csv`` and ``report/`` into ``out``.

    Args:
        report: The assembled report.
        figures: ``(reference, figure)`` pairs.
        out: The output folder.

    Returns:
        The paths of ``report.md``, ``report.html``, ``report_rows.csv`` and ``stages.csv``.
    """
    out = Path(out)
    report.save(out / "report")  # the values first: the figure export comes last and is bounded
    write_text_atomic(out / "report_rows.csv", report.to_frame().to_csv(index=False))
    write_text_atomic(out / "stages.csv", report.stage_frame().to_csv(index=False))
    files = save_figures(figures, out / "figures")
    write_text_atomic(out / "report.md", markdown(report, files))
    write_text_atomic(out / "report.html", html_page(report, figures))
    return [out / "report.md", out / "report.html", out / "report_rows.csv", out / "stages.csv"]


__all__ = ["write_report", "markdown", "html_page", "save_figures", "fmt_num", "fmt_p", "intro"]
