"""Effects with CI and p-value (tlcap.metrics.effects), checked against hand computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from tlcap.metrics.bootstrap import crossed_ci
from tlcap.metrics.effects import (
    bootstrap_p,
    paired_effect,
    proportion_diff,
    random_draws_effect,
    share_effect,
    two_group_effect,
)
from tlcap.metrics.estimate import StatisticsError, TooFewSamplesError


def test_bootstrap_p_counts_replicates_on_each_side_of_zero():
    assert bootstrap_p([1.0, 2.0, 3.0, -1.0]) == pytest.approx(0.8)  # 2 · (1 + 1) / (4 + 1)
    assert bootstrap_p([1.0, 2.0, math.nan]) == pytest.approx(2 / 3)  # the floor of 2 replicates: 2 · 1 / 3
    assert bootstrap_p([1.0] * 999) == pytest.approx(0.002)
    assert bootstrap_p([0.0, 0.0]) == 1.0
    assert math.isnan(bootstrap_p([math.nan]))


def test_proportion_diff_newcombe_by_hand():
    est, p, test, _ = proportion_diff(8, 10, 2, 10)
    # Wilson 95 % intervals of 0.8 and 0.2 at n = 10 (z = 1.96): [0.4902, 0.9433] and [0.0567, 0.5098]
    low = 0.6 - math.sqrt((0.8 - 0.4902) ** 2 + (0.5098 - 0.2) ** 2)
    high = 0.6 + math.sqrt((0.9433 - 0.8) ** 2 + (0.2 - 0.0567) ** 2)
    assert est.value == pytest.approx(0.6)
    assert est.low == pytest.approx(low, abs=2e-3) and est.high == pytest.approx(high, abs=2e-3)
    z = 0.6 / math.sqrt(0.5 * 0.5 * (2 / 10))
    assert p == pytest.approx(2 * stats.norm.sf(z)) and test == "two-proportion z-test"
    with pytest.raises(TooFewSamplesError):
        proportion_diff(0, 0, 1, 2)


def test_share_effect_is_the_share_minus_p0_with_an_exact_binomial_test():
    est, p, *_ = share_effect([True] * 9 + [False], 0.5)
    assert est.value == pytest.approx(0.4)
    assert p == pytest.approx(stats.binomtest(9, 10, 0.5).pvalue)


def test_paired_effect_of_identical_samples_is_zero_and_t_test_matches_scipy():
    a = np.array([0.1, 0.5, 0.3, 0.9])
    est, p, *_ = paired_effect(a, a, n_boot=200)
    assert est.value == 0.0 and p == 1.0
    b = np.array([0.0, 0.2, 0.4, 0.1])
    est, p, *_ = paired_effect(a, b, n_boot=200)
    assert est.value == pytest.approx(float((a - b).mean()))
    assert p == pytest.approx(stats.ttest_1samp(a - b, 0.0).pvalue)


def test_two_group_effect_value_and_welch_p():
    a, b = [1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 1.0]
    est, p, test, _ = two_group_effect(a, b, n_boot=500)
    assert est.value == pytest.approx(2.5 - 0.5)
    assert p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue) and test == "Welch's t-test"
    assert est.low <= est.value <= est.high
    with pytest.raises(TooFewSamplesError):
        two_group_effect([], [1.0])


def _cr1_t_by_hand(d, groups):
    """The cluster-robust t statistic of mean(d), written out: residual sums per cluster, G/(G−1) · Σ e² / N²."""
    mean = sum(d) / len(d)
    sums: dict = {}
    for v, g in zip(d, groups):
        sums[g] = sums.get(g, 0.0) + (v - mean)
    G = len(sums)
    var = G / (G - 1) * sum(e * e for e in sums.values()) / len(d) ** 2
    return mean / math.sqrt(var), G - 1


def test_paired_effect_with_unequal_clusters_tests_the_mean_it_reports():
    """60 facts × 3 queries around +1 and 80 facts × 1 query around −1.2: the pooled mean is positive, the mean of
    the cluster means negative. The test must be of the pooled mean (the estimate's sign), not of the cluster means."""
    rng = np.random.default_rng(3)
    d = np.concatenate([1.0 + rng.normal(0, 0.5, 180), -1.2 + rng.normal(0, 0.5, 80)])
    groups = [i // 3 for i in range(180)] + [60 + i for i in range(80)]
    est, p, test, floor = paired_effect(d, np.zeros_like(d), groups=groups, n_boot=300)
    cluster_means = [d[np.asarray(groups) == g].mean() for g in dict.fromkeys(groups)]
    assert est.value > 0 > np.mean(cluster_means)  # the case that made the two disagree in sign
    t, df = _cr1_t_by_hand(list(d), groups)
    assert t > 0 and p == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-10)
    assert test == "paired t-test, cluster-robust" and floor == 0.0
    # equal clusters: exactly the t-test of the cluster means (what the code did before, where it was right)
    g2 = [i // 2 for i in range(10)]
    a, b = rng.normal(size=10), rng.normal(size=10)
    means = [(a - b)[np.asarray(g2) == g].mean() for g in range(5)]
    assert paired_effect(a, b, groups=g2, n_boot=50).p_value == pytest.approx(stats.ttest_1samp(means, 0.0).pvalue)


def test_two_group_effect_cluster_robust_and_no_spread():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=10), rng.normal(size=8)
    ga, gb = [i // 2 for i in range(10)], [i // 2 for i in range(8)]
    ma = [a[np.asarray(ga) == g].mean() for g in range(5)]
    mb = [b[np.asarray(gb) == g].mean() for g in range(4)]
    e = two_group_effect(a, b, groups_a=ga, groups_b=gb, n_boot=50)  # equal sizes within each sample: Welch on means
    assert e.p_value == pytest.approx(stats.ttest_ind(ma, mb, equal_var=False).pvalue)
    assert e.test == "Welch's t-test, cluster-robust"
    # neither sample varies: the exact permutation p, checked by enumerating every labelling of the units
    for na, nb in ((3, 3), (2, 3), (12, 12)):
        e = two_group_effect([1.0] * na, [0.0] * nb, n_boot=20)
        if na + nb <= 8:
            vals = [1.0] * na + [0.0] * nb
            labellings = list(itertools.combinations(range(na + nb), na))
            diffs = [np.mean([vals[i] for i in c]) - np.mean([vals[i] for i in range(na + nb) if i not in c])
                     for c in labellings]
            expect = sum(abs(x) >= 1.0 - 1e-12 for x in diffs) / len(labellings)
        else:
            expect = 2 / math.comb(24, 12)
        assert e.p_value == pytest.approx(expect) and e.p_floor == pytest.approx(expect)
    assert two_group_effect([1.0] * 3, [1.0] * 3, n_boot=20).p_value == 1.0


def test_paired_effect_without_spread_reports_the_sign_tests_floor():
    est, p, test, floor = paired_effect([1.0] * 6, [0.0] * 6, n_boot=50)
    assert p == pytest.approx(2 * 0.5 ** 6) and floor == pytest.approx(2 * 0.5 ** 6) and test == "exact sign test"


def test_random_draws_effect_is_the_larger_p_of_a_prediction_t_over_draws_and_a_paired_t_over_items():
    rng = np.random.default_rng(3)
    loc = (rng.random(40) < 0.6).astype(float)
    rnd = (rng.random((4, 40)) < 0.4).astype(float)
    e = random_draws_effect(loc, rnd, n_boot=400, seed=1)
    acc = rnd.mean(1)
    t = (loc.mean() - acc.mean()) / (acc.std(ddof=1) * np.sqrt(1 + 1 / 4))  # one more draw's prediction interval
    p_draws = 2 * stats.t.sf(abs(t), 3)
    p_items = stats.ttest_1samp(loc - rnd.mean(0), 0.0).pvalue
    assert e.estimate.value == pytest.approx(loc.mean() - rnd.mean(), abs=1e-15)
    assert e.p_value == pytest.approx(max(p_draws, p_items), rel=1e-12) and e.p_floor == 0.0
    assert f"(p {p_draws:.2g})" in e.test and f"(p {p_items:.2g})" in e.test
    assert e.estimate.low < e.estimate.value < e.estimate.high and e.estimate.n_boot == 400
    # the crossed bootstrap is wider than resampling items alone (the draws' spread is in it)
    items_only = paired_effect(loc, rnd.mean(0), n_boot=400, seed=1).estimate
    assert e.estimate.high - e.estimate.low > items_only.high - items_only.low
    # 0/1 draws that do not vary: their spread is taken at the accuracy grid's rounding SD, 1/(40·√12)
    same = np.tile(rnd[0], (3, 1))
    e2 = random_draws_effect(loc, same, n_boot=50)
    grid = 1 / (40 * np.sqrt(12))
    p_grid = 2 * stats.t.sf(abs(loc.mean() - rnd[0].mean()) / (grid * np.sqrt(1 + 1 / 3)), 2)
    p_items = stats.ttest_1samp(loc - rnd[0], 0.0).pvalue
    assert e2.p_value == pytest.approx(max(p_grid, p_items), rel=1e-9)
    assert e2.p_floor == pytest.approx(2 * stats.t.sf(1 / (grid * np.sqrt(1 + 1 / 3)), 2), rel=1e-9)
    assert f"(p {p_grid:.2g})" in e2.test and "the draws' spread 0 is below the 1/(n√12) = 0.0072" in e2.test
    assert random_draws_effect(rnd[0], same, n_boot=50).p_value == 1.0  # no gap, no item differs
    # scores that are not 0/1 and draws that do not vary at all: the prediction test is degenerate, the items decide
    e3 = random_draws_effect(loc * 0.7, same * 0.7 + 0.01, n_boot=50)
    assert e3.p_value == pytest.approx(stats.ttest_1samp(loc * 0.7 - rnd[0] * 0.7 - 0.01, 0.0).pvalue, rel=1e-9)
    assert e3.test.endswith("the prediction test is degenerate and the items decide") and e3.p_floor == 0.0
    with pytest.raises(StatisticsError, match="at least 2 random draws"):
        random_draws_effect(loc, rnd[:1])
    with pytest.raises(StatisticsError, match="40 items"):
        random_draws_effect(loc, rnd[:, :10])


def test_crossed_ci_resamples_items_and_draws_as_a_slow_loop_does():
    rng = np.random.default_rng(5)
    rnd = (rng.random((3, 25)) < 0.5).astype(float)
    loc = (rng.random(25) < 0.7).astype(float)
    n_boot = 300  # two blocks of resamples (256 + 44)
    # the reference: per block, the item indices then the draw indices; each resample's R x n cells
    g = np.random.default_rng(9)
    ref_mean, ref_diff = [], []
    for b0 in range(0, n_boot, 256):
        b = min(256, n_boot - b0)
        ii, kk = g.integers(0, 25, (b, 25)), g.integers(0, 3, (b, 3))
        for j in range(b):
            cells = np.array([[rnd[k, i] for i in ii[j]] for k in kk[j]])
            ref_mean.append(cells.mean())
            ref_diff.append(loc[ii[j]].mean() - cells.mean())
    for located, reps, theta in ((None, ref_mean, rnd.mean()), (loc, ref_diff, (loc - rnd.mean(0)).mean())):
        e = crossed_ci(rnd, located, n_boot=n_boot, seed=9)
        lo, hi = np.quantile(reps, [0.025, 0.975])
        assert (e.value, e.low, e.high) == pytest.approx((theta, lo, hi), abs=1e-12)
        assert e.n == 25 and e.method == "crossed bootstrap (items × draws)"
    # random_draws_effect's CI is this one
    assert random_draws_effect(loc, rnd, n_boot=n_boot, seed=9).estimate == crossed_ci(rnd, loc, n_boot=n_boot, seed=9)
    with pytest.raises(StatisticsError, match="one score per item"):
        crossed_ci(rnd, loc[:5])
    with pytest.raises(StatisticsError, match="draws, items"):
        crossed_ci(loc)
