"""Multiplicity control over the p-values of one report: Benjamini–Hochberg (FDR) and Holm (FWER).

A reproduction report tests dozens of claims at once. Judged one by one at α = 0.05, about one in
twenty true nulls comes out "significant". :func:`benjamini_hochberg` returns the BH-adjusted
p-values (Benjamini & Hochberg 1995, the step-up q-values): a row is a discovery at false
discovery rate α when its adjusted value is below α, and the expected share of false discoveries
among all discoveries is then at most α (independent or positively dependent tests).
:func:`holm` gives the family-wise (Holm 1979) adjustment for comparison.

:func:`bh_critical_level` is the raw-p level a row had to reach to be a discovery in this family
(``α·k/m`` for the k discoveries of m tests, or ``α/m`` when there are none): the significance
level "after adjustment" that a power calculation for that family should use.

NaN p-values (rows without a test) are left out of the family and stay NaN.

Example:
    >>> [round(q, 4) for q in benjamini_hochberg([0.01, 0.04, 0.03, 0.5])]
    [0.04, 0.0533, 0.0533, 0.5]
    >>> [round(q, 4) for q in holm([0.01, 0.04, 0.03, 0.5])]
    [0.04, 0.09, 0.09, 0.5]
    >>> round(bh_critical_level([0.01, 0.04, 0.03, 0.5], 0.05), 4)
    0.0125
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tlcap.metrics.estimate import StatisticsError


def _valid(p: Sequence[float | None] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray([math.nan if v is None else float(v) for v in p], dtype=float)
    ok = ~np.isnan(arr)
    if ((arr[ok] < 0) | (arr[ok] > 1)).any():
        raise StatisticsError(f"p-values must lie in [0, 1], got {arr[ok][(arr[ok] < 0) | (arr[ok] > 1)].tolist()}")
    return arr, ok


def benjamini_hochberg(p: Sequence[float | None] | np.ndarray) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (q-values), in the input order.

    ``q_(i) = min_{j ≥ i} min(1, m · p_(j) / j)`` over the m non-NaN p-values sorted ascending.

    Args:
        p: Raw p-values (``None``/NaN for rows without a test).

    Returns:
        The adjusted values, NaN where the input is NaN.

    Raises:
        StatisticsError: A p-value outside [0, 1].

    Example:
        >>> benjamini_hochberg([0.2, None, 0.01])
        [0.2, nan, 0.02]
    """
    arr, ok = _valid(p)
    out = np.full(len(arr), math.nan)
    vals = arr[ok]
    m = len(vals)
    if m:
        order = np.argsort(vals, kind="stable")
        ranked = vals[order] * m / np.arange(1, m + 1)
        q = np.minimum.accumulate(ranked[::-1])[::-1].clip(max=1.0)
        adj = np.empty(m)
        adj[order] = q
        out[ok] = adj
    return [float(v) for v in out]


def holm(p: Sequence[float | None] | np.ndarray) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error rate), in the input order.

    Args:
        p: Raw p-values (``None``/NaN for rows without a test).

    Returns:
        The adjusted values, NaN where the input is NaN.

    Raises:
        StatisticsError: A p-value outside [0, 1].
    """
    arr, ok = _valid(p)
    out = np.full(len(arr), math.nan)
    vals = arr[ok]
    m = len(vals)
    if m:
        order = np.argsort(vals, kind="stable")
        ranked = vals[order] * (m - np.arange(m))
        q = np.maximum.accumulate(ranked).clip(max=1.0)
        adj = np.empty(m)
        adj[order] = q
        out[ok] = adj
    return [float(v) for v in out]


def bh_critical_level(p: Sequence[float | None] | np.ndarray, alpha: float = 0.05) -> float:
    """The raw-p level a test needed to be a BH discovery in this family.

    With k discoveries among m tests it is ``α·k/m`` (every p ≤ it is a discovery); with none it is
    ``α/m`` (the level the smallest p would have had to reach). NaN for an empty family.

    Args:
        p: Raw p-values of the family (NaN ignored).
        alpha: The false discovery rate.

    Returns:
        The critical raw-p level.

    Raises:
        StatisticsError: ``alpha`` outside (0, 1) or a p-value outside [0, 1].
    """
    if not 0.0 < alpha < 1.0:
        raise StatisticsError(f"alpha must lie in (0, 1), got {alpha}")
    arr, ok = _valid(p)
    vals = np.sort(arr[ok])
    m = len(vals)
    if not m:
        return math.nan
    below = np.nonzero(vals <= alpha * np.arange(1, m + 1) / m)[0]
    k = int(below[-1]) + 1 if len(below) else 0
    return alpha * max(k, 1) / m


__all__ = ["benjamini_hochberg", "holm", "bh_critical_level"]
