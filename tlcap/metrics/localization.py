"""The CNL paper's evaluation quantities, over plain sets: overlap, IoU, coincidence rates, IPP.

Every function takes sets of hashable items — MLP neurons ``(layer, index)``, layer indices
(causal tracing's top-3 layers), circuit edges — as Python sets, any iterable (lists of
``[layer, index]`` pairs from JSON are turned into tuples), or :class:`NeuronSet`.

- :func:`overlap` ``= (|a∩b|/|a| + |a∩b|/|b|) / 2`` (CNL fidelity, split-half stability) and
  :func:`iou` ``= |a∩b| / |a∪b|``, with :class:`NeuronSet`'s conventions for empty sets:
  overlap is 0 when either set is empty; IoU is 1 for two empty sets (identical) and 0 when only
  one is empty.
- :func:`mean_pairwise_overlap`: the mean over the ``k(k−1)/2`` unordered pairs of ``k`` sets
  (fidelity: the 5 rewrites of a fact).
- :func:`coincidence_rates`: the decoupling experiment's ``C^{1,2}``, ``C^{1,1}``, ``C^{2,2}``,
  literal and normalised (see its docstring).
- :func:`ipp` / :func:`ipp_ci`: located performance minus the best of ≥ 5 random draws.

Example:
    >>> overlap({1, 2, 3}, {2, 3, 4, 5})           # (2/3 + 2/4) / 2
    0.5833333333333333
    >>> mean_pairwise_overlap([{1, 2}, {2, 3}, {2}]).mean      # the 3 pairs: 0.5, 0.75, 0.75
    0.6666666666666666
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.metrics.bootstrap import (
    Groups,
    Values,
    WeightedStatistic,
    as_array,
    bootstrap_ci,
)
from tlcap.metrics.estimate import Estimate, StatisticsError, TooFewSamplesError
from tlcap.metrics.permutation import require_draws
from tlcap.metrics.sets import NeuronSet
from tlcap.results import Result
from tlcap.viz.stats import pair_matrix

SetLike = NeuronSet | AbstractSet[Hashable] | Iterable[Any]  # JSON lists of [layer, index] too
MIN_IPP_DRAWS = 5
"""Fewest random draws an IPP may take its best random performance from."""


def as_set(a: SetLike) -> frozenset:
    """``a`` as a frozenset; list items (e.g. ``[layer, index]`` from JSON) become tuples."""
    if isinstance(a, NeuronSet):
        return frozenset(a.neurons)
    return frozenset(tuple(x) if isinstance(x, list) else x for x in a)


def overlap(a: SetLike, b: SetLike) -> float:
    """The CNL paper's overlap ``(|a∩b|/|a| + |a∩b|/|b|) / 2``; 0 if either set is empty.

    Args:
        a: A located set.
        b: Another located set of the same kind.

    Returns:
        The overlap in [0, 1] (1 iff the sets are equal and non-empty).

    Example:
        >>> overlap({(0, 1), (2, 5)}, {(0, 1)})        # (1/2 + 1/1) / 2
        0.75
    """
    if isinstance(a, NeuronSet) and isinstance(b, NeuronSet):
        return a.overlap(b)
    sa, sb = as_set(a), as_set(b)
    if not sa or not sb:
        return 0.0
    inter = len(sa & sb)
    return 0.5 * (inter / len(sa) + inter / len(sb))


def iou(a: SetLike, b: SetLike) -> float:
    """Intersection over union ``|a∩b| / |a∪b|``; 1 for two empty sets, 0 if only one is empty.

    Args:
        a: A :class:`NeuronSet`, a set, or an iterable of items (e.g. JSON ``[layer, index]`` lists).
        b: The same kinds as ``a``.

    Returns:
        The IoU in ``[0, 1]``.

    Example:
        >>> iou({1, 2, 3}, {2, 3, 4, 5})               # 2 / 5
        0.4
    """
    if isinstance(a, NeuronSet) and isinstance(b, NeuronSet):
        return a.iou(b)
    sa, sb = as_set(a), as_set(b)
    union = len(sa | sb)
    return 1.0 if union == 0 else len(sa & sb) / union


@dataclass(frozen=True)
class PairwiseOverlap(Result):
    """Overlap (or IoU) of every unordered pair of ``k`` sets, and their mean.

    Attributes:
        mean: Mean over the ``k(k−1)/2`` pairs.
        pairs: The pairs ``(i, j)``, ``i < j``, in :func:`itertools.combinations` order.
        values: The measure of each pair, aligned with ``pairs``.
        measure: ``"overlap"`` or ``"iou"``.
    """

    mean: float
    pairs: tuple[tuple[int, int], ...]
    values: tuple[float, ...]
    measure: str = "overlap"

    @property
    def k(self) -> int:
        """Number of sets."""
        return max(j for _, j in self.pairs) + 1

    def summary(self) -> dict[str, Any]:
        return {"measure": self.measure, "k": self.k, "mean": self.mean, "min": min(self.values), "max": max(self.values)}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([(i, j, v) for (i, j), v in zip(self.pairs, self.values)], columns=["i", "j", self.measure])

    def figure(self, labels: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
        """The ``k × k`` matrix of pair values (diagonal empty); the mean in the title.

        Args:
            labels: One label per set (default ``0..k-1``), e.g. the rewrites of a fact.
            title: Figure title.

        Returns:
            The plotly heatmap.
        """
        return pair_matrix(self.k, self.pairs, self.values, value_name=self.measure, labels=labels,
                           title=title or f"Pairwise {self.measure} of {self.k} sets: mean {self.mean:.3f}")


def mean_pairwise_overlap(sets: Sequence[SetLike], measure: str = "overlap") -> PairwiseOverlap:
    """The mean overlap over all unordered pairs of ``k ≥ 2`` sets (the CNL fidelity score of one fact).

    Args:
        sets: The located sets, e.g. one per rewrite of a fact (k = 5 in the paper).
        measure: ``"overlap"`` (the paper's) or ``"iou"``.

    Returns:
        A :class:`PairwiseOverlap` with the mean and every pair's value.

    Raises:
        TooFewSamplesError: Fewer than 2 sets.

    Example:
        >>> rewrite_sets = [{(0, 1), (1, 2)}, {(0, 1)}, {(0, 1), (1, 5)}]   # one located set per rewrite
        >>> r = mean_pairwise_overlap(rewrite_sets)
        >>> r.mean, r.values                          # pairs (1,2), (1,3), (2,3)
        (0.6666666666666666, (0.75, 0.5, 0.75))
    """
    if len(sets) < 2:
        raise TooFewSamplesError(f"a pairwise overlap needs at least 2 sets, got {len(sets)}")
    fn = {"overlap": overlap, "iou": iou}.get(measure)
    if fn is None:
        raise StatisticsError(f"unknown measure {measure!r}; use 'overlap' or 'iou'")
    pairs = tuple(combinations(range(len(sets)), 2))
    values = tuple(float(fn(sets[i], sets[j])) for i, j in pairs)
    return PairwiseOverlap(float(np.mean(values)), pairs, values, measure)


def _ipp_draws(draws: Values, min_draws: int) -> np.ndarray:
    return require_draws(draws, min_draws, "random draws")


def ipp(
    performance_located: float,
    performance_random_draws: Values,
    *,
    higher_is_better: bool = True,
    min_draws: int = MIN_IPP_DRAWS,
) -> float:
    """The CNL paper's IPP: located performance minus the best performance over random draws.

    ``IPP = performance(param_located) − max_d performance(param_random_d)`` (the poster's
    ``performance(param_located) − performance_optimal(param ∈ random)``), with ``d`` over at
    least ``min_draws`` random sets of the located set's size. Positive IPP means the located
    parameters beat every random draw (the paper: KN 11.4, ROME 0.0, KC 10.5, CNL 20.0 points).
    When a lower performance means a stronger effect (e.g. accuracy after erasing), pass
    ``higher_is_better=False``: ``IPP = min_d performance(random_d) − performance(located)``, so
    the sign convention (positive = located better) is kept.

    Args:
        performance_located: Performance with the located parameters manipulated.
        performance_random_draws: Performance with each random draw manipulated instead.
        higher_is_better: Whether a larger performance means a stronger localization.
        min_draws: The fewest random draws accepted (default 5).

    Returns:
        The IPP, in the unit of the performance (a share: multiply by 100 for points).

    Raises:
        TooFewSamplesError: Fewer than ``min_draws`` draws.
        StatisticsError: NaN performances.

    Example:
        >>> round(ipp(0.60, [0.41, 0.45, 0.39, 0.40, 0.44]), 6)      # 0.60 − 0.45
        0.15
    """
    draws = _ipp_draws(performance_random_draws, min_draws)
    located = float(performance_located)
    if np.isnan(located):
        raise StatisticsError("the located performance is NaN; an IPP needs a number")
    return located - float(draws.max()) if higher_is_better else float(draws.min()) - located


def ipp_ci(
    located: Values,
    random_draws: Values,
    *,
    higher_is_better: bool = True,
    min_draws: int = MIN_IPP_DRAWS,
    n_boot: int = 5000,
    level: float = 0.95,
    seed: int = 0,
    groups: Groups | None = None,
) -> Estimate:
    """IPP from per-sample performances, with a bootstrap interval over samples.

    Performance is the mean over samples; IPP = ``mean(located) − max_d mean(random_d)`` (or
    its mirror with ``higher_is_better=False``). Every resample draws the same samples for the
    located set and for all draws, so the interval reflects sample variability with the random
    draws held fixed (the max over draws is recomputed in each resample).

    Args:
        located: Per-sample performance with the located parameters manipulated, shape ``(n,)``.
        random_draws: Per-sample performance for each random draw, shape ``(draws, n)``.
        higher_is_better: As in :func:`ipp`.
        min_draws: The fewest random draws accepted.
        n_boot: Resamples.
        level: Confidence level.
        seed: Seed of the resampling generator.
        groups: One label per sample for a cluster bootstrap.

    Returns:
        An :class:`Estimate` whose value equals ``ipp(mean(located), means of the draws)``.

    Example:
        >>> acc_located_per_sample = np.array([1, 1, 0, 1, 1, 0, 1, 1])
        >>> acc_random_per_sample = np.array([[0, 1, 0, 1, 0, 0, 1, 0]] * 5)
        >>> print(ipp_ci(acc_located_per_sample, acc_random_per_sample))   # (n,), (5, n)
        0.375 [0.12, 0.75] (n=8)
    """
    loc = as_array(located, "located")
    rnd = as_array(random_draws, "random_draws", ndim=(2,))
    if rnd.shape[1] != len(loc):
        raise StatisticsError(f"random_draws must have shape (draws, {len(loc)}), got {rnd.shape}")
    _ipp_draws(rnd[:, 0], min_draws)
    x = np.column_stack([loc, rnd.T])
    sign = 1.0 if higher_is_better else -1.0

    def fn(x: np.ndarray, W: np.ndarray) -> np.ndarray:
        m = sign * (W @ x) / W.sum(1)[:, None]
        return m[:, 0] - m[:, 1:].max(1)  # with sign = −1: min_d mean(random_d) − mean(located)

    return bootstrap_ci(x, WeightedStatistic(fn, "ipp"), n_boot=n_boot, level=level, seed=seed, groups=groups)
