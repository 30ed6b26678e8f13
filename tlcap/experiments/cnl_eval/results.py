"""Result values of the fidelity experiment, and the paper's numbers every result prints beside ours.

Rows are stored column-free as tuples (JSON-safe) and handed out as typed rows
(:class:`FidelityRow`, :class:`RewriteRow`); estimates are computed on demand from the per-fact
values with the statistics layer (percentile bootstrap over facts, 5000 resamples, seed 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.metrics.bootstrap import bootstrap_ci, paired_difference_ci
from tlcap.metrics.estimate import Estimate
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.cnl_eval import paper_bars

METHOD_LABELS: dict[str, str] = {"kn": "KN", "trace": "ROME (tracing)", "kc": "KC", "cnl": "CNL"}

PAPER: dict[str, Any] = {
    # §3.1 (GPT-J): mean pairwise overlap of the 5 rewrites (the introduction prints other numbers, see docs)
    "fidelity": {"kn": 0.373, "trace": 0.327, "kc": 0.072},
    "kn_located_neurons_per_sample": 15.3,
    # §3.2 (GPT-J, zsRE): share of samples whose target probability rises / falls
    "kn_double_located": {"rise": 0.851, "fall": 0.149},
    "kn_double_random": {"rise": 0.723, "fall": 0.277},
    "kn_zero_located": {"rise": 0.274, "fall": 0.724},
    "kn_zero_random": {"rise": 0.176, "fall": 0.826},
    "kc_recall_at_1": 0.123,
    "kc_param_share_fidelity": 0.016,
    "kc_param_share_recalled": 0.026,
    # §4 (decoupling): coincidence rates
    "decoupling": {"c12": 0.156, "c11": 0.073, "c22": 0.086},
    # Table 4: Overlap, Neuron (% of parameters), IPP, in points
    "table4": {"kn": (37.3, 0.2, 11.4), "rome": (32.7, 16.7, 0.0), "kc": (7.2, 1.6, 10.5), "cnl": (96.4, 0.2, 20.0)},
}

CI_NOTE = "percentile bootstrap over facts, 95 %, 5000 resamples, seed 0"


def nan_row(row: Any) -> tuple[Any, ...]:
    """A stored row with JSON's ``null`` (a saved NaN) read back as NaN.

    Args:
        row: A stored row (a sequence of values).

    Returns:
        The row as a tuple, ``None`` replaced by NaN.
    """
    return tuple(float("nan") if v is None else v for v in row)


def est_dict(est: Estimate, paper: float | None = None) -> dict[str, Any]:
    """An estimate as JSON (with its printed text) and the paper's value beside it.

    Args:
        est: The estimate.
        paper: The paper's value (``None``: not reported).

    Returns:
        :meth:`Estimate.summary`, plus ``paper`` and ``paper_inside_ci`` when ``paper`` is given.
    """
    out = est.summary()
    if paper is not None:
        out["paper"] = paper
        out["paper_inside_ci"] = est.contains(paper)
    return out


@dataclass(frozen=True)
class FidelityRow:
    """One fact × method of the fidelity experiment.

    Attributes:
        fact: Position of the fact in the dataset.
        uid: The fact's id.
        relation: ParaRel relation (or ``""``).
        subject: The subject.
        target: The answer.
        method: ``kn``, ``trace`` or ``kc``.
        overlap: Mean pairwise overlap over the rewrites (the paper's fidelity of the fact).
        iou: Mean pairwise IoU.
        chance: Expected overlap of random sets of the same sizes.
        mean_size: Mean located-set size over the rewrites (neurons, layers or edges).
        min_size: Smallest located set.
        max_size: Largest located set.
        param_share: Mean share of block parameters in the located set.
    """

    fact: int
    uid: str
    relation: str
    subject: str
    target: str
    method: str
    overlap: float
    iou: float
    chance: float
    mean_size: float
    min_size: int
    max_size: int
    param_share: float


@dataclass(frozen=True)
class RewriteRow:
    """One rewrite × method: the located set's size, its parameter share and a probability.

    Attributes:
        fact: Position of the fact.
        rewrite: Position of the rewrite within the fact.
        method: ``kn``, ``trace`` or ``kc``.
        prompt: The rewrite.
        size: Located-set size.
        param_share: Share of block parameters in the located set.
        prob: P(target) on the rewrite (KN: clean probability; tracing: clean first-token
            probability; KC: NaN).
    """

    fact: int
    rewrite: int
    method: str
    prompt: str
    size: int
    param_share: float
    prob: float


@dataclass(frozen=True)
class FidelityResult(Result):
    """The fidelity experiment (:func:`tlcap.experiments.cnl_eval.fidelity`).

    Attributes:
        rows: :class:`FidelityRow` tuples, one per fact × method.
        rewrite_rows: :class:`RewriteRow` tuples, one per rewrite × method.
        sets: ``method → fact → rewrite → located ids`` (neurons ``l·d_mlp + j``, layers in
            decreasing traced effect, edges ``u·n_readers + v``).
        universe: Number of possible items per method (neurons, layers, edges).
        methods: The methods run.
        n_facts: Facts in the dataset.
        model_name: The model.
        shape: ``(n_layers, d_mlp)``.
        config: :class:`FidelityConfig` as a dict.
        method_seconds: Seconds spent in each method.
        wall_seconds: Seconds of the whole run (summed over resumed runs).
    """

    rows: tuple[tuple[Any, ...], ...]
    rewrite_rows: tuple[tuple[Any, ...], ...]
    sets: dict = field(default_factory=dict)
    universe: dict = field(default_factory=dict)
    methods: tuple[str, ...] = ()
    n_facts: int = 0
    model_name: str = ""
    shape: tuple[int, int] = (0, 0)
    config: dict = field(default_factory=dict)
    method_seconds: dict = field(default_factory=dict)
    wall_seconds: float = 0.0

    def records(self) -> list[FidelityRow]:
        """The stored fact × method rows as :class:`FidelityRow` records (missing values as NaN).

        Returns:
            One :class:`FidelityRow` per fact and method.
        """
        return [FidelityRow(*nan_row(r)) for r in self.rows]

    def rewrite_records(self) -> list[RewriteRow]:
        """The stored rewrite × method rows as :class:`RewriteRow` records (missing values as NaN).

        Returns:
            One :class:`RewriteRow` per rewrite and method.
        """
        return [RewriteRow(*nan_row(r)) for r in self.rewrite_rows]

    def values(self, method: str, column: str = "overlap") -> np.ndarray:
        """Per-fact values of one column for ``method`` (fact order).

        Args:
            method: ``"kn"``, ``"trace"`` or ``"kc"``.
            column: A :class:`FidelityRow` field, e.g. ``"overlap"``, ``"iou"``, ``"chance"``.

        Returns:
            ``(n_facts,)`` float array (NaN where missing).
        """
        return np.array([getattr(r, column) for r in self.records() if r.method == method], dtype=float)

    def estimate(self, method: str, measure: str = "overlap") -> Estimate:
        """Mean of ``measure`` (``overlap``, ``iou``, ``chance``, ``mean_size``, ``param_share``) over facts, with CI.

        Args:
            method: ``"kn"``, ``"trace"`` or ``"kc"``.
            measure: The :class:`FidelityRow` column averaged.

        Returns:
            The bootstrap mean with its CI.
        """
        return bootstrap_ci(self.values(method, measure))

    def versus_chance(self, method: str) -> Estimate:
        """Overlap minus chance overlap, paired over facts, with CI.

        Args:
            method: ``"kn"``, ``"trace"`` or ``"kc"``.

        Returns:
            The paired mean difference ``overlap − chance`` with its CI.
        """
        return paired_difference_ci(self.values(method, "overlap"), self.values(method, "chance"))

    def summary(self) -> dict[str, Any]:
        """Per method: overlap (paper beside), IoU, chance, overlap − chance, set size, parameter share.

        Returns:
            A JSON-safe dict: model, facts, methods, timings and config, then per method its estimates
            (:func:`est_dict`; overlap with the paper's value).
        """
        out: dict[str, Any] = {"model": self.model_name, "n_facts": self.n_facts, "methods": list(self.methods),
                               "ci": CI_NOTE, "wall_seconds": self.wall_seconds,
                               "method_seconds": dict(self.method_seconds), "config": dict(self.config)}
        for m in self.methods:
            out[m] = {
                "overlap": est_dict(self.estimate(m), PAPER["fidelity"].get(m)),
                "iou": est_dict(self.estimate(m, "iou")),
                "chance_overlap": est_dict(self.estimate(m, "chance")),
                "overlap_minus_chance": est_dict(self.versus_chance(m)),
                "mean_set_size": est_dict(self.estimate(m, "mean_size")),
                "param_share_blocks": est_dict(self.estimate(m, "param_share")),
                "universe": self.universe.get(m),
            }
        if "kn" in self.methods:
            out["kn"]["paper_neurons_per_sample"] = PAPER["kn_located_neurons_per_sample"]
        if "kc" in self.methods:
            out["kc"]["param_share_blocks"]["paper"] = PAPER["kc_param_share_fidelity"]
        return out

    def to_frame(self) -> pd.DataFrame:
        """One :class:`FidelityRow` per fact × method.

        Returns:
            A DataFrame of :meth:`records`.
        """
        return frame(self.records(), FidelityRow)

    def rewrite_frame(self) -> pd.DataFrame:
        """One :class:`RewriteRow` per rewrite × method.

        Returns:
            A DataFrame of :meth:`rewrite_records`.
        """
        return frame(self.rewrite_records(), RewriteRow)

    def figure(self) -> go.Figure:
        """Mean pairwise overlap per method with its CI, the paper's value and the chance overlap.

        Returns:
            The Plotly bar chart.
        """
        ests = [self.estimate(m) for m in self.methods]
        chance = [float(self.values(m, "chance").mean()) for m in self.methods]
        return paper_bars(
            [METHOD_LABELS[m] for m in self.methods], [e.value for e in ests], [e.low for e in ests],
            [e.high for e in ests], paper=[PAPER["fidelity"].get(m) for m in self.methods],
            extra={"chance (random sets of the same sizes)": chance},
            title=f"Fidelity: mean pairwise overlap of the located sets over rewrites ({self.model_name}, "
                  f"{self.n_facts} facts)", yaxis_title="overlap (%)",
        )


__all__ = ["CI_NOTE", "METHOD_LABELS", "PAPER", "FidelityResult", "FidelityRow", "RewriteRow", "est_dict", "nan_row"]
