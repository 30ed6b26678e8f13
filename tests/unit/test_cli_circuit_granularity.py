"""``tlcap circuit --granularity node|neuron``: nodes.csv / neurons.csv, summary keys, KN overlap; refused combinations."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.locate.circuits import node_attribution
from tlcap.locate.circuits.dataset_circuit import DatasetCircuit
from tlcap.locate.circuits.export import read_circuit_json
from tlcap.locate.circuits.knowledge_circuit import KnowledgeCircuit

pytestmark = pytest.mark.heavy  # seconds per module: runs after the fast gate (make unit)

ROWS = [
    {"prompt": "The capital of France is", "target": " Paris", "corrupt_prompt": "The capital of Italy is"},
    {"prompt": "London is the capital of", "target": " England", "corrupt_prompt": "Paris is the capital of"},
    {"prompt": "The language of France is", "target": " French", "corrupt_prompt": "The language of Italy is"},
]
FACT = ["--prompt", "The capital of France is", "--target", " Paris", "--corrupt-prompt", "The capital of Italy is"]


def _data(tmp_path):
    data = tmp_path / "facts.json"
    data.write_text(json.dumps(ROWS))
    return str(data)


def test_cli_node_granularity_dataset(tmp_path):
    out = tmp_path / "run"
    run = run_cli(["circuit", "--model", "gpt2-tiny", "--dataset", _data(tmp_path), "--granularity", "node",
                   "--top-n", "4", "--ig-steps", "1", "--batch-size", "2", "--sweep", "0,2,11", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    nodes = pd.read_csv(out / "nodes.csv")
    assert list(nodes.columns) == ["node", "kind", "layer", "score", "rank"] and len(nodes) == 11
    assert s["granularity"] == "node" and s["selection"] == "node" and s["top_n"] == 4 and "nodes.csv" in s["tables"]
    assert [n for n, _ in s["top_nodes"]] == list(nodes["node"][: len(s["top_nodes"])])
    res = DatasetCircuit.load(out / "result")
    ns = node_attribution(res.edge_scores)
    assert nodes["score"].tolist() == pytest.approx([v for _, v in ns.top()], rel=1e-6)
    # the circuit is the top-4 nodes with all their out-edges; the curve is over nodes
    assert {u for u, _, _ in read_circuit_json(out / "circuit.json")} == set(nodes["node"][:4])
    assert s["faithfulness_curve"]["n_requested"] == [0, 2, 4, 11] and "nodes" in s["pruning"]
    assert s["faithfulness_curve"]["faithfulness"][-1] == pytest.approx(1.0, abs=1e-4)
    assert "top nodes:" in run.stdout and "(node 4 nodes)" in run.stdout


def test_cli_node_granularity_single_prompt_keeps_the_edge_circuit(tmp_path):
    out = tmp_path / "run"
    run = run_cli(["circuit", "--model", "gpt2-tiny", *FACT, "--granularity", "node", "--top-n", "20",
                   "--ig-steps", "1", "--no-sweep", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    res = KnowledgeCircuit.load(out / "result")
    nodes = pd.read_csv(out / "nodes.csv")
    assert s["granularity"] == "node" and s["selection"] == "top_n=20" and s["n_edges"] <= 20
    assert nodes["node"].tolist() == [n for n, _ in node_attribution(res.edge_scores).top()]


def test_cli_neuron_granularity_dataset_with_kn_overlap(tmp_path):
    kn = tmp_path / "kn.json"
    kn.write_text(json.dumps({"neurons": [[0, 5], [1, 7], [1, 200]]}))  # a `tlcap kn` summary.json works too
    out = tmp_path / "run"
    run = run_cli(["circuit", "--model", "gpt2-tiny", "--dataset", _data(tmp_path), "--granularity", "neuron",
                   "--top-neurons", "7", "--kn-neurons", str(kn), "--top-n", "20", "--ig-steps", "1",
                   "--sweep", "0,297", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    neurons = pd.read_csv(out / "neurons.csv")
    assert list(neurons.columns) == ["layer", "neuron", "score"] and len(neurons) == 7 == s["n_top_neurons"]
    assert neurons["score"].abs().is_monotonic_decreasing
    assert s["granularity"] == "neuron" and s["top_neurons"] == neurons.values.tolist()
    o = s["kn_overlap"]
    assert (o["k"], o["n_kn"]) == (3, 3)  # k = |KN set| (neuron_overlap's default)
    assert o["chance_overlap"] == pytest.approx(3 * 3 / (2 * 256))
    assert "kn_overlap_circuit_mlps" in s and "KN overlap:" in run.stdout
    assert s["selection"] == "top_n" and s["n_edges"] <= 20  # the edge circuit and its curve are unchanged


def test_cli_neuron_granularity_single_prompt(tmp_path):
    out = tmp_path / "run"
    run = run_cli(["circuit", "--model", "gpt2-tiny", *FACT, "--granularity", "neuron", "--ig-steps", "1",
                   "--no-sweep", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert len(pd.read_csv(out / "neurons.csv")) == 100 and s["granularity"] == "neuron"
    assert "kn_overlap" not in s and len(s["top_neurons"]) == 20


def test_cli_edge_granularity_writes_no_node_or_neuron_outputs(tmp_path):
    out = tmp_path / "run"
    run = run_cli(["circuit", "--model", "gpt2-tiny", *FACT, "--ig-steps", "1", "--no-sweep", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert "granularity" not in s and s["tables"] == ["circuit_edges.csv"]
    assert not (out / "nodes.csv").exists() and not (out / "neurons.csv").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--granularity", "nodes"], "unknown granularity 'nodes' (--granularity); choose one of: edge, node, neuron"),
        (["--top-neurons", "5"], "--top-neurons applies to --granularity neuron: add it or drop --top-neurons"),
        (["--granularity", "node", "--kn-neurons", "kn.json"],
         "--kn-neurons applies to --granularity neuron: add it or drop --kn-neurons"),
        (["--granularity", "neuron", "--top-neurons", "0"], "top_neurons (--top-neurons) must be >= 1, got 0"),
        (["--granularity", "node", "--dataset", "pararel", "--greedy"],
         "--greedy grows an edge circuit from the logits; with --granularity node the circuit is the --top-n nodes "
         "by |node score|: drop --greedy"),
    ],
)
def test_granularity_errors_before_loading(tmp_path, extra, message):
    out = tmp_path / "run"
    args = extra if "--dataset" in extra else [*FACT, *extra]
    assert_cli_error(["circuit", "--model", "no-such-model", *args, "--out", str(out)], message, out=out)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--kn-neurons {p} not found; give a JSON file of [layer, neuron] pairs"),
        ("[[0, 1], [2]]", "--kn-neurons {p} must be a JSON list of [layer, neuron] integer pairs, e.g. [[3, 10], "
                          "[5, 7]]; item 1 is [2]"),
        ('{"a": 1}', "--kn-neurons {p} must be a JSON list of [layer, neuron] integer pairs, e.g. [[3, 10], "
                     "[5, 7]], got a JSON dict"),
    ],
)
def test_kn_neuron_file_errors_before_loading(tmp_path, content, message):
    p = tmp_path / "kn.json"
    if content is not None:
        p.write_text(content)
    out = tmp_path / "run"
    assert_cli_error(["circuit", "--model", "no-such-model", *FACT, "--granularity", "neuron", "--kn-neurons", str(p),
                      "--out", str(out)], message.format(p=p), out=out)


def test_kn_neurons_outside_the_model_are_refused(tmp_path):
    p = tmp_path / "kn.json"
    p.write_text("[[5, 0]]")
    out = tmp_path / "run"
    assert_cli_error(["circuit", "--model", "gpt2-tiny", *FACT, "--granularity", "neuron", "--kn-neurons", str(p),
                      "--ig-steps", "1", "--no-sweep", "--out", str(out)],
                     f"the neurons in {p} reach layer 5 and neuron 0, but gpt2-tiny has 2 layers of 256 neurons; locate "
                     "them on the same model (or pass --model of the locate run)", out=out)  # before the model load
