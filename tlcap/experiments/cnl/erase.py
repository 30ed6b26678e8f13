"""CNL erase (CNL paper §5.4 "Proving II", Table 3): accuracy with the located neurons erased vs
as many random neurons, at one σ or a σ sweep re-thresholded from one saved scoring run.

Erasing zeroes the neurons' down-projection rows (:func:`~tlcap.intervene.weights.erase_neurons`,
restored exactly on every exit path). The random baseline erases ``n_random`` draws of
:meth:`NeuronSet.random_like` (same count per layer, never a located neuron).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.data.sample import DataReport, Sample
from tlcap.errors import EmptyNeuronSetError
from tlcap.experiments.cnl.config import CNLWarning, EraseConfig, check_sigmas
from tlcap.experiments.cnl.locate import CNLLocation
from tlcap.experiments.cnl.rows import RowFields
from tlcap.intervene.weights import erase_neurons
from tlcap.metrics.accuracy import TaskAccuracy, task_accuracy
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result, frame
from tlcap.viz.cnl import erase_figure, erase_sweep_figure

NAN = float("nan")


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else NAN


@dataclass(frozen=True)
class EraseRow:
    """One row of :meth:`EraseResult.to_frame`: a condition and its accuracy."""

    condition: str
    accuracy: float


@dataclass(frozen=True)
class EraseResult(Result):
    """Accuracy with located neurons erased vs as many random neurons (several draws).

    Attributes:
        random_accuracy: Mean over the random draws (NaN with ``n_random=0``: no baseline).
        majority_share: Share of the most frequent gold label (a constant predictor's accuracy).
        n_skipped: Evaluation samples not scored (prompt beyond the context window).
    """

    task: str
    base_accuracy: float
    located_accuracy: float
    random_accuracy: float
    random_accuracies: tuple[float, ...] = ()
    n_neurons: int = 0
    n_eval: int = 0
    metric: str = ""
    source: str = ""
    meta: dict = field(default_factory=dict)
    majority_share: float = NAN
    n_skipped: int = 0
    config: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    @property
    def located_delta(self) -> float:
        return self.located_accuracy - self.base_accuracy

    @property
    def random_delta(self) -> float:
        return self.random_accuracy - self.base_accuracy

    def summary(self) -> dict[str, Any]:
        """Base, located-erased and random-erased accuracy and their changes (random: ``None`` without draws)."""
        no_rnd = not self.random_accuracies
        return {
            "task": self.task, "source": self.source, "metric": self.metric, "n_eval": self.n_eval,
            "n_skipped": self.n_skipped, "n_neurons": self.n_neurons, "base_accuracy": self.base_accuracy,
            "majority_share": self.majority_share, "located_accuracy": self.located_accuracy,
            "random_accuracy": None if no_rnd else self.random_accuracy, "random_accuracies": list(self.random_accuracies),
            "located_delta": self.located_delta, "random_delta": None if no_rnd else self.random_delta,
            "data": dict(self.data), "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`EraseRow` per condition (base, located, each random draw)."""
        rows = [EraseRow("base", self.base_accuracy), EraseRow("located erased", self.located_accuracy)]
        rows += [EraseRow(f"random erased #{i}", a) for i, a in enumerate(self.random_accuracies)]
        return frame(rows, EraseRow)

    def figure(self) -> go.Figure:
        """Bars: base, located erased, random erased (mean ± sd of the draws)."""
        return erase_figure(self.base_accuracy, self.located_accuracy, self.random_accuracies, metric=self.metric,
                            title=f"CNL erase: {self.source or self.task} neurons ({self.n_neurons}) → {self.task}")


def _base(model: Model, task: str, samples: Sequence[Sample], base: float | TaskAccuracy | None,
          progress: bool) -> tuple[float, float, int, str]:
    """``(accuracy, majority share, skipped, metric)`` of the unchanged model."""
    if isinstance(base, (int, float)):
        return float(base), NAN, 0, ""
    acc = base if base is not None else task_accuracy(model, task, samples, progress=progress)
    return acc.accuracy, acc.majority_share, acc.n_skipped, acc.metric


def _erased(model: Model, task: str, samples: Sequence[Sample], neurons: NeuronSet, cfg: EraseConfig,
            progress: bool) -> tuple[TaskAccuracy, list[float]]:
    with erase_neurons(model, neurons, include_input=cfg.include_input):
        loc = task_accuracy(model, task, samples, progress=progress)
    rnd = []
    for k in range(cfg.n_random):
        with erase_neurons(model, neurons.random_like(seed=cfg.seed + k), include_input=cfg.include_input):
            rnd.append(task_accuracy(model, task, samples, progress=progress).accuracy)
    return loc, rnd


def erase_effect(
    model: Model,
    task: str,
    samples: Sequence[Sample],
    neurons: NeuronSet,
    *,
    config: EraseConfig | None = None,
    base_accuracy: float | TaskAccuracy | None = None,
    source: str = "",
    progress: bool = False,
    **overrides: Any,
) -> EraseResult:
    """Erase the neurons and compare accuracy with ``n_random`` random draws of the same count per layer.

    Args:
        model: The model (weights restored exactly afterwards, also on errors).
        task: The evaluated task.
        samples: Evaluation samples.
        neurons: The located neurons.
        config: An :class:`EraseConfig` (``n_random``, ``seed``, ``include_input``).
        base_accuracy: The unchanged model's accuracy when already measured (float or
            :class:`TaskAccuracy`).
        source: Where the neurons come from (recorded; default ``task``).
        progress: Progress bars.
        **overrides: :class:`EraseConfig` fields.

    Returns:
        An :class:`EraseResult` with provenance.

    Raises:
        EmptyNeuronSetError: ``neurons`` is empty (erasing nothing could only report "no change").

    Example:
        >>> er = erase_effect(model, "imdb", load_task("imdb", split="test", n=200), loc.neuron_set(), n_random=3)
        >>> er.located_delta, er.random_delta
    """
    cfg = EraseConfig.resolve(config, **overrides)
    if not len(neurons):
        raise EmptyNeuronSetError(f"the neuron set{f' of {source}' if source else ''} is empty (0 neurons): erasing it "
                                  "changes nothing; locate with a lower --sigma or on more samples")
    base, majority, skipped, metric = _base(model, task, samples, base_accuracy, progress)
    loc, rnd = _erased(model, task, samples, neurons, cfg, progress)
    res = EraseResult(
        task=task, base_accuracy=base, located_accuracy=loc.accuracy, random_accuracy=_mean(rnd),
        random_accuracies=tuple(rnd), n_neurons=len(neurons), n_eval=len(samples), metric=metric or loc.metric,
        source=source or task, majority_share=majority, n_skipped=max(skipped, loc.n_skipped), config=cfg.to_dict(),
        data=DataReport.of(samples, task).summary(),
    )
    return res.with_provenance(Provenance.collect(model, cfg, cfg.seed))


@dataclass(frozen=True)
class SweepRow:
    """One σ of :class:`EraseSweep` (a row of CNL Table 3)."""

    sigma: float
    n_neurons: int
    neuron_ratio: float
    split_overlap: float
    split_iou: float
    located_accuracy: float
    random_accuracy: float
    located_delta: float
    random_delta: float
    empty: bool


@dataclass(frozen=True)
class EraseSweep(RowFields, Result):
    """Erase at several σ re-thresholded from one scoring run (CNL Table 3).

    Attributes:
        rows: One :class:`SweepRow` per σ; a σ whose located set is empty has ``empty=True``
            and NaN accuracies (nothing was erased).
    """

    _row_types: ClassVar[dict[str, type]] = {"rows": SweepRow}

    task: str
    base_accuracy: float
    rows: tuple[SweepRow, ...] = ()
    spread: str = "std"
    source: str = ""
    metric: str = ""
    n_eval: int = 0
    n_random: int = 0
    majority_share: float = NAN
    n_skipped: int = 0
    config: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Base accuracy and one row per σ; empty sets listed in ``empty_sigmas``."""
        return {
            "task": self.task, "source": self.source, "metric": self.metric, "spread": self.spread, "n_eval": self.n_eval,
            "n_skipped": self.n_skipped, "n_random": self.n_random, "base_accuracy": self.base_accuracy,
            "majority_share": self.majority_share, "sigmas": [r.sigma for r in self.rows],
            "empty_sigmas": [r.sigma for r in self.rows if r.empty], "rows": [dataclasses.asdict(r) for r in self.rows],
            "data": dict(self.data), "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`SweepRow` per σ."""
        return frame(self.rows, SweepRow)

    def figure(self) -> go.Figure:
        """Located vs random erased accuracy per σ, base accuracy as a line."""
        return erase_sweep_figure(self.to_frame(), self.base_accuracy, metric=self.metric,
                                  title=f"CNL erase σ sweep: {self.source or self.task} neurons → {self.task}")


def erase_sweep(
    model: Model,
    task: str,
    samples: Sequence[Sample],
    location: CNLLocation,
    sigmas: Sequence[float],
    *,
    spread: str | None = None,
    config: EraseConfig | None = None,
    progress: bool = False,
    **overrides: Any,
) -> EraseSweep:
    """Erase the neurons located at each σ (re-thresholded from ``location.scores``; nothing is
    re-scored) and compare with random draws of the same size (CNL Table 3).

    Args:
        model: The model (weights restored exactly afterwards).
        task: The evaluated task.
        samples: Evaluation samples.
        location: A :class:`CNLLocation` (e.g. loaded from ``tlcap cnl locate``'s ``result/``).
        sigmas: The σ values (each ``> 0``, distinct), e.g. ``(3, 6, 12)``.
        spread: ``std`` or ``var`` (default: the location's).
        config: An :class:`EraseConfig`.
        progress: Progress bars.
        **overrides: :class:`EraseConfig` fields.

    Returns:
        An :class:`EraseSweep`; a σ with an empty set is recorded as such, with a warning.

    Example:
        >>> sweep = erase_sweep(model, "imdb", test, CNLLocation.load("runs/imdb/result"), (3, 6, 12))
        >>> sweep.to_frame()
    """
    cfg = EraseConfig.resolve(config, **overrides)
    sigmas = check_sigmas(list(sigmas))
    spread = spread or location.spread
    sets = {s: location.reselect(s, spread) for s in sigmas}
    base = task_accuracy(model, task, samples, progress=progress)
    rows = []
    for s in sigmas:
        ns = sets[s]
        ha, hb = location.halves(s, spread)
        ov, iou = (ha.overlap(hb), ha.iou(hb))
        if not len(ns):
            warnings.warn(CNLWarning(f"σ={s:g}: the located set is empty (0 neurons); nothing erased at this σ"),
                          stacklevel=2)
            rows.append(SweepRow(s, 0, 0.0, ov, iou, NAN, NAN, NAN, NAN, True))
            continue
        loc, rnd = _erased(model, task, samples, ns, cfg, progress)
        r = _mean(rnd)
        rows.append(SweepRow(s, len(ns), ns.ratio(), ov, iou, loc.accuracy, r, loc.accuracy - base.accuracy,
                             r - base.accuracy if not math.isnan(r) else NAN, False))
    res = EraseSweep(
        task=task, base_accuracy=base.accuracy, rows=tuple(rows), spread=spread, source=location.task or task,
        metric=base.metric, n_eval=len(samples), n_random=cfg.n_random, majority_share=base.majority_share,
        n_skipped=base.n_skipped, config={**cfg.to_dict(), "sigmas": list(sigmas), "spread": spread},
        data=DataReport.of(samples, task).summary(),
    )
    return res.with_provenance(Provenance.collect(model, res.config, cfg.seed))


__all__ = ["EraseResult", "EraseRow", "EraseSweep", "SweepRow", "erase_effect", "erase_sweep"]
