"""Effects with CI and p-value (tlcap.metrics.effects), checked against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tlcap.metrics.effects import bootstrap_p, paired_effect, proportion_diff, share_effect, two_group_effect
from tlcap.metrics.estimate import TooFewSamplesError


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
