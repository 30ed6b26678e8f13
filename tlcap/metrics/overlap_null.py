"""The exact null distribution of a set overlap against random sets matched per layer.

"Is the overlap of two located sets above chance?" compares ``|A ∩ B|`` with ``|A ∩ R|`` for
random sets R that have B's count in every layer, drawn uniformly from the layer's neurons (the
whole pool, or the pool minus an ``exclude`` set). No model run is needed, so instead of a few
Monte-Carlo draws the null is exact: in layer l, ``|A_l ∩ R_l|`` is hypergeometric
(population ``N_l``, ``K_l = |A_l|`` successes, ``n_l = |B_l|`` draws), independently across
layers, and the total ``k = Σ_l |A_l ∩ R_l|`` has the convolution of those laws. The CNL
overlap ``(k/|A| + k/|B|)/2`` and the IoU ``k/(|A|+|B|−k)`` are increasing in k, so one
distribution gives exact p-values for the intersection, the overlap and the IoU alike. The
convolution is done in log space, so p-values far below any Monte-Carlo floor (1e-100 and
smaller) are resolved; they are clipped at ``1e-300``.

Example:
    >>> a = NeuronSet.from_list([(0, 1), (0, 2), (1, 3)], shape=(2, 10))
    >>> b = NeuronSet.from_list([(0, 1), (0, 2), (1, 4)], shape=(2, 10))
    >>> null = overlap_null(a, b)
    >>> round(null.mean_intersection, 3)     # layer 0: 2·2/10, layer 1: 1·1/10
    0.5
    >>> round(null.p_value(a.overlap(b), "greater"), 4)     # 1/45 + 16/45 · 1/10
    0.0578
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp
from scipy.stats import hypergeom

from tlcap.metrics.estimate import StatisticsError
from tlcap.metrics.sets import NeuronSet

P_MIN = 1e-300
"""Smallest p-value reported (double precision)."""


def _logconv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.full(len(a) + len(b) - 1, -np.inf)
    for i, la in enumerate(a):
        if la == -np.inf:
            continue
        out[i:i + len(b)] = np.logaddexp(out[i:i + len(b)], la + b)
    return out


@dataclass(frozen=True)
class OverlapNull:
    """The law of ``|A ∩ R|`` for R matched per layer to B (see the module doc).

    Attributes:
        logpmf: ``log P(k)`` for ``k = 0 .. len(logpmf) − 1``.
        size_a: ``|A|``.
        size_b: ``|B|`` (= ``|R|``).
        pool: Neurons per layer R is drawn from (``d_mlp`` minus the excluded ones), per layer of B.
    """

    logpmf: tuple[float, ...]
    size_a: int
    size_b: int
    pool: tuple[int, ...] = ()

    def _k(self, overlap: float) -> float:
        """The intersection size whose CNL overlap is ``overlap``."""
        if not self.size_a or not self.size_b:
            return 0.0
        return overlap / (0.5 * (1.0 / self.size_a + 1.0 / self.size_b))

    @property
    def pmf(self) -> np.ndarray:
        return np.exp(np.asarray(self.logpmf))

    @property
    def mean_intersection(self) -> float:
        """``E|A ∩ R|``."""
        return float((np.arange(len(self.logpmf)) * self.pmf).sum())

    @property
    def mean_overlap(self) -> float:
        """``E overlap(A, R)`` (the CNL overlap under the null)."""
        if not self.size_a or not self.size_b:
            return 0.0
        return 0.5 * self.mean_intersection * (1.0 / self.size_a + 1.0 / self.size_b)

    def tail(self, k: float, side: str) -> float:
        """``P(K ≥ k)`` (``"greater"``) or ``P(K ≤ k)`` (``"less"``), clipped at :data:`P_MIN`.

        Args:
            k: The observed overlap count.
            side: ``"greater"`` or ``"less"``.

        Returns:
            The tail probability in ``[P_MIN, 1]``.
        """
        lp = np.asarray(self.logpmf)
        ks = np.arange(len(lp))
        eps = 1e-9
        sel = ks >= k - eps if side == "greater" else ks <= k + eps
        if not sel.any():
            return P_MIN
        return float(min(1.0, max(P_MIN, math.exp(logsumexp(lp[sel])))))

    def p_value(self, overlap: float, alternative: str = "two-sided") -> float:
        """Exact p-value of an observed CNL overlap of A with B.

        Args:
            overlap: The observed ``overlap(A, B)``.
            alternative: ``"greater"``, ``"less"`` or ``"two-sided"`` (twice the smaller tail).

        Returns:
            The p-value in ``[P_MIN, 1]``.

        Raises:
            StatisticsError: An unknown alternative.
        """
        k = self._k(overlap)
        if alternative == "greater":
            return self.tail(k, "greater")
        if alternative == "less":
            return self.tail(k, "less")
        if alternative == "two-sided":
            return min(1.0, 2.0 * min(self.tail(k, "greater"), self.tail(k, "less")))
        raise StatisticsError(f"unknown alternative {alternative!r}; use 'greater', 'less' or 'two-sided'")

    def quantile_overlap(self, q: float) -> float:
        """The overlap at the ``q`` quantile of the null (for a null band in figures).

        Args:
            q: The quantile, in ``[0, 1]``.

        Returns:
            The overlap ``k · (1/|A| + 1/|B|) / 2`` at the quantile's count ``k``.
        """
        cdf = np.cumsum(self.pmf)
        k = int(np.searchsorted(cdf, q - 1e-12))
        return 0.5 * k * (1.0 / max(self.size_a, 1) + 1.0 / max(self.size_b, 1))


def overlap_null(fixed: NeuronSet, matched: NeuronSet, exclude: NeuronSet | None = None) -> OverlapNull:
    """The exact null law of ``|fixed ∩ R|``, R drawn uniformly with ``matched``'s count per layer.

    Args:
        fixed: The set held fixed (A).
        matched: The set whose per-layer counts the random sets copy (B).
        exclude: Neurons R never contains (default: none — R is drawn from the whole layer).

    Returns:
        An :class:`OverlapNull`.

    Raises:
        StatisticsError: Sets of different shapes, or a layer whose pool is smaller than the
            count drawn from it.
    """
    if fixed.shape != matched.shape or (exclude is not None and exclude.shape != fixed.shape):
        raise StatisticsError(f"sets of different shapes: {fixed.shape} vs {matched.shape}")
    d = fixed.shape[1]
    a_by, b_by = fixed.by_layer(), matched.by_layer()
    ex_by = exclude.by_layer() if exclude is not None else {}
    logpmf = np.zeros(1)
    pools = []
    for l, idx in sorted(b_by.items()):
        ex = set(ex_by.get(l, ()))
        pool = d - len(ex)
        K = len(set(a_by.get(l, ())) - ex)
        n = len(idx)
        if n > pool:
            raise StatisticsError(f"layer {l}: cannot draw {n} neurons from a pool of {pool}")
        pools.append(pool)
        ks = np.arange(0, min(K, n) + 1)
        lp = hypergeom.logpmf(ks, pool, K, n)
        logpmf = _logconv(logpmf, lp)
    return OverlapNull(tuple(float(v) for v in logpmf), len(fixed), len(matched), tuple(pools))


__all__ = ["OverlapNull", "overlap_null", "P_MIN"]
