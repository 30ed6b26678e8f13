"""The verdict layer of ``tlcap reproduce``: every branch, the Benjamini–Hochberg adjustment, power, model map, gaps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tlcap.metrics.effects import bootstrap_p, bootstrap_p_floor, mcnemar_effect
from tlcap.metrics.estimate import Estimate
from tlcap.metrics.multiplicity import benjamini_hochberg, bh_critical_level, holm
from tlcap.metrics.permutation import p_floor, permutation_p_value
from tlcap.metrics.power import mde, power_at, se_from_ci
from tlcap.metrics.selection_bootstrap import recentred_estimate
from tlcap.reproduce import report_cnl as rc
from tlcap.reproduce.items import is_paper_model, paper_model, reference_model
from tlcap.reproduce.not_reproduced import not_reproduced
from tlcap.reproduce.registry import paper_claim
from tlcap.reproduce.report import FigureRef, RowBuilder
from tlcap.reproduce.verdict import AGREES, DESCRIPTIVE, DISAGREES, NOT_COMPARABLE, UNDECIDED, verdict

EST = Estimate(0.42, 0.35, 0.50, n=120)


# ------------------------------------------------------------------ multiplicity
def test_benjamini_hochberg_by_hand():
    # m = 4; sorted 0.01 0.03 0.04 0.5 → 0.04, 0.06, 0.0533, 0.5 → step-up minima
    q = benjamini_hochberg([0.01, 0.04, 0.03, 0.5])
    assert q == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.5])
    assert math.isnan(benjamini_hochberg([0.2, None, 0.01])[1])
    assert benjamini_hochberg([0.2, None, 0.01])[2] == pytest.approx(0.02)
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert bh_critical_level([0.01, 0.04, 0.03, 0.5]) == pytest.approx(0.0125)     # one discovery of 4
    assert bh_critical_level([0.001, 0.002, 0.003, 0.9]) == pytest.approx(0.0375)  # three of 4


def test_benjamini_hochberg_equals_a_brute_force_definition():
    rng = np.random.default_rng(3)
    p = rng.uniform(0, 0.2, 37)
    q = np.array(benjamini_hochberg(p))
    m = len(p)
    for i in range(m):  # q_i = min over j with p_j ≥ p_i of m·p_j / rank_j
        ranks = np.argsort(np.argsort(p, kind="stable"), kind="stable") + 1
        cand = [min(1.0, m * p[j] / ranks[j]) for j in range(m) if p[j] >= p[i]]
        assert q[i] == pytest.approx(min(cand))


# ------------------------------------------------------------------ floors and power
def test_p_value_floors_are_those_of_the_tests():
    assert permutation_p_value(0.9, [0.1] * 200) == pytest.approx(2 / 201) == pytest.approx(p_floor(200))
    assert permutation_p_value(0.9, [0.1] * 200, "greater") == pytest.approx(1 / 201)
    assert bootstrap_p([1.0] * 250) == pytest.approx(bootstrap_p_floor(250)) == pytest.approx(2 / 251)
    assert bootstrap_p([1.0, -1.0, 2.0, 3.0]) == pytest.approx(2 * 2 / 5)
    e = mcnemar_effect([1] * 7 + [0] * 3, [0] * 10)
    assert e.p_value == pytest.approx(2 * 0.5 ** 7) == pytest.approx(e.p_floor)   # 7 vs 0 discordant items


def test_mde_and_power_by_hand():
    se = se_from_ci(-0.1, 0.1)
    assert se == pytest.approx(0.1 / 1.959964, rel=1e-5)
    assert mde(se, 0.05) == pytest.approx((1.959964 + 0.841621) * se, rel=1e-5)
    assert power_at(mde(se, 0.05), se, 0.05) == pytest.approx(0.8, abs=1e-3)
    assert power_at(0.0, se, 0.05) == pytest.approx(0.05, abs=1e-9)
    assert mde(se, 0.001) > mde(se, 0.05)  # a stricter adjusted level needs a larger effect


# ------------------------------------------------------------------ verdict branches
def test_value_rows():
    assert verdict(EST, 0.44, paper_rounding=0.005).word == AGREES  # [0.35, 0.5] within 0.44 ± 25 %
    assert verdict(EST, 0.60).word == DISAGREES
    # 2 of 3 facts: Wilson [0.21, 0.94] holds the paper's 0.56 (and 0.44) but could not have told them apart
    wide = verdict(Estimate(2 / 3, 0.208, 0.939, n=3), 0.56)
    assert wide.word == UNDECIDED and "wider than ±25 % of it (±0.14): too wide to agree" in wide.reason
    assert verdict(Estimate(0.56, 0.50, 0.62, n=300), 0.56).word == AGREES
    v = verdict(EST, 0.44, differences=["model: smollm2 vs GPT-2"], comparable_on="GPT-2")
    assert v.word == NOT_COMPARABLE and "comparable on GPT-2" in v.reason and "inside" in v.reason
    assert verdict(EST, None).word == DESCRIPTIVE
    assert verdict(None, 0.4, missing="stage failed").reason == "stage failed"
    no_ci = Estimate(0.4, math.nan, math.nan, n=1)
    assert verdict(no_ci, 0.4, no_ci="one number per cell").reason == "one number per cell"


def test_effect_rows_use_the_adjusted_p_and_the_sign():
    neg = Estimate(-0.2, -0.3, -0.1, n=200)
    assert verdict(neg, kind="effect", sign=-1, p_adjusted=0.003).word == AGREES
    assert verdict(neg, kind="effect", sign=+1, p_adjusted=0.003).word == DISAGREES
    assert verdict(neg, kind="effect", sign=-1, p_adjusted=0.2).word == UNDECIDED
    # not significant on the paper's own setting, and the paper's effect size rejected: disagrees
    flat = Estimate(0.0, -0.05, 0.05, n=300)
    assert verdict(flat, -0.3, kind="effect", sign=-1, p_adjusted=0.9, p_paper_size=1e-6).word == DISAGREES
    # ... but not on another model (the paper's size is then only a yardstick), nor when the size is not rejected
    assert verdict(flat, -0.3, kind="effect", sign=-1, p_adjusted=0.9, p_paper_size=1e-6,
                   differences=["model: x"]).word == UNDECIDED
    assert verdict(flat, -0.3, kind="effect", sign=-1, p_adjusted=0.9, p_paper_size=0.3).word == UNDECIDED
    v = verdict(neg, kind="effect", sign=-1, p_adjusted=0.3, p_floor=0.095, alpha_adjusted=0.01)
    assert v.word == UNDECIDED and "cannot fall below 0.095" in v.reason


def test_no_difference_claims():
    small = Estimate(0.02, -0.05, 0.08, n=400)
    assert verdict(small, kind="effect", sign=0, p_adjusted=0.5, margin=0.1).word == AGREES
    # an equivalence judgement: a significant difference wholly inside the margin is "no difference" ...
    tiny = verdict(Estimate(0.03, 0.01, 0.05, n=4000), kind="effect", sign=0, p_adjusted=0.004, margin=0.1)
    assert tiny.word == AGREES and "lies within ±0.1" in tiny.reason
    # ... one wholly outside it disagrees, one reaching into it decides nothing
    assert verdict(Estimate(0.3, 0.15, 0.5, n=10), kind="effect", sign=0, p_adjusted=0.01, margin=0.1).word == DISAGREES
    straddle = verdict(Estimate(0.3, 0.05, 0.5, n=10), kind="effect", sign=0, p_adjusted=0.01, margin=0.1)
    assert straddle.word == UNDECIDED and "reaches within ±0.1" in straddle.reason
    assert verdict(Estimate(0.05, -0.2, 0.3, n=10), kind="effect", sign=0, p_adjusted=0.6, margin=0.1).word == UNDECIDED
    # the paper's own difference (CNL §3.2: 85.1 − 72.3 points) outside the margin is said
    v = verdict(Estimate(0.35, 0.075, 0.554, n=10), 0.128, kind="effect", sign=0, p_adjusted=0.07, margin=0.1)
    assert v.word == UNDECIDED and "the paper's own difference, 0.128, is outside ±0.1 itself" in v.reason
    # without a margin only a significant difference decides (it disagrees)
    assert verdict(small, kind="effect", sign=0, p_adjusted=0.01).word == DISAGREES
    assert verdict(small, kind="effect", sign=0, p_adjusted=0.5).word == UNDECIDED


def test_a_p_value_at_the_critical_level_is_a_discovery_as_in_benjamini_hochberg():
    neg = Estimate(-0.2, -0.3, -0.1, n=200)
    # BH counts p ≤ α·k/m: an adjusted p equal to α is a discovery, and a floor equal to the level is reachable
    ps = [0.01, 0.05]  # m = 2: 0.05 ≤ 0.05 · 2/2, both discoveries, adjusted (0.02, 0.05)
    assert bh_critical_level(ps) == pytest.approx(0.05) and benjamini_hochberg(ps)[1] == pytest.approx(0.05)
    assert verdict(neg, kind="effect", sign=-1, p_adjusted=0.05).word == AGREES
    v = verdict(neg, kind="effect", sign=-1, p_adjusted=0.05, p_floor=0.01, alpha_adjusted=0.01)
    assert v.word == AGREES and "cannot fall below" not in v.reason


def test_a_row_whose_floor_is_above_the_level_has_no_power():
    """R = 20 random sets (floor 2/21 = 0.095) cannot reach a 0.021 level: power 0 and no MDE, whatever the CI."""
    rb = RowBuilder("smollm2-135m", papers=("cnl",))
    c = paper_claim("cnl.table3.located-vs-random")
    est = Estimate(-0.2, -0.25, -0.15, n=300)
    for i in range(40):  # a family whose critical level ends up at 0.05 · 21/41 ≈ 0.026
        rb.effect("CNL Table 3", f"r{i}", c, est, 1e-4 if i < 20 else 0.9, "t", paper=-0.174)
    rb.effect("CNL Table 3", "floored", c, est, p_floor(20), "rank test, 20 random sets", p_floor=p_floor(20),
              paper=-0.174)
    rows = rb.finalize()
    assert p_floor(20) > rb.alpha_adjusted
    floored, ok = rows[-1], rows[0]
    assert floored.power == 0.0 and floored.mde is None and floored.verdict == UNDECIDED
    assert "power against the paper's -0.174: 0%" in floored.reason and "cannot fall below 0.095" in floored.reason
    assert ok.power is not None and ok.power > 0.99 and ok.mde is not None  # the same CI with a reachable floor


def test_control_and_descriptive_rows_never_agree_or_disagree():
    assert verdict(EST, kind="control", p_adjusted=0.001).word == DESCRIPTIVE
    # a control whose test cannot reach the report's level (50 random sets: floor 2/51) is not called "not different"
    big = Estimate(66.4, 60.6, 68.4, n=50)
    floored = verdict(big, kind="control", p_adjusted=0.059, p_floor=p_floor(50), alpha_adjusted=0.026)
    assert floored.word == DESCRIPTIVE and "not significantly different" not in floored.reason
    assert floored.reason.startswith("control, no paper claim: not resolved against the matched control (our value is "
                                     "above it)") and "cannot fall below 0.039, above the 0.026" in floored.reason
    resolved = verdict(big, kind="control", p_adjusted=0.2, p_floor=p_floor(200), alpha_adjusted=0.026)
    assert "not significantly different from the matched control" in resolved.reason and "cannot" not in resolved.reason
    assert verdict(EST, kind="descriptive", descriptive="true by construction").reason == "true by construction"


# ------------------------------------------------------------------ the row builder
def test_finalize_adjusts_over_the_report_and_per_paper():
    rb = RowBuilder("smollm2-135m", papers=("cnl", "ql"))
    c_cnl, c_ql = paper_claim("cnl.table3.located-vs-random"), paper_claim("ql.fig7.suppress-lowers")
    est = Estimate(-0.2, -0.3, -0.1, n=100)
    rb.effect("CNL Table 3", "a", c_cnl, est, 0.01, "t")
    rb.effect("CNL Table 3", "b", c_cnl, est, 0.04, "t")
    rb.effect("QL Fig. 7", "c", c_ql, est, 0.03, "t")
    rb.value("QL Table 1", "d", est, None)
    rows = rb.finalize()
    assert [r.p_adjusted for r in rows[:3]] == pytest.approx([0.03, 0.04, 0.04])
    assert [r.p_adjusted_paper for r in rows[:3]] == pytest.approx([0.02, 0.04, 0.03])
    assert rows[3].p_adjusted is None and rows[3].verdict == DESCRIPTIVE
    assert [r.verdict for r in rows[:3]] == [AGREES, AGREES, AGREES]
    assert rb.alpha_adjusted == pytest.approx(0.05)  # all three are discoveries
    assert rows[0].mde == pytest.approx(mde(se_from_ci(-0.3, -0.1), 0.05))
    assert all(r.p_paper_size is None for r in rows)  # another model: the paper's size is not tested


def test_the_papers_effect_size_is_tested_in_the_same_family_on_the_papers_model():
    rb = RowBuilder("gpt2", papers=("ql",))
    flat = Estimate(0.0, -0.05, 0.05, n=300)
    rb.effect("QL Fig. 7", "x", paper_claim("ql.fig7.suppress-lowers"), flat, 0.9, "t", paper=-0.3)
    (row,) = rb.finalize()
    assert row.p_paper_size is not None and row.p_paper_size < 1e-10
    assert row.verdict == DISAGREES and "is rejected" in row.reason
    # the per-paper adjustment has the same family as the report-wide one (the paper-size tests included)
    rb = RowBuilder("gpt2", papers=("ql",))
    on_size = Estimate(-0.3, -0.35, -0.25, n=300)  # our effect equals the paper's: its size test gives p = 1
    rb.effect("QL Fig. 7", "y", paper_claim("ql.fig7.suppress-lowers"), on_size, 0.01, "t", paper=-0.3)
    (row,) = rb.finalize()
    assert row.p_paper_size == pytest.approx(1.0)
    assert row.p_adjusted == pytest.approx(0.02) and row.p_adjusted_paper == pytest.approx(0.02)  # BH of (0.01, 1)


def test_value_rows_become_comparable_on_the_papers_model():
    assert paper_model("gpt2") == "GPT-2" and paper_model("gpt2-small-random") is None
    assert paper_model("llama-7b-shape") is None and is_paper_model("cnl", "meta-llama/Llama-2-13b-hf")
    assert reference_model("cnl", "meta-llama/Llama-2-13b-hf") == "LLaMA2-13B"
    est = Estimate(0.56, 0.50, 0.62, n=100)
    for model, word in (("gpt2", AGREES), ("smollm2-135m", NOT_COMPARABLE)):
        rb = RowBuilder(model, papers=("ql",))
        rb.value("QL Table 1", "R:I", est, rb.paper_value("ql", "Table 1", "R:I", threshold="static", method="IG"),
                 differences=rb.model_difference("ql"))
        (row,) = rb.finalize()
        assert row.verdict == word, row.reason
    assert "comparable on GPT-2, LLaMA2-7B, LLaMA3-8B" in row.reason


def test_not_reproduced_is_computed_from_the_registry():
    rb = RowBuilder("smollm2-135m", papers=("ql",))
    rb.value("QL Table 4", "IG · Otsu", EST, rb.paper_value("ql", "Table 4", "threshold", threshold="Otsu", method="IG"))
    rows = rb.finalize()
    nr = {n.item: n.why for n in not_reproduced(("ql",), rows, [FigureRef("QL Fig. 3", "v", "violin")], rb.reference)}
    assert "Table 1" in nr and "Fig. 1" in nr                          # nothing of ours: listed
    assert nr["Table 4"].startswith("partly: 5 of 6 printed GPT-2 values")  # one of six thresholds has a number
    assert "Fig. 3" not in nr or "claims" in nr["Fig. 3"]              # a figure, its claim without a number
    assert "method diagrams and settings" in nr and "Fig. 2" in nr["method diagrams and settings"]


def test_fig6_subtracts_the_resampled_mean_of_the_single_groups():
    """Fig. 6's θ = overlap of the full halves − the mean of k single-group overlaps: each replicate must subtract the
    mean of k resampled single-group overlaps (its spread is that of a mean), not one group's overlap."""
    rng = np.random.default_rng(0)
    L, D, G = 2, 400, 8
    sig = np.zeros((L, D))
    sig[0, :15], sig[1, :10] = np.linspace(2, 5, 15), -np.linspace(2, 5, 10)
    g = object.__new__(rc.Groups)  # the group sums of a located dataset, written directly
    g.a, g.b = [None] * G, [None] * G
    g.sa = torch.stack([torch.tensor(sig + rng.standard_normal((L, D))) for _ in range(G)])
    g.sb = torch.stack([torch.tensor(sig + rng.standard_normal((L, D))) for _ in range(G)])
    g.na = g.nb = torch.ones(G, dtype=torch.float64)
    g.n, g.n_groups = 2 * G, 2 * G
    a, b = g.halves(3.0)
    est = Estimate(a.overlap(b), math.nan, math.nan, n=g.n)
    rb = RowBuilder("smollm2-135m", papers=("cnl",))
    rc._convergence(rb, "gsm8k", g, est, 3.0, n_boot=400, seed=5, diffs=[])
    captured = {"eff": rb.specs[-1].ours}
    singles = np.array([sa.overlap(sb) for sa, sb in (g.single(j, 3.0) for j in range(G))])
    r = np.random.default_rng(5)  # the documented replicate, written out
    reps, one_group = [], []
    for _ in range(400):
        ra, rb_ = g.halves(3.0, g.weights(r, G), g.weights(r, G))
        reps.append(ra.overlap(rb_) - singles[r.integers(0, G, G)].mean())
    theta = est.value - singles.mean()
    expect = recentred_estimate(theta, reps, n=g.n, n_groups=g.n_groups, seed=5)
    assert captured["eff"].value == pytest.approx(theta)
    assert (captured["eff"].low, captured["eff"].high) == pytest.approx((expect.low, expect.high))
    r = np.random.default_rng(5)  # the replicate of one random group's overlap, as before: a wider interval
    for _ in range(400):
        ra, rb_ = g.halves(3.0, g.weights(r, G), g.weights(r, G))
        one_group.append(ra.overlap(rb_) - singles[int(r.integers(0, G))])
    wide = recentred_estimate(theta, one_group, n=g.n, n_groups=g.n_groups, seed=5)
    assert singles.std() > 0 and expect.high - expect.low < 0.8 * (wide.high - wide.low)
