"""Power of a report row: the smallest effect its test could detect, and its power at the paper's effect.

For an effect estimated with standard error ``se`` and judged two-sided at level α, the minimum
detectable effect at power 1 − β is (normal approximation)

    MDE = (z_{1−α/2} + z_{1−β}) · se

and the power to detect a true effect δ is ``Φ(|δ|/se − z_{1−α/2}) + Φ(−|δ|/se − z_{1−α/2})``.
The standard error is read from the row's 95 % CI (``se = width / (2 · 1.96)``), so the same
number serves bootstrap, Wilson, Newcombe and t intervals. α is the level *after* multiplicity
adjustment (:func:`tlcap.metrics.multiplicity.bh_critical_level`).

A Monte-Carlo p-value cannot fall below its floor (``2/(R+1)`` for R random sets, two-sided):
when the floor is above α the row cannot be significant whatever the effect, and
:func:`detectable` says so.

Example:
    >>> round(mde(0.05, alpha=0.05), 4)      # (1.96 + 0.8416) · 0.05
    0.1401
    >>> round(power_at(0.14, 0.05, alpha=0.05), 2)
    0.8
    >>> round(se_from_ci(0.1, 0.3), 4)
    0.051
"""

from __future__ import annotations

import math

from scipy.stats import norm

from tlcap.metrics.estimate import StatisticsError

POWER = 0.8
"""The power at which the minimum detectable effect is stated."""


def _z(alpha: float) -> float:
    if not 0.0 < alpha < 1.0:
        raise StatisticsError(f"alpha must lie in (0, 1), got {alpha}")
    return float(norm.isf(alpha / 2.0))


def se_from_ci(low: float, high: float, level: float = 0.95) -> float:
    """The standard error a two-sided CI at ``level`` implies (NaN without an interval).

    Args:
        low: Lower end of the CI.
        high: Upper end of the CI.
        level: Its confidence level.

    Returns:
        ``(high − low) / (2 · z_{(1+level)/2})``.
    """
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return math.nan
    return (high - low) / (2.0 * float(norm.isf((1.0 - level) / 2.0)))


def mde(se: float, alpha: float = 0.05, power: float = POWER) -> float:
    """Minimum detectable effect of a two-sided test at level ``alpha`` with power ``power``.

    Args:
        se: Standard error of the effect.
        alpha: Significance level (after adjustment).
        power: Desired power.

    Returns:
        ``(z_{1−α/2} + z_{power}) · se`` (NaN when ``se`` is NaN).

    Raises:
        StatisticsError: ``alpha`` or ``power`` outside (0, 1).
    """
    if not 0.0 < power < 1.0:
        raise StatisticsError(f"power must lie in (0, 1), got {power}")
    if se is None or math.isnan(se):
        return math.nan
    return (_z(alpha) + float(norm.ppf(power))) * se


def power_at(effect: float, se: float, alpha: float = 0.05) -> float:
    """Power of a two-sided test at level ``alpha`` against a true effect ``effect``.

    Args:
        effect: The true effect (e.g. the paper's effect size on our scale).
        se: Standard error of our estimate.
        alpha: Significance level (after adjustment).

    Returns:
        The probability of a significant result (NaN when ``se`` is NaN; 1 or ``alpha`` when
        ``se`` is 0).
    """
    if se is None or effect is None or math.isnan(se) or math.isnan(effect):
        return math.nan
    z = _z(alpha)
    if se == 0:
        return 1.0 if effect != 0 else alpha
    d = abs(effect) / se
    return float(norm.cdf(d - z) + norm.cdf(-d - z))


def detectable(p_floor: float | None, alpha: float) -> bool:
    """Whether a p-value with smallest attainable value ``p_floor`` can be significant at ``alpha``.

    Args:
        p_floor: Smallest attainable p-value (None or NaN: unknown, taken as detectable).
        alpha: Significance level.

    Returns:
        True unless ``p_floor > alpha`` (a p-value at the level is significant, as in Benjamini–Hochberg's rule).
    """
    return p_floor is None or math.isnan(p_floor) or p_floor <= alpha


__all__ = ["mde", "power_at", "se_from_ci", "detectable", "POWER"]
