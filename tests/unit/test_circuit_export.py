"""Circuit export: DOT and JSON files parse back to the circuit's edges and scores (GQA kv fan-out included)."""

from __future__ import annotations

import json

import pytest

from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits import edge_attribution
from tlcap.locate.circuits.export import export_circuit, read_circuit_dot, read_circuit_json


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama"])
def test_dot_and_json_parse_back(request, tmp_path, name):
    model = request.getfixturevalue(name)
    sc = edge_attribution(model, "The capital of France is", " Paris", "The capital of Italy is")
    c = sc.select(top_n=40)
    want = sorted(c.edges)
    for suffix, reader in ((".json", read_circuit_json), (".dot", read_circuit_dot)):
        got = sorted(reader(export_circuit(c, tmp_path / f"c{suffix}")))
        assert [(u, v) for u, v, _ in got] == [(u, v) for u, v, _ in want]
        assert [s for _, _, s in got] == pytest.approx([s for _, _, s in want], rel=1e-6)
    data = json.loads((tmp_path / "c.json").read_text())
    assert {n["name"] for n in data["nodes"]} == set(c.nodes)
    kv = [e for e in data["edges"] if "kv" in e["reader"]]
    if model.n_kv_heads != model.n_heads:  # a kv reader feeds every head of its group: one file edge per head
        assert kv and len(kv) % (model.n_heads // model.n_kv_heads) == 0
    dot = (tmp_path / "c.dot").read_text()
    assert dot.startswith("digraph circuit {") and dot.rstrip().endswith("}")
    with pytest.raises(InvalidConfigError, match="to a .dot"):
        export_circuit(c, tmp_path / "c.png")
