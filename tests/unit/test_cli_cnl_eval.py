"""``tlcap cnl fidelity|reliability|decouple`` on a tiny random model: outputs, resume after an
interrupt, and the error contract (one line, exit 2, nothing written)."""

from __future__ import annotations

import importlib
import json

import pytest

from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.data.rewrites import RewriteFact, save_rewrites
from tlcap.results import load_result

pytestmark = pytest.mark.heavy  # seconds per module: runs after the fast gate (make unit)

FACTS = [
    RewriteFact("France", " Paris", ("The capital of France is", "France's capital is"), "P36", "a", " Rome"),
    RewriteFact("Germany", " Berlin", ("The capital of Germany is", "Germany's capital is"), "P36", "b", " Paris"),
]
TINY = ["--model", "gpt2-tiny", "--steps", "2", "--top-k", "4"]


@pytest.fixture(scope="module")
def facts_file(tmp_path_factory):
    return str(save_rewrites(FACTS, tmp_path_factory.mktemp("facts") / "facts.json"))


def test_cli_fidelity(tmp_path, facts_file):
    out = tmp_path / "fid"
    run = run_cli(["cnl", "fidelity", *TINY, "--facts", facts_file, "--methods", "kn,trace", "--trace-top-k", "1",
                   "--trace-samples", "1", "--bos", "--set", "trace.window=1", "--set", "kn.ig.method=joint",
                   "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    res = load_result(out / "result")
    assert s["n_facts"] == 2 and s["methods"] == ["kn", "trace"]
    assert res.config["trace"]["bos"] is True  # --bos reaches the trace's settings (its effect: test_cnl_eval_fidelity)
    assert res.config["trace"]["window"] == 1 and res.config["kn"]["ig"]["method"] == "joint"  # --set, dotted names
    assert s["kn"]["overlap"]["value"] == pytest.approx(res.estimate("kn").value)
    assert s["kn"]["overlap"]["paper"] == 0.373
    assert set(s["tables"]) == {"fidelity.csv", "fidelity_rewrites.csv"} and (out / "fidelity.html").exists()
    assert json.loads((out / "facts.json").read_text())["facts"][0]["subject"] == "France"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fid"]  # no checkpoints / staging left


def test_cli_decouple_resumes(tmp_path, monkeypatch):
    dec_mod = importlib.import_module("tlcap.experiments.cnl_eval.decoupling")
    out = tmp_path / "dec"
    args = ["cnl", "decouple", *TINY, "--n", "3", "--sources", "template", "--out", str(out)]
    calls = []
    orig = dec_mod._pair_items

    def flaky(model, pairs, cfg):
        calls.extend(p.main for p in pairs)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return orig(model, pairs, cfg)

    monkeypatch.setattr(dec_mod, "PAIR_WINDOW", 1)  # one pair per window: the interrupt falls between pairs
    monkeypatch.setattr(dec_mod, "_pair_items", flaky)
    assert run_cli(args).code == 130  # Ctrl-C: "aborted"
    assert not out.exists() and (tmp_path / ".dec.checkpoints" / "items.json").exists()
    run = run_cli(args)
    assert run.code == 0, run.stderr[-3000:]
    assert len(calls) == 4  # pair 1 twice (interrupted, then resumed), pairs 2, 3 once; pair 0 from the checkpoint
    s = json.loads((out / "summary.json").read_text())
    assert s["n_pairs"] == 3 and s["c12"]["literal"]["paper"] == 0.156
    assert {"decoupling_pairs.csv", "decoupling_rates.csv"} == set(s["tables"])
    assert not (tmp_path / ".dec.checkpoints").exists()


@pytest.mark.parametrize("command", ["fidelity", "reliability", "decouple"])
def test_cli_rule_is_checked_before_loading(tmp_path, command):
    out = tmp_path / "o"
    assert_cli_error(["cnl", command, *TINY, "--n", "1", "--rule", "simpson", "--out", str(out)],
                     "unknown rule 'simpson' (--rule); choose one of: midpoint, left, right, linspace, trapezoid, "
                     "cnl, gauss_legendre", out=out)


def test_cli_decouple_rule_reaches_the_ig_config(tmp_path):
    out = tmp_path / "dec"
    run = run_cli(["cnl", "decouple", *TINY, "--n", "1", "--sources", "template", "--rule", "gauss_legendre",
                   "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    ig = json.loads((out / "summary.json").read_text())["provenance"]["config"]["kn"]["ig"]
    assert (ig["rule"], ig["steps"]) == ("gauss_legendre", 2)


def test_cli_reliability_kn(tmp_path, facts_file):
    out = tmp_path / "rel"
    run = run_cli(["cnl", "reliability", *TINY, "--facts", facts_file, "--parts", "kn", "--n-random", "2",
                   "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["kn"]["double"]["located_rise"]["paper"] == 0.851
    assert (out / "reliability_kn.csv").exists() and (out / "reliability_kn.html").exists()


def test_cli_reliability_merge(tmp_path, facts_file):
    # a KN run and a KC run of the same facts merge into one result with both parts; runs over
    # other facts are refused with a one-line error
    for part in ("kn", "kc"):
        run = run_cli(["cnl", "reliability", *TINY, "--facts", facts_file, "--parts", part, "--n-random", "2",
                       "--n-random-circuits", "2", "--kc-top-n", "5", "--kc-steps", "1", "--out", str(tmp_path / part)])
        assert run.code == 0, run.stderr[-3000:]
    out = tmp_path / "both"
    run = run_cli(["cnl", "reliability-merge", str(tmp_path / "kn"), str(tmp_path / "kc"), "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    merged, kn, kc = (load_result(p / "result") for p in (out, tmp_path / "kn", tmp_path / "kc"))
    assert merged.parts == ("kn", "kc") and merged.kn_rows == kn.kn_rows and merged.kc_rows == kc.kc_rows
    assert {"reliability_kn.csv", "reliability_kc.csv"} <= set(json.loads((out / "summary.json").read_text())["tables"])
    one = tmp_path / "one"
    save_rewrites(FACTS[:1], one / "f.json")
    assert run_cli(["cnl", "reliability", *TINY, "--facts", str(one / "f.json"), "--parts", "kn", "--n-random", "2",
                    "--out", str(one / "run")]).code == 0
    assert_cli_error(["cnl", "reliability-merge", str(tmp_path / "kn"), str(one / "run"), "--out", str(tmp_path / "x")],
                     "the runs must share one facts.json", out=tmp_path / "x", exact=False)


@pytest.mark.parametrize("cmd, extra, message", [
    ("fidelity", ["--methods", "kn,rome"], "unknown methods[1] 'rome' (--methods); choose one of: kn, trace, kc"),
    ("fidelity", ["--n", "0"], "n (--n) must be >= 1, got 0"),
    ("fidelity", ["--n-rewrites", "1"], "n_rewrites (--n-rewrites) must be >= 2, got 1"),
    ("fidelity", ["--max-misses", "-1"], "max_misses (--max-misses) must be >= 0 (0 = only --max-scan), got -1"),
    ("reliability", ["--max-scan", "0"], "max_scan (--max-scan) must be >= 1, got 0"),
    ("reliability", ["--parts", "kc,x"], "unknown parts[1] 'x' (--parts); choose one of: kn, rome, kc"),
    ("reliability", ["--rome-layers", "1,a"], "--rome-layers must be comma-separated integers, e.g. '0,5,10', got '1,a'"),
    ("decouple", ["--sources", "mmlu"], "unknown source 'mmlu' (--sources); choose one of: template, gsm8k, svamp"),
    ("decouple", ["--max-operand", "1"], "max_operand (--max-operand) must be >= 2, got 1"),
])
def test_cli_errors(tmp_path, cmd, extra, message):
    out = tmp_path / "x"
    assert_cli_error(["cnl", cmd, "--model", "gpt2-tiny", *extra, "--out", str(out)], message, out=out, exact=False)


def test_cli_compare(tmp_path):
    from tests.reliability_rows import REL, _fid

    _fid().save(tmp_path / "fid" / "result")
    REL.save(tmp_path / "rel" / "result")
    (tmp_path / "erase.json").write_text(json.dumps({"located_accuracy": 0.2,
                                                     "random_accuracies": [0.5, 0.45, 0.6, 0.4, 0.55]}))
    (tmp_path / "loc.json").write_text(json.dumps({"split_overlap": 0.9, "n_neurons": 10}))
    out = tmp_path / "t4"
    run = run_cli(["cnl", "compare", "--fidelity", str(tmp_path / "fid"), "--reliability", str(tmp_path / "rel"),
                   "--cnl-locate", str(tmp_path / "loc.json"), "--cnl-erase", str(tmp_path / "erase.json"),
                   "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["kn"]["overlap"]["value"] == pytest.approx(30.0) and s["kn"]["overlap"]["paper"] == 37.3
    assert s["cnl"]["ipp"]["value"] == pytest.approx(20.0) and s["cnl"]["neuron"]["value"] is None
    assert (out / "table4.csv").exists() and (out / "table4.html").exists()
    # a saved erase result (e.g. a reproduce stage's sigma3/) is read through its summary()
    from tlcap.experiments.cnl.erase import EraseResult

    EraseResult("emotion", 0.7, 0.2, 0.5, (0.5, 0.45, 0.6, 0.4, 0.55), n_neurons=10, n_eval=20).save(tmp_path / "sigma3")
    out2 = tmp_path / "t4b"
    run = run_cli(["cnl", "compare", "--fidelity", str(tmp_path / "fid"), "--cnl-locate", str(tmp_path / "loc.json"),
                   "--cnl-erase", str(tmp_path / "sigma3"), "--out", str(out2)])
    assert run.code == 0, run.stderr[-3000:]
    assert json.loads((out2 / "summary.json").read_text())["cnl"]["ipp"]["value"] == pytest.approx(20.0)
    assert_cli_error(["cnl", "compare", "--fidelity", str(tmp_path / "fid"), "--cnl-locate", str(tmp_path / "sigma3"),
                      "--out", str(tmp_path / "z")], "holds a EraseResult, not the result of `tlcap cnl locate`",
                     out=tmp_path / "z", exact=False)
    assert_cli_error(["cnl", "compare", "--fidelity", str(tmp_path / "rel"), "--out", str(tmp_path / "y")],
                     "holds a ReliabilityResult, not the result of `tlcap cnl fidelity`", out=tmp_path / "y", exact=False)
    assert_cli_error(["cnl", "compare", "--out", str(tmp_path / "y")],
                     "compare needs at least one of --fidelity, --reliability, --cnl-locate", out=tmp_path / "y")
