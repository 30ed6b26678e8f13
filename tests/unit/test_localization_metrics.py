"""The CNL evaluation quantities on hand-made sets: overlap, IoU, pairwise fidelity overlap,
the decoupling coincidence rates (literal and normalised) and IPP."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tlcap.metrics import (
    NeuronSet,
    StatisticsError,
    TooFewSamplesError,
    coincidence_rates,
    iou,
    ipp,
    ipp_ci,
    mean_pairwise_overlap,
    overlap,
)
from tlcap.results import load_result

# Three known sets of neurons (layer, index)
A = {(0, 1), (0, 2), (1, 3)}
B = {(0, 1), (1, 3), (2, 0), (2, 5)}
C = {(0, 2)}


def test_overlap_and_iou_of_three_known_sets():
    # A∩B = {(0,1), (1,3)}: overlap (2/3 + 2/4)/2 = 7/12, IoU 2/5
    assert overlap(A, B) == pytest.approx(7 / 12) and iou(A, B) == pytest.approx(2 / 5)
    # A∩C = {(0,2)}: overlap (1/3 + 1/1)/2 = 2/3, IoU 1/3
    assert overlap(A, C) == pytest.approx(2 / 3) and iou(A, C) == pytest.approx(1 / 3)
    # B∩C = ∅
    assert overlap(B, C) == 0.0 and iou(B, C) == 0.0
    # fidelity of the "fact" with these three "rewrites": (7/12 + 2/3 + 0) / 3 = 5/12
    r = mean_pairwise_overlap([A, B, C])
    assert r.mean == pytest.approx(5 / 12) and r.pairs == ((0, 1), (0, 2), (1, 2)) and r.k == 3
    assert r.values == pytest.approx((7 / 12, 2 / 3, 0.0))
    assert mean_pairwise_overlap([A, B, C], "iou").mean == pytest.approx((2 / 5 + 1 / 3) / 3)
    assert list(r.to_frame().columns) == ["i", "j", "overlap"]


def test_works_on_layers_and_edges_and_json_lists():
    assert overlap({5, 6, 7}, {6, 7, 8}) == pytest.approx(2 / 3)  # causal tracing: top-3 layers
    assert overlap({("a0.h1", "m2"), ("m2", "logits")}, {("m2", "logits")}) == pytest.approx(0.75)  # circuit edges
    assert overlap([[0, 1], [0, 2], [1, 3]], A) == 1.0  # [layer, index] lists from JSON


def test_empty_sets_follow_neuronset_conventions():
    assert overlap(set(), set()) == 0.0 and overlap(set(), A) == 0.0
    assert iou(set(), set()) == 1.0 and iou(set(), A) == 0.0
    rng = random.Random(0)
    for _ in range(200):
        a = {(rng.randrange(3), rng.randrange(4)) for _ in range(rng.randrange(5))}
        b = {(rng.randrange(3), rng.randrange(4)) for _ in range(rng.randrange(5))}
        na, nb = NeuronSet(tuple(a), (3, 4)), NeuronSet(tuple(b), (3, 4))
        assert overlap(a, b) == na.overlap(nb) and iou(a, b) == na.iou(nb)
        assert overlap(na, nb) == na.overlap(nb) and overlap(na, b) == na.overlap(nb)


def test_pairwise_overlap_needs_two_sets():
    with pytest.raises(TooFewSamplesError, match="at least 2"):
        mean_pairwise_overlap([A])
    with pytest.raises(StatisticsError, match="measure"):
        mean_pairwise_overlap([A, B], "dice")


# Decoupling by hand: L = 2 layers, J = 5 neurons (L·J = 10), n = 3 comparative samples.
N1 = [{(0, 0), (0, 1), (1, 2)}, {(0, 0), (1, 2), (1, 4)}, {(0, 0), (1, 2)}]
N2 = [{(0, 0), (0, 3)}, {(1, 2), (1, 4), (0, 2), (1, 0)}, {(0, 4)}]


def test_coincidence_rates_by_hand():
    r = coincidence_rates(N1, N2, n_layers=2, d_mlp=5)
    # pair intersections: {(0,0)}, {(1,2),(1,4)}, ∅ → 1, 2, 0
    assert r.pair_intersections == (1, 2, 0)
    # literal C^{1,2} = (1 + 2 + 0) / (n·L·J) = 3 / 30
    assert r.c12 == pytest.approx(0.1)
    # ⋂N¹ = {(0,0), (1,2)} → C^{1,1} = 2 / (L·J) = 0.2;  ⋂N² = ∅ → C^{2,2} = 0
    assert (r.common1, r.common2) == (2, 0)
    assert r.c11 == pytest.approx(0.2) and r.c22 == 0.0
    # overlap-normalised C^{1,2}: pair overlaps (1/3 + 1/2)/2 = 5/12, (2/3 + 2/4)/2 = 7/12, 0 → mean 1/3
    assert r.pair_overlaps == pytest.approx((5 / 12, 7 / 12, 0.0))
    assert r.c12_overlap == pytest.approx(1 / 3)
    # overlap-normalised C^{1,1}: |⋂N¹| / |N¹_k| = 2/3, 2/3, 2/2 → mean 7/9;  C^{2,2}: 0
    assert r.c11_overlap == pytest.approx(7 / 9) and r.c22_overlap == 0.0
    # IoU: pairs 1/4, 2/5, 0/3 → mean 0.65/3;  C^{1,1}: 2 / |⋃N¹| = 2/4;  C^{2,2}: 0
    assert r.c12_iou == pytest.approx(0.65 / 3) and r.c11_iou == pytest.approx(0.5) and r.c22_iou == 0.0
    assert (r.sizes1, r.sizes2, r.n) == ((3, 3, 2), (2, 4, 1), 3)
    table = r.to_frame().set_index("rate")
    assert table.loc["C^{1,1}", "literal"] == pytest.approx(0.2) and table.loc["C^{1,2}", "overlap"] == pytest.approx(1 / 3)


def test_results_survive_save_and_load(tmp_path):
    r = coincidence_rates(N1, N2, n_layers=2, d_mlp=5)
    assert load_result(r.save(tmp_path / "c")) == r
    p = mean_pairwise_overlap([A, B, C])
    assert load_result(p.save(tmp_path / "p")) == p


def test_within_framing_rate_of_two_sets_is_their_overlap():
    r = coincidence_rates([A, B], [C, C], n_layers=3, d_mlp=6)
    assert r.c11_overlap == pytest.approx(overlap(A, B)) and r.c22_overlap == 1.0


def test_coincidence_c12_interval_is_a_bootstrap_over_pairs():
    r = coincidence_rates(N1 * 4, N2 * 4, n_layers=2, d_mlp=5)
    lit = r.c12_ci("literal", n_boot=500, seed=1)
    assert lit.value == pytest.approx(r.c12) and lit.n == 12 and lit.low <= lit.value <= lit.high
    assert r.c12_ci(n_boot=500, seed=1).value == pytest.approx(r.c12_overlap)


def test_coincidence_rates_refuse_what_is_not_a_neuron_set_of_the_model():
    with pytest.raises(StatisticsError, match="unaligned"):
        coincidence_rates(N1, N2[:2], 2, 5)
    with pytest.raises(TooFewSamplesError):
        coincidence_rates([], [], 2, 5)
    with pytest.raises(StatisticsError, match=r"\(2, 0\)"):
        coincidence_rates([{(2, 0)}], [{(0, 0)}], 2, 5)  # layer out of range
    with pytest.raises(StatisticsError, match="neurons"):
        coincidence_rates([{5}], [{(0, 0)}], 2, 5)  # a layer index, not a neuron
    with pytest.raises(StatisticsError, match="shape"):
        coincidence_rates([NeuronSet(((0, 0),), (3, 5))], [{(0, 0)}], 2, 5)
    ns = [NeuronSet(tuple(s), (2, 5)) for s in N1]
    assert coincidence_rates(ns, N2, 2, 5).c12 == pytest.approx(0.1)


# IPP on a fixed set of draws
DRAWS = [0.50, 0.55, 0.47, 0.58, 0.51]


def test_ipp_on_fixed_draws():
    assert ipp(0.62, DRAWS) == pytest.approx(0.62 - 0.58)
    assert ipp(0.55, DRAWS) == pytest.approx(-0.03)  # a random draw beats the located set
    # erase: accuracy after erasing, lower is stronger → min(random) − located = 0.47 − 0.20
    assert ipp(0.20, DRAWS, higher_is_better=False) == pytest.approx(0.27)
    with pytest.raises(TooFewSamplesError, match="4 random draws given, at least 5 needed"):
        ipp(0.62, DRAWS[:4])
    with pytest.raises(StatisticsError, match="NaN"):
        ipp(math.nan, DRAWS)


def _loop_ipp(loc, rnd, n_boot, seed, sign):
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        i = rng.integers(0, len(loc), len(loc))
        m = rnd[:, i].mean(1)
        reps.append(loc[i].mean() - m.max() if sign > 0 else m.min() - loc[i].mean())
    return np.percentile(reps, 2.5), np.percentile(reps, 97.5)


@pytest.mark.parametrize("higher", [True, False])
def test_ipp_ci_equals_ipp_of_means_and_a_slow_loop(higher):
    rng = np.random.default_rng(4)
    loc = rng.random(40)
    rnd = rng.random((5, 40)) * 0.9
    e = ipp_ci(loc, rnd, higher_is_better=higher, n_boot=800, seed=2)
    assert e.value == pytest.approx(ipp(loc.mean(), rnd.mean(1), higher_is_better=higher))
    assert (e.low, e.high) == pytest.approx(_loop_ipp(loc, rnd, 800, 2, 1 if higher else -1), abs=1e-12)
    with pytest.raises(StatisticsError, match="shape"):
        ipp_ci(loc, rnd[:, :30])
    with pytest.raises(TooFewSamplesError):
        ipp_ci(loc, rnd[:3])
