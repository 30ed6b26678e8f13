"""Effects with a CI and a p-value, for the report's effect rows (built on :mod:`tlcap.metrics`).

Each function returns ``(Estimate, p_value, test)``: the effect (a difference), its 95 % CI and
a two-sided p-value with the name of the test, so a report row can print all three.

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
:func:`proportion_diff`   k1/n1 − k2/n2                         Newcombe's hybrid score interval / two-
                                                               proportion z-test
:func:`bootstrap_p`       —                                     ``2·min(P*(θ ≤ 0), P*(θ ≥ 0))`` of
                                                               bootstrap replicates
========================  ===================================  =========================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from tlcap.metrics.bootstrap import paired_difference_ci
from tlcap.metrics.estimate import Estimate, TooFewSamplesError
from tlcap.metrics.shares import share_ci, wilson_interval

Effect = tuple[Estimate, float, str]
Values = Sequence[float] | np.ndarray


def _cluster_means(x: np.ndarray, groups: Sequence | None) -> np.ndarray:
    if groups is None:
        return x
    g = np.asarray(list(groups))
    return np.array([x[g == k].mean() for k in dict.fromkeys(g.tolist())])


def bootstrap_p(replicates: Sequence[float] | np.ndarray) -> float:
    """Two-sided bootstrap p-value of "the effect is 0": ``min(1, 2·min(P*(θ ≤ 0), P*(θ ≥ 0)))`` (NaN replicates dropped)."""
    r = np.asarray(replicates, dtype=float)
    r = r[~np.isnan(r)]
    if not len(r):
        return math.nan
    return float(min(1.0, 2.0 * min((r <= 0).mean(), (r >= 0).mean())))


def paired_effect(a: Values, b: Values, *, groups: Sequence | np.ndarray | None = None, n_boot: int = 5000,
                  seed: int = 0) -> Effect:
    """mean(a − b) of paired samples (e.g. the same query under two KN sets).

    Example:
        >>> est, p, test = paired_effect(dprob_self, dprob_intersection, groups=fact_ids)
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    est = paired_difference_ci(x, y, n_boot=n_boot, seed=seed, groups=groups)
    d = _cluster_means(x - y, groups)
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if len(d) > 1 and np.std(d) > 0 else (1.0 if len(d) > 1 else math.nan)
    return est, p, "paired t-test" + (" on cluster means" if groups is not None else "")


def two_group_effect(a: Values, b: Values, *, groups_a: Sequence | np.ndarray | None = None,
                     groups_b: Sequence | np.ndarray | None = None, n_boot: int = 5000, seed: int = 0) -> Effect:
    """mean(a) − mean(b) of two independent samples (e.g. K_I facts vs K_II facts).

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
    return est, p, "Welch's t-test" + (" on cluster means" if n_groups is not None else "")


def share_effect(events: Sequence[bool] | Values, p0: float) -> Effect:
    """share(events) − ``p0`` with the Wilson interval (shifted) and an exact binomial test."""
    est = share_ci(np.asarray(events, dtype=float))
    k = int(round(est.value * est.n))
    p = float(stats.binomtest(k, est.n, p0).pvalue)
    shifted = Estimate(est.value - p0, est.low - p0, est.high - p0, n=est.n, method="wilson")
    return shifted, p, "exact binomial test"


def proportion_diff(k1: int, n1: int, k2: int, n2: int) -> Effect:
    """k1/n1 − k2/n2 with Newcombe's hybrid score interval and a two-proportion z-test.

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
    return Estimate(d, low, high, n=n1 + n2, method="newcombe"), p, "two-proportion z-test"


__all__ = ["paired_effect", "two_group_effect", "share_effect", "proportion_diff", "bootstrap_p", "Effect", "Values"]
