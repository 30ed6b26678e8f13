r"""Coincidence rates of the CNL decoupling experiment (paper §4, poster formula).

Each of ``n`` comparative samples has two framings ``t ∈ {1, 2}`` of the same main part
("give the answer to 17+25=?" / "write Python code for 17+25=?"); KN locates a neuron set
``N^t_k = P_s | Attr(ω^{l,j} | x^t_k)`` for framing ``t`` of sample ``k`` in a model with ``L``
layers of ``J`` MLP neurons. The poster prints (``|·|`` read as set size):

.. math::

    C_r^{t,t^*} = \begin{cases}
        \frac{1}{n \cdot L \cdot J} \sum_{k=1}^n |N^t_k \cap N^{t^*}_k| & t \neq t^* \\
        \frac{1}{L \cdot J} \left|\bigcap_{k=1}^n N^t_k\right| & t = t^*
    \end{cases}

i.e. ``C^{1,2}`` = mean over pairs of the neurons both framings share, as a share of **all**
``L·J`` neurons, and ``C^{t,t}`` = neurons located for every sample of framing ``t``, again as a
share of all neurons. With KN sets of a few neurons in a model of 10⁴–10⁵ neurons these are of
order 10⁻⁴, far from the paper's 15.6 / 7.3 / 8.6 %, which therefore cannot be the literal
formula's values; we report the literal rates and two normalised variants:

- **overlap-normalised** (``*_overlap``, our recommended reading): keep the numerators and divide
  by the located sets' sizes instead of ``L·J``:
  ``C^{1,2} = (1/n) Σ_k (|N¹_k∩N²_k|/|N¹_k| + |N¹_k∩N²_k|/|N²_k|) / 2`` (the paper's own
  fidelity *overlap* of each pair, averaged) and ``C^{t,t} = (1/n) Σ_k |⋂_j N^t_j| / |N^t_k|``
  (the share of each sample's located set that every sample of the framing shares, averaged;
  for ``n = 2`` it is exactly the overlap of the two sets). Both read on the same scale as the
  paper's fidelity numbers (37.3 %, ...) and Table 1's overlap. Dividing by the smaller set
  instead would reach 1 whenever a tiny set sits inside a large one; an empty set contributes 0
  (the overlap convention of :class:`NeuronSet`).
- **IoU** (``*_iou``): ``C^{1,2} = (1/n) Σ_k |N¹_k∩N²_k| / |N¹_k∪N²_k|`` and
  ``C^{t,t} = |⋂_k N^t_k| / |⋃_k N^t_k|`` (CS1 of the QL paper); empty unions give 1 (the IoU
  convention). The union over all samples grows with ``n``, so ``C^{t,t}_iou`` shrinks with
  the sample count; it is given for comparison.

Example:
    >>> r = coincidence_rates([{(0, 1), (1, 2)}], [{(0, 1)}], n_layers=2, d_mlp=4)
    >>> r.c12, r.c12_overlap          # 1 / (1·2·4); (1/2 + 1/1) / 2
    (0.125, 0.75)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.metrics.bootstrap import bootstrap_ci
from tlcap.metrics.estimate import Estimate, StatisticsError, TooFewSamplesError
from tlcap.metrics.localization import SetLike, as_set, iou, overlap
from tlcap.metrics.sets import NeuronSet
from tlcap.results import Result
from tlcap.viz.stats import grouped_bars


@dataclass(frozen=True)
class CoincidenceRates(Result):
    """``C^{1,2}``, ``C^{1,1}``, ``C^{2,2}``, literal and normalised (formulas in the module doc).

    Attributes:
        n_layers: ``L``.
        d_mlp: ``J``.
        c12: Literal ``C^{1,2}`` (share of all ``L·J`` neurons).
        c11: Literal ``C^{1,1}``.
        c22: Literal ``C^{2,2}``.
        c12_overlap: Overlap-normalised ``C^{1,2}``.
        c11_overlap: Overlap-normalised ``C^{1,1}``.
        c22_overlap: Overlap-normalised ``C^{2,2}``.
        c12_iou: IoU ``C^{1,2}``.
        c11_iou: IoU ``C^{1,1}``.
        c22_iou: IoU ``C^{2,2}``.
        pair_intersections: ``|N¹_k ∩ N²_k|`` per pair.
        pair_overlaps: Overlap of each pair.
        pair_ious: IoU of each pair.
        sizes1: ``|N¹_k|`` per sample.
        sizes2: ``|N²_k|`` per sample.
        common1: ``|⋂_k N¹_k|``.
        common2: ``|⋂_k N²_k|``.
    """

    n_layers: int
    d_mlp: int
    c12: float
    c11: float
    c22: float
    c12_overlap: float
    c11_overlap: float
    c22_overlap: float
    c12_iou: float
    c11_iou: float
    c22_iou: float
    pair_intersections: tuple[int, ...]
    pair_overlaps: tuple[float, ...]
    pair_ious: tuple[float, ...]
    sizes1: tuple[int, ...]
    sizes2: tuple[int, ...]
    common1: int
    common2: int

    @property
    def n(self) -> int:
        """Number of comparative samples (pairs)."""
        return len(self.pair_intersections)

    def c12_ci(self, variant: Literal["literal", "overlap", "iou"] = "overlap", **bootstrap: Any) -> Estimate:
        """``C^{1,2}`` with a bootstrap CI over pairs (it is a mean over pairs).

        ``C^{t,t}`` has none: it is an intersection over all samples, and a bootstrap resample
        (with repeats, hence fewer distinct samples) can only enlarge it.

        Args:
            variant: ``"literal"``, ``"overlap"`` or ``"iou"``.
            **bootstrap: Passed to :func:`bootstrap_ci` (``n_boot``, ``level``, ``seed``, ...).

        Returns:
            The :class:`Estimate` of ``C^{1,2}`` (mean over pairs) with its bootstrap interval.

        Raises:
            StatisticsError: an unknown ``variant``.
        """
        if variant == "literal":
            vals = np.asarray(self.pair_intersections, float) / (self.n_layers * self.d_mlp)
        elif variant in ("overlap", "iou"):
            vals = np.asarray(self.pair_overlaps if variant == "overlap" else self.pair_ious, float)
        else:
            raise StatisticsError(f"unknown variant {variant!r}; use 'literal', 'overlap' or 'iou'")
        return bootstrap_ci(vals, **bootstrap)

    def summary(self) -> dict[str, Any]:
        return {"n": self.n, "n_layers": self.n_layers, "d_mlp": self.d_mlp,
                **{f"{c}{v}": getattr(self, f"{c}{v}") for v in ("", "_overlap", "_iou") for c in ("c12", "c11", "c22")},
                "mean_size1": float(np.mean(self.sizes1)), "mean_size2": float(np.mean(self.sizes2)),
                "common1": self.common1, "common2": self.common2}

    def to_frame(self) -> pd.DataFrame:
        """Rows: the three rates; columns: literal, overlap, iou.

        Returns:
            A 3-row DataFrame (``rate`` column, then ``literal``, ``overlap``, ``iou``).
        """
        return pd.DataFrame(
            [{"rate": name, **{v or "literal": getattr(self, f"{c}{'_' + v if v else ''}") for v in ("", "overlap", "iou")}}
             for name, c in (("C^{1,2}", "c12"), ("C^{1,1}", "c11"), ("C^{2,2}", "c22"))]
        )

    def figure(self, title: str | None = None) -> go.Figure:
        """The three rates as grouped bars, one bar per variant (literal, overlap, IoU), in %.

        Args:
            title: Figure title (default: the number of samples).

        Returns:
            The plotly grouped-bar figure.
        """
        rates = ("c12", "c11", "c22")
        series = {name: [getattr(self, f"{c}{suffix}") for c in rates]
                  for name, suffix in (("literal (poster)", ""), ("overlap-normalised", "_overlap"), ("IoU", "_iou"))}
        return grouped_bars(["C^{1,2}", "C^{1,1}", "C^{2,2}"], series, percent=True, value_name="coincidence rate",
                            title=title or f"Coincidence rates over {self.n} comparative samples")


def _neuron_sets(sets: Sequence[SetLike], n_layers: int, d_mlp: int, name: str) -> list[frozenset]:
    out = []
    for k, s in enumerate(sets):
        if isinstance(s, NeuronSet) and s.shape != (n_layers, d_mlp):
            raise StatisticsError(f"{name}[{k}] is a NeuronSet of shape {s.shape}, not ({n_layers}, {d_mlp})")
        fs = as_set(s)
        for item in fs:
            ok = isinstance(item, tuple) and len(item) == 2 and all(isinstance(v, (int, np.integer)) for v in item)
            if not ok or not (0 <= item[0] < n_layers and 0 <= item[1] < d_mlp):
                raise StatisticsError(
                    f"{name}[{k}] holds {item!r}; coincidence rates need neurons (layer, index) "
                    f"with 0 <= layer < {n_layers} and 0 <= index < {d_mlp}"
                )
        out.append(fs)
    return out


def _common(sets: list[frozenset]) -> frozenset:
    return frozenset.intersection(*sets)


def _within(sets: list[frozenset]) -> tuple[int, float, float]:
    """``|⋂|``, the overlap-normalised and the IoU ``C^{t,t}`` of one framing's sets."""
    common = _common(sets)
    shares = [len(common) / len(s) if s else 0.0 for s in sets]
    union = frozenset.union(*sets)
    return len(common), float(np.mean(shares)), (1.0 if not union else len(common) / len(union))


def coincidence_rates(
    sets_framing1: Sequence[SetLike],
    sets_framing2: Sequence[SetLike],
    n_layers: int,
    d_mlp: int,
) -> CoincidenceRates:
    """The decoupling experiment's coincidence rates, literal (poster) and normalised.

    Args:
        sets_framing1: ``N¹_k``, the neurons located for framing 1 of each sample ``k``.
        sets_framing2: ``N²_k`` for framing 2, aligned with ``sets_framing1``.
        n_layers: ``L``, the model's layers.
        d_mlp: ``J``, MLP neurons per layer.

    Returns:
        A :class:`CoincidenceRates` with all three rates in the three variants, and the per-pair
        values (for :meth:`CoincidenceRates.c12_ci`).

    Raises:
        TooFewSamplesError: No samples.
        StatisticsError: Unaligned framings, or items that are not neurons of an ``(L, J)`` model.

    Example:
        >>> kn_sets_answer = [{(0, 1), (1, 2)}, {(0, 3)}]      # per pair: KN's set for framing 1
        >>> kn_sets_code = [{(0, 1)}, {(1, 3)}]                 # ... and for framing 2
        >>> r = coincidence_rates(kn_sets_answer, kn_sets_code, model.n_layers, model.d_mlp)
        >>> r.c12_overlap, r.c11_overlap, r.c22_overlap        # ((1/2 + 1/1) / 2 + 0) / 2; no shared neuron
        (0.375, 0.0, 0.0)
    """
    if len(sets_framing1) != len(sets_framing2):
        raise StatisticsError(
            f"framings are unaligned: {len(sets_framing1)} sets for framing 1, {len(sets_framing2)} for framing 2; "
            "give one set per sample for each framing, in the same order"
        )
    if not sets_framing1:
        raise TooFewSamplesError("coincidence rates need at least one comparative sample")
    if n_layers < 1 or d_mlp < 1:
        raise StatisticsError(f"n_layers and d_mlp must be positive, got {n_layers} and {d_mlp}")
    s1 = _neuron_sets(sets_framing1, n_layers, d_mlp, "sets_framing1")
    s2 = _neuron_sets(sets_framing2, n_layers, d_mlp, "sets_framing2")
    n, total = len(s1), n_layers * d_mlp
    inter = tuple(len(a & b) for a, b in zip(s1, s2))
    ovl = tuple(overlap(a, b) for a, b in zip(s1, s2))
    ious = tuple(iou(a, b) for a, b in zip(s1, s2))
    k1, o1, i1 = _within(s1)
    k2, o2, i2 = _within(s2)
    return CoincidenceRates(
        n_layers=n_layers, d_mlp=d_mlp,
        c12=sum(inter) / (n * total), c11=k1 / total, c22=k2 / total,
        c12_overlap=float(np.mean(ovl)), c11_overlap=o1, c22_overlap=o2,
        c12_iou=float(np.mean(ious)), c11_iou=i1, c22_iou=i2,
        pair_intersections=inter, pair_overlaps=ovl, pair_ious=ious,
        sizes1=tuple(len(s) for s in s1), sizes2=tuple(len(s) for s in s2), common1=k1, common2=k2,
    )
