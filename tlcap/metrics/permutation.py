"""Monte-Carlo p-values for "located vs matched random sets".

A located set's effect (probability change, accuracy drop, ...) is compared with the same effect
of ``n_null`` random sets matched to it (same count per layer, :meth:`NeuronSet.random_like`).
Under the null hypothesis "the located set is one more random set", the observed effect is
exchangeable with the null effects, and its rank among the ``n_null + 1`` values is uniform. The
Monte-Carlo p-value (Davison & Hinkley 1997, §4.2; Phipson & Smyth 2010) counts the observed
value itself:

    p_greater = (1 + #{null_i ≥ observed}) / (1 + n_null)
    p_less    = (1 + #{null_i ≤ observed}) / (1 + n_null)
    p_two     = min(1, 2 · min(p_greater, p_less))

Ties count as "at least as extreme" (conservative). **Two-sided is the default**: the direction is
read from the sign of the effect, and a one-sided test needs a written reason. The smallest
attainable p (the *floor*, :func:`p_floor`) is ``2 / (1 + n_null)`` two-sided and
``1 / (1 + n_null)`` one-sided: with 20 draws the two-sided floor is 0.095, above α = 0.05, so
such a test can never be significant. :data:`MIN_NULL_DRAWS` (20) is the fewest draws
:func:`located_vs_random` accepts at all; :data:`RECOMMENDED_NULL_DRAWS` (200, floor 0.00995) is
what ``tlcap reproduce`` uses for nulls that need forward passes at ``cpu`` scale. A null that needs
no model run (set overlaps) is exact instead (:mod:`tlcap.metrics.overlap_null`).

Example:
    >>> permutation_p_value(0.9, [0.1] * 20)          # above all 20 nulls: the two-sided floor
    0.09523809523809523
    >>> permutation_p_value(0.9, [0.1] * 20, "greater")
    0.047619047619047616
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.metrics.bootstrap import Values, as_array
from tlcap.metrics.estimate import StatisticsError, TooFewSamplesError
from tlcap.results import Result
from tlcap.viz.stats import null_histogram

MIN_NULL_DRAWS = 20
"""Fewest matched random sets a "located vs random" p-value may rest on at all (issue 12)."""
RECOMMENDED_NULL_DRAWS = 200
"""Matched random sets for a p-value resolved well below α = 0.05 (two-sided floor 2/201 ≈ 0.00995)."""

Alternative = Literal["greater", "less", "two-sided"]


def require_draws(draws: Values, minimum: int, what: str = "random draws") -> np.ndarray:
    """``draws`` as a 1-D float array, refusing fewer than ``minimum`` of them or any NaN.

    Args:
        draws: The values of the draws (one per random set).
        minimum: The fewest draws accepted.
        what: How the message names the draws.

    Returns:
        The draws as a float64 numpy array.

    Raises:
        TooFewSamplesError: Fewer than ``minimum`` draws (the message says how many more).
        StatisticsError: A NaN among the draws, or not a 1-D sequence of numbers.

    Example:
        >>> null_effects = [0.01 * k for k in range(25)]
        >>> require_draws(null_effects, 20, "matched random sets").shape
        (25,)
        >>> require_draws(null_effects[:5], 20, "matched random sets")
        Traceback (most recent call last):
        ...
        tlcap.errors.TooFewSamplesError: 5 matched random sets given, at least 20 needed; draw 15 more ...
    """
    arr = as_array(draws, what)
    if len(arr) < minimum:
        raise TooFewSamplesError(
            f"{len(arr)} {what} given, at least {minimum} needed; draw {minimum - len(arr)} more "
            f"(e.g. NeuronSet.random_like(seed=i) for i in range({minimum}))"
        )
    if np.isnan(arr).any():
        raise StatisticsError(f"{int(np.isnan(arr).sum())} of the {what} are NaN; drop or recompute them")
    return arr


def p_floor(n_null: int, alternative: str = "two-sided") -> float:
    """The smallest p-value :func:`permutation_p_value` can return with ``n_null`` draws.

    Args:
        n_null: Number of null draws.
        alternative: ``"two-sided"`` (``2/(n+1)``) or a one-sided alternative (``1/(n+1)``).

    Returns:
        The floor.

    Example:
        >>> round(p_floor(200), 5)
        0.00995
    """
    return min(1.0, (2.0 if alternative == "two-sided" else 1.0) / (1 + int(n_null)))


def permutation_p_value(observed: float, null_values: Values, alternative: str = "two-sided") -> float:
    """Monte-Carlo rank p-value of ``observed`` among ``null_values`` (formulas in the module doc).

    Args:
        observed: The statistic of the located set.
        null_values: The same statistic of each matched random set, shape ``(n_null,)``.
        alternative: ``"two-sided"`` (default), ``"greater"`` (located larger than random) or
            ``"less"``.

    Returns:
        The p-value in ``[p_floor(n_null, alternative), 1]``.

    Raises:
        TooFewSamplesError: No null values.
        StatisticsError: NaN observed or null values, or an unknown alternative.

    Example:
        >>> permutation_p_value(3.0, [1, 2, 3, 4], "greater")    # (1 + 2) / 5
        0.6
        >>> permutation_p_value(3.0, [1, 2, 3, 4])               # 2 · min(3/5, 4/5)
        1.0
    """
    null = require_draws(null_values, 1, "null values")
    if observed is None or math.isnan(float(observed)):
        raise StatisticsError("the observed statistic is NaN; a p-value needs a number")
    n = len(null)
    p_greater = (1 + int((null >= observed).sum())) / (1 + n)
    p_less = (1 + int((null <= observed).sum())) / (1 + n)
    if alternative == "greater":
        return p_greater
    if alternative == "less":
        return p_less
    if alternative == "two-sided":
        return min(1.0, 2.0 * min(p_greater, p_less))
    raise StatisticsError(f"unknown alternative {alternative!r}; use 'greater', 'less' or 'two-sided'")


@dataclass(frozen=True)
class RandomControlTest(Result):
    """A located set's statistic against matched random sets.

    Attributes:
        observed: The located set's statistic.
        null_values: The statistic of each random set.
        alternative: Direction of the test.
        p_value: Monte-Carlo p-value (:func:`permutation_p_value`).
        n_as_extreme: Random sets at least as extreme as the located one (in the tested direction;
            for ``"two-sided"``, in the direction of the smaller one-sided p).
        statistic: What was measured (for reports).
    """

    observed: float
    null_values: tuple[float, ...]
    alternative: str
    p_value: float
    n_as_extreme: int
    statistic: str = ""

    @property
    def n_null(self) -> int:
        return len(self.null_values)

    @property
    def p_floor(self) -> float:
        """The smallest p-value these draws allow (:func:`p_floor`)."""
        return p_floor(self.n_null, self.alternative)

    @property
    def null_mean(self) -> float:
        return float(np.mean(self.null_values))

    @property
    def null_std(self) -> float:
        """Sample standard deviation of the null values (ddof = 1)."""
        return float(np.std(self.null_values, ddof=1)) if self.n_null > 1 else math.nan

    @property
    def null_max(self) -> float:
        return float(np.max(self.null_values))

    @property
    def null_min(self) -> float:
        return float(np.min(self.null_values))

    def summary(self) -> dict[str, Any]:
        return {
            "statistic": self.statistic, "observed": self.observed, "alternative": self.alternative,
            "p_value": self.p_value, "p_floor": self.p_floor, "n_null": self.n_null, "n_as_extreme": self.n_as_extreme,
            "null_mean": self.null_mean, "null_std": self.null_std, "null_min": self.null_min, "null_max": self.null_max,
            "text": str(self),
        }

    def __str__(self) -> str:
        return (f"{self.observed:.3f} vs random {self.null_mean:.3f} ± {self.null_std:.3f} "
                f"(p = {self.p_value:.3g}, {self.alternative}, {self.n_null} random sets)")

    def to_frame(self) -> pd.DataFrame:
        rows = [("located", self.observed)] + [(f"random #{i}", v) for i, v in enumerate(self.null_values)]
        return pd.DataFrame(rows, columns=["set", "value"])

    def figure(self, title: str | None = None) -> go.Figure:
        """Histogram of the random sets' statistic, the located set's value as a red line.

        Args:
            title: Figure title (default: statistic, number of random sets, p-value and alternative).

        Returns:
            The plotly histogram.
        """
        name = self.statistic or "statistic"
        return null_histogram(self.observed, self.null_values, value_name=name,
                              title=title or f"{name}: located vs {self.n_null} random sets (p = {self.p_value:.3g}, "
                                             f"{self.alternative})")


def located_vs_random(
    observed: float,
    null_values: Values,
    *,
    alternative: Alternative = "two-sided",
    min_draws: int = MIN_NULL_DRAWS,
    statistic: str = "",
) -> RandomControlTest:
    """Test a located set against at least ``min_draws`` matched random sets.

    Args:
        observed: The located set's statistic (e.g. mean probability change when doubling).
        null_values: The same statistic for each matched random set (same count per layer).
        alternative: ``"two-sided"`` (default; the direction is the sign of observed − null
            mean), or ``"greater"`` / ``"less"`` with a written reason for a one-sided test.
        min_draws: The fewest random sets accepted (default 20, issue 12).
        statistic: A name for reports.

    Returns:
        A :class:`RandomControlTest`.

    Raises:
        TooFewSamplesError: Fewer than ``min_draws`` random sets.

    Example:
        >>> acc_located, acc_random = 0.21, np.linspace(0.40, 0.50, 20)
        >>> t = located_vs_random(acc_located, acc_random, statistic="accuracy after erase")
        >>> t.p_value, t.n_as_extreme                # below all 20 draws: the two-sided floor 2/21
        (0.09523809523809523, 0)
    """
    null = require_draws(null_values, min_draws, "matched random sets")
    p = permutation_p_value(observed, null, alternative)
    if alternative == "greater" or (alternative == "two-sided" and (null >= observed).sum() <= (null <= observed).sum()):
        k = int((null >= observed).sum())
    else:
        k = int((null <= observed).sum())
    return RandomControlTest(float(observed), tuple(float(v) for v in null), alternative, p, k, statistic)
