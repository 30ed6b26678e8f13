"""Checks shared by the reproduce tests (unit tier on a tiny model, integration on SmolLM2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tlcap.reproduce.report import Report
from tlcap.reproduce.verdict import WORDS
from tlcap.results import load_result

# Every table / figure of both papers the report must hold rows for (issue 12).
CNL_ITEMS = ("CNL Table 1", "CNL Table 2", "CNL Table 3", "CNL Fig. 5", "CNL §3.1 fidelity", "CNL §3.2 reliability",
             "CNL §4 decoupling", "CNL Table 4", "CNL Fig. 2")
QL_ITEMS = ("QL Table 1", "QL Table 2", "QL Table 3", "QL Fig. 4", "QL Fig. 5", "QL Fig. 7")


def check_report(out: Path, papers: tuple[str, ...]) -> Report:
    """Assert the written report's structure; returns the saved :class:`Report`."""
    md = (out / "report.md").read_text(encoding="utf-8")
    html = (out / "report.html").read_text(encoding="utf-8")
    report = load_result(out / "report")
    assert isinstance(report, Report)
    assert report.papers == papers
    rows = report.report_rows()
    items = report.items()
    expected = (CNL_ITEMS if "cnl" in papers else ()) + (QL_ITEMS if "ql" in papers else ())
    for item in expected:
        mine = [r for r in rows if r.item == item]
        assert mine, f"{item} has no rows"
        assert f"## {item}\n" in md and f"<h2>{item}</h2>" in html
    for r in rows:
        assert r.verdict in WORDS and r.reason, r
        if r.ours is None:  # no number of ours: never a verdict other than "not comparable"
            assert r.verdict == "not comparable", r
        if r.low is not None and r.high is not None and r.ours is not None:
            assert r.low - 1e-9 <= r.ours <= r.high + 1e-9 or r.kind == "effect", r
    # every item's table in the Markdown has one line per row
    for item in items:
        section = md.split(f"## {item}\n", 1)[1].split("\n## ", 1)[0]
        table = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| row |")]
        assert len(table) == sum(r.item == item for r in rows), item
    # figures: one inline plotly div per figure in the HTML, a file per figure on disk
    assert html.count("class=\"plotly-graph-div\"") == len(report.figures) > 0
    for f in report.figures:
        assert list((out / "figures").glob(f"{f.stem}.*")), f.stem
    assert "## Not reproduced" in md and "## Stages: predicted vs measured" in md
    if "cnl" in papers:
        # the CNL evaluation suite (tlcap.experiments.cnl_eval) gives numbers, and a row without one keeps its reason
        for item in ("CNL §3.1 fidelity", "CNL §4 decoupling", "CNL Table 4"):
            mine = [r for r in rows if r.item == item]
            assert any(r.ours is not None for r in mine), item
            assert all(r.ours is not None or r.reason for r in mine), item
    stages = {s.name: s for s in report.stages}
    assert stages and all(s.status in ("computed", "cached", "pending", "blocked", "failed") for s in stages.values())
    assert not [s for s in stages.values() if s.status == "failed"], [s for s in stages.values() if s.status == "failed"]
    csv = (out / "report_rows.csv").read_text(encoding="utf-8").splitlines()
    assert len(csv) == len(rows) + 1
    return report


def table_frame_text(out: Path) -> str:
    """The report rows without the run-dependent stage table (for comparing two runs)."""
    return json.dumps(json.loads((out / "report" / "result.json").read_text())["fields"]["rows"], sort_keys=True) \
        if (out / "report" / "result.json").exists() else ""


def md_without_costs(out: Path) -> str:
    md = (out / "report.md").read_text(encoding="utf-8")
    return re.split(r"## Stages: predicted vs measured", md)[0]
