"""Node granularity: node scores are sums of out-edge scores, and (plain EAP) the derivative of patching the node."""

from __future__ import annotations

import pytest
import torch

from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits import (
    CircuitDataset,
    CircuitItem,
    EdgeGraph,
    NodeScores,
    edge_attribution,
    make_task,
    node_attribution,
)
from tlcap.locate.circuits.dataset_circuit import dataset_circuit
from tlcap.locate.circuits.faithfulness import circuit_masks
from tlcap.models import make_gpt2, make_llama
from tlcap.results import load_result
from tlcap.runtime import hooks as H

PROMPT, TARGET, CORRUPT = "The capital of France is", " Paris", "The capital of Italy is"
ITEMS = (
    CircuitItem("The capital of France is", " Paris", "The capital of Italy is"),
    CircuitItem("London is the capital of", " England", "Paris is the capital of"),
)


def test_node_scores_are_hand_sums_of_out_edge_scores(tiny_gpt2, tmp_path):
    sc = edge_attribution(tiny_gpt2, CircuitDataset(ITEMS, "two"), batch_size=2)
    ns = node_attribution(sc)
    g = sc.graph
    for u, node in enumerate(g.upstream):
        hand = sum(float(sc.scores[u, v]) for v in range(g.n_readers) if sc.valid[u, v])
        assert float(ns.scores[u]) == pytest.approx(hand, rel=1e-5, abs=1e-9), node
    df = ns.to_frame()
    assert list(df.columns) == ["node", "kind", "layer", "score", "rank"] and list(df["rank"]) == list(range(1, 12))
    assert df["score"].abs().is_monotonic_decreasing and set(df["node"]) == set(g.upstream)
    assert df.set_index("node").loc["m1", "kind"] == "MLP" and df.set_index("node").loc["input", "layer"] == -1
    # the rank is the order in which faithfulness_curve(selection="node") keeps nodes
    for k in (1, 3, 7):
        mask = circuit_masks(g, sc.scores, [k], "node")[0][0]
        assert {g.upstream[u] for u in torch.nonzero(mask.any(1)).flatten().tolist()} == set(df["node"][:k])
    s = ns.summary(top=3)
    assert s["top_nodes"] == [[n, v] for n, v in ns.top(3)] and s["n_nodes"] == 11 and s["dataset"] == "two"
    ns.save(tmp_path / "nodes")
    again = load_result(tmp_path / "nodes")
    assert isinstance(again, NodeScores) and torch.equal(again.scores, ns.scores) and len(again.figure().data) == 1


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_eap_node_score_is_the_derivative_of_patching_the_node(arch):
    """Plain EAP, corrupt ablation, float64: each node's score = d metric / d eps when its output is moved a
    fraction eps from clean toward corrupt (every reader at once), by central differences (eps = +-1e-2)."""
    m = make_gpt2("tiny", seed=1) if arch == "gpt2" else make_llama(seed=1)
    m.backend.to(torch.float64)
    ns = node_attribution(edge_attribution(m, PROMPT, TARGET, CORRUPT, steps=1))
    task = make_task(m, PROMPT, TARGET, CORRUPT)
    g = EdgeGraph.from_model(m)
    with m.edge_hooks():
        _, cache = m.run_with_cache(task.corrupt, [name for name, _, _ in g.upstream_hooks()])
    n, eps = g.n_upstream, 1e-2
    w = torch.zeros(2 * n, n, dtype=torch.float64)  # row u moves node u by +eps, row n + u by -eps
    w[torch.arange(n), torch.arange(n)] = eps
    w[n + torch.arange(n), torch.arange(n)] = -eps

    def toward_corrupt(name, start, count):
        cor = cache[name][0]

        def delta(act):  # input / mlp_out: [b, pos, d]; head_result: [b, pos, head, d]
            ww = w[:, start : start + count]
            if act.ndim == 4:
                return torch.einsum("bh,bphd->bphd", ww, cor[None] - act)
            return ww[:, 0, None, None] * (cor[None] - act)

        return name, H.add_computed(delta)

    with m.edge_hooks():
        lg = m.logits(task.clean.expand(2 * n, -1), hooks=[toward_corrupt(*h) for h in g.upstream_hooks()])
    met = task.metric_rows(lg, torch.zeros(2 * n, dtype=torch.long)).double()
    fd = (met[:n] - met[n:]) / (2 * eps)
    est = ns.scores.double()
    err = ((est - fd).norm() / fd.norm()).item()
    print(f"{arch}: {n} nodes, rel err {err:.2e}, |score| {fd.abs().min():.2e} .. {fd.abs().max():.2e}")
    assert err < 2e-4
    torch.testing.assert_close(est, fd, rtol=1e-3, atol=1e-3 * float(fd.abs().max()))


def test_node_dataset_circuit_keeps_the_top_nodes(tiny_gpt2):
    ds = CircuitDataset(ITEMS, "two")
    res = dataset_circuit(tiny_gpt2, ds, granularity="node", top_n=3, sweep_sizes=[0, 11], batch_size=2)
    top = [n for n, _ in node_attribution(res.edge_scores).top(3)]
    g = res.graph
    assert {g.upstream[u] for u in torch.nonzero(res.mask.any(1)).flatten().tolist()} == set(top)
    assert torch.equal(res.mask, g.valid_mask() & res.mask.any(1)[:, None])  # every out-edge of a kept node
    assert res.selection == "node" and res.curve.selection == "node" and res.curve.n_requested == (0, 3, 11)
    assert res.curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-4)
    assert res.circuit_faithfulness == pytest.approx(res.curve.faithfulness[1])
    with pytest.raises(InvalidConfigError, match="drop --greedy"):
        dataset_circuit(tiny_gpt2, ds, granularity="node", greedy=True)
