"""The CNL paper's Table 4: Overlap, Neuron (% of parameters) and IPP for KN, ROME, KC and CNL.

A composition of results already computed (nothing is re-run):

- **Overlap** — KN, ROME (causal tracing), KC: the fidelity experiment's mean pairwise overlap
  over rewrites; CNL: the split-half overlap of ``tlcap cnl locate``.
- **Neuron** — share of the transformer blocks' parameters in the located set: KN neurons, the
  MLPs of the traced top-k layers, the circuit's nodes (fidelity); CNL: its neurons.
- **IPP** = performance with the located parameters manipulated − the best performance over
  ≥ 5 random draws of equal size (:func:`tlcap.metrics.ipp_ci`). "Performance" per method
  (docs/cnl_eval.md): KN — mean P(target) with the located activations doubled (vs matched
  random neuron sets); ROME — edit efficacy at the traced layer (vs a random other layer per
  fact); KC — recall@1 of the circuit alone (vs random circuits of as many edges); CNL — task
  accuracy after erasing the located neurons (lower is the stronger effect, so
  ``IPP = min random accuracy − located accuracy``).

Example:
    >>> from tlcap.data.rewrites import rewrite_facts
    >>> from tlcap.experiments.cnl_eval import fidelity, reliability
    >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
    >>> from tlcap import RunControl
    >>> fid_result = fidelity(model, facts, kn__steps=2, trace__top_k=1, samples=2, top_n=20, kc__steps=2,
    ...                       run=RunControl(progress=False))
    >>> rel_result = reliability(model, facts, parts=("kn",), n_random=2, run=RunControl(progress=False))
    >>> from tlcap.data import load_task
    >>> from tlcap.experiments.cnl import cnl_locate as locate
    >>> loc = locate(model, "emotion", load_task("emotion", split="train", n=4), steps=2, run=RunControl(progress=False))
    >>> tab = compare(fid_result, rel_result, cnl_locate=loc.summary())   # or json.load(open(".../summary.json"))
    >>> tab.to_frame()["method"].tolist()        # one Table 4 row per method (+ CNL); notes say what is missing
    ['kn', 'rome', 'kc', 'cnl']
    >>> fig = tab.figure()
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from tlcap.experiments.cnl_eval.common import ParamCounts
from tlcap.experiments.cnl_eval.reliability_result import ReliabilityResult
from tlcap.experiments.cnl_eval.results import PAPER, FidelityResult, nan_row
from tlcap.metrics.estimate import Estimate, StatisticsError
from tlcap.metrics.localization import ipp_ci
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.cnl_eval import paper_panels

PERFORMANCE: dict[str, str] = {
    "kn": "mean P(target) with the located activations doubled, vs matched random neuron sets",
    "rome": "edit efficacy at the traced layer, vs one random other layer per fact",
    "kc": "recall@1 of the circuit alone, vs random circuits of as many edges",
    "cnl": "task accuracy after erasing the located neurons (lower = stronger), vs random neurons",
}
LABELS = {"kn": "KN", "rome": "ROME", "kc": "KC", "cnl": "CNL"}
NAN = Estimate(math.nan, math.nan, math.nan, n=0)


@dataclass(frozen=True)
class Table4Row:
    """One method of Table 4 (shares, not points; the paper's values in points).

    Attributes:
        method: ``kn``, ``rome``, ``kc`` or ``cnl``.
        overlap, overlap_low, overlap_high: Overlap and its 95 % CI.
        neuron, neuron_low, neuron_high: Share of block parameters and its CI.
        ipp, ipp_low, ipp_high: IPP and its CI.
        n_draws: Random draws behind the IPP.
        paper_overlap, paper_neuron, paper_ipp: The paper's row (points).
        note: Why a value is missing, if one is.
    """

    method: str
    overlap: float
    overlap_low: float
    overlap_high: float
    neuron: float
    neuron_low: float
    neuron_high: float
    ipp: float
    ipp_low: float
    ipp_high: float
    n_draws: int
    paper_overlap: float
    paper_neuron: float
    paper_ipp: float
    note: str


def _row(method: str, overlap: Estimate, neuron: Estimate, ipp: Estimate, n_draws: int, note: str = "") -> tuple:
    paper = PAPER["table4"][method]
    return astuple(Table4Row(method, overlap.value, overlap.low, overlap.high, neuron.value, neuron.low, neuron.high,
                             ipp.value, ipp.low, ipp.high, n_draws, *paper, note))


def _safe(fn: Any, what: str, notes: list[str]) -> Estimate:
    try:
        out = fn()
    except (StatisticsError, KeyError, ValueError) as exc:
        notes.append(f"{what}: {exc}")
        return NAN
    if out is None:
        notes.append(f"{what}: not in the results")
        return NAN
    return out


def _draws(res: ReliabilityResult | None, part: str) -> int:
    if res is None:
        return 0
    rows = {"kn": res.kn_records, "kc": res.kc_records}.get(part)
    if rows is None:
        return res.n_random if res.rome_rows else 0
    return len({r.draw for r in rows() if r.set == "random"})


def _cnl_row(locate: Mapping[str, Any] | None, erase: Mapping[str, Any] | None, counts: ParamCounts | None) -> tuple:
    notes: list[str] = []
    if locate is None:
        return _row("cnl", NAN, NAN, NAN, 0, "no `tlcap cnl locate` summary given")
    overlap = Estimate(float(locate.get("split_overlap", math.nan)), math.nan, math.nan, n=1, method="split-half")
    neuron = NAN
    if counts is not None and "n_neurons" in locate:
        neuron = Estimate(counts.neurons_share(int(locate["n_neurons"])), math.nan, math.nan, n=1, method="exact")
    else:
        notes.append("neuron share: needs the model's parameter counts and n_neurons")
    ipp, n_draws = NAN, 0
    if erase is None:
        notes.append("IPP: no `tlcap cnl erase` summary given")
    else:
        draws = list(erase.get("random_accuracies", []))
        n_draws = len(draws)
        ipp = _safe(lambda: ipp_ci([float(erase["located_accuracy"])], [[float(a)] for a in draws],
                                   higher_is_better=False), "IPP", notes)
    return _row("cnl", overlap, neuron, ipp, n_draws, "; ".join(notes))


@dataclass(frozen=True)
class CompareResult(Result):
    """Table 4 (:func:`compare`): one :class:`Table4Row` per method.

    Attributes:
        rows: :class:`Table4Row` tuples (KN, ROME, KC, CNL).
        model_name: The model.
        n_facts: Facts behind the KN / ROME / KC rows (fidelity, reliability).
    """

    rows: tuple[tuple[Any, ...], ...]
    model_name: str = ""
    n_facts: tuple[int, int] = (0, 0)

    def records(self) -> list[Table4Row]:
        """The stored rows as :class:`Table4Row` records (missing values as NaN).

        Returns:
            One :class:`Table4Row` per method, in table order.
        """
        return [Table4Row(*nan_row(r)) for r in self.rows]

    def summary(self) -> dict[str, Any]:
        """Per method: overlap, neuron share and IPP in points with CIs, the paper's row, performance.

        Returns:
            A JSON-safe dict: model, fact counts and unit, then per method its ``overlap`` / ``neuron`` / ``ipp``
            (value, low, high in points, and the paper's), ``n_draws``, ``performance`` and ``note``.
        """
        out: dict[str, Any] = {"model": self.model_name, "n_facts_fidelity": self.n_facts[0],
                               "n_facts_reliability": self.n_facts[1], "unit": "points (%)"}
        for r in self.records():
            out[r.method] = {
                **{k: {"value": 100 * getattr(r, k), "low": 100 * getattr(r, k + "_low"),
                       "high": 100 * getattr(r, k + "_high"), "paper": getattr(r, "paper_" + k)}
                   for k in ("overlap", "neuron", "ipp")},
                "n_draws": r.n_draws, "performance": PERFORMANCE[r.method], "note": r.note,
            }
        return out

    def to_frame(self) -> pd.DataFrame:
        """One :class:`Table4Row` per method (shares; the paper's columns in points).

        Returns:
            A DataFrame of :meth:`records`.
        """
        return frame(self.records(), Table4Row)

    def figure(self) -> go.Figure:
        """Three panels (Overlap, Neuron, IPP): ours with CIs beside the paper's row.

        Returns:
            The Plotly figure, one panel per column of Table 4.
        """
        rs = self.records()
        labels = [LABELS[r.method] for r in rs]
        panels = {}
        for k, title in (("overlap", "Overlap (%)"), ("neuron", "Neuron (% of parameters)"), ("ipp", "IPP (points)")):
            panels[title] = (labels, [getattr(r, k) for r in rs], [getattr(r, k + "_low") for r in rs],
                             [getattr(r, k + "_high") for r in rs], [getattr(r, "paper_" + k) / 100 for r in rs])
        return paper_panels(panels, title=f"Table 4 ({self.model_name}): tlcap vs the CNL paper")


def compare(
    fidelity: FidelityResult | None,
    reliability: ReliabilityResult | None,
    *,
    cnl_locate: Mapping[str, Any] | None = None,
    cnl_erase: Mapping[str, Any] | None = None,
    counts: ParamCounts | None = None,
) -> CompareResult:
    """Table 4 from saved results (module docstring).

    Args:
        fidelity: A fidelity result (Overlap and Neuron of KN, ROME, KC), or ``None``.
        reliability: A reliability result (IPP of KN, ROME, KC), or ``None``.
        cnl_locate: The ``summary.json`` of ``tlcap cnl locate`` (``split_overlap``, ``n_neurons``).
        cnl_erase: The ``summary.json`` of ``tlcap cnl erase`` (``located_accuracy``,
            ``random_accuracies``; the IPP needs ≥ 5 draws: ``--n-random 5``).
        counts: Parameter counts of the model (:func:`~tlcap.experiments.cnl_eval.common.param_counts`)
            for the CNL neuron share.

    Returns:
        A :class:`CompareResult`; a value that cannot be formed is NaN with a note saying why.

    Example:
        >>> import os, tempfile
        >>> from tlcap.results import load_result
        >>> from tlcap.data.rewrites import rewrite_facts
        >>> from tlcap.experiments.cnl_eval import fidelity, reliability
        >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
        >>> from tlcap import RunControl
        >>> fid_result = fidelity(model, facts, kn__steps=2, trace__top_k=1, samples=2, top_n=20, kc__steps=2,
        ...                       run=RunControl(progress=False))
        >>> rel_result = reliability(model, facts, parts=("kn",), n_random=2, run=RunControl(progress=False))
        >>> out = tempfile.mkdtemp()
        >>> fid_path, rel_path = fid_result.save(os.path.join(out, "fid")), rel_result.save(os.path.join(out, "rel"))
        >>> tab = compare(load_result(fid_path), load_result(rel_path))
        >>> {k: round(v, 1) for k, v in tab.summary()["kn"]["overlap"].items()}   # %, with the paper's value
        {'value': 94.0, 'low': 92.6, 'high': 95.3, 'paper': 37.3}
    """
    rows = []
    fid_name = {"kn": "kn", "rome": "trace", "kc": "kc"}
    for method in ("kn", "rome", "kc"):
        notes: list[str] = []
        fm = fid_name[method]
        if fidelity is not None and fm in fidelity.methods:
            overlap = _safe(lambda fm=fm: fidelity.estimate(fm), "overlap", notes)
            neuron = _safe(lambda fm=fm: fidelity.estimate(fm, "param_share"), "neuron share", notes)
        else:
            overlap, neuron = NAN, NAN
            notes.append(f"no fidelity result with {fm}")
        ipp = NAN
        part = "rome" if method == "rome" else method
        if reliability is not None and part in reliability.parts:
            fn = {"kn": lambda: reliability.kn_ipp("double"), "rome": lambda: reliability.rome_ipp(),
                  "kc": lambda: reliability.kc_ipp()}[method]
            ipp = _safe(fn, "IPP", notes)
        else:
            notes.append(f"no reliability result with {part}")
        rows.append(_row(method, overlap, neuron, ipp, _draws(reliability, part), "; ".join(notes)))
    rows.append(_cnl_row(cnl_locate, cnl_erase, counts))
    name = (fidelity or reliability).model_name if (fidelity or reliability) is not None else ""
    return CompareResult(rows=tuple(rows), model_name=name,
                         n_facts=(fidelity.n_facts if fidelity else 0, reliability.n_facts if reliability else 0))


__all__ = ["PERFORMANCE", "CompareResult", "Table4Row", "compare"]
