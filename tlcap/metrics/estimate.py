"""A point value with its confidence interval, and the errors of the statistics layer.

Every share, overlap and accuracy that tlcap reports is an :class:`Estimate`: the value computed
on the whole sample, the two ends of a confidence interval, the confidence level, the sample
size and the name of the method that produced the interval. Reports print it with ``str()``
(``0.373 [0.31, 0.44] (n=50)``) or :meth:`Estimate.format` (``37.3 [31.0, 44.0] % (n=50)``);
JSON gets :meth:`Estimate.to_dict`.

Example:
    >>> est = Estimate(0.373, 0.31, 0.44, level=0.95, n=50, method="percentile")
    >>> str(est)
    '0.373 [0.31, 0.44] (n=50)'
    >>> est.format(percent=True)
    '37.3 [31.0, 44.0] % (n=50)'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from tlcap.errors import StatisticsError, TooFewSamplesError  # re-exported: defined in tlcap.errors
from tlcap.results import Result
from tlcap.viz.stats import interval_figure


@dataclass(frozen=True)
class Estimate(Result):
    """A point value and a two-sided confidence interval.

    Attributes:
        value: The statistic on the whole sample.
        low: Lower end of the interval (NaN when no interval can be formed, e.g. ``n == 1``).
        high: Upper end of the interval (NaN likewise).
        level: Confidence level of the interval, e.g. ``0.95``.
        n: Number of samples the value was computed from.
        method: How the interval was formed: ``"percentile"`` or ``"bca"`` (bootstrap),
            ``"wilson"`` (score interval of a share), or a caller's own name.
        n_groups: Number of clusters resampled by a cluster bootstrap (``None`` otherwise).
        n_boot: Bootstrap resamples drawn (``None`` for closed-form intervals).
        seed: Seed of the bootstrap generator (``None`` for closed-form intervals).

    Example:
        >>> Estimate(0.5, 0.4, 0.6, n=100).contains(0.45)
        True
    """

    value: float
    low: float
    high: float
    level: float = 0.95
    n: int = 0
    method: str = "percentile"
    n_groups: int | None = None
    n_boot: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("value", "low", "high", "level"):
            v = getattr(self, name)
            object.__setattr__(self, name, math.nan if v is None else float(v))
        object.__setattr__(self, "n", int(self.n))
        if not 0.0 < self.level < 1.0:
            raise StatisticsError(f"confidence level must lie in (0, 1), got {self.level}; use e.g. 0.95")

    @property
    def has_interval(self) -> bool:
        """Whether both ends of the interval are numbers (False for ``n == 1`` and the like)."""
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def half_width(self) -> float:
        """Half the interval's width (NaN without an interval)."""
        return (self.high - self.low) / 2.0

    def contains(self, x: float) -> bool:
        """Whether ``low <= x <= high`` (False without an interval).

        Args:
            x: The value tested.

        Returns:
            True when ``x`` lies in the closed interval.
        """
        return self.has_interval and self.low <= x <= self.high

    def format(self, digits: int | None = None, ci_digits: int | None = None, percent: bool = False) -> str:
        """The estimate as report text.

        Args:
            digits: Decimals of the point value (default 3, or 1 with ``percent``).
            ci_digits: Decimals of the interval's ends (default ``digits - 1``, or ``digits``
                with ``percent``).
            percent: Multiply by 100 and append ``" %"`` after the interval.

        Returns:
            ``"0.373 [0.31, 0.44] (n=50)"``; with ``percent=True``, ``"37.3 [31.0, 44.0] % (n=50)"``;
            without an interval ``"0.373 (no CI, n=1)"``. A cluster bootstrap adds the number
            of groups: ``"(n=200, 50 groups)"``.
        """
        scale = 100.0 if percent else 1.0
        if digits is None:
            digits = 1 if percent else 3
        if ci_digits is None:
            ci_digits = digits if percent else max(digits - 1, 0)
        unit = " %" if percent else ""
        size = f"n={self.n}" if self.n_groups is None else f"n={self.n}, {self.n_groups} groups"
        point = f"{self.value * scale:.{digits}f}"
        if not self.has_interval:
            return f"{point}{unit} (no CI, {size})"
        return f"{point} [{self.low * scale:.{ci_digits}f}, {self.high * scale:.{ci_digits}f}]{unit} ({size})"

    def __str__(self) -> str:
        return self.format()

    def summary(self) -> dict[str, Any]:
        """JSON-ready dict (NaN as ``None``) plus the printed form under ``"text"``.

        Returns:
            :meth:`to_dict` plus ``"text"``.
        """
        return {**self.to_dict(), "text": str(self)}

    def to_frame(self) -> pd.DataFrame:
        """One row with every field.

        Returns:
            A one-row DataFrame (``low`` / ``high`` kept as floats, NaN included).
        """
        return pd.DataFrame([{**self.to_dict(), "low": self.low, "high": self.high}])

    def figure(self, label: str | None = None, title: str | None = None) -> go.Figure:
        """The point value with its interval (a point alone without one).

        Args:
            label: Row label (default: the interval's method, level and sample size).
            title: Figure title (default: the printed estimate).

        Returns:
            The plotly interval figure (one row).
        """
        size = f"n={self.n}" if self.n_groups is None else f"n={self.n}, {self.n_groups} groups"
        row = label or (f"{self.method} {self.level:.0%} CI ({size})" if self.has_interval else f"no CI ({size})")
        return interval_figure([row], [self.value], [self.low], [self.high], title=title or str(self))


__all__ = ["Estimate", "StatisticsError", "TooFewSamplesError"]
