"""``reproduce`` end to end on a tiny random Llama: report structure, every table has rows, a rerun hits the cache."""

from __future__ import annotations

import pytest

from tests.cli_helpers import assert_cli_error
from tests.reproduce_checks import check_report, md_without_costs
from tlcap.reproduce.run import papers_of, reproduce
from tlcap.reproduce.scales import ScaleConfig
from tlcap.results import load_result

pytestmark = pytest.mark.heavy  # over ~5 s per module: runs after the fast gate (make unit)

TINY = ScaleConfig(name="smoke", cnl_datasets=("emotion",), cnl_eval_datasets=("emotion",), cnl_locate_n=4,
                   cnl_eval_n=2, enhance_eval_n=2, cross_eval_n=2, ql_n_facts=2, ql_sig_facts=1, ql_max_queries=3, n_boot=200,
                   cnl_eval_facts=1, cnl_eval_pairs=2, cnl_eval_known_top_k=None)


@pytest.fixture(scope="module")
def runs(tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "out"
    first = reproduce(tiny_llama, out, papers=("cnl", "ql"), scale=TINY)
    first_md = md_without_costs(out)
    second = reproduce(tiny_llama, out, papers=("cnl", "ql"), scale=TINY)
    return out, first, first_md, second


def test_report_structure_and_every_table_has_rows(runs):
    out, first, _, _ = runs
    report = check_report(out, ("cnl", "ql"))
    assert first.computed  # the first run computed its stages
    statuses = {s.name: s.status for s in report.stages}
    assert statuses["cnl.locate.emotion"] == "cached"  # the saved report is the second run's
    # stage costs: every computed stage has a prediction and a measurement (cnl.compare only composes
    # results computed by other stages, and ql.facts without a known-fact test only reads and tokenizes
    # ParaRel: their model is 0 s)
    assert TINY.ql_known_top_k is None
    for s in first.report.stages:
        if s.status == "computed":
            assert s.predicted_s is not None and s.measured_s > 0, s
            assert s.predicted_s > 0 or (s.name in ("cnl.compare", "ql.facts") and s.predicted_s == 0), s


def test_table4_composes_the_suite_and_the_locate_results(runs):
    out, first, _, _ = runs
    rows = {(r.item, r.row.split(" (")[0]): r for r in first.report.report_rows()}
    # Table 4's KN / ROME / KC overlaps are the fidelity experiment's, CNL's is the located split-half overlap
    for method, fid in (("KN", "KN · overlap"), ("ROME", "ROME · overlap"), ("KC", "KC · overlap")):
        assert rows[("CNL Table 4", f"{method} · Overlap")].ours == rows[("CNL §3.1 fidelity", fid)].ours
    loc = load_result(next((out / "cache").glob("cnl.locate.emotion-" + "?" * 16)) / "location")
    assert rows[("CNL Table 4", "CNL · Overlap")].ours == pytest.approx(loc.split_overlap)
    # the decoupling rates and Fig. 2 have rows of ours
    assert rows[("CNL §4 decoupling", "C12 overlap-normalised")].ours is not None


def test_rerun_hits_the_cache_and_gives_the_same_report(runs):
    out, first, first_md, second = runs
    assert second.executed == () and second.computed == []
    assert {r.status for r in second.records} <= {"cached", "pending"}
    assert {r.name for r in first.records if r.status == "computed"} == {r.name for r in second.records if r.status == "cached"}
    assert md_without_costs(out) == first_md  # same rows, CIs, verdicts and figures


def test_one_stage_reuses_the_shared_localization(runs, tiny_llama, tmp_path):
    out, _, _, _ = runs
    run = reproduce(tiny_llama, tmp_path / "one", papers=("ql",), scale=TINY, only=["ql.fig4"], cache_dir=out / "cache")
    assert run.executed == ()  # ql.facts, ql.localize.ig and ql.fig4 all come from the first run's cache
    assert [r.name for r in run.records] == ["ql.facts", "ql.localize.ig", "ql.fig4"]


def test_papers_of():
    assert papers_of("all") == ("cnl", "ql") and papers_of("ql") == ("ql",)


def test_cli_rejects_an_unknown_paper_and_scale(tmp_path):
    assert_cli_error(["reproduce", "qx", "--model", "gpt2-tiny", "--out", str(tmp_path / "o")], "unknown paper 'qx'", exact=False,
                     out=tmp_path / "o")
    assert_cli_error(["reproduce", "ql", "--model", "gpt2-tiny", "--scale", "huge", "--out", str(tmp_path / "o")],
                     "unknown scale 'huge'", out=tmp_path / "o", exact=False)
