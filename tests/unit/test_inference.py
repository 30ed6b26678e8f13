"""Statistics layer: Estimate, bootstrap (plain, BCa, cluster, paired), Wilson shares,
Monte-Carlo permutation p-values and threshold-sensitivity curves.

Reference values are slow explicit loops with the same seed, scipy.stats.bootstrap, hand
computations, and seeded simulations whose tolerance a wrong implementation would miss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from beartype import beartype
from jaxtyping import jaxtyped
from scipy import stats

from tlcap.errors import TlcapError
from tlcap.metrics import (
    Estimate,
    SensitivityCurve,
    StatisticsError,
    TooFewSamplesError,
    bootstrap_ci,
    located_vs_random,
    paired_difference_ci,
    permutation_p_value,
    require_draws,
    share_ci,
    threshold_curve,
    wilson_interval,
)
from tlcap.metrics.bootstrap import WeightedStatistic
from tlcap.results import load_result


def loop_bootstrap(x: np.ndarray, stat, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """The textbook percentile bootstrap: one resample per loop iteration."""
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(x), len(x))
        reps.append(stat(x[idx]))
    a = (1 - level) / 2
    return float(np.percentile(reps, 100 * a)), float(np.percentile(reps, 100 * (1 - a)))


SKEWED = np.random.default_rng(3).exponential(size=30)


# ---------------------------------------------------------------- Estimate
def test_estimate_prints_as_reports_expect():
    e = Estimate(0.373, 0.31, 0.44, n=50)
    assert str(e) == "0.373 [0.31, 0.44] (n=50)"
    assert e.format(percent=True) == "37.3 [31.0, 44.0] % (n=50)"
    assert str(Estimate(0.5, math.nan, math.nan, n=1)) == "0.500 (no CI, n=1)"
    assert str(Estimate(0.5, 0.4, 0.6, n=200, n_groups=50)) == "0.500 [0.40, 0.60] (n=200, 50 groups)"


def test_estimate_is_a_json_ready_saveable_value(tmp_path):
    e = Estimate(0.5, math.nan, math.nan, n=1, method="percentile", n_boot=10, seed=3)
    d = e.to_dict()
    assert d == {
        "value": 0.5,
        "low": None,
        "high": None,
        "level": 0.95,
        "n": 1,
        "method": "percentile",
        "n_groups": None,
        "n_boot": 10,
        "seed": 3,
    }
    back = load_result(e.save(tmp_path / "e"))
    assert isinstance(back, Estimate) and back.value == 0.5 and math.isnan(back.low) and not back.has_interval
    with pytest.raises(StatisticsError, match="level"):
        Estimate(0.5, 0.4, 0.6, level=95)


# ---------------------------------------------------------------- bootstrap_ci
@pytest.mark.parametrize("stat_name, stat", [("mean", np.mean), ("median", np.median)])
def test_bootstrap_ci_equals_slow_loop_with_same_seed(stat_name, stat):
    est = bootstrap_ci(SKEWED, stat_name, n_boot=2000, seed=11)
    lo, hi = loop_bootstrap(SKEWED, stat, 2000, 11)
    assert est.value == pytest.approx(stat(SKEWED), abs=1e-12)
    assert (est.low, est.high) == pytest.approx((lo, hi), abs=1e-12)
    assert est.n == 30 and est.method == "percentile" and est.n_boot == 2000 and est.seed == 11


def test_bootstrap_ci_callable_statistic_equals_loop():
    def trimmed(s):
        return float(stats.trim_mean(s, 0.1))

    est = bootstrap_ci(SKEWED, trimmed, n_boot=500, seed=2)
    assert (est.low, est.high) == pytest.approx(loop_bootstrap(SKEWED, trimmed, 500, 2), abs=1e-12)


@pytest.mark.parametrize("method, scipy_method", [("percentile", "percentile"), ("bca", "BCa")])
def test_bootstrap_ci_matches_scipy(method, scipy_method):
    est = bootstrap_ci(SKEWED, n_boot=3000, seed=7, method=method)
    ref = stats.bootstrap((SKEWED,), np.mean, n_resamples=3000, method=scipy_method, rng=np.random.default_rng(7))
    assert (est.low, est.high) == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high), abs=1e-12)


def test_bca_shifts_the_interval_of_a_skewed_sample_upwards():
    pct = bootstrap_ci(SKEWED, n_boot=3000, seed=7)
    bca = bootstrap_ci(SKEWED, n_boot=3000, seed=7, method="bca")
    assert bca.low > pct.low and bca.high > pct.high  # right-skewed mean: BCa moves right


def test_bootstrap_ci_is_deterministic_and_accepts_numpy_torch_lists():
    a = bootstrap_ci(SKEWED, seed=5, n_boot=300)
    assert a == bootstrap_ci(torch.tensor(SKEWED), seed=5, n_boot=300) == bootstrap_ci(SKEWED.tolist(), seed=5, n_boot=300)
    assert bootstrap_ci(SKEWED, seed=6, n_boot=300).low != a.low


def test_bootstrap_ci_degenerate_samples():
    with pytest.raises(TooFewSamplesError, match="empty") as info:
        bootstrap_ci([])
    assert isinstance(info.value, TlcapError)
    one = bootstrap_ci([0.7])
    assert one.value == 0.7 and math.isnan(one.low) and math.isnan(one.high) and one.n == 1
    for method in ("percentile", "bca"):
        same = bootstrap_ci([0.25] * 8, method=method)
        assert (same.value, same.low, same.high) == (0.25, 0.25, 0.25)
    with pytest.raises(StatisticsError, match="NaN"):
        bootstrap_ci([1.0, math.nan, 2.0])
    assert bootstrap_ci([1.0, math.nan, 3.0], nan_policy="omit").value == 2.0
    with pytest.raises(StatisticsError, match="dimension"):
        bootstrap_ci(np.ones((3, 2)))  # mean needs 1-D values


def test_percentile_ci_covers_the_mean_of_normal_samples_at_the_nominal_rate():
    """1000 seeded normal samples of n = 40: coverage ≈ 0.94 (the percentile bootstrap is a bit
    short at small n). A 90 % interval mistaken for 95 % (~0.885), α instead of α/2 (~0.89) or
    the sample SD instead of the SE (~1.0) fall outside the tolerance."""
    rng = np.random.default_rng(2024)
    hits = [bootstrap_ci(rng.normal(1.0, 2.0, 40), n_boot=1000, seed=i).contains(1.0) for i in range(1000)]
    assert abs(np.mean(hits) - 0.95) < 0.03


# ---------------------------------------------------------------- cluster bootstrap
def test_cluster_bootstrap_equals_plain_bootstrap_of_group_means():
    """10 equal-sized groups: a cluster resample draws 10 group indices exactly as a plain
    resample of the 10 group means does, so the intervals coincide; resampling the 100 values
    one by one ignores that each group's values are copies and is about √10 times narrower."""
    rng = np.random.default_rng(0)
    means = rng.normal(size=10)
    values = np.repeat(means, 10) + rng.normal(scale=0.01, size=100)
    groups = [f"fact{g}" for g in np.repeat(np.arange(10), 10)]
    cluster = bootstrap_ci(values, groups=groups, n_boot=2000, seed=4)
    by_group = bootstrap_ci(values.reshape(10, 10).mean(1), n_boot=2000, seed=4)
    assert (cluster.value, cluster.low, cluster.high) == pytest.approx((by_group.value, by_group.low, by_group.high), abs=1e-12)
    assert cluster.n == 100 and cluster.n_groups == 10
    naive = bootstrap_ci(values, n_boot=2000, seed=4)
    assert naive.value == pytest.approx(cluster.value)
    assert (cluster.high - cluster.low) > 2.5 * (naive.high - naive.low)


def test_cluster_bootstrap_keeps_groups_together():
    sizes = [1, 2, 3, 4, 5]
    codes = np.concatenate([[g] * s for g, s in enumerate(sizes)]).astype(float)
    seen = []

    def whole_groups(sample: np.ndarray) -> float:
        counts = np.bincount(sample.astype(int), minlength=5)
        assert all(c % s == 0 for c, s in zip(counts, sizes)), counts
        seen.append(counts // np.array(sizes))
        return float(sample.mean())

    bootstrap_ci(codes, whole_groups, groups=codes.astype(int), n_boot=200, seed=1)
    draws = np.array(seen[1:])  # first call is the full sample
    assert (draws.sum(1) == 5).all()  # 5 groups drawn per resample
    assert len({tuple(d) for d in draws}) > 50  # and they vary


def test_cluster_bootstrap_vectorised_mean_equals_materialised_resamples():
    rng = np.random.default_rng(9)
    x = rng.normal(size=23)
    g = rng.integers(0, 6, 23)
    fast = bootstrap_ci(x, "mean", groups=g, n_boot=400, seed=3, method="bca")
    slow = bootstrap_ci(x, lambda s: float(np.mean(s)), groups=g, n_boot=400, seed=3, method="bca")
    assert (fast.low, fast.high) == pytest.approx((slow.low, slow.high), abs=1e-12)


def test_cluster_bootstrap_covers_when_the_naive_one_does_not():
    """Strong within-fact correlation (15 facts × 4 queries): the cluster interval covers 0.91,
    the naive per-query interval 0.63 (300 seeded data sets)."""
    rng = np.random.default_rng(7)
    g = np.repeat(np.arange(15), 4)
    cluster, naive = [], []
    for i in range(300):
        x = rng.normal(0, 1, 15)[g] + rng.normal(0, 0.5, 60)
        cluster.append(bootstrap_ci(x, groups=g, n_boot=1000, seed=i).contains(0.0))
        naive.append(bootstrap_ci(x, n_boot=1000, seed=i).contains(0.0))
    assert np.mean(cluster) > 0.87 and np.mean(naive) < 0.8


def test_one_group_gives_no_interval():
    e = bootstrap_ci([1.0, 2.0, 3.0], groups=["a", "a", "a"])
    assert e.value == 2.0 and not e.has_interval and e.n_groups == 1


# ---------------------------------------------------------------- paired difference
def test_paired_difference_of_means_is_the_bootstrap_of_differences():
    rng = np.random.default_rng(1)
    base = rng.normal(size=40)
    a, b = base + rng.normal(0.3, 0.2, 40), base
    d = paired_difference_ci(a, b, n_boot=2000, seed=8)
    ref = bootstrap_ci(a - b, n_boot=2000, seed=8)
    assert (d.value, d.low, d.high) == pytest.approx((ref.value, ref.low, ref.high), abs=1e-12)
    # pairing removes the shared per-sample variation: far narrower than the two intervals combined
    ea, eb = bootstrap_ci(a, seed=8), bootstrap_ci(b, seed=8)
    assert d.high - d.low < 0.3 * ((ea.high - ea.low) + (eb.high - eb.low))


def test_paired_median_difference_equals_loop():
    rng = np.random.default_rng(2)
    a, b = rng.exponential(size=25), rng.exponential(size=25)
    d = paired_difference_ci(a, b, "median", n_boot=500, seed=4)
    ab = np.stack([a, b], 1)
    ref = loop_bootstrap(ab, lambda s: np.median(s[:, 0]) - np.median(s[:, 1]), 500, 4)
    assert d.value == pytest.approx(np.median(a) - np.median(b))
    assert (d.low, d.high) == pytest.approx(ref, abs=1e-12)
    with pytest.raises(StatisticsError, match="paired"):
        paired_difference_ci(a, b[:-1])


# ---------------------------------------------------------------- shares
def test_wilson_interval_by_hand():
    # 8 of 10, z = 1.959964, z² = 3.841459: centre (0.8 + z²/20) / (1 + z²/10) = 0.992073 / 1.384146
    # = 0.716740; half-width z/(1 + z²/10) · sqrt(0.016 + z²/400) = 1.416010 · 0.160011 = 0.226578
    # → [0.490162, 0.943318]
    e = share_ci([1] * 8 + [0] * 2)
    assert e.method == "wilson" and e.value == 0.8 and e.n == 10
    assert (e.low, e.high) == pytest.approx((0.490162, 0.943318), abs=1e-6)
    # 0 of 20: [0, z²/(20 + z²)] = [0, 0.161125] — not the bootstrap's [0, 0]
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.161125), abs=1e-6)
    assert share_ci(np.zeros(20, bool), method="bootstrap").high == 0.0


def test_share_ci_with_groups_uses_the_cluster_bootstrap():
    ev = torch.tensor([True, True, False, False, True, True, False, True])
    g = [0, 0, 1, 1, 2, 2, 3, 3]
    e = share_ci(ev, groups=g, n_boot=500, seed=1)
    ref = bootstrap_ci(ev.double(), groups=g, n_boot=500, seed=1)
    assert e.method == "percentile" and e.n_groups == 4 and (e.low, e.high) == (ref.low, ref.high)
    with pytest.raises(StatisticsError, match="independent"):
        share_ci(ev, groups=g, method="wilson")
    with pytest.raises(StatisticsError, match="0/1"):
        share_ci([0.2, 1.0])
    with pytest.raises(TooFewSamplesError):
        share_ci([])


# ---------------------------------------------------------------- permutation p-values
def test_permutation_p_value_on_constructed_examples():
    null = np.linspace(0.0, 0.5, 20)
    assert permutation_p_value(0.9, null) == pytest.approx(2 / 21)  # two-sided by default
    assert permutation_p_value(0.9, null, "greater") == pytest.approx(1 / 21)
    assert permutation_p_value(0.9, null, "less") == pytest.approx(1.0)
    assert permutation_p_value(-1.0, null, "less") == pytest.approx(1 / 21)
    assert permutation_p_value(0.9, null, "two-sided") == pytest.approx(2 / 21)
    # ties count as at least as extreme: 3 in [1, 2, 3, 4]
    assert permutation_p_value(3.0, [1, 2, 3, 4], "greater") == pytest.approx(3 / 5)
    assert permutation_p_value(3.0, [1, 2, 3, 4], "less") == pytest.approx(4 / 5)
    assert permutation_p_value(3.0, [1, 2, 3, 4], "two-sided") == 1.0
    with pytest.raises(StatisticsError, match="alternative"):
        permutation_p_value(1.0, null, "bigger")
    with pytest.raises(TooFewSamplesError):
        permutation_p_value(1.0, [])


def test_permutation_p_value_is_exact_under_the_null():
    """With exchangeable values P(p ≤ 1/21) = 1/21 exactly (SE 0.0033 over 4200 trials); an
    off-by-one (#/n, or dropping the +1) would give 0 or 2/21."""
    trials = np.random.default_rng(0).normal(size=(4200, 21))
    p = np.array([permutation_p_value(t[0], t[1:], "greater") for t in trials])
    assert abs(np.mean(p <= 1 / 21 + 1e-12) - 1 / 21) < 0.01
    p2 = np.array([permutation_p_value(t[0], t[1:]) for t in trials])  # two-sided: P(p ≤ 2/21) = 2/21
    assert abs(np.mean(p2 <= 2 / 21 + 1e-12) - 2 / 21) < 0.015 and p2.min() == pytest.approx(2 / 21)


def test_located_vs_random_refuses_fewer_than_20_draws():
    with pytest.raises(TooFewSamplesError, match="19 matched random sets given, at least 20 needed"):
        located_vs_random(0.9, np.zeros(19))
    t = located_vs_random(0.30, [0.1] * 17 + [0.3, 0.4, 0.5], statistic="Δprob", alternative="greater")
    assert t.n_null == 20 and t.n_as_extreme == 3 and t.p_value == pytest.approx(4 / 21)
    assert located_vs_random(0.30, [0.1] * 17 + [0.3, 0.4, 0.5]).p_value == pytest.approx(8 / 21)  # two-sided
    assert t.null_max == 0.5 and t.null_mean == pytest.approx((1.7 + 1.2) / 20)
    low = located_vs_random(0.0, np.arange(1, 21) / 10, alternative="less")
    assert low.p_value == pytest.approx(1 / 21) and low.n_as_extreme == 0
    assert "p = 0.0476" in str(low) and len(low.to_frame()) == 21
    with pytest.raises(StatisticsError, match="NaN"):
        require_draws([1.0, math.nan], 2)


# ---------------------------------------------------------------- threshold curves
CS2 = np.array([0.0, 0.05, 0.1, 0.1, 0.2, 0.3, 0.35, 0.5, 0.6, 0.9])


def test_threshold_curve_values_by_hand_and_bands_equal_per_threshold_bootstrap():
    grid = [0.1, 0.3, 0.55]
    c = threshold_curve(CS2, grid, "share_at_or_below", n_boot=1000, seed=3)  # the K_II share
    assert c.value == pytest.approx((0.4, 0.6, 0.8))
    for t, lo, hi in zip(grid, c.low, c.high):
        ref = bootstrap_ci((CS2 <= t).astype(float), n_boot=1000, seed=3)
        assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-12)
    above = threshold_curve(CS2, grid, "share_above", n_boot=1000, seed=3)
    assert np.allclose(np.array(above.low), 1 - np.array(c.high)) and np.allclose(np.array(above.high), 1 - np.array(c.low))


@pytest.mark.filterwarnings(
    "ignore:Mean of empty slice", "ignore:invalid value"
)  # resamples with an empty side give NaN (dropped)
def test_threshold_curve_separation_and_callable():
    c = threshold_curve(CS2, [0.3], "separation", n_boot=300, seed=0)
    # above 0.3: 0.35, 0.5, 0.6, 0.9 → 0.5875; at or below: 0, .05, .1, .1, .2, .3 → 0.125
    assert c.value[0] == pytest.approx(0.5875 - 0.125)
    assert c.low[0] < c.value[0] < c.high[0]
    f = threshold_curve(CS2, [0.1, 0.3], lambda s, t: float(np.mean(s <= t)), n_boot=300, seed=0)
    b = threshold_curve(CS2, [0.1, 0.3], "share_at_or_below", n_boot=300, seed=0)
    assert f.low + f.high == pytest.approx(b.low + b.high, abs=1e-12)
    # a threshold on column 0 acting on column 1: ΔProb of K_I minus K_II
    rows = np.stack([CS2, np.arange(10.0)], 1)
    d = threshold_curve(rows, [0.3], lambda s, t: s[s[:, 0] > t, 1].mean() - s[s[:, 0] <= t, 1].mean(), n_boot=200)
    assert d.value[0] == pytest.approx(7.5 - 2.5)


def test_sensitivity_curve_from_estimates_table_and_figure():
    ests = [Estimate(0.2, 0.1, 0.3, n=50), Estimate(0.3, 0.2, 0.4, n=50), Estimate(0.5, 0.4, 0.6, n=50)]
    c = SensitivityCurve.from_estimates([3, 6, 12], ests, "sigma", "accuracy drop")
    assert c.estimates() == [Estimate(e.value, e.low, e.high, n=50) for e in ests]
    assert list(c.to_frame().columns) == ["sigma", "value", "low", "high"]
    assert len(c.figure().data) == 3
    with pytest.raises(StatisticsError, match="one estimate per grid point"):
        SensitivityCurve.from_estimates([3, 6], ests)


def test_results_survive_save_and_load(tmp_path):
    curve = threshold_curve([0.5], [0.1, 0.9])  # one sample: NaN bands
    back = load_result(curve.save(tmp_path / "curve"))
    assert back.value == (1.0, 0.0) and all(math.isnan(v) for v in back.low + back.high)
    test = located_vs_random(0.3, np.linspace(0, 1, 20))
    assert load_result(test.save(tmp_path / "test")) == test


# ---------------------------------------------------------------- annotations
def test_public_annotations_accept_lists_numpy_and_torch():
    checked = [jaxtyped(typechecker=beartype)(f) for f in (bootstrap_ci, share_ci, permutation_p_value, threshold_curve)]
    boot, share, perm, curve = checked
    for x in ([0.1, 0.5, 0.3], np.array([0.1, 0.5, 0.3]), torch.tensor([0.1, 0.5, 0.3])):
        assert boot(x, n_boot=50).n == 3
        assert curve(x, [0.2], n_boot=50).value == pytest.approx((2 / 3,))
    assert share([True, False]).value == 0.5 and perm(1.0, [0.0, 2.0], "greater") == pytest.approx(2 / 3)
    assert isinstance(WeightedStatistic(lambda x, W: W @ x, "sum")(np.ones(3), np.ones((2, 3))), np.ndarray)
