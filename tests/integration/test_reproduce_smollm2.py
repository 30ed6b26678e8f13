"""``tlcap reproduce all --scale smoke`` on the real SmolLM2: report structure, every table has rows, rerun is cached."""

from __future__ import annotations

import pytest

from tests.cli_helpers import run_cli
from tests.reproduce_checks import check_report, md_without_costs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smoke(smollm2, tmp_path_factory):  # smollm2: skip when the offline model is missing
    out = tmp_path_factory.mktemp("repro") / "smoke"
    args = ["reproduce", "all", "--model", "smollm2-135m", "--scale", "smoke", "--out", str(out), "--no-progress"]
    first = run_cli(args)
    first_md = md_without_costs(out) if (out / "report.md").exists() else ""
    second = run_cli(args)
    return out, first, first_md, second


def test_smoke_report_structure_and_every_table_has_rows(smoke):
    out, first, _, _ = smoke
    assert first.code == 0, first.stderr[-3000:]
    check_report(out, ("cnl", "ql"))
    # the plan with predicted cost is printed before the run, predicted vs measured after it
    assert first.stdout.index("predicted") < first.stdout.index("cnl.locate.gsm8k: computed")
    assert "predicted vs measured:" in first.stdout


def test_smoke_rerun_recomputes_nothing(smoke):
    out, _, first_md, second = smoke
    assert second.code == 0, second.stderr[-3000:]
    assert ": computed" not in second.stdout and "cnl.locate.gsm8k: cached" in second.stdout
    assert "calibration probe" not in second.stdout  # nothing to run: no probe either
    assert md_without_costs(out) == first_md
