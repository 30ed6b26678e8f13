"""Sensitivity curves: a statistic as a function of a threshold, with pointwise bootstrap bands.

For the questions "does the K_II share depend on where the CS2 threshold is put?" (QL) and "does
erasing still hurt at σ = 3, 6, 12?" (CNL): :func:`threshold_curve` takes per-item scores and a
grid of thresholds and computes the statistic at every threshold on the same bootstrap resamples
(so neighbouring points of a band move together); :meth:`SensitivityCurve.from_estimates` builds
the same value from one :class:`Estimate` per grid point when each point needs its own
experiment (e.g. accuracy after erasing the neurons located at each σ).

Built-in statistics of ``scores`` ``x`` at threshold ``t``:

- ``"share_above"``: ``mean(x > t)`` (K_I share with the QL split ``K_I ⇔ CS2 > t``);
- ``"share_at_or_below"``: ``mean(x ≤ t)`` (the K_II share);
- ``"separation"``: ``mean(x | x > t) − mean(x | x ≤ t)`` (NaN when a side is empty);
- a function ``f(sample, t) -> float`` of the resampled rows (pass ``(n, m)`` scores to let the
  threshold act on one column and the statistic on another, e.g. ΔProb of K_I minus K_II).

Example:
    >>> cs2_per_fact = [0.05, 0.12, 0.3, 0.45, 0.08, 0.22, 0.6, 0.15]
    >>> curve = threshold_curve(cs2_per_fact, np.linspace(0, 0.5, 11), "share_at_or_below", groups=None)
    >>> curve.to_frame().head(3)      # threshold, value, low, high
       threshold  value  low   high
    0       0.00  0.000  0.0  0.000
    1       0.05  0.125  0.0  0.375
    2       0.10  0.250  0.0  0.500
    >>> fig = curve.figure()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.metrics.bootstrap import (
    Groups,
    Values,
    WeightedStatistic,
    as_array,
    check_options,
    clean,
    from_callable,
    interval,
    jackknife,
    weight_blocks,
)
from tlcap.metrics.estimate import Estimate, StatisticsError
from tlcap.results import Result

ThresholdStatistic = Literal["share_above", "share_at_or_below", "separation"]


def _share(mask: np.ndarray) -> WeightedStatistic:
    m = mask.astype(np.float64)
    return WeightedStatistic(lambda x, W: (W @ m) / W.sum(1), "share")


def _separation(x: np.ndarray, t: float) -> WeightedStatistic:
    m = (x > t).astype(np.float64)

    def fn(_: np.ndarray, W: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            hi = (W @ (x * m)) / (W @ m)
            lo = (W @ (x * (1 - m))) / (W @ (1 - m))
        return hi - lo

    return WeightedStatistic(fn, "separation")


def threshold_statistic(
    statistic: ThresholdStatistic | Callable[[np.ndarray, float], float], x: np.ndarray, t: float
) -> WeightedStatistic:
    """The statistic at threshold ``t`` as a :class:`WeightedStatistic` of the sample ``x``."""
    if callable(statistic):
        return from_callable(lambda s: statistic(s, t), getattr(statistic, "__name__", "statistic"))
    if x.ndim != 1:
        raise StatisticsError(f"the built-in statistic {statistic!r} needs 1-D scores; pass a function for {x.ndim}-D rows")
    if statistic == "share_above":
        return _share(x > t)
    if statistic == "share_at_or_below":
        return _share(x <= t)
    if statistic == "separation":
        return _separation(x, t)
    raise StatisticsError(
        f"unknown threshold statistic {statistic!r}; use share_above, share_at_or_below, separation or a function"
    )


@dataclass(frozen=True)
class SensitivityCurve(Result):
    """A statistic over a grid of a parameter (threshold, σ), with pointwise confidence bands.

    Attributes:
        parameter: Name of the swept parameter (``"threshold"``, ``"sigma"``).
        statistic: Name of the statistic.
        x: The grid.
        value: The statistic at each grid point on the whole sample.
        low: Lower band.
        high: Upper band.
        level: Confidence level of the bands.
        n: Samples (per point; the largest when points differ).
        method: Interval method.
        n_groups: Clusters resampled, if a cluster bootstrap.
        n_boot: Resamples, if a bootstrap.
        seed: Seed, if a bootstrap.
    """

    parameter: str
    statistic: str
    x: tuple[float, ...]
    value: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    level: float = 0.95
    n: int = 0
    method: str = "percentile"
    n_groups: int | None = None
    n_boot: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("x", "value", "low", "high"):  # JSON stores NaN as null
            object.__setattr__(self, name, tuple(math.nan if v is None else float(v) for v in getattr(self, name)))

    @classmethod
    def from_estimates(cls, x: Sequence[float], estimates: Sequence[Estimate], parameter: str = "sigma",
                       statistic: str = "") -> SensitivityCurve:
        """A curve from one :class:`Estimate` per grid point (e.g. erase accuracy at each σ).

        Args:
            x: The grid values of the parameter.
            estimates: One estimate per grid value (level, method, seed, ... taken from the first).
            parameter: Name of the varied parameter.
            statistic: Name of the estimated statistic.

        Returns:
            The :class:`SensitivityCurve` (``n``: the largest sample size).

        Raises:
            StatisticsError: no estimates, or not one per grid point.

        Example:
            >>> from tlcap.metrics.shares import share_ci
            >>> acc3, acc6, acc12 = share_ci([1, 0, 0, 1, 0]), share_ci([0, 0, 0, 1, 0]), share_ci([0] * 5)
            >>> c = SensitivityCurve.from_estimates([3, 6, 12], [acc3, acc6, acc12], "sigma", "accuracy after erase")
            >>> c.x, c.value, c.method
            ((3.0, 6.0, 12.0), (0.4, 0.2, 0.0), 'wilson')
        """
        if len(x) != len(estimates) or not estimates:
            raise StatisticsError(f"need one estimate per grid point, got {len(estimates)} for {len(x)} points")
        e0 = estimates[0]
        return cls(parameter, statistic, tuple(float(v) for v in x), tuple(e.value for e in estimates),
                   tuple(e.low for e in estimates), tuple(e.high for e in estimates), level=e0.level,
                   n=max(e.n for e in estimates), method=e0.method, n_groups=e0.n_groups, n_boot=e0.n_boot, seed=e0.seed)

    def estimates(self) -> list[Estimate]:
        """One :class:`Estimate` per grid point.

        Returns:
            The estimates, in grid order.
        """
        return [Estimate(v, lo, hi, level=self.level, n=self.n, method=self.method, n_groups=self.n_groups,
                         n_boot=self.n_boot, seed=self.seed) for v, lo, hi in zip(self.value, self.low, self.high)]

    def summary(self) -> dict[str, Any]:
        return {"parameter": self.parameter, "statistic": self.statistic, "n": self.n, "level": self.level,
                "points": [{self.parameter: x, "text": str(e)} for x, e in zip(self.x, self.estimates())]}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({self.parameter: self.x, "value": self.value, "low": self.low, "high": self.high})

    def figure(self, title: str | None = None) -> go.Figure:
        """The curve with its band (plotly).

        Args:
            title: Figure title (default: statistic vs parameter and ``n``).

        Returns:
            The plotly figure: the value as a line, the CI as a shaded band.
        """
        x = list(self.x)
        band = f"{self.level:.0%} CI"
        fig = go.Figure([
            go.Scatter(x=x, y=list(self.high), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"),
            go.Scatter(x=x, y=list(self.low), mode="lines", line={"width": 0}, fill="tonexty",
                       fillcolor="rgba(31,119,180,0.2)", name=band),
            go.Scatter(x=x, y=list(self.value), mode="lines+markers", line={"color": "rgb(31,119,180)"},
                       name=self.statistic or "value"),
        ])
        fig.update_layout(title=title or f"{self.statistic or 'statistic'} vs {self.parameter} (n={self.n})",
                          xaxis_title=self.parameter, yaxis_title=self.statistic or "value",
                          template="plotly_white", width=700, height=450)
        return fig


def threshold_curve(
    scores: Values,
    thresholds: Values,
    statistic: ThresholdStatistic | Callable[[np.ndarray, float], float] = "share_above",
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    method: Literal["percentile", "bca"] = "percentile",
    seed: int = 0,
    groups: Groups | None = None,
    parameter: str = "threshold",
    nan_policy: Literal["raise", "omit"] = "raise",
) -> SensitivityCurve:
    """A statistic of per-item scores at every threshold of a grid, with bootstrap bands.

    Args:
        scores: Per-item scores, shape ``(n,)`` (or ``(n, m)`` rows for a function statistic).
        thresholds: The grid, shape ``(T,)``.
        statistic: A built-in name (module doc) or ``f(sample, t) -> float``.
        n_boot: Resamples, shared by every threshold.
        level: Confidence level of the pointwise bands.
        method: ``"percentile"`` or ``"bca"``.
        seed: Seed of the resampling generator.
        groups: One label per item for a cluster bootstrap.
        parameter: Name of the swept parameter in the result.
        nan_policy: ``"raise"`` or ``"omit"``.

    Returns:
        A :class:`SensitivityCurve`.

    Example:
        >>> cs2 = [0.05, 0.12, 0.3, 0.45, 0.08, 0.22, 0.6, 0.15]
        >>> c = threshold_curve(cs2, [0.1, 0.2, 0.3], "share_at_or_below")   # K_II share
        >>> c.value
        (0.25, 0.5, 0.75)
    """
    check_options(level, n_boot)
    x = as_array(scores, "scores", ndim=(1, 2))
    grid = [float(t) for t in as_array(thresholds, "thresholds")]
    if not grid:
        raise StatisticsError("thresholds are empty; give at least one")
    x, codes, units = clean(x, groups, nan_policy, "scores")
    stats = [threshold_statistic(statistic, x, t) for t in grid]
    ones = np.ones((1, len(x)))
    theta = [float(s(x, ones)[0]) for s in stats]
    if units < 2:
        low = high = [math.nan] * len(grid)
    else:
        reps = np.concatenate([np.stack([s(x, W) for s in stats], axis=1)
                               for W in weight_blocks(len(x), n_boot, seed, codes, units)])
        bounds = [interval(reps[:, i], theta[i], level, method,
                           jackknife(x, s, codes, units) if method == "bca" else None) for i, s in enumerate(stats)]
        low, high = [b[0] for b in bounds], [b[1] for b in bounds]
    name = statistic if isinstance(statistic, str) else stats[0].name
    return SensitivityCurve(parameter, name, tuple(grid), tuple(theta), tuple(low), tuple(high), level=level, n=len(x),
                            method=method, n_groups=None if codes is None else units, n_boot=n_boot, seed=seed)
