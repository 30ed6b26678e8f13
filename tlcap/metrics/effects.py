"""Effects with a CI and a p-value, for the report's effect rows (built on :mod:`tlcap.metrics`).

Each function returns an :class:`Effect` ``(estimate, p_value, test, p_floor)``: the effect (a
difference), its 95 % CI, a two-sided p-value with the name of the test, and the smallest p-value
the test can give (0 for t-tests; ``2/(B+1)`` for a bootstrap p from B replicates; ``2·0.5^m`` for
an exact McNemar test on m discordant pairs), so a report row can print all four.

========================  ===================================  =========================================
function                  effect                               CI / test
========================  ===================================  =========================================
:func:`paired_effect`     mean(a − b) over paired samples       ``paired_difference_ci`` (cluster bootstrap
                                                               with ``groups``) / t-test of the cluster
                                                               means of a − b
:func:`two_group_effect`  mean(a) − mean(b), two samples        bootstrap of both samples (their clusters
                                                               resampled independently) / Welch's t-test
                                                               of the cluster means
:func:`share_effect`      share of events − p0                  Wilson interval shifted by p0 / exact
                                                               binomial test
:func:`proportion_diff`   k1/n1 − k2/n2 (independent samples)   Newcombe's hybrid score interval / two-
                                                               proportion z-test
:func:`mcnemar_effect`    mean(a) − mean(b), paired 0/1        paired bootstrap over items / exact
                                                               McNemar test (binomial on the
                                                               discordant pairs)
:func:`bootstrap_p`       —                                     ``2·(1 + min(#θ* ≤ 0, #θ* ≥ 0))/(B+1)``,
                                                               at most 1 (floor ``2/(B+1)``)
========================  ===================================  =========================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats

from tlcap.metrics.bootstrap import paired_difference_ci
from tlcap.metrics.estimate import Estimate, StatisticsError, TooFewSamplesError
from tlcap.metrics.shares import share_ci, wilson_interval

Values = Sequence[float] | np.ndarray


class Effect(NamedTuple):
    """An effect with its CI, its two-sided p-value, the test's name and the p-value's floor."""

    estimate: Estimate | None
    p_value: float | None
    test: str
    p_floor: float | None = 0.0


NO_EFFECT = Effect(None, None, "", None)


def _cluster_means(x: np.ndarray, groups: Sequence | None) -> np.ndarray:
    if groups is None:
        return x
    g = np.asarray(list(groups))
    return np.array([x[g == k].mean() for k in dict.fromkeys(g.tolist())])


def bootstrap_p(replicates: Sequence[float] | np.ndarray) -> float:
    """Two-sided bootstrap p-value of "the effect is 0" (NaN replicates dropped).

    ``min(1, 2·(1 + min(#{θ* ≤ 0}, #{θ* ≥ 0})) / (B + 1))``: twice the smaller tail, each tail
    counted with one more replicate (as a Monte-Carlo p-value, Davison & Hinkley 1997, §4.4), so
    that B replicates never claim a p below their resolution ``2/(B+1)`` (:func:`bootstrap_p_floor`).

    Args:
        replicates: The bootstrap replicates θ*.

    Returns:
        The p-value in ``(0, 1]``; NaN when no replicate is left.

    Example:
        >>> round(bootstrap_p([1.0, 2.0, 3.0, -1.0]), 3)      # 2 · (1 + 1) / 5
        0.8
        >>> round(bootstrap_p([1.0] * 999), 4)                  # the floor 2/1000
        0.002
    """
    r = np.asarray(replicates, dtype=float)
    r = r[~np.isnan(r)]
    if not len(r):
        return math.nan
    k = min(int((r <= 0).sum()), int((r >= 0).sum()))
    return float(min(1.0, 2.0 * (1 + k) / (len(r) + 1)))


def bootstrap_p_floor(n_boot: int) -> float:
    """The smallest :func:`bootstrap_p` of ``n_boot`` replicates: ``2/(n_boot + 1)``.

    Args:
        n_boot: Number of replicates.

    Returns:
        The floor, at most 1.
    """
    return min(1.0, 2.0 / (int(n_boot) + 1))


def paired_effect(a: Values, b: Values, *, groups: Sequence | np.ndarray | None = None, n_boot: int = 5000,
                  seed: int = 0) -> Effect:
    """mean(a − b) of paired samples (e.g. the same query under two KN sets).

    Args:
        a: First values.
        b: Second values, paired with ``a``.
        groups: Cluster id of each pair (bootstrap by cluster, test on cluster means); None: pairs independent.
        n_boot: Bootstrap replicates of the interval.
        seed: Bootstrap seed.

    Returns:
        An :class:`Effect`: the estimate, the paired t-test p-value, the test's name and a floor of 0.

    Example:
        >>> dprob_self = [0.9, 0.8, 0.7, 0.6, 0.85, 0.75]
        >>> dprob_intersection = [0.3, 0.5, 0.2, 0.4, 0.35, 0.3]
        >>> fact_ids = ["a", "a", "b", "b", "c", "c"]
        >>> est, p, test, p_floor = paired_effect(dprob_self, dprob_intersection, groups=fact_ids)
        >>> print(est); round(p, 4), test, p_floor
        0.425 [0.35, 0.48] (n=6, 3 groups)
        (0.008, 'paired t-test on cluster means', 0.0)
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    est = paired_difference_ci(x, y, n_boot=n_boot, seed=seed, groups=groups)
    d = _cluster_means(x - y, groups)
    return Effect(est, paired_p(d), "paired t-test" + (" on cluster means" if groups is not None else ""), 0.0)


def paired_p(d: np.ndarray) -> float:
    """Two-sided p of mean(d) = 0: the t-test; with no spread, the exact sign test on the non-zero differences.

    Args:
        d: The paired differences (or cluster means of them).

    Returns:
        The p-value; NaN for fewer than 2 differences.
    """
    if len(d) < 2:
        return math.nan
    if np.std(d) > 0:
        return float(stats.ttest_1samp(d, 0.0).pvalue)
    m = int((d != 0).sum())  # every difference equal: all zero (no effect) or all the same sign
    return 1.0 if m == 0 else float(min(1.0, 2.0 * 0.5 ** m))


def two_group_effect(a: Values, b: Values, *, groups_a: Sequence | np.ndarray | None = None,
                     groups_b: Sequence | np.ndarray | None = None, n_boot: int = 5000, seed: int = 0) -> Effect:
    """mean(a) − mean(b) of two independent samples (e.g. K_I facts vs K_II facts).

    Args:
        a: First sample.
        b: Second sample.
        groups_a: Cluster id of each value of ``a`` (resampled by cluster); None: values independent.
        groups_b: Cluster id of each value of ``b``.
        n_boot: Bootstrap replicates of the percentile interval.
        seed: Bootstrap seed.

    Returns:
        An :class:`Effect` with Welch's t-test p-value (NaN with too few units or no spread).

    Raises:
        TooFewSamplesError: an empty sample.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not len(x) or not len(y):
        raise TooFewSamplesError(f"two_group_effect needs both samples, got {len(x)} and {len(y)}")
    rng = np.random.default_rng(seed)

    def units(v: np.ndarray, g: Sequence | None) -> list[np.ndarray]:
        if g is None:
            return [v[i:i + 1] for i in range(len(v))]
        ga = np.asarray(list(g))
        return [v[ga == k] for k in dict.fromkeys(ga.tolist())]

    ua, ub = units(x, groups_a), units(y, groups_b)
    reps = np.empty(n_boot)
    for i in range(n_boot):
        ra = np.concatenate([ua[j] for j in rng.integers(0, len(ua), len(ua))])
        rb = np.concatenate([ub[j] for j in rng.integers(0, len(ub), len(ub))])
        reps[i] = ra.mean() - rb.mean()
    value = float(x.mean() - y.mean())
    low, high = (float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975))) if len(ua) > 1 and len(ub) > 1 \
        else (math.nan, math.nan)
    ma, mb = _cluster_means(x, groups_a), _cluster_means(y, groups_b)
    if len(ma) > 1 and len(mb) > 1 and (np.std(ma) > 0 or np.std(mb) > 0):
        p = float(stats.ttest_ind(ma, mb, equal_var=False).pvalue)
    else:
        p = math.nan
    n_groups = None if groups_a is None and groups_b is None else len(ua) + len(ub)
    est = Estimate(value, low, high, n=len(x) + len(y), method="percentile", n_groups=n_groups, n_boot=n_boot, seed=seed)
    return Effect(est, p, "Welch's t-test" + (" on cluster means" if n_groups is not None else ""), 0.0)


def share_effect(events: Sequence[bool] | Values, p0: float) -> Effect:
    """share(events) − ``p0`` with the Wilson interval (shifted) and an exact binomial test.

    Args:
        events: 0/1 outcomes.
        p0: The reference share.

    Returns:
        An :class:`Effect`; its floor is the test's p-value at the most extreme outcome.
    """
    est = share_ci(np.asarray(events, dtype=float))
    k = int(round(est.value * est.n))
    p = float(stats.binomtest(k, est.n, p0).pvalue)
    shifted = Estimate(est.value - p0, est.low - p0, est.high - p0, n=est.n, method="wilson")
    floor = float(stats.binomtest(0 if p0 >= 0.5 else est.n, est.n, p0).pvalue) if est.n else math.nan
    return Effect(shifted, p, "exact binomial test", floor)


def proportion_diff(k1: int, n1: int, k2: int, n2: int) -> Effect:
    """k1/n1 − k2/n2 with Newcombe's hybrid score interval and a two-proportion z-test.

    Args:
        k1: Events in the first sample.
        n1: Size of the first sample.
        k2: Events in the second sample.
        n2: Size of the second sample.

    Returns:
        An :class:`Effect` (method ``"newcombe"``, floor 0).

    Raises:
        TooFewSamplesError: ``n1`` or ``n2`` is 0.
    """
    if n1 < 1 or n2 < 1:
        raise TooFewSamplesError(f"proportion_diff needs samples on both sides, got n1={n1}, n2={n2}")
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1)
    l2, u2 = wilson_interval(k2, n2)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    pool = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pool * (1 - pool) * (1 / n1 + 1 / n2))
    p = float(2 * stats.norm.sf(abs(d) / se)) if se > 0 else (1.0 if d == 0 else 0.0)
    return Effect(Estimate(d, low, high, n=n1 + n2, method="newcombe"), p, "two-proportion z-test", 0.0)


def mcnemar_effect(a: Values, b: Values, *, n_boot: int = 5000, seed: int = 0) -> Effect:
    """mean(a) − mean(b) for 0/1 outcomes of the same items under two conditions (located vs random).

    The test is the exact McNemar test: under "no difference" each discordant item (1 under one
    condition, 0 under the other) falls either way with probability 1/2, so with ``n10`` items
    ``(1, 0)`` and ``n01`` items ``(0, 1)`` the two-sided p-value is
    ``min(1, 2·P(Bin(n10 + n01, 1/2) ≤ min(n10, n01)))``. The CI is the paired bootstrap over items.

    Args:
        a: 0/1 outcome per item under the first condition.
        b: 0/1 outcome per item under the second condition (same items, same order).
        n_boot: Bootstrap resamples of the CI.
        seed: Their seed.

    Returns:
        The :class:`Effect` (floor ``2·0.5^(n10+n01)``; p = 1 without discordant items).

    Raises:
        StatisticsError: Lengths differ or a value is not 0/1.

    Example:
        >>> e = mcnemar_effect([1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0])
        >>> round(e.p_value, 4), round(e.estimate.value, 3)      # 2 · 0.5^5
        (0.0625, 0.833)
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise StatisticsError(f"mcnemar_effect needs the same items under both conditions, got {x.shape} and {y.shape}")
    if not np.isin(x, (0.0, 1.0)).all() or not np.isin(y, (0.0, 1.0)).all():
        raise StatisticsError("mcnemar_effect takes 0/1 outcomes (correct / not); use paired_effect for scores")
    n10, n01 = int(((x == 1) & (y == 0)).sum()), int(((x == 0) & (y == 1)).sum())
    m = n10 + n01
    p = float(min(1.0, 2.0 * stats.binom.cdf(min(n10, n01), m, 0.5))) if m else 1.0
    est = paired_difference_ci(x, y, n_boot=n_boot, seed=seed)
    return Effect(est, p, f"exact McNemar test ({n10} vs {n01} discordant items)", min(1.0, 2.0 * 0.5 ** m) if m else 1.0)


__all__ = ["paired_p", "paired_effect", "two_group_effect", "share_effect", "proportion_diff", "mcnemar_effect", "bootstrap_p",
           "bootstrap_p_floor", "Effect", "NO_EFFECT", "Values"]
