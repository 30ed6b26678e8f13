"""The ``tlcap trace`` and ``tlcap edit`` commands on a tiny random model: outputs and provenance,
and bad inputs (one-line error, exit 2, nothing written)."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import assert_cli_error, run_cli
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
    ],
)
def test_trace_bad_option_fails_before_any_work(tmp_path, extra, message):
    out = tmp_path / "deep" / "run"
    assert_cli_error(["trace", *FACT, *extra, "--out", str(out)], message, out=out)
    assert list(tmp_path.iterdir()) == []
