"""The ``tlcap trace`` and ``tlcap edit`` commands on a tiny random model: outputs and provenance,
and bad inputs (one-line error, exit 2, nothing written)."""

from __future__ import annotations

import json
import warnings

import pytest

from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.locate.subjects import SubjectWarning
from tlcap.results import load_result

FACT = ["--model", "gpt2-tiny", "--prompt", "The capital of France is", "--subject", "France"]
EDIT = ["edit", "--model", "gpt2-tiny", "--prompt", "The capital of France is", "--subject", "France",
        "--target-new", " Rome", "--steps", "2", "--cov-tokens", "256"]


def test_trace_writes_summary_result_and_figure(tmp_path):
    out = tmp_path / "trace"
    run = run_cli(["trace", *FACT, "--samples", "2", "--window", "2", "--kinds", "mlp,resid", "--seed", "4",
                   "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "single" and s["model"] == "gpt2-tiny-random-seed0" and s["kinds"] == ["mlp", "resid"]
    assert s["scores"]["attn"] is None and len(s["scores"]["mlp"]) == len(s["tokens"])
    assert s["provenance"]["config"]["samples"] == 2 and s["provenance"]["seed"] == 4
    assert s["figures"] == ["causal_trace.html", "causal_trace.png"]
    res = load_result(out / "result")
    assert res.summary()["top_layers"] == s["top_layers"]
    assert [p.name for p in tmp_path.iterdir()] == ["trace"]


def test_edit_single_layer_and_all_layers(tmp_path):
    out = tmp_path / "edit"
    run = run_cli([*EDIT, "--layer", "1", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "single" and s["layer"] == 1 and s["provenance"]["config"]["steps"] == 2
    assert set(s["figures"]) == {"rome_edit.html", "rome_edit.png"}
    out2 = tmp_path / "sweep"
    run = run_cli([*EDIT, "--all-layers", "--out", str(out2)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out2 / "summary.json").read_text())
    assert s["mode"] == "all_layers" and s["layers"] == [0, 1] and len(s["efficacy"]) == 2
    assert s["tables"] == ["rome_layers.csv"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--kinds", "foo"], "unknown kind 'foo' (--kinds); choose one of: resid, mlp, attn"),
        (["--samples", "0"], "samples (--samples) must be >= 1, got 0"),
        (["--noise", "-1"], "noise_std (--noise) must be > 0, got -1"),
        (["--layers", "1-x"], "layers (--layers) cannot read '1-x' in '1-x'; give layer numbers >= 0 and ranges "
                              "such as 0-5,10"),
        (["--layers", "-1"], "layers (--layers) cannot read '-1' in '-1'; give layer numbers >= 0 and ranges "
                             "such as 0-5,10"),
        (["--layers", "0-5"], "layers (--layers) [2, 3, 4, 5] out of range for gpt2-tiny (2 layers: 0..1)"),
        (["--window", "0"], "window (--window) must be >= 1, got 0"),
        (["--noise", "0"], "noise_std (--noise) must be > 0, got 0"),
        (["--noise-factor", "0"], "noise_factor (--noise-factor) must be > 0, got 0"),
        (["--noise-from", "foo"], "unknown noise_from 'foo' (--noise-from); choose one of: subjects, embedding"),
        (["--occurrence", "1"], "occurrence (--occurrence) must be in -1..0: subject 'France' occurs 1 time in the "
                                "prompt, got 1"),
        (["--target", " "], "target (--target) must not be empty"),
        (["--tokens", "3,abc"], "tokens (--tokens) 'abc' in '3,abc' is not a position; give all, subject, last_subject "
                                "or positions such as 0,3,-1 (counted with the BOS under --bos)"),
        (["--tokens", "first"], "unknown tokens 'first' (--tokens); choose one of: all, subject, last_subject"),
    ],
)
def test_trace_bad_option_fails_before_any_work(tmp_path, extra, message):
    out = tmp_path / "deep" / "run"
    assert_cli_error(["trace", *FACT, *extra, "--out", str(out)], message, out=out)
    assert list(tmp_path.iterdir()) == []


ABSENT = ("subject 'Germany' does not occur in the prompt 'The capital of France is'; pass the subject exactly as it "
          "is written in the prompt (case and spacing included)")


@pytest.mark.parametrize(
    "args, message",
    [
        (["trace", "--model", "gpt2-tiny", "--prompt", " ", "--subject", "France"], "prompt (--prompt) must not be empty"),
        (["trace", "--model", "gpt2-tiny", "--prompt", "The capital of France is", "--subject", "Germany"], ABSENT),
        (["trace", "--model", "gpt2-tiny", "--prompt", "France or France is", "--subject", "France", "--occurrence", "2"],
         "occurrence (--occurrence) must be in -2..1: subject 'France' occurs 2 times in the prompt, got 2"),
        (["trace", "--model", "gpt2-tiny", "--dataset", "known", "--occurrence", "1"],
         "--dataset traces the dataset's facts; leave out --prompt, --subject, --target and --occurrence"),
        ([*EDIT, "--layer", "-1"], "layer (--layer) must be >= 0, got -1"),
        ([*EDIT, "--layer", "7"], "layer (--layer) 7 out of range for gpt2-tiny (2 layers: 0..1)"),
        ([*EDIT, "--layer", "0", "--steps", "0"], "steps (--steps) must be >= 1, got 0"),
        ([*EDIT, "--layer", "0", "--lr", "0"], "lr (--lr) must be > 0, got 0"),
        ([*EDIT, "--layer", "0", "--cov-tokens", "0"], "cov_tokens (--cov-tokens) must be >= 1, got 0"),
        (["edit", "--model", "gpt2-tiny", "--prompt", "", "--subject", "France", "--target-new", " Rome", "--layer",
          "0"], "prompt (--prompt) must not be empty"),
        (["edit", "--model", "gpt2-tiny", "--prompt", "The capital of France is", "--subject", "Germany",
          "--target-new", " Rome", "--layer", "0"], ABSENT),
        (["edit", "--model", "gpt2-tiny", "--prompt", "The capital of France is", "--subject", "France",
          "--target-new", "", "--layer", "0"], "target_new (--target-new) must not be empty"),
        (["edit", "--model", "gpt2-tiny", "--prompt", "France or France is", "--subject", "France", "--target-new",
          " Rome", "--layer", "0", "--occurrence", "-3"],
         "occurrence (--occurrence) must be in -2..1: subject 'France' occurs 2 times in the prompt, got -3"),
    ],
)
def test_bad_fact_or_option_exits_2_and_leaves_no_out(tmp_path, args, message):
    """Issue 15 input classes for trace/edit: one-line error, exit 2, no --out left."""
    out = tmp_path / "deep" / "run"
    assert_cli_error([*args, "--out", str(out)], message, out=out)
    assert list(tmp_path.iterdir()) == []


def test_ambiguous_subject_warns_and_occurrence_chooses(tmp_path):
    prompt = "France is big and France is"
    base = ["trace", "--model", "gpt2-tiny", "--prompt", prompt, "--subject", "France", "--samples", "1",
            "--window", "1", "--kinds", "mlp"]
    msg = ("subject 'France' occurs 2 times in the prompt 'France is big and France is'; using the first "
           "(occurrence 0); pass occurrence= (--occurrence) to choose another")
    with pytest.warns(SubjectWarning) as rec:
        run = run_cli([*base, "--bos", "--out", str(tmp_path / "a")])
    assert run.code == 0, run.stderr[-3000:]
    assert [str(w.message) for w in rec if w.category is SubjectWarning] == [msg]
    first = json.loads((tmp_path / "a" / "summary.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error", SubjectWarning)
        run = run_cli([*base, "--bos", "--occurrence", "1", "--out", str(tmp_path / "b")])
    assert run.code == 0, run.stderr[-3000:]
    second = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert first["subject_range"] == [1, 2] and second["subject_range"] == [5, 6] and second["bos"] is True
    assert second["tokens"][5].strip() == "France" and second["subject_at_start"] is False
    # without --bos the first occurrence is at position 0: the sink warning (and no ambiguity one)
    with pytest.warns(SubjectWarning) as rec:
        run = run_cli([*base, "--occurrence", "0", "--out", str(tmp_path / "c")])
    assert run.code == 0 and [str(w.message) for w in rec if w.category is SubjectWarning] == [
        "subject 'France' starts the prompt 'France is big and France is': its first token is at position 0, the "
        "model's attention sink, so noising it also corrupts what every later token attends to; pass bos=True (--bos) "
        "to prepend the BOS token"]
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["subject_at_start"] is True
