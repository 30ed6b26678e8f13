"""Faithfulness curves: CPR / CMD on hand-computed curves, greedy selection on a hand-made score matrix, exact ends."""

from __future__ import annotations

import pytest
import torch

from tlcap.locate.circuits import CircuitDataset, CircuitItem, EdgeGraph, edge_attribution
from tlcap.locate.circuits.faithfulness import (
    PRUNING,
    FaithfulnessCurve,
    curve_area,
    default_sizes,
    faithfulness_curve,
    greedy_order,
)
from tlcap.results import load_result

ITEMS = (
    CircuitItem("The capital of France is", " Paris", "The capital of Italy is"),
    CircuitItem("London is the capital of", " England", "Paris is the capital of"),
)


def test_cpr_cmd_and_complement_area_by_hand():
    # a 4-edge graph: MatchNLL 5 with every edge ablated, 1 with the full model
    c = FaithfulnessCurve.from_metrics([0, 1, 2, 4], [0, 1, 2, 4], 4, [5.0, 3.0, 2.0, 1.0], [1.0, 2.0, 4.0, 5.0],
                                       full_metric=1.0, ablated_metric=5.0)
    assert c.fraction == (0.0, 0.25, 0.5, 1.0)
    assert c.faithfulness == (0.0, 0.5, 0.75, 1.0)
    assert c.complement_faithfulness == (1.0, 0.75, 0.25, 0.0)
    # trapezoids: .25*(0+.5)/2 + .25*(.5+.75)/2 + .5*(.75+1)/2
    assert c.cpr == pytest.approx(0.0625 + 0.15625 + 0.4375)
    # |1-f| = 1, .5, .25, 0
    assert c.cmd == pytest.approx(0.1875 + 0.09375 + 0.0625)
    assert c.complement_area == pytest.approx(0.21875 + 0.125 + 0.0625)
    assert curve_area([1.0, 0.0], [1.0, 1.0]) == 1.0 and curve_area([0.5], [1.0]) == 0.0  # sorted; one point: 0
    assert default_sizes(297) == [0, 1, 3, 6, 15, 30, 59, 148, 297]
    s = c.summary()
    assert s["pruning"] == PRUNING["top_n"] and s["unit"] == "edges" and s["curve"]["faithfulness"][1] == 0.5


def test_greedy_grows_from_the_logits(tiny_gpt2):
    g = EdgeGraph.from_model(tiny_gpt2)
    sc = torch.zeros(g.n_upstream, g.n_readers)
    up, rd = g.upstream.index, g.readers.index
    sc[up("a1.h0"), rd("logits")] = 1.0
    sc[up("a0.h0"), rd("a1.h0<q>")] = 5.0  # the largest score, but its reader is not in the circuit yet
    sc[up("input"), rd("logits")] = 0.5
    sc[up("a0.h1"), rd("a1.h2<k>")] = 4.0  # never reachable before the zero-score edges of the logits are exhausted
    order = greedy_order(g, sc)
    nr = g.n_readers
    first = [(g.upstream[i // nr], g.readers[i % nr]) for i in order[:3].tolist()]
    assert first == [("a1.h0", "logits"), ("a0.h0", "a1.h0<q>"), ("input", "logits")]
    assert sorted(order.tolist()) == torch.nonzero(g.valid_mask().flatten()).flatten().tolist()  # every edge once


def test_curve_ends_are_exact_and_roundtrip(tiny_gpt2, tmp_path):
    ds = CircuitDataset(ITEMS, "two")
    sc = edge_attribution(tiny_gpt2, ds, batch_size=2)
    for selection in ("top_n", "greedy", "node"):
        total = sc.graph.n_upstream if selection == "node" else sc.n_edges
        c = faithfulness_curve(tiny_gpt2, sc, ds, sizes=[0, 3, 20, total], selection=selection, batch_size=1)
        assert c.n[0] == 0 and c.n[-1] == total and c.n_items == 2 and c.selection == selection
        assert c.faithfulness[0] == pytest.approx(0.0, abs=1e-5) and c.faithfulness[-1] == pytest.approx(1.0, abs=1e-4)
        assert c.complement_faithfulness[0] == pytest.approx(1.0, abs=1e-4)
        assert c.complement_faithfulness[-1] == pytest.approx(0.0, abs=1e-5)
        assert c.full_metric == pytest.approx(sc.clean_metric, rel=1e-5)
        assert c.ablated_metric == pytest.approx(sc.corrupt_metric, rel=1e-5)
        assert c.cpr == pytest.approx(curve_area(c.fraction, c.faithfulness))
        c.save(tmp_path / selection)
        again = load_result(tmp_path / selection)
        assert again.summary()["cpr"] == pytest.approx(c.cpr) and again.pruning == PRUNING[selection]
        assert len(c.figure().data) == 2
