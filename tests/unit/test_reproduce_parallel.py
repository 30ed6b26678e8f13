"""``reproduce(jobs=2)``: stages computed by worker processes equal the sequential run's; the schedule's wall time."""

from __future__ import annotations

import functools
import json

import pytest

from tests.reproduce_checks import check_report, md_without_costs
from tlcap.config import Config
from tlcap.errors import InvalidConfigError
from tlcap.models import make_llama
from tlcap.reproduce.parallel import critical_path, makespan, threads_per_job
from tlcap.reproduce.run import reproduce
from tlcap.reproduce.scales import ScaleConfig
from tlcap.reproduce.stages import STAGE_FILE, Stage, StageError

pytestmark = pytest.mark.heavy  # over ~5 s per module: runs after the fast gate (make unit)

TINY_QL = ScaleConfig(name="smoke", ql_n_facts=2, ql_sig_facts=1, ql_amig_facts=1, ql_max_queries=3, n_boot=200)


def _stage(name, deps=()):
    return Stage(name, lambda ctx: {}, Config(), deps=tuple(deps))


def _fails(ctx):
    raise RuntimeError("boom")


def _makes_a_result(ctx):
    from tlcap.experiments.cnl.erase import EraseResult

    return {"r": EraseResult("t", 0.5, 0.25, 0.5, (0.5,), n_neurons=1, n_eval=4)}


def _graph():
    """a fails; b needs a; c needs b; d and e (needs d) are fine."""
    return [Stage("a", _fails, Config()), Stage("b", _makes_a_result, Config(), deps=("a",)),
            Stage("c", _makes_a_result, Config(), deps=("b",)), Stage("d", _makes_a_result, Config()),
            Stage("e", _makes_a_result, Config(), deps=("d",))]


def _no_model():
    return None


def test_failed_stage_blocks_its_dependents_in_parallel_as_in_sequence(tmp_path):
    from tlcap.reproduce.parallel import run_parallel, worker_spec
    from tlcap.reproduce.stages import Runner

    seq = Runner(_graph(), tmp_path / "seq", None, keep_going=True)
    want = {r.name: r.status for r in seq.run(seq.plan())}
    assert want == {"a": "failed", "b": "blocked", "c": "blocked", "d": "computed", "e": "computed"}
    par = Runner(_graph(), tmp_path / "par", None, keep_going=True)
    recs = run_parallel(par, par.plan(), worker_spec(_no_model, _graph, tmp_path / "par", 2), 2)
    assert {r.name: r.status for r in recs} == want
    again = Runner(_graph(), tmp_path / "par", None, keep_going=True)  # a rerun: cached stages stay in the parent
    recs = run_parallel(again, again.plan(), worker_spec(_no_model, _graph, tmp_path / "par", 2), 2)
    assert {r.name: r.status for r in recs} == {**want, "d": "cached", "e": "cached"}
    strict = Runner(_graph(), tmp_path / "strict", None, keep_going=False)
    with pytest.raises(RuntimeError, match="boom"):
        run_parallel(strict, strict.plan(), worker_spec(_no_model, _graph, tmp_path / "strict", 2, keep_going=False), 2)


def test_makespan_is_the_greedy_schedule_by_hand():
    plan = [_stage("a"), _stage("b"), _stage("c", ["a"]), _stage("d"), _stage("e", ["b", "d"])]
    sec = {"a": 10, "b": 5, "c": 3, "d": 2, "e": 4}
    assert critical_path(plan, sec) == {"a": 13, "b": 9, "c": 3, "d": 6, "e": 4}
    # 1 job: the sum. 2 jobs, longest critical path first: w0 a 0-10, w1 b 0-5, w1 d 5-7, w1 e 7-11, w0 c 10-13
    assert makespan(plan, sec, 1) == 24
    assert makespan(plan, sec, 2) == 13
    # a short stage gating a long chain starts first: f (1 s) -> g (10 s) beside h (5 s), i (5 s) on 2 workers
    chain = [_stage("h"), _stage("i"), _stage("f"), _stage("g", ["f"])]
    assert makespan(chain, {"f": 1, "g": 10, "h": 5, "i": 5}, 2) == 11  # own-time order (h, i first) would take 16
    # enough workers: the critical path a -> c
    assert makespan(plan, sec, 5) == 13
    assert makespan(plan, {"a": None}, 2) == 0  # cached stages cost nothing
    assert threads_per_job(2, cpus=2) == 1 and threads_per_job(3, cpus=16) == 5 and threads_per_job(4, cpus=2) == 1


@pytest.fixture(scope="module")
def sequential_and_parallel(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("par")
    seq = reproduce(tiny_llama, root / "seq", papers=("ql",), scale=TINY_QL)
    seq_md = md_without_costs(root / "seq")
    par = reproduce(tiny_llama, root / "par", papers=("ql",), scale=TINY_QL, jobs=2,
                    load=functools.partial(make_llama, seed=0))
    return root, seq, seq_md, par


def test_workers_compute_what_the_sequential_run_computes(sequential_and_parallel, tiny_llama):
    root, seq, seq_md, par = sequential_and_parallel
    check_report(root / "par", ("ql",))
    assert sorted(par.computed) == sorted(seq.computed) and par.computed
    assert md_without_costs(root / "par") == seq_md  # same rows, CIs, verdicts, figures
    # each stage was computed once, into the same content key as the sequential run's
    seq_keys = {p.name for p in (root / "seq" / "cache").iterdir() if (p / STAGE_FILE).exists()}
    par_keys = {p.name for p in (root / "par" / "cache").iterdir() if (p / STAGE_FILE).exists()}
    assert seq_keys == par_keys
    for k in par_keys:
        a = json.loads((root / "seq" / "cache" / k / STAGE_FILE).read_text())
        b = json.loads((root / "par" / "cache" / k / STAGE_FILE).read_text())
        assert a["payload"] == b["payload"] and a["results"] == b["results"]
    assert {r.status for r in par.records} == {"computed"}


def test_a_worker_with_another_model_is_refused(sequential_and_parallel, tiny_llama):
    root, _, _, _ = sequential_and_parallel
    with pytest.raises(StageError, match="another key"):
        reproduce(tiny_llama, root / "wrong", papers=("ql",), scale=TINY_QL, jobs=2, only=["ql.facts"],
                  load=functools.partial(make_llama, seed=1))


def test_jobs_needs_a_loader_and_a_positive_count(tiny_llama, tmp_path):
    with pytest.raises(InvalidConfigError, match="load="):
        reproduce(tiny_llama, tmp_path / "o", papers=("ql",), scale=TINY_QL, jobs=2)
    with pytest.raises(InvalidConfigError, match="--jobs"):
        reproduce(tiny_llama, tmp_path / "o", papers=("ql",), scale=TINY_QL, jobs=0)


def test_cli_rejects_jobs_below_one(tmp_path):
    from tests.cli_helpers import assert_cli_error

    assert_cli_error(["reproduce", "ql", "--model", "gpt2-tiny", "--jobs", "0", "--out", str(tmp_path / "o")],
                     "jobs (--jobs) must be >= 1, got 0", out=tmp_path / "o", exact=False)
