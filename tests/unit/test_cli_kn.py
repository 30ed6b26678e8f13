"""The ``tlcap kn`` command on a tiny random model (contract checked from outside), its bad
inputs (one-line error, exit 2, nothing written), and the output-folder policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli_helpers import assert_cli_error, run_cli

pytestmark = pytest.mark.heavy  # seconds per module: runs after the fast gate (make unit)

FACT = ["--model", "gpt2-tiny", "--prompt", "The capital of France is", "--target", " Paris"]


def test_cli_kn_tiny(tmp_path):
    out = tmp_path / "kn"
    cmd = [sys.executable, "-m", "tlcap", "kn", *FACT, "--steps", "4", "--n-random", "10", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert {"neurons", "target_prob", "completeness_rel_error", "suppress_located_rel_change",
            "suppress_random_rel_change"} <= set(s)
    assert len(s["suppress_random_draws"]) == 10
    assert s["suppress_random_rel_change"] == pytest.approx(sum(s["suppress_random_draws"]) / 10)
    assert (out / "kn_heatmap.html").exists() and (out / "kn_heatmap.png").exists()
    prov = s["provenance"]
    assert prov["model_name"] == "gpt2-tiny-random-seed0" and prov["config"]["ig"]["steps"] == 4 and prov["seed"] == 0
    assert (out / "kn_neurons.csv").exists() and s["tables"] == ["kn_neurons.csv"]
    # nothing but the output folder is left in its parent (no staging folder, no checkpoints)
    assert [p.name for p in tmp_path.iterdir()] == ["kn"]


def test_cli_clear_error_for_unknown_model(tmp_path):
    cmd = [sys.executable, "-m", "tlcap", "kn", "--model", "no-such-model", "--prompt", "a", "--target", " b",
           "--out", str(tmp_path / "x")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 2
    assert "Unknown model" in proc.stderr and "registered name" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--steps", "0"], "steps (--steps) must be >= 1, got 0"),
        (["--threshold", "1.5"], "threshold (--threshold) must be in (0, 1), got 1.5"),
        (["--threshold", "1"], "threshold (--threshold) must be in (0, 1), got 1"),  # score > max: always empty
        (["--threshold", "0"], "threshold (--threshold) must be in (0, 1), got 0"),
        (["--top-k", "0"], "top_k (--top-k) must be >= 1, got 0"),
        (["--refine-p", "1"], "refine_p (--refine-p) must be in [0, 1), got 1"),
        (["--n-random", "-1"], "n_random (--n-random) must be >= 0, got -1"),
        (["--rule", "simpson"], "unknown rule 'simpson' (--rule); choose one of: midpoint, left, right, linspace, "
                               "trapezoid, cnl, gauss_legendre"),
        (["--site", "resid_post"], "unknown site 'resid_post' (--site); choose one of: mlp_post, mlp_pre"),
        (["--method", "sig"], "unknown method 'sig' (--method); choose one of: ig, joint, grad_x_act"),
        (["--steps", "abc"], "Invalid value for '--steps': Input should be a valid integer, unable to parse string "
                             "as an integer (see 'tlcap kn --help')"),
        (["--stepz", "3"], "No such option: --stepz (Possible options: --seed, --site, --steps) (see 'tlcap kn --help')"),
        (["--batch-rows", "0"], "batch_rows (--batch-rows) must be >= 1, got 0"),
        (["--batch-rows", "many"], "--batch-rows must be auto or an integer >= 1, got 'many'"),
        (["--batch-rows", "auto", "--max-memory", "lots"],
         "max_memory (--max-memory) must be a size such as 8GiB or 500MB, got 'lots'"),
        (["--batch-rows", "256", "--max-memory", "1GiB"], "--max-memory applies to --batch-rows auto only; got --batch-rows 256"),
    ],
)
def test_bad_option_fails_before_any_work(tmp_path, extra, message):
    out = tmp_path / "deep" / "run"
    assert_cli_error(["kn", *FACT, *extra, "--out", str(out)], message, out=out)
    assert list(tmp_path.iterdir()) == []  # not even the parent folder


def test_unknown_model_and_empty_prompt(tmp_path):
    out = tmp_path / "run"
    run = assert_cli_error(["kn", "--model", "no-such-model", "--prompt", "a", "--target", " b", "--out", str(out)],
                           "Unknown model 'no-such-model'.", out=out, exact=False)
    assert "registered name" in run.stderr
    assert_cli_error(["kn", "--model", "gpt2-tiny", "--prompt", " ", "--target", " b", "--out", str(out)],
                     "prompt (--prompt) must not be empty", out=out)
    assert_cli_error([*["kn", *FACT], "--paraphrase", "", "--out", str(out)],
                     "paraphrase[0] (--paraphrase) must not be empty", out=out)


def test_out_is_a_file(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    assert_cli_error(["kn", *FACT, "--out", str(f)], f"--out {f} is a file; give a folder path", out=f)
    assert_cli_error(["kn", *FACT, "--out", str(f / "sub")],
                     f"--out {f / 'sub'} cannot be created: {f} is a file; give a folder path", out=f)


def test_no_random_control_and_finished_run_policy(tmp_path):
    out = tmp_path / "run"
    args = ["kn", *FACT, "--steps", "2", "--n-random", "0", "--out", str(out)]
    ok = run_cli(args)
    assert ok.code == 0, ok.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["n_random"] == 0 and s["suppress_random_draws"] == []
    assert s["suppress_random_rel_change"] is None and s["enhance_random_rel_change"] is None  # absent, not +0.0 %
    assert "vs random none (--n-random 0)" in ok.stdout
    assert s["suppress_located_rel_change"] is not None

    # a finished run is never overwritten silently
    assert_cli_error(args, f"{out} already holds a finished run (summary.json); pass --overwrite to replace it "
                           "or choose another --out", out=out)
    # --overwrite replaces it: outputs of the old run that the new one does not write are removed,
    # files the user put there are kept
    (out / "kn_extra_from_old_run.csv").write_text("x")
    manifest = json.loads((out / ".tlcap-run.json").read_text())
    manifest["entries"].append("kn_extra_from_old_run.csv")
    (out / ".tlcap-run.json").write_text(json.dumps(manifest))
    (out / "my_notes.txt").write_text("mine")
    again = run_cli([*args, "--steps", "3", "--overwrite"])
    assert again.code == 0, again.stderr[-3000:]
    s2 = json.loads((out / "summary.json").read_text())
    assert s2["config"]["ig"]["steps"] == 3
    assert not (out / "kn_extra_from_old_run.csv").exists() and (out / "my_notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_batch_rows_auto_with_max_memory_equals_a_fixed_batch(tmp_path):
    """--batch-rows auto --max-memory: the budget reaches IG (recorded in the config) and the neurons equal batch 3's."""
    runs = {}
    for name, extra in (("auto", ["--batch-rows", "auto", "--max-memory", "64KiB"]), ("fixed", ["--batch-rows", "3"])):
        out = tmp_path / name
        run = run_cli(["kn", *FACT, "--steps", "3", "--n-random", "0", *extra, "--out", str(out)])
        assert run.code == 0, run.stderr[-2000:]
        runs[name] = json.loads((out / "summary.json").read_text())
    ig = runs["auto"]["provenance"]["config"]["ig"]
    assert ig["batch_rows"] == "auto" and ig["max_memory"] == "64KiB"
    assert runs["fixed"]["provenance"]["config"]["ig"]["batch_rows"] == 3
    assert runs["auto"]["neurons"] == runs["fixed"]["neurons"]
    assert runs["auto"]["target_prob"] == runs["fixed"]["target_prob"]
