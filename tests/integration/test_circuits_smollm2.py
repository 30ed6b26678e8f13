"""Knowledge circuits on the real SmolLM2-135M (grouped-query attention)."""

from __future__ import annotations

import pytest
import torch

from tlcap.locate.circuits import edge_attribution, evaluate_masks, make_task

pytestmark = pytest.mark.integration


def test_small_circuit_keeps_fact_random_does_not(smollm2):
    m = smollm2
    prompt, target, corrupt = "The capital of France is", " Paris", "The capital of Italy is"
    sc = edge_attribution(m, prompt, target, corrupt, steps=5)
    g = sc.graph
    assert g.n_kv_heads == 3 and g.n_heads == 9 and sc.n_edges > 50_000
    circ = sc.select(top_n=300)
    assert 100 <= circ.n_edges <= 300
    rnd = circ.random_like(0)
    task = make_task(m, prompt, target, corrupt)
    r = evaluate_masks(m, g, task, torch.stack([g.valid_mask(), circ.mask, rnd.mask, torch.zeros_like(circ.mask)]))
    rank = r["rank"].tolist()
    print(f"circuit {circ.n_edges} edges / {circ.n_nodes} nodes ({circ.param_fraction:.1%} of block params): "
          f"rank full {rank[0]}, circuit {rank[1]}, random {rank[2]}, ablated {rank[3]}; NLL {r['nll'].tolist()}")
    assert rank[0] == 1  # the model knows the fact
    assert rank[3] > 10  # corrupting everything loses it
    assert rank[1] <= 10  # a few hundred edges keep it
    assert rank[2] > 10  # as many random edges do not
    assert circ.param_fraction < 1.0
