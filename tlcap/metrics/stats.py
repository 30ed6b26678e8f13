"""Statistics of the Query Localization analyses: KN-consistency, thresholds, tests, predominance.

- :func:`cs1` / :func:`cs2` — KN-Consistency Scores of a fact's neighbor KN sets (QL eq. 1).
- :func:`otsu_threshold` — Otsu's threshold on a 1-D sample (scikit-image, with a hand
  implementation as the fallback and the reference in tests).
- :func:`welch_t_test` — Welch's unequal-variance t-test (scipy).
- :func:`predominance` — the share of queries agreeing on their most-attended token (QL eq. 4).
- :func:`consistency_aware_scores` — CAS = β1·μ − β2·σ over the queries' scores (QL eq. 7).

Example:
    >>> sets = [NeuronSet.from_list([(0, 1), (0, 2)], (2, 4)), NeuronSet.from_list([(0, 1)], (2, 4))]
    >>> cs1(sets), cs2(sets)
    (0.5, 0.5)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import TooFewSamplesError
from tlcap.metrics.sets import NeuronSet


def _check_sets(sets: Sequence[NeuronSet]) -> None:
    if len(sets) < 2:
        raise TooFewSamplesError(f"KN-consistency needs the KN sets of at least 2 neighbor queries, got {len(sets)}")


def cs1(sets: Sequence[NeuronSet]) -> float:
    """CS1 = |∩N_i| / |∪N_i| (0 when the union is empty).

    Args:
        sets: The KN sets of the neighbor queries (at least 2).

    Returns:
        CS1 in ``[0, 1]``.

    Raises:
        TooFewSamplesError: fewer than 2 sets.
    """
    _check_sets(sets)
    union = set().union(*(set(s) for s in sets))
    if not union:
        return 0.0
    inter = set(sets[0]).intersection(*(set(s) for s in sets[1:]))
    return len(inter) / len(union)


def cs2(sets: Sequence[NeuronSet]) -> float:
    """CS2 = |{n ∈ ∪N_i : n in more than one N_i}| / |∪N_i| (0 when the union is empty).

    Args:
        sets: The KN sets of the neighbor queries (at least 2).

    Returns:
        CS2 in ``[0, 1]``.

    Raises:
        TooFewSamplesError: fewer than 2 sets.
    """
    _check_sets(sets)
    counts = Counter(n for s in sets for n in set(s))
    if not counts:
        return 0.0
    return sum(1 for c in counts.values() if c > 1) / len(counts)


def refined_set(sets: Sequence[NeuronSet], min_count: int = 2) -> NeuronSet:
    """Neurons present in at least ``min_count`` of the sets (the "refine" set of QL eq. 3)."""
    if not sets:
        raise TooFewSamplesError("refined_set needs at least one neuron set")
    counts = Counter(n for s in sets for n in set(s))
    return NeuronSet(tuple(n for n, c in counts.items() if c >= min_count), sets[0].shape)


def _otsu_hand(values: np.ndarray, nbins: int = 256) -> float:
    """Otsu's threshold by hand (same histogram convention as ``skimage.filters.threshold_otsu``)."""
    hist, edges = np.histogram(values, bins=nbins, range=(values.min(), values.max()))
    centers = (edges[:-1] + edges[1:]) / 2.0
    hist = hist.astype(float)
    w1 = np.cumsum(hist)
    w2 = np.cumsum(hist[::-1])[::-1]
    m1 = np.cumsum(hist * centers) / np.maximum(w1, 1e-300)
    m2 = (np.cumsum((hist * centers)[::-1]) / np.maximum(w2[::-1], 1e-300))[::-1]
    var_between = w1[:-1] * w2[1:] * (m1[:-1] - m2[1:]) ** 2
    return float(centers[:-1][int(np.argmax(var_between))])


def otsu_threshold(values: Iterable[float], nbins: int = 256, backend: str = "skimage") -> float:
    """Otsu's threshold (maximal between-class variance) of a 1-D sample.

    Args:
        values: The sample (e.g. CS2 of every fact).
        nbins: Histogram bins.
        backend: ``"skimage"`` (default, ``skimage.filters.threshold_otsu``) or ``"hand"``.

    Returns:
        The threshold; values ``> threshold`` form the upper class. A constant sample returns
        its value (nothing can be split).
    """
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        raise TooFewSamplesError("otsu_threshold needs at least one value")
    if np.all(v == v[0]):
        return float(v[0])
    if backend == "skimage":
        try:
            from skimage.filters import threshold_otsu

            return float(threshold_otsu(v, nbins=nbins))
        except ImportError:  # pragma: no cover - scikit-image is a dependency
            pass
    return _otsu_hand(v, nbins)


def welch_t_test(a: Iterable[float], b: Iterable[float]) -> tuple[float, float]:
    """Welch's t-test (unequal variances) of ``a`` vs ``b``; ``(nan, nan)`` if a group has < 2 values.

    Args:
        a: The first group's values.
        b: The second group's values.

    Returns:
        ``(t, p)`` with ``t = (mean_a − mean_b) / sqrt(var_a/n_a + var_b/n_b)`` (sample variances)
        and the two-sided p-value with Welch–Satterthwaite degrees of freedom.
    """
    from scipy import stats

    a = np.asarray(list(a), dtype=float)
    b = np.asarray(list(b), dtype=float)
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan
    res = stats.ttest_ind(a, b, equal_var=False)
    return float(res.statistic), float(res.pvalue)


def split_groups(values: Sequence[float], threshold: float) -> list[str]:
    """``"K_I"`` for values above ``threshold`` (consistent facts), else ``"K_II"``."""
    return ["K_I" if v > threshold else "K_II" for v in values]


def predominance(tokens: Sequence[str]) -> float:
    """P = the largest share of queries whose most-attended token is the same (QL eq. 4).

    Tokens are compared after stripping whitespace and lower-casing.
    """
    if not tokens:
        raise TooFewSamplesError("predominance needs at least one token")
    counts = Counter(t.strip().lower() for t in tokens)
    return max(counts.values()) / len(tokens)


def consistency_aware_scores(
    scores: Float[Tensor, "k layer d_mlp"], beta1: float = 0.7, beta2: float = 0.3
) -> Float[Tensor, "layer d_mlp"]:
    """CAS_{l,p} = β1·μ_{l,p} − β2·σ_{l,p} over the k queries' scores (σ: population std, QL eq. 7)."""
    s = scores.double()
    mu = s.mean(0)
    sigma = s.std(0, unbiased=False)
    return (beta1 * mu - beta2 * sigma).float()


def relative_change(after: float, before: float, sign: float = 1.0, eps: float = 1e-12) -> float:
    """``sign · (after − before) / before`` (ΔProb / ΔValue of the QL paper); nan if before ≈ 0."""
    if abs(before) < eps:
        return math.nan
    return float(sign * (after - before) / before)
