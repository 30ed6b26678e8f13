"""``tlcap circuit --dataset``: summary.json with the faithfulness curve, CPR/CMD and pruning; exports; mode errors."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.locate.circuits.dataset_circuit import DatasetCircuit
from tlcap.locate.circuits.export import read_circuit_dot, read_circuit_json

ROWS = [
    {"prompt": "The capital of France is", "target": " Paris", "corrupt_prompt": "The capital of Italy is"},
    {"prompt": "London is the capital of", "target": " England", "corrupt_prompt": "Paris is the capital of"},
    {"prompt": "The language of France is", "target": " French", "corrupt_prompt": "The language of Italy is"},
]


def test_cli_dataset_contract(tmp_path):
    data = tmp_path / "facts.json"
    data.write_text(json.dumps(ROWS))
    out = tmp_path / "run"
    run = run_cli(["circuit", "--model", "gpt2-tiny", "--dataset", str(data), "--ablation", "mean", "--top-n", "20",
                   "--greedy", "--ig-steps", "1", "--batch-size", "2", "--sweep", "0,5,297", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    res = DatasetCircuit.load(out / "result")
    assert s["n_items"] == 3 and s["ablation"] == "mean" and s["selection"] == "greedy" and s["dataset"] == "facts.json"
    assert s["faithfulness_curve"]["n_requested"] == [0, 5, 20, 297]  # the circuit's own size joins the curve
    assert s["faithfulness_curve"]["faithfulness"][0] == pytest.approx(0.0, abs=1e-5)
    assert s["faithfulness_curve"]["faithfulness"][-1] == pytest.approx(1.0, abs=1e-4)
    assert s["cpr"] == pytest.approx(res.curve.cpr) and "greedy" in s["pruning"]
    assert s["circuit_faithfulness"] == pytest.approx(res.curve.faithfulness[2])
    assert sorted(read_circuit_json(out / "circuit.json")) == sorted(read_circuit_dot(out / "circuit.dot"))
    assert len(read_circuit_json(out / "circuit.json")) == s["n_edges"] <= 20
    assert (out / "faithfulness.html").exists() and "CPR" in run.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dataset", "pararel", "--prompt", "The capital of France is"],
         "give --dataset or --prompt/--target/--corrupt-prompt, not both"),
        (["--relation", "P36"], "give --prompt and --target (one fact), or --dataset (pararel, known or a file)"),
        (["--prompt", "x", "--target", " y", "--relation", "P36"],
         "--relation and --n-items select dataset items: use them with --dataset"),
        (["--dataset", "pararel", "--ablation", "median"],
         "unknown ablation 'median'; choose one of: corrupt, zero, mean, mean-positional"),
        (["--dataset", "pararel", "--batch-size", "0"], "batch_size (--batch-size) must be >= 1, got 0"),
    ],
)
def test_dataset_mode_errors_before_loading(tmp_path, extra, message):
    out = tmp_path / "run"
    assert_cli_error(["circuit", "--model", "no-such-model", *extra, "--out", str(out)], message, out=out)
