"""The decoupling experiment's result: per-pair located sets, coincidence rates with CIs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.experiments.cnl_eval.results import PAPER, est_dict
from tlcap.metrics.bootstrap import bootstrap_ci, paired_difference_ci
from tlcap.metrics.coincidence import CoincidenceRates, coincidence_rates
from tlcap.metrics.localization import iou, overlap
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.cnl_eval import paper_bars

CI_NOTE = "percentile bootstrap over pairs, 95 %, 5000 resamples, seed 0 (C^{t,t}: none, an intersection over all pairs)"


@dataclass(frozen=True)
class PairRow:
    """One comparative pair (:meth:`DecouplingResult.to_frame`).

    Attributes:
        pair: Position of the pair.
        uid: The pair's id.
        source: Where its main part came from.
        main: The main part.
        size1, size2: KN neurons located on framing 1 / 2.
        intersection: ``|N¹ ∩ N²|``.
        overlap: ``(|∩|/|N¹| + |∩|/|N²|) / 2``.
        iou: ``|∩| / |∪|``.
        cross_overlap: Overlap of ``N¹`` of this pair with ``N²`` of the next pair (reference).
        prob1, prob2: P(target) of framing 1 / 2 (first token for a multi-token target: the
            probability :func:`tlcap.integrated_gradients` reports).
    """

    pair: int
    uid: str
    source: str
    main: str
    size1: int
    size2: int
    intersection: int
    overlap: float
    iou: float
    cross_overlap: float
    prob1: float
    prob2: float


@dataclass(frozen=True)
class DecouplingResult(Result):
    """The decoupling experiment (:func:`tlcap.experiments.cnl_eval.decoupling`).

    Attributes:
        pairs: ``(uid, source, main, prompt1, target1, prompt2, target2)`` per pair.
        sets1, sets2: Located neurons per pair for framing 1 / 2, as flat ids ``l·d_mlp + j``.
        probs1, probs2: P(target) per pair for framing 1 / 2.
        n_layers, d_mlp: ``L`` and ``J``.
        model_name: The model.
        config: :class:`DecouplingConfig` as a dict.
        method_seconds: Seconds spent per method.
        wall_seconds: Seconds of the whole run (summed over resumed runs).
    """

    pairs: tuple[tuple[Any, ...], ...]
    sets1: tuple[tuple[int, ...], ...]
    sets2: tuple[tuple[int, ...], ...]
    probs1: tuple[float, ...] = ()
    probs2: tuple[float, ...] = ()
    n_layers: int = 0
    d_mlp: int = 0
    model_name: str = ""
    config: dict = field(default_factory=dict)
    method_seconds: dict = field(default_factory=dict)
    wall_seconds: float = 0.0

    def _neurons(self, sets: tuple[tuple[int, ...], ...]) -> list[set[tuple[int, int]]]:
        return [{(int(i) // self.d_mlp, int(i) % self.d_mlp) for i in s} for s in sets]

    def rates(self) -> CoincidenceRates:
        """``C^{1,2}``, ``C^{1,1}``, ``C^{2,2}`` (literal, overlap, IoU) of the pairs.

        Returns:
            The :class:`CoincidenceRates` of :attr:`sets1` and :attr:`sets2` (one pair per sample).
        """
        return coincidence_rates(self._neurons(self.sets1), self._neurons(self.sets2), self.n_layers, self.d_mlp)

    def cross_overlaps(self) -> np.ndarray:
        """Overlap of framing 1 of pair ``k`` with framing 2 of pair ``k+1`` (cyclic); NaN for one pair.

        Returns:
            ``(n_pairs,)`` float array of overlaps, all NaN with fewer than two pairs.
        """
        n = len(self.sets1)
        if n < 2:
            return np.full(n, np.nan)
        return np.array([overlap(set(self.sets1[k]), set(self.sets2[(k + 1) % n])) for k in range(n)])

    def summary(self) -> dict[str, Any]:
        """The three rates in each variant (C^{1,2} with CI), the paper's value, the cross-pair reference.

        Returns:
            A JSON-safe dict: model, pairs, shape, timings and config, ``c12`` / ``c11`` / ``c22`` per variant
            (``literal``, ``overlap``, ``iou``) with the paper's value, and the cross-pair reference.
        """
        r = self.rates()
        out: dict[str, Any] = {"model": self.model_name, "n_pairs": r.n, "n_layers": self.n_layers, "d_mlp": self.d_mlp,
                               "ci": CI_NOTE, "wall_seconds": self.wall_seconds,
                               "method_seconds": dict(self.method_seconds), "config": dict(self.config)}
        out["c12"] = {v: est_dict(r.c12_ci(v), PAPER["decoupling"]["c12"]) for v in ("literal", "overlap", "iou")}
        for c in ("c11", "c22"):
            out[c] = {v: getattr(r, c + ("" if v == "literal" else "_" + v)) for v in ("literal", "overlap", "iou")}
            out[c]["paper"] = PAPER["decoupling"][c]
        out["common1"], out["common2"] = r.common1, r.common2
        out["mean_size1"], out["mean_size2"] = float(np.mean(r.sizes1)), float(np.mean(r.sizes2))
        cross = self.cross_overlaps()
        if r.n >= 2:
            out["c12_cross_pair_overlap"] = est_dict(bootstrap_ci(cross))
            out["c12_overlap_minus_cross_pair"] = est_dict(paired_difference_ci(np.array(r.pair_overlaps), cross))
        out["mean_prob1"], out["mean_prob2"] = float(np.mean(self.probs1)), float(np.mean(self.probs2))
        return out

    def to_frame(self) -> pd.DataFrame:
        """One :class:`PairRow` per pair.

        Returns:
            A DataFrame of :class:`PairRow`: set sizes, shared neurons, overlap, IoU, cross-pair overlap and
            the two framings' probabilities.
        """
        cross = self.cross_overlaps()
        rows = []
        for k, (a, b) in enumerate(zip(self.sets1, self.sets2)):
            uid, source, main = self.pairs[k][:3]
            sa, sb = set(a), set(b)
            rows.append(PairRow(k, uid, source, main, len(sa), len(sb), len(sa & sb), overlap(sa, sb), iou(sa, sb),
                                float(cross[k]), float(self.probs1[k]), float(self.probs2[k])))
        return frame(rows, PairRow)

    def figure(self) -> go.Figure:
        """The three rates (overlap-normalised; C^{1,2} with CI) beside the paper; literal and cross-pair as ticks.

        Returns:
            The Plotly bar chart.
        """
        r = self.rates()
        c12 = r.c12_ci("overlap")
        nan = float("nan")
        cross = self.cross_overlaps()
        return paper_bars(
            ["C^{1,2}", "C^{1,1}", "C^{2,2}"], [c12.value, r.c11_overlap, r.c22_overlap], [c12.low, nan, nan],
            [c12.high, nan, nan], paper=[PAPER["decoupling"][c] for c in ("c12", "c11", "c22")],
            extra={"cross-pair reference": [float(np.nanmean(cross)) if r.n >= 2 else nan, nan, nan],
                   "literal (share of all L·J neurons)": [r.c12, r.c11, r.c22]},
            title=f"Decoupling: KN coincidence rates, overlap-normalised ({self.model_name}, {r.n} pairs)",
            yaxis_title="coincidence (%)",
        )


__all__ = ["DecouplingResult", "PairRow"]
