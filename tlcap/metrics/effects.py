"""Effects with a CI and a p-value, for the report's effect rows (built on :mod:`tlcap.metrics`).

Each function returns an :class:`Effect` ``(estimate, p_value, test, p_floor)``: the effect (a
difference), its 95 % CI, a two-sided p-value with the name of the test, and the smallest p-value
the test can give (0 for t-tests; ``2/(B+1)`` for a bootstrap p from B replicates; ``2·0.5^m`` for
an exact McNemar or sign test on m discordant pairs), so a report row can print all four.

With clusters (several queries of one fact, items of one group) the estimate is the mean over every
observation, and so is what the test tests: the t statistic's standard error is the cluster-robust
(CR1, "sandwich") one, ``√(G/(G−1) · Σ_c e_c²) / N`` with ``e_c`` the sum of cluster ``c``'s residuals
about the mean, on ``G − 1`` degrees of freedom. With clusters of equal size this is exactly the
t-test of the cluster means; with unequal sizes the t-test of the cluster means would test another
mean (each cluster weighted 1/G), whose sign can differ from the estimate's.

============================  ===================================  =========================================
function                      effect                               CI / test
============================  ===================================  =========================================
:func:`paired_effect`         mean(a − b) over paired samples       ``paired_difference_ci`` (cluster bootstrap
                                                                   with ``groups``) / t-test of the mean,
                                                                   cluster-robust with ``groups``
:func:`two_group_effect`      mean(a) − mean(b), two samples        bootstrap of both samples (their clusters
                                                                   resampled independently) / Welch's t-test,
                                                                   cluster-robust with groups
:func:`share_effect`          share of events − p0                  Wilson interval shifted by p0 / exact
                                                                   binomial test
:func:`proportion_diff`       k1/n1 − k2/n2 (independent samples)   Newcombe's hybrid score interval / two-
                                                                   proportion z-test
:func:`mcnemar_effect`        mean(a) − mean(b), paired 0/1        paired bootstrap over items / exact
                                                                   McNemar test (binomial on the
                                                                   discordant pairs)
:func:`random_draws_effect`   mean(L) − mean of the R draws'       crossed bootstrap (items and draws) /
                              means, on shared items               max of a prediction t-test over draws
                                                                   and a paired t-test over items
:func:`bootstrap_p`           —                                     ``2·(1 + min(#θ* ≤ 0, #θ* ≥ 0))/(B+1)``,
                                                                   at most 1 (floor ``2/(B+1)``)
============================  ===================================  =========================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats

from tlcap.metrics.bootstrap import crossed_ci, paired_difference_ci
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


def _per_cluster(x: np.ndarray, groups: Sequence | None, reduce: str) -> np.ndarray:
    """``x.mean()`` or ``x.sum()`` (``reduce``) of each cluster, in order of first appearance (``x`` itself without groups)."""
    if groups is None:
        return x
    g = np.asarray(list(groups))
    return np.array([getattr(x[g == k], reduce)() for k in dict.fromkeys(g.tolist())])


def _cluster_means(x: np.ndarray, groups: Sequence | None) -> np.ndarray:
    return _per_cluster(x, groups, "mean")


def cluster_robust_var(x: Values, groups: Sequence | np.ndarray | None = None) -> tuple[float, int]:
    """The CR1 variance of mean(x) over every value, with values correlated within ``groups``, and its cluster count.

    ``G/(G−1) · Σ_c e_c² / N²``, ``e_c`` the sum of cluster ``c``'s deviations from the overall mean. Without
    ``groups`` every value is its own cluster and this is ``s²/N``; with clusters of equal size it is the variance
    of the mean of the cluster means, ``s_c²/G``.

    Args:
        x: The values.
        groups: Cluster id of each value; None: values independent.

    Returns:
        ``(variance, G)``; the variance is NaN for fewer than 2 clusters.

    Example:
        >>> v, g = cluster_robust_var([1.0, 2.0, 3.0, 6.0])     # no clusters: s²/N = (14/3)/4
        >>> round(v, 4), g
        (1.1667, 4)
        >>> v, g = cluster_robust_var([1.0, 3.0, 2.0, 6.0], groups=["a", "a", "b", "b"])  # cluster means 2, 4
        >>> round(v, 4), g                                         # = var of the mean of the cluster means, 2/2
        (1.0, 2)
    """
    v = np.asarray(x, dtype=float)
    e = _per_cluster(v - v.mean(), groups, "sum")  # each cluster's residuals about the overall mean, summed
    G = len(e)
    if G < 2:
        return math.nan, G
    return float(G / (G - 1) * float((e ** 2).sum()) / len(v) ** 2), G


def _t_p(t: float, df: float) -> float:
    return float(2.0 * stats.t.sf(abs(t), df))


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
        groups: Cluster id of each pair (bootstrap by cluster, cluster-robust t-test); None: pairs independent.
        n_boot: Bootstrap replicates of the interval.
        seed: Bootstrap seed.

    Returns:
        An :class:`Effect`: the estimate, the paired t-test p-value (cluster-robust with ``groups``: module
        docstring), the test's name and its floor (0; ``2·0.5^m`` when no difference varies and the exact sign
        test on the m non-zero clusters decides).

    Example:
        >>> dprob_self = [0.9, 0.8, 0.7, 0.6, 0.85, 0.75]
        >>> dprob_intersection = [0.3, 0.5, 0.2, 0.4, 0.35, 0.3]
        >>> fact_ids = ["a", "a", "b", "b", "c", "c"]
        >>> est, p, test, p_floor = paired_effect(dprob_self, dprob_intersection, groups=fact_ids)
        >>> print(est); round(p, 4), test, p_floor
        0.425 [0.35, 0.48] (n=6, 3 groups)
        (0.008, 'paired t-test, cluster-robust', 0.0)
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    est = paired_difference_ci(x, y, n_boot=n_boot, seed=seed, groups=groups)
    d = x - y
    name = "paired t-test" + (", cluster-robust" if groups is not None else "")
    var, G = cluster_robust_var(d, groups)
    if G < 2:
        return Effect(est, math.nan, name, 0.0)
    if var > 0:
        return Effect(est, _t_p(float(d.mean()) / math.sqrt(var), G - 1), name, 0.0)
    # no spread about the mean: every cluster's mean equals it, so the exact sign test on the clusters decides
    means = _cluster_means(d, groups)
    return Effect(est, paired_p(means), "exact sign test" + (" on clusters" if groups is not None else ""),
                  paired_p_floor(means))


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
    return paired_p_floor(d)  # every difference equal: all zero (no effect) or all the same sign


def paired_p_floor(d: np.ndarray) -> float:
    """The smallest p-value :func:`paired_p` can give on these differences.

    Args:
        d: The paired differences.

    Returns:
        0 when they vary (the t-test is continuous); otherwise the exact sign test's ``2·0.5^m`` on the ``m``
        non-zero differences (1 when every difference is 0), which is then also the p-value.

    Example:
        >>> paired_p_floor(np.array([1.0, 1.0, 1.0])), paired_p_floor(np.array([0.5, 1.0]))
        (0.25, 0.0)
    """
    return 0.0 if np.std(d) > 0 else _sign_floor(int((d != 0).sum()))


def _sign_floor(m: int) -> float:
    """The exact two-sided sign (or McNemar) test's smallest p on ``m`` non-zero (discordant) pairs."""
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
        An :class:`Effect` with Welch's t-test p-value, cluster-robust with groups (module docstring; the
        Welch–Satterthwaite degrees of freedom from ``G_a − 1`` and ``G_b − 1``); NaN with fewer than 2 units in a
        sample. When neither sample varies (all of ``a`` one value, all of ``b`` another) the exact permutation
        test of the units decides: ``p = (1 + [G_a = G_b]) / C(G_a + G_b, G_a)``, which is also its floor.

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
    n_groups = None if groups_a is None and groups_b is None else len(ua) + len(ub)
    est = Estimate(value, low, high, n=len(x) + len(y), method="percentile", n_groups=n_groups, n_boot=n_boot, seed=seed)
    name = "Welch's t-test" + (", cluster-robust" if n_groups is not None else "")
    (va, ga), (vb, gb) = cluster_robust_var(x, groups_a), cluster_robust_var(y, groups_b)
    if ga < 2 or gb < 2:
        return Effect(est, math.nan, name, 0.0)
    if va + vb > 0:
        df = (va + vb) ** 2 / (va ** 2 / (ga - 1) + vb ** 2 / (gb - 1))
        return Effect(est, _t_p(value / math.sqrt(va + vb), df), name, 0.0)
    if value == 0:
        return Effect(est, 1.0, name, 0.0)
    # neither sample varies and they differ: only the unit labellings as extreme as this one (it, and its mirror
    # when the samples have as many units) give a difference this large
    p = min(1.0, (1 + (ga == gb)) / math.comb(ga + gb, ga))
    return Effect(est, p, "exact permutation test of the units (no spread)", p)


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
    return Effect(est, p, f"exact McNemar test ({n10} vs {n01} discordant items)", _sign_floor(m))


def random_draws_effect(located: Values, random: np.ndarray, *, n_boot: int = 5000, seed: int = 0) -> Effect:
    """A located set against R random draws (each a set trained or edited alike), scored on the same items.

    The effect is ``mean_i(L_i − R̄_i)``: ``L_i`` item ``i``'s score with the located set, ``R̄_i`` its mean
    score over the draws. Two things must both hold for "the located set differs from random sets":

    - **beyond the draws**: the located accuracy ``L̄`` is not a typical draw. If it were one more draw
      (exchangeable, accuracies normal), ``(L̄ − mean_k R̄_k) / (s_R·√(1 + 1/R))`` is t on ``R − 1``
      degrees of freedom, ``s_R`` the draws' standard deviation (the prediction-interval test; a t-test
      of ``mean_k(L̄ − R̄_k)`` would instead treat ``L̄`` as a known constant and reject for any set as
      R grows);
    - **beyond item noise**: the paired t-test of ``L_i − R̄_i`` over the items.

    The p-value is the larger of the two (an intersection–union test: its size is at most α). The CI
    resamples items and draws independently (:func:`~tlcap.metrics.bootstrap.crossed_ci`), so it carries both
    sources of noise.

    Draws whose accuracies barely vary (random sets that move no prediction) would make ``s_R`` 0 and the
    prediction test's p 0 whatever the gap. With 0/1 scores an accuracy lives on the grid ``k/n``, and a spread
    below that grid's rounding SD ``1/(n√12)`` is not resolved, so ``s_R`` is taken as at least that (a
    conservative choice: the p-value can only grow); the floor is then the p of the largest possible gap, 1.
    With scores that are not 0/1 and draws that do not vary at all, the prediction test is degenerate and the
    items' test decides; the test's name says which of these happened.

    Args:
        located: Per-item scores with the located set, ``(n,)``.
        random: Per-item scores with each random draw, ``(R, n)``, ``R >= 2``.
        n_boot: Bootstrap resamples of the CI.
        seed: Their seed.

    Returns:
        An :class:`Effect`; its test names both p-values. The floor is 0 (both tests are continuous) unless
        the items' differences do not vary (then the exact sign test's ``2·0.5^m``) or the draws' spread is
        taken at the accuracy grid's (then at least the p of a gap of 1).

    Raises:
        StatisticsError: fewer than 2 draws, or ``random`` not ``(R, n)`` with ``n = len(located)``.

    Example:
        >>> L = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 1.0])
        >>> R = np.array([[1, 0, 1, 0, 0, 1, 0, 0, 1, 0], [0, 1, 0, 0, 1, 0, 0, 1, 0, 0],
        ...               [1, 0, 0, 0, 0, 1, 0, 1, 0, 1.0]])
        >>> est, p, test, floor = random_draws_effect(L, R, n_boot=2000)
        >>> round(est.value, 3), round(p, 4), floor
        (0.433, 0.0229, 0.0)
        >>> test
        'max of a prediction t-test over 3 random draws (p 0.023) and a paired t-test over 10 items (p 0.00075)'

        Random sets that move no prediction (every draw scores the base model's 0/1 outcomes): their spread is 0,
        and the grid of accuracies on 10 items, steps of 0.1, stands in for it:

        >>> base = np.array([1, 0, 1, 0, 0, 1, 0, 0, 1, 0.0])
        >>> e = random_draws_effect(L, np.tile(base, (3, 1)), n_boot=200)
        >>> round(e.p_value, 4), round(e.p_floor, 5)      # the items' p; the draws' (0.0069) is no longer 0
        (0.0368, 0.00111)
        >>> e.test.split("; ")[1]
        "the draws' spread 0 is below the 1/(n√12) = 0.029 an accuracy on 10 items resolves, so that is used"
    """
    x = np.asarray(located, dtype=float)
    r = np.asarray(random, dtype=float)
    if r.ndim != 2 or r.shape[1] != len(x):
        raise StatisticsError(f"random must be (draws, items) with {len(x)} items, got shape {r.shape}")
    R, n = r.shape
    if R < 2:
        raise StatisticsError(f"random_draws_effect needs at least 2 random draws, got {R}; with one draw use "
                              "mcnemar_effect or paired_effect (a test conditional on that draw)")
    if n < 2:
        raise TooFewSamplesError(f"random_draws_effect needs at least 2 items, got {n}")
    d = x - r.mean(0)
    acc = r.mean(1)
    s = float(acc.std(ddof=1)) if np.ptp(acc) > 0 else 0.0  # identical accuracies: 0, not the mean's rounding
    gap = float(x.mean() - acc.mean())
    scale = math.sqrt(1.0 + 1.0 / R)
    binary = bool(np.isin(r, (0.0, 1.0)).all() and np.isin(x, (0.0, 1.0)).all())
    lattice = 1.0 / (n * math.sqrt(12.0)) if binary else 0.0  # rounding SD of an accuracy on the grid k/n
    note, floor_draws = "", 0.0
    if s < lattice:  # 0/1 scores: an accuracy's spread is not resolved below the grid it lives on
        note = (f"; the draws' spread {s:.2g} is below the 1/(n√12) = {lattice:.2g} an accuracy on {n} items "
                "resolves, so that is used")
        s = lattice
        floor_draws = _t_p(1.0 / (s * scale), R - 1)  # the largest gap an accuracy can have is 1
    if s > 0:
        p_draws = _t_p(gap / (s * scale), R - 1)
    else:  # scores that are not 0/1 and draws that do not vary at all: the items decide
        p_draws = 1.0 if gap == 0 else 0.0
        note = "; the draws do not vary at all, so the prediction test is degenerate and the items decide"
    p_items = paired_p(d)
    floor = max(paired_p_floor(d), floor_draws)
    est = crossed_ci(r, x, n_boot=n_boot, seed=seed)
    return Effect(est, max(p_draws, p_items), f"max of a prediction t-test over {R} random draws (p {p_draws:.2g}) "
                                            f"and a paired t-test over {n} items (p {p_items:.2g}){note}", floor)


__all__ = ["cluster_robust_var", "paired_p", "paired_effect", "two_group_effect", "share_effect", "proportion_diff",
           "mcnemar_effect", "random_draws_effect", "paired_p_floor", "bootstrap_p", "bootstrap_p_floor",
           "Effect", "NO_EFFECT", "Values"]
