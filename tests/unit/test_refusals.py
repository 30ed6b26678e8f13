"""Issue 28: every bad input refused before the work, for the right reason; messages a person can act on.

Each class of the issue has a case here. "Before the work" is checked, not assumed: the tiny
model's loader is replaced by one that fails the test, so a refusal that needed the model (or came
after it) shows up as a failure, and ``assert_cli_error`` checks that nothing was written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.errors import InvalidConfigError, TlcapError, TlcapWarning
from tlcap.models import loading
from tlcap.models.spec import model_spec
from tlcap.runtime.run_control import RunControl

FACT = ["--prompt", "The capital of France is", "--subject", "France"]


@pytest.fixture()
def no_model_load(monkeypatch):
    """Loading gpt2-tiny fails the test: the refusal must come before the load."""

    def loaded(**_):
        raise AssertionError("the model was loaded before the input was refused")

    monkeypatch.setitem(loading.REGISTRY, "gpt2-tiny", loaded)


def test_model_shapes_come_from_the_config_without_weights(monkeypatch):
    monkeypatch.setitem(loading.REGISTRY, "gpt2-tiny", lambda **_: pytest.fail("loaded"))
    s = model_spec("gpt2-tiny")
    assert (s.n_layers, s.n_heads, s.d_mlp, s.n_ctx) == (2, 4, 256, 128)
    assert (model_spec("smollm2-135m").n_layers, model_spec("smollm2-135m").d_mlp) == (30, 1536)
    assert (model_spec("qwen2-tiny").n_layers, model_spec("qwen2-tiny").d_mlp) == (2, 128)
    assert model_spec("no-such-model") is None


# ------------------------------------------------------------------ refused only after the work
@pytest.mark.parametrize("args, message", [
    (["cnl", "reliability", "--model", "gpt2-tiny", "--parts", "rome", "--rome-layers", "0,7"],
     "rome_layers (--rome-layers) [7] out of range for gpt2-tiny (2 layers: 0..1)"),
    (["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--layers", "1-3"],
     "layers (--layers) [2, 3] out of range for gpt2-tiny (2 layers: 0..1)"),
    (["trace", "--model", "gpt2-tiny", *FACT, "--layers", "0-5"],
     "layers (--layers) [2, 3, 4, 5] out of range for gpt2-tiny (2 layers: 0..1)"),
    (["edit", "--model", "gpt2-tiny", *FACT, "--target-new", " Rome", "--layer", "2"],
     "layer (--layer) 2 out of range for gpt2-tiny (2 layers: 0..1)"),
    # accepted and meaningless before: every layer located for every rewrite, an overlap of 1 by construction
    (["cnl", "fidelity", "--model", "gpt2-tiny", "--methods", "trace", "--trace-top-k", "2"],
     "trace.top_k (--trace-top-k) must be below the 2 layers of gpt2-tiny, got 2: with every layer located for every "
     "rewrite the overlap is 1 by construction; use a smaller --trace-top-k (the paper: 3)"),
    # --set takes the config's dotted names; another name is refused with the names it could be
    (["cnl", "fidelity", "--model", "gpt2-tiny", "--set", "trace.windw=3"],
     "unknown TraceConfig field 'windw'; choose one of: kinds, layers, window, samples, noise_std, noise_factor, "
     "noise_from, bos, seed, top_k, use_attribute, batch_rows, max_memory, prefix_reuse, skip_pre_subject, late_expand, "
     "tokens"),
])
def test_model_dependent_ranges_are_refused_before_the_load_and_the_draw(tmp_path, no_model_load, args, message):
    out = tmp_path / "run"
    assert_cli_error([*args, "--out", str(out)], message, out=out)


def test_trace_k_is_refused_by_the_api_too(tiny_llama):
    from tlcap.data.rewrites import RewriteFact
    from tlcap.experiments.cnl_eval import fidelity

    fact = RewriteFact("France", " Paris", ("The capital of France is", "France's capital is"), "P36", "a", " Rome")
    with pytest.raises(InvalidConfigError, match=r"trace.top_k \(--trace-top-k\) must be below the 2 layers"):
        fidelity(tiny_llama, [fact], methods=("trace",), trace__top_k=2, run=RunControl(progress=False))


def test_reproduce_refuses_a_bad_n_boot_out_and_only_before_the_model(tmp_path, no_model_load):
    base = ["reproduce", "ql", "--model", "gpt2-tiny"]
    out = tmp_path / "repro"
    assert_cli_error([*base, "--n-boot", "-5", "--out", str(out)], "n_boot (--n-boot) must be >= 1, got -5", out=out)
    assert_cli_error([*base, "--only", "ql.nope", "--out", str(out)], "unknown stage 'ql.nope' (--only); choose one of: ",
                     out=out, exact=False)
    (tmp_path / "file").write_text("x")
    assert_cli_error([*base, "--out", str(tmp_path / "file")], f"--out {tmp_path / 'file'} is a file; give a folder path")
    assert os.listdir(tmp_path) == ["file"]  # no cache folder left behind


# ------------------------------------------------------------------ output folders not checked
@pytest.mark.parametrize("cmd", [
    ["kn", "--model", "gpt2-tiny", "--prompt", "The capital of France is", "--target", " Paris"],
    ["trace", "--model", "gpt2-tiny", *FACT],
    ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion"],
    ["reproduce", "ql", "--model", "gpt2-tiny"],
])
@pytest.mark.parametrize("place", ["/proc/tlcap-test/run", "/sys/tlcap-test"])
def test_out_where_nothing_can_be_created_is_refused_before_the_load(no_model_load, cmd, place):
    # as root, os.access says /proc and /sys are writable; creating a folder there fails: that is what is checked
    run = run_cli([*cmd, "--out", place])
    assert run.code == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --out {place} cannot be written (") and last.endswith("; choose another folder")


# ------------------------------------------------------------------ the wrong cause named
def _summary(tmp_path: Path, neurons) -> Path:
    d = tmp_path / "located"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"task": "emotion", "sigma": 3.0, "neurons": neurons}))
    return d


@pytest.mark.parametrize("neurons, message", [
    ([[0, 1], [1]], "'neurons' entry 1 is [1], not a [layer, neuron] pair of integers >= 0; pass the summary.json written "
                    "by `tlcap cnl locate`"),
    ([[0, "a"]], "'neurons' entry 0 is [0, 'a'], not a [layer, neuron] pair of integers >= 0"),
    ({"0": 1}, "'neurons' is a dict, not a list of [layer, neuron] pairs"),
])
def test_a_malformed_neurons_list_is_named_not_blamed_on_the_model(tmp_path, no_model_load, neurons, message):
    src = _summary(tmp_path, neurons)
    out = tmp_path / "run"
    run = assert_cli_error(["cnl", "erase", "--model", "gpt2-tiny", "--dataset", "emotion", "--neurons", str(src),
                            "--out", str(out)], message, out=out, exact=False)
    assert str(src / "summary.json") in run.stderr


def test_neurons_of_another_model_are_refused_before_the_load(tmp_path, no_model_load):
    src = _summary(tmp_path, [[0, 3], [5, 900]])
    out = tmp_path / "run"
    assert_cli_error(["cnl", "enhance", "--model", "gpt2-tiny", "--dataset", "emotion", "--neurons", str(src), "--out",
                      str(out)],
                     f"the neurons in {src / 'summary.json'} reach layer 5 and neuron 900, but gpt2-tiny has 2 layers of "
                     "256 neurons; locate them on the same model (or pass --model of the locate run)", out=out)


def test_enhance_refuses_zero_random_sets_before_the_load(tmp_path, no_model_load):
    src = _summary(tmp_path, [[0, 3]])
    out = tmp_path / "run"
    assert_cli_error(["cnl", "enhance", "--model", "gpt2-tiny", "--dataset", "emotion", "--neurons", str(src), "--out",
                      str(out), "--n-random", "0"], "n_random (--n-random) must be >= 1, got 0", out=out)


@pytest.mark.parametrize("task, name, rows", [
    ("gsm8k", "train.jsonl", "\n".join(json.dumps({"question": f"q{i}"}) for i in range(3))),
    ("svamp", "SVAMP.json", json.dumps([{"Body": "b", "Question": "q", "Answer": 1}] * 6)),
])
def test_a_data_file_missing_a_field_names_it_without_a_useless_strict_hint(tmp_path, no_model_load, task, name, rows):
    d = tmp_path / "data" / task
    d.mkdir(parents=True)
    (d / name).write_text(rows)
    out = tmp_path / "run"
    run = assert_cli_error(["cnl", "locate", "--model", "gpt2-tiny", "--dataset", task, "--data-dir", str(tmp_path / "data"),
                            "--n", "4", "--out", str(out)], "no row could be read (", out=out, exact=False)
    field = "'answer'" if task == "gsm8k" else "'Equation'"
    assert f"no {field} field" in run.stderr and "--strict" not in run.stderr and "has no samples" not in run.stderr


def _emotion(tmp_path: Path, lines: list[str]) -> Path:
    d = tmp_path / "data"
    (d / "emotion").mkdir(parents=True)
    for split in ("train", "test"):
        (d / "emotion" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return d


def test_every_sample_skipped_says_why_and_leaves_no_checkpoint(tmp_path):
    long = " ".join(["word"] * 300)  # beyond gpt2-tiny's 128-token context
    data = _emotion(tmp_path, [f"{long} {i};joy" for i in range(4)])
    out = tmp_path / "run"
    assert_cli_error(["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--data-dir", str(data), "--n", "4",
                      "--steps", "1", "--out", str(out)],
                     "every one of the 4 samples would be skipped (4 too long for the 128-token context of "
                     "gpt2-tiny-random-seed0, 0 with an empty answer): nothing to score; use shorter samples, a smaller "
                     "--max-answer-tokens, or a model with a longer context", out=out)  # and no .run.checkpoints beside it


def test_a_one_sample_dataset_is_not_told_to_raise_n(tmp_path, no_model_load):
    data = _emotion(tmp_path, ["i feel fine;joy"])
    out = tmp_path / "run"
    assert_cli_error(["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--data-dir", str(data), "--n", "50",
                      "--out", str(out)],
                     "emotion 'train' has 1 usable sample (asked for 50); the split-half test needs at least 2: point "
                     "--data-dir at a file with more samples", out=out)


# ------------------------------------------------------------------ messages
def test_warnings_are_one_line_each_once_per_run_before_the_error(tmp_path, monkeypatch):
    import warnings

    import tlcap.cli.kn as kn_cmd

    def noisy(*a, **k):
        for _ in range(3):  # e.g. once per rewrite
            warnings.warn(TlcapWarning("the same thing\n   on two lines"), stacklevel=1)
        warnings.warn(TlcapWarning("another thing"), stacklevel=1)
        raise TlcapError("it failed")

    monkeypatch.setattr(kn_cmd, "load", lambda *a, **k: None)
    monkeypatch.setattr(kn_cmd, "locate_knowledge_neurons", noisy)
    out = tmp_path / "run"
    run = run_cli(["kn", "--model", "gpt2-tiny", "--prompt", "a", "--target", " b", "--out", str(out)])
    lines = [ln for ln in run.stderr.splitlines() if ln.strip() and not ln.startswith("loading ")]
    assert lines == ["warning: the same thing on two lines", "warning: another thing", "error: it failed"]
    assert run.code == 2


def test_an_interrupted_run_says_how_to_resume_and_the_rerun_does(tmp_path, monkeypatch):
    from tlcap.attribution import dataset as ds

    real = ds._score_window
    calls = {"n": 0}

    def stop_at_the_fourth(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ds, "_score_window", stop_at_the_fourth)
    out = tmp_path / "run"
    args = ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--n", "8", "--method", "grad_x_act",
            "--max-answer-tokens", "1", "--convergence-points", "2", "--checkpoint-every", "1", "--out", str(out)]
    run = run_cli(args)
    assert run.code == 130 and not out.exists()
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: interrupted; --out {out} is unchanged; rerun the same command to resume: the work done so far is kept "
        f"in {tmp_path / '.run.checkpoints'}")
    calls["n"] = 100
    again = run_cli(args)
    assert again.code == 0, again.stderr[-2000:]
    assert calls["n"] == 100 + 5  # the 3 samples done were not scored again
    assert json.loads((out / "summary.json").read_text())["n_samples"] == 8


def test_a_full_disk_in_a_command_is_one_line(tmp_path, monkeypatch):
    import errno

    from tlcap import atomic

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full)
    out = tmp_path / "run"
    run = assert_cli_error(["kn", "--model", "gpt2-tiny", "--prompt", "The capital of France is", "--target", " Paris",
                            "--steps", "1", "--n-random", "0", "--out", str(out)],
                           "the disk is full (No space left on device); free some space; --out", out=out, exact=False)
    assert "error: cannot write " in run.stderr


# ------------------------------------------------------------------ a retry does not redo the draw or the scan
def test_a_retry_reuses_the_pararel_scan(tmp_path, monkeypatch):
    import tlcap.cli.ql as ql_cmd

    real_scan = ql_cmd.scan_pararel
    scans = []

    def counted(*a, **k):
        scans.append(1)
        return real_scan(*a, **k)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ql_cmd, "scan_pararel", counted)
    real_mapping = ql_cmd.ql.query_kn_mapping
    monkeypatch.setattr(ql_cmd.ql, "query_kn_mapping", interrupted)
    out = tmp_path / "run"
    args = ["ql", "mapping", "--model", "gpt2-tiny", "--relations", "P36", "--n-facts", "2", "--known-top-k", "40000",
            "--max-scan", "6", "--steps", "1", "--max-queries", "2", "--out", str(out)]
    first = run_cli(args)
    assert first.code == 130 and "rerun the same command to resume" in first.stderr.splitlines()[-1]
    assert len(list((tmp_path / ".run.checkpoints").glob("pararel-scan-*.json"))) == 1
    monkeypatch.setattr(ql_cmd.ql, "query_kn_mapping", real_mapping)
    again = run_cli(args)
    assert again.code == 0, again.stderr[-2000:]
    assert len(scans) == 1  # the model's answers were not scanned again
    assert json.loads((out / "summary.json").read_text())["pararel"]["relations"][0]["tested"] > 0


def test_a_retry_reuses_the_drawn_facts(tmp_path, monkeypatch):
    import tlcap.cli.cnl_eval as eval_cmd
    from tlcap.data.rewrites import RewriteFact

    facts = [RewriteFact("France", " Paris", ("The capital of France is", "France's capital is"), "P36", "a", " Rome")]
    draws = []

    def draw(*a, **k):
        draws.append(1)
        return facts

    real = eval_cmd.fidelity

    def fails_once(*a, **k):
        if len(draws) == 1 and not getattr(fails_once, "done", False):
            fails_once.done = True
            raise TlcapError("the first fact failed")
        return real(*a, **k)

    monkeypatch.setattr(eval_cmd, "rewrite_facts", draw)
    monkeypatch.setattr(eval_cmd, "fidelity", fails_once)
    out = tmp_path / "run"
    args = ["cnl", "fidelity", "--model", "gpt2-tiny", "--methods", "kn", "--steps", "1", "--top-k", "3", "--n", "1",
            "--out", str(out)]
    assert run_cli(args).code == 2
    again = run_cli(args)
    assert again.code == 0, again.stderr[-2000:]
    assert len(draws) == 1
    assert json.loads((out / "facts.json").read_text())["facts"][0]["subject"] == "France"


def test_reproduce_keeps_its_fact_draw_for_the_next_run(tiny_llama, tmp_path, monkeypatch):
    # the suite's ParaRel draw runs the model; the stage key needs it: a rerun (or a retry) reads it from the cache
    from tlcap.reproduce import suite_stages
    from tlcap.reproduce.run import build_stages
    from tlcap.reproduce.scales import ScaleConfig
    from tlcap.reproduce.stages import Runner

    real, draws = suite_stages.rewrite_facts, []

    def counted(*a, **k):
        draws.append(1)
        return real(*a, **k)

    monkeypatch.setattr(suite_stages, "rewrite_facts", counted)
    sc = ScaleConfig(cnl_datasets=("emotion",), cnl_eval_datasets=("emotion",), cnl_eval_facts=1, cnl_eval_known_top_k=None)
    keys = [Runner(build_stages(("cnl",), sc), tmp_path / "cache", tiny_llama).key("cnl.fidelity") for _ in range(2)]
    assert keys[0] == keys[1] and len(draws) == 1
    assert len(list((tmp_path / "cache" / "draws").glob("rewrite-facts-*.json"))) == 1
