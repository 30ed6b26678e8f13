"""Bootstrap confidence intervals over samples or clusters of samples, (Wilson intervals of shares: :mod:`tlcap.metrics.shares`).

What tlcap uses, and why (the long form is ``docs/statistics.md``):

- **Percentile bootstrap by default.** The interval is the ``α/2`` and ``1 − α/2`` quantiles
  (linear interpolation) of the statistic over ``n_boot`` resamples. It is transparent, needs
  no assumption on the statistic's distribution, and never leaves the statistic's range (a share
  or an overlap stays in [0, 1]). At the sample sizes the reports use (≥ 50 facts, ≥ 200 pairs)
  it is close to BCa for means.
- **BCa on request** (``method="bca"``): bias-corrected and accelerated (Efron & Tibshirani 1993,
  §14.3; the acceleration from a jackknife over the resampled units, as ``scipy.stats.bootstrap``
  does). Better coverage for skewed statistics at small n (an overlap near 0), at the cost of n
  extra evaluations of the statistic.
- **Cluster bootstrap** (``groups=``): resample whole groups (facts) with replacement and keep
  every sample (query, rewrite) of a drawn group, as many times as the group is drawn. Samples
  of one fact are not independent; resampling them one by one gives too narrow intervals.
- **Wilson score interval for shares** (:func:`share_ci`) unless groups are given: it has
  near-nominal coverage even at small n, and unlike the bootstrap it does not collapse to
  ``[0, 0]`` when no sample shows the event.

Determinism: resamples come from ``numpy.random.default_rng(seed)`` as a ``(n_boot, n)`` matrix
of indices ``rng.integers(0, n, (n_boot, n))`` (``(n_boot, n_groups)`` for clusters), drawn in
row blocks; the same seed gives the same interval, and the same resamples as a loop drawing
``rng.integers(0, n, n)`` once per resample, or as ``scipy.stats.bootstrap(..., rng=default_rng(seed))``.

Degenerate samples: ``n == 0`` raises :class:`TooFewSamplesError`; one sample (or one group)
gives the value with a NaN interval (a single observation says nothing about spread, and a
zero-width interval would claim certainty); ``n ≥ 2`` equal values give the zero-width interval
``[v, v]`` — the sample shows no variability, which is not the same as certainty: report n.

Example:
    >>> print(bootstrap_ci([0.2, 0.5, 0.4, 0.9, 0.3], seed=0))
    0.460 [0.28, 0.68] (n=5)
    >>> from tlcap.metrics.shares import share_ci
    >>> share_ci([True, True, False, True]).method
    'wilson'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from jaxtyping import Shaped
from scipy.special import ndtr, ndtri
from torch import Tensor

from tlcap.metrics.estimate import Estimate, StatisticsError, TooFewSamplesError

Number = float | int
Values = Sequence[Number] | Sequence[Sequence[Number]] | Shaped[np.ndarray, " _n *_cols"] | Shaped[Tensor, " _n *_cols"]
"""Per-sample values: a list, a numpy array or a torch tensor, shape ``(n,)`` (or ``(n, m)`` rows)."""
Groups = Sequence[Hashable] | Shaped[np.ndarray, " _n"] | Shaped[Tensor, " _n"]
_MAX_CELLS = 1 << 22  # resample-matrix cells per block (memory bound; does not change results)


@dataclass(frozen=True)
class WeightedStatistic:
    """A statistic evaluated on many resamples at once, each given as integer weights.

    ``fn(x, W)`` receives the sample ``x`` (rows are samples) and a ``(b, n)`` matrix whose row
    ``r`` holds how many times each sample occurs in resample ``r``; it returns ``(b,)`` values.
    The full sample is the all-ones row. Use it for fast, vectorised statistics of means.

    Example:
        >>> mean = WeightedStatistic(lambda x, W: (W @ x) / W.sum(1), "mean")
    """

    fn: Callable[[np.ndarray, np.ndarray], np.ndarray]
    name: str = "statistic"

    def __call__(self, x: np.ndarray, W: np.ndarray) -> np.ndarray:
        return np.asarray(self.fn(x, W), dtype=float)


def _mean_fn(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    return (W @ x) / W.sum(1)


MEAN = WeightedStatistic(_mean_fn, "mean")


def from_callable(f: Callable[[np.ndarray], float], name: str | None = None) -> WeightedStatistic:
    """Wrap a statistic of one sample (rows = samples) as a :class:`WeightedStatistic`.

    Each resample is materialised with ``np.repeat(x, weights, axis=0)`` (so a resample lists
    samples in their original order, each as often as drawn); slower than a vectorised statistic.
    """

    def fn(x: np.ndarray, W: np.ndarray) -> np.ndarray:
        return np.array([float(f(np.repeat(x, w.astype(np.int64), axis=0))) for w in W])

    return WeightedStatistic(fn, name or getattr(f, "__name__", "statistic"))


def as_statistic(statistic: str | Callable[[np.ndarray], float] | WeightedStatistic) -> WeightedStatistic:
    """``"mean"``, ``"median"``, a callable of one sample, or a :class:`WeightedStatistic`."""
    if isinstance(statistic, WeightedStatistic):
        return statistic
    if (isinstance(statistic, str) and statistic == "mean") or statistic is np.mean:
        return MEAN
    if isinstance(statistic, str) and statistic == "median":
        return from_callable(np.median, "median")
    if callable(statistic):
        return from_callable(statistic)
    raise StatisticsError(f"unknown statistic {statistic!r}; use 'mean', 'median' or a function of one sample")


def as_array(values: Values, name: str = "values", ndim: tuple[int, ...] = (1,)) -> np.ndarray:
    """``values`` (list, numpy array or torch tensor) as a float64 numpy array with a checked rank."""
    if isinstance(values, Tensor):
        arr = values.detach().to("cpu", torch.float64).numpy()
    else:
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise StatisticsError(f"{name} must be numbers (a list, numpy array or tensor): {exc}") from exc
    if arr.ndim not in ndim:
        raise StatisticsError(f"{name} must have {' or '.join(map(str, ndim))} dimension(s), got shape {arr.shape}")
    return arr


def group_codes(groups: Groups, n: int) -> tuple[np.ndarray, int]:
    """Integer codes ``0..G-1`` of ``groups`` in order of first appearance, and ``G``."""
    labels = groups.tolist() if isinstance(groups, (np.ndarray, Tensor)) else list(groups)
    if len(labels) != n:
        raise StatisticsError(f"groups has {len(labels)} labels for {n} values; give one group label per value")
    seen: dict[Hashable, int] = {}
    codes = np.fromiter((seen.setdefault(g, len(seen)) for g in labels), dtype=np.int64, count=n)
    return codes, len(seen)


def clean(
    x: np.ndarray, groups: Groups | None, nan_policy: str, name: str = "values"
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Apply ``nan_policy`` and encode groups; returns ``(x, codes or None, number of units)``."""
    if nan_policy not in ("raise", "omit"):
        raise StatisticsError(f"nan_policy must be 'raise' or 'omit', got {nan_policy!r}")
    codes, G = (None, 0) if groups is None else group_codes(groups, len(x))
    bad = np.isnan(x).reshape(len(x), -1).any(1) if x.size else np.zeros(len(x), bool)
    if bad.any():
        if nan_policy == "raise":
            raise StatisticsError(
                f"{name} hold {int(bad.sum())} NaN(s) (first at index {int(np.argmax(bad))}); "
                "drop them, or pass nan_policy='omit'"
            )
        x = x[~bad]
        if codes is not None:
            codes, G = group_codes(codes[~bad], len(x))
    if len(x) == 0:
        raise TooFewSamplesError(f"{name} are empty: a statistic needs at least one sample")
    return x, codes, (len(x) if codes is None else G)


def weight_blocks(
    n: int, n_boot: int, seed: int, codes: np.ndarray | None = None, n_groups: int = 0
) -> Iterator[np.ndarray]:
    """Bootstrap resamples as ``(b, n)`` float weight blocks (``n_boot`` rows in all).

    Without ``codes``: row ``r`` counts how often each index occurs in ``rng.integers(0, n, n)``.
    With ``codes`` (cluster bootstrap): ``n_groups`` groups are drawn with replacement and every
    sample gets its group's count, so groups stay together.
    """
    rng = np.random.default_rng(seed)
    units = n if codes is None else n_groups
    block = max(1, _MAX_CELLS // max(n, units))
    done = 0
    while done < n_boot:
        b = min(block, n_boot - done)
        idx = rng.integers(0, units, (b, units))
        flat = (idx + units * np.arange(b)[:, None]).ravel()
        counts = np.bincount(flat, minlength=b * units).reshape(b, units).astype(np.float64)
        yield counts if codes is None else counts[:, codes]
        done += b


def replicates(x: np.ndarray, stat: WeightedStatistic, n_boot: int, seed: int,
               codes: np.ndarray | None = None, n_groups: int = 0) -> np.ndarray:
    """The statistic on each of ``n_boot`` resamples (see :func:`weight_blocks`)."""
    return np.concatenate([stat(x, W) for W in weight_blocks(len(x), n_boot, seed, codes, n_groups)])


def jackknife(x: np.ndarray, stat: WeightedStatistic, codes: np.ndarray | None = None, n_groups: int = 0) -> np.ndarray:
    """The statistic with each unit (sample, or group with ``codes``) left out in turn."""
    n = len(x)
    units = np.arange(n) if codes is None else codes
    J = n if codes is None else n_groups
    out = []
    block = max(1, _MAX_CELLS // max(n, 1))
    for start in range(0, J, block):
        js = np.arange(start, min(J, start + block))
        W = (units[None, :] != js[:, None]).astype(np.float64)
        out.append(stat(x, W))
    return np.concatenate(out)


def interval(reps: np.ndarray, theta: float, level: float, method: str, jack: np.ndarray | None = None) -> tuple[float, float]:
    """Percentile or BCa interval from bootstrap replicates (NaN replicates are ignored)."""
    reps = reps[~np.isnan(reps)]
    if reps.size == 0 or math.isnan(theta):
        return math.nan, math.nan
    if reps.min() == reps.max():
        return float(reps[0]), float(reps[0])
    alpha = (1.0 - level) / 2.0
    if method == "percentile":
        q = (alpha, 1.0 - alpha)
    elif method == "bca":
        if jack is None:
            raise StatisticsError("a BCa interval needs the jackknife values of the statistic")
        # share of replicates below θ̂, ties counted half; replicates within rounding of θ̂ are ties
        # (a resample holding every unit once gives θ̂ up to the summation order)
        tie = np.isclose(reps, theta, rtol=1e-10, atol=1e-12)
        z0 = float(ndtri((2 * ((reps < theta) & ~tie).sum() + tie.sum()) / (2.0 * reps.size)))
        u = jack.mean() - jack
        den = float((u**2).sum()) ** 1.5
        a = float((u**3).sum()) / (6.0 * den) if den > 0 else 0.0
        z = np.array([ndtri(alpha), -ndtri(alpha)])
        q = tuple(float(v) for v in ndtr(z0 + (z0 + z) / (1.0 - a * (z0 + z))))
        if any(math.isnan(v) for v in q):
            return math.nan, math.nan
    else:
        raise StatisticsError(f"unknown interval method {method!r}; use 'percentile' or 'bca'")
    lo, hi = np.quantile(reps, q)
    return float(lo), float(hi)


def check_options(level: float, n_boot: int) -> None:
    """Refuse a confidence level outside (0, 1) or fewer than one resample."""
    if not 0.0 < level < 1.0:
        raise StatisticsError(f"level must lie in (0, 1), got {level}; use e.g. 0.95")
    if int(n_boot) < 1:
        raise StatisticsError(f"n_boot must be at least 1, got {n_boot}; use a few thousand")


def _estimate(x: np.ndarray, stat: WeightedStatistic, codes: np.ndarray | None, units: int, *,
              n_boot: int, level: float, method: str, seed: int) -> Estimate:
    if method not in ("percentile", "bca"):
        raise StatisticsError(f"unknown interval method {method!r}; use 'percentile' or 'bca'")
    theta = float(stat(x, np.ones((1, len(x))))[0])
    if units < 2:
        lo = hi = math.nan
    else:
        reps = replicates(x, stat, n_boot, seed, codes, units)
        jack = jackknife(x, stat, codes, units) if method == "bca" else None
        lo, hi = interval(reps, theta, level, method, jack)
    return Estimate(theta, lo, hi, level=level, n=len(x), method=method,
                    n_groups=None if codes is None else units, n_boot=n_boot, seed=seed)


def bootstrap_ci(
    values: Values,
    statistic: str | Callable[[np.ndarray], float] | WeightedStatistic = "mean",
    *,
    n_boot: int = 5000,
    level: float = 0.95,
    method: Literal["percentile", "bca"] = "percentile",
    seed: int = 0,
    groups: Groups | None = None,
    nan_policy: Literal["raise", "omit"] = "raise",
) -> Estimate:
    """A statistic of a sample with its bootstrap confidence interval.

    Args:
        values: Per-sample values, shape ``(n,)``; or ``(n, m)`` rows (one per sample) for a
            callable or weighted statistic of several columns.
        statistic: ``"mean"`` (vectorised), ``"median"``, a function of one sample (a numpy
            array, rows = samples) returning a number, or a :class:`WeightedStatistic`.
        n_boot: Number of resamples.
        level: Confidence level of the two-sided interval.
        method: ``"percentile"`` (default) or ``"bca"``.
        seed: Seed of the resampling generator (same seed, same interval).
        groups: One label per sample for a cluster bootstrap (e.g. the fact id of each query):
            whole groups are resampled and ``Estimate.n_groups`` is set.
        nan_policy: ``"raise"`` (default) or ``"omit"`` (drop NaN rows and their labels).

    Returns:
        An :class:`Estimate`; NaN interval with one sample (or one group), ``[v, v]`` when every
        resample gives ``v``.

    Raises:
        TooFewSamplesError: No values.
        StatisticsError: NaN values (with ``nan_policy="raise"``), a bad shape, level or method.

    Example:
        >>> per_fact_overlap = [0.2, 0.5, 0.4, 0.9, 0.3, 0.6]
        >>> est = bootstrap_ci(per_fact_overlap, seed=0)       # mean overlap over facts
        >>> print(est)
        0.483 [0.32, 0.67] (n=6)
        >>> per_query_hit, fact_ids = [1, 1, 0, 1, 0, 0], ["a", "a", "b", "b", "c", "c"]
        >>> print(bootstrap_ci(per_query_hit, groups=fact_ids))      # queries clustered by fact
        0.500 [0.00, 1.00] (n=6, 3 groups)
    """
    check_options(level, n_boot)
    stat = as_statistic(statistic)
    x = as_array(values, ndim=(1,) if stat is MEAN else (1, 2))
    x, codes, units = clean(x, groups, nan_policy)
    return _estimate(x, stat, codes, units, n_boot=n_boot, level=level, method=method, seed=seed)


def paired_difference_ci(
    a: Values,
    b: Values,
    statistic: str | Callable[[np.ndarray], float] = "mean",
    *,
    n_boot: int = 5000,
    level: float = 0.95,
    method: Literal["percentile", "bca"] = "percentile",
    seed: int = 0,
    groups: Groups | None = None,
    nan_policy: Literal["raise", "omit"] = "raise",
) -> Estimate:
    """``statistic(a) − statistic(b)`` on the same samples, resampling the pairs together.

    For "located minus random" or "method A minus method B" measured on the same facts: sample
    ``i`` contributes ``(a[i], b[i])`` to every resample it is drawn in, so what the two share
    (the fact's difficulty) cancels and the interval is narrower than two separate intervals.

    Args:
        a: Per-sample values of the first condition, shape ``(n,)``.
        b: Per-sample values of the second condition on the same samples, shape ``(n,)``.
        statistic: ``"mean"`` (the mean difference), ``"median"`` or a function of one sample,
            applied to each column separately.
        n_boot: Number of resamples.
        level: Confidence level.
        method: ``"percentile"`` or ``"bca"``.
        seed: Seed of the resampling generator.
        groups: One label per pair for a cluster bootstrap.
        nan_policy: ``"raise"`` or ``"omit"`` (drop pairs with a NaN on either side).

    Returns:
        An :class:`Estimate` of the difference.

    Example:
        >>> rises_located, rises_random = [1, 1, 1, 0, 1, 1], [0, 1, 0, 0, 0, 1]
        >>> print(paired_difference_ci(rises_located, rises_random))   # share difference, 0/1 per fact
        0.500 [0.17, 0.83] (n=6)
    """
    check_options(level, n_boot)
    xa, xb = as_array(a, "a"), as_array(b, "b")
    if xa.shape != xb.shape:
        raise StatisticsError(f"a and b must be paired (same length), got {xa.shape} and {xb.shape}")
    x = np.stack([xa, xb], axis=1)
    if statistic == "mean":
        stat = WeightedStatistic(lambda x, W: _mean_fn(x[:, 0] - x[:, 1], W), "mean difference")
    else:
        f = as_statistic(statistic)
        stat = WeightedStatistic(lambda x, W: f(x[:, 0], W) - f(x[:, 1], W), f"{f.name} difference")
    x, codes, units = clean(x, groups, nan_policy, "a, b")
    return _estimate(x, stat, codes, units, n_boot=n_boot, level=level, method=method, seed=seed)


def crossed_ci(
    draws: Values,
    located: Values | None = None,
    *,
    n_boot: int = 5000,
    level: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Mean over random draws and items with a CI that resamples both (a crossed bootstrap).

    ``draws[k, i]`` is item ``i``'s score under random draw ``k`` (a random neuron set fine-tuned or
    edited alike). Each resample draws ``n`` items and ``R`` draws with replacement, independently, and
    recomputes the mean over the ``R × n`` cells, so the interval carries both the item noise and the
    draw-to-draw spread. With ``located`` (one score per item under the located set) the statistic is
    the located − random difference ``mean_i(L_i − R̄_i)``, the same item resample applied to both.

    Resamples are drawn 256 at a time from ``numpy.random.default_rng(seed)``: first the ``(256, n)``
    item indices, then the ``(256, R)`` draw indices.

    Args:
        draws: Scores ``(R, n)``: R random draws, n items, ``R >= 1``, ``n >= 1``.
        located: Optional scores of the located set on the same items, ``(n,)``.
        n_boot: Number of resamples.
        level: Confidence level.
        seed: Seed of the resampling generator.

    Returns:
        An :class:`Estimate` (method ``"crossed bootstrap (items × draws)"``).

    Raises:
        StatisticsError: ``draws`` is not 2-d, ``located`` does not have one score per item, or the
            options are out of range.
        TooFewSamplesError: no draw or no item.

    Example:
        >>> R = [[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 1, 0]]
        >>> print(crossed_ci(R, n_boot=2000))
        0.583 [0.17, 1.00] (n=4)
        >>> print(crossed_ci(R, [1, 1, 1, 1], n_boot=2000))
        0.417 [0.00, 0.83] (n=4)
    """
    check_options(level, n_boot)
    r = np.asarray(draws, dtype=float)
    if r.ndim != 2:
        raise StatisticsError(f"draws must be (draws, items), got shape {r.shape}")
    R, n = r.shape
    if R < 1 or n < 1:
        raise TooFewSamplesError(f"crossed_ci needs at least one draw and one item, got shape {r.shape}")
    x = None if located is None else np.asarray(located, dtype=float)
    if x is not None and x.shape != (n,):
        raise StatisticsError(f"located must have one score per item ({n}), got shape {x.shape}")
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    for b0 in range(0, n_boot, 256):  # (256, R, n) gathered at once
        b = min(256, n_boot - b0)
        ii, kk = rng.integers(0, n, (b, n)), rng.integers(0, R, (b, R))
        reps[b0:b0 + b] = r[kk[:, :, None], ii[:, None, :]].mean((1, 2))
        if x is not None:
            reps[b0:b0 + b] = x[ii].mean(1) - reps[b0:b0 + b]
    theta = float(r.mean()) if x is None else float((x - r.mean(0)).mean())
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(reps, [alpha, 1.0 - alpha])
    return Estimate(theta, float(lo), float(hi), n=n, method="crossed bootstrap (items × draws)", n_boot=n_boot,
                    seed=seed)
