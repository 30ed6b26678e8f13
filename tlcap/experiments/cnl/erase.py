"""CNL erase (CNL paper §5.4 "Proving II", Table 3): accuracy with the located neurons erased vs
as many random neurons, at one σ or a σ sweep re-thresholded from one saved scoring run.

Erasing zeroes the neurons' down-projection rows (:func:`~tlcap.intervene.weights.erase_neurons`,
restored exactly on every exit path), or — the default, same numbers — zeroes their activations
in batch rows that each carry one set, so one forward pass scores many sets
(:mod:`tlcap.experiments.cnl.erase_sets`). The random baseline erases ``n_random`` draws of
:meth:`NeuronSet.random_like` (same count per layer, never a located neuron; draw ``k`` has seed
``seed + k``). :class:`EraseResult` keeps the per-item scores of the unedited model, the located
set and every random set (for permutation tests over sets and item × set bootstraps) and, with
``ppl_texts > 0``, the WikiText-2 perplexity control (unedited, located, the first
``ppl_n_random`` random sets).
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
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.data.sample import DataReport, Sample
from tlcap.errors import EmptyNeuronSetError
from tlcap.experiments.cnl.config import CNLWarning, EraseConfig, check_sigmas
from tlcap.experiments.cnl.erase_sets import ErasedSets, erase_sets
from tlcap.experiments.cnl.locate import CNLLocation
from tlcap.metrics.accuracy import TaskAccuracy, task_accuracy
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import RowFields, frame
from tlcap.runtime.run_control import RunControl
from tlcap.viz.cnl import erase_figure, erase_sweep_figure

NAN = float("nan")


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else NAN


@dataclass(frozen=True)
class EraseRow:
    """One row of :meth:`EraseResult.to_frame`: a condition and its accuracy."""

    condition: str
    accuracy: float


def _empty(*shape: int) -> Tensor:
    return torch.zeros(*shape, dtype=torch.float64)


@dataclass(frozen=True)
class EraseResult(Result):
    """Accuracy with located neurons erased vs as many random neurons (several draws).

    Attributes:
        random_accuracy: Mean over the random draws (NaN with ``n_random=0``: no baseline).
        majority_share: Share of the most frequent gold label (a constant predictor's accuracy).
        n_skipped: Evaluation samples not scored (prompt beyond the context window).
        base_scores: ``[item]`` per-item score of the unedited model (0/1, or the token accuracy
            for code; empty in results saved before tlcap kept per-item scores).
        located_scores: ``[item]`` per-item score with the located set erased.
        random_scores: ``[random, item]`` per-item score with each random set erased (row ``k``:
            seed ``random_seeds[k]``); ``random_accuracies[k]`` is its mean.
        random_seeds: Seed of each random set (:meth:`NeuronSet.random_like`).
        items: Positions of the scored items among the evaluation samples.
        ppl_nll: ``[ppl_set, text]`` summed next-token NLL (nats) of each WikiText-2 text; rows:
            unedited, located erased, then the first ``ppl_set - 2`` random sets erased (the
            same sets as rows of ``random_scores``); empty without the control.
        ppl_count: ``[text]`` predicted tokens of each text.
        ppl_texts: The control's texts (``source``, ``n_texts``, ``max_tokens``, ``n_random``).
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
    base_scores: Float[Tensor, " item"] = field(default_factory=lambda: _empty(0))
    located_scores: Float[Tensor, " item"] = field(default_factory=lambda: _empty(0))
    random_scores: Float[Tensor, "random item"] = field(default_factory=lambda: _empty(0, 0))
    random_seeds: tuple[int, ...] = ()
    items: tuple[int, ...] = ()
    ppl_nll: Float[Tensor, "ppl_set text"] = field(default_factory=lambda: _empty(0, 0))
    ppl_count: Float[Tensor, " text"] = field(default_factory=lambda: _empty(0))
    ppl_texts: dict = field(default_factory=dict)

    @property
    def located_delta(self) -> float:
        return self.located_accuracy - self.base_accuracy

    @property
    def random_delta(self) -> float:
        return self.random_accuracy - self.base_accuracy

    @property
    def perplexities(self) -> Float[Tensor, " ppl_set"]:
        """WikiText-2 perplexity of each row of :attr:`ppl_nll` (unedited, located, random...; empty: no control)."""
        if not self.ppl_nll.numel():
            return _empty(0)
        return (self.ppl_nll.sum(1) / self.ppl_count.sum().clamp(min=1)).exp()

    def _ppl_summary(self) -> dict[str, Any]:
        p = self.perplexities.tolist()
        if not p:
            return {"ppl_base": None, "ppl_located": None, "ppl_random": []}
        return {"ppl_base": p[0], "ppl_located": p[1], "ppl_random": p[2:], "ppl_texts": dict(self.ppl_texts),
                "ppl_tokens": int(self.ppl_count.sum())}

    def summary(self) -> dict[str, Any]:
        """Base, located-erased and random-erased accuracy and their changes (random: ``None`` without draws),
        and the perplexity control (``ppl_base`` / ``ppl_located`` / ``ppl_random``; ``None`` / ``[]`` without it).

        Returns:
            A JSON-safe dict: task, source, metric, counts, the accuracies and deltas, the perplexity control,
            the data report and the config.
        """
        no_rnd = not self.random_accuracies
        return {
            "task": self.task, "source": self.source, "metric": self.metric, "n_eval": self.n_eval,
            "n_skipped": self.n_skipped, "n_neurons": self.n_neurons, "base_accuracy": self.base_accuracy,
            "majority_share": self.majority_share, "located_accuracy": self.located_accuracy,
            "random_accuracy": None if no_rnd else self.random_accuracy, "random_accuracies": list(self.random_accuracies),
            "located_delta": self.located_delta, "random_delta": None if no_rnd else self.random_delta,
            **self._ppl_summary(), "data": dict(self.data), "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`EraseRow` per condition (base, located, each random draw).

        Returns:
            A DataFrame of :class:`EraseRow` (condition, accuracy).
        """
        rows = [EraseRow("base", self.base_accuracy), EraseRow("located erased", self.located_accuracy)]
        rows += [EraseRow(f"random erased #{i}", a) for i, a in enumerate(self.random_accuracies)]
        return frame(rows, EraseRow)

    def figure(self) -> go.Figure:
        """Bars: base, located erased, random erased (mean ± sd of the draws).

        Returns:
            The Plotly bar chart.
        """
        return erase_figure(self.base_accuracy, self.located_accuracy, self.random_accuracies, metric=self.metric,
                            title=f"CNL erase: {self.source or self.task} neurons ({self.n_neurons}) → {self.task}")


def _majority(golds: Sequence[str]) -> float:
    return TaskAccuracy("", "", 0.0, golds=tuple(golds)).majority_share


def located_accuracy(runs: ErasedSets, task: str) -> TaskAccuracy:
    """The located-erased model's :class:`TaskAccuracy` from an :class:`ErasedSets` (no extra pass).

    Args:
        runs: The erased runs (:func:`~tlcap.experiments.cnl.erase_sets.erase_sets`).
        task: The task name (recorded).

    Returns:
        The accuracy with the located set erased, with its per-item scores, predictions and golds.
    """
    sc = runs.located.tolist()
    return TaskAccuracy(task, runs.metric, sum(sc) / len(sc), tuple(sc), runs.located_predictions, runs.golds,
                        n_skipped=runs.n_skipped)


def erase_effect(
    model: Model,
    task: str,
    samples: Sequence[Sample],
    neurons: NeuronSet,
    *,
    config: EraseConfig | None = None,
    base_accuracy: float | TaskAccuracy | None = None,
    source: str = "",
    run: RunControl | None = None,
    runs: list[ErasedSets] | None = None,
    **overrides: Any,
) -> EraseResult:
    """Erase the neurons and compare accuracy with ``n_random`` random draws of the same count per layer.

    Args:
        model: The model (weights restored exactly afterwards, also on errors).
        task: The evaluated task.
        samples: Evaluation samples.
        neurons: The located neurons.
        config: An :class:`EraseConfig` (``n_random``, ``seed``, ``include_input``, ``batched``,
            ``ppl_texts`` / ``ppl_n_random`` / ``ppl_max_tokens``).
        base_accuracy: The unchanged model's accuracy when already measured: a
            :class:`TaskAccuracy` (its per-item scores are kept) or a number (kept as
            ``base_accuracy``; the unedited model is still scored per item, in the same batches).
        source: Where the neurons come from (recorded; default ``task``).
        run: ``checkpoint_dir`` (finished chunks of sets are saved there, so a rerun resumes),
            ``checkpoint_every`` (sets per chunk, default 25) and ``progress``
            (:class:`~tlcap.runtime.run_control.RunControl`; default: no checkpoints, no bars).
        runs: A list that receives the :class:`~tlcap.experiments.cnl.erase_sets.ErasedSets` behind
            the result (e.g. for the located set's predictions).
        **overrides: :class:`EraseConfig` fields.

    Returns:
        An :class:`EraseResult` with provenance.

    Raises:
        EmptyNeuronSetError: ``neurons`` is empty (erasing nothing could only report "no change").

    Example:
        >>> from tlcap.data import load_task
        >>> from tlcap.experiments.cnl import cnl_locate
        >>> train = load_task("emotion", split="train", n=4)
        >>> loc = cnl_locate(model, "emotion", train, sigma=3, steps=2, run=RunControl(progress=False))
        >>> er = erase_effect(model, "emotion", load_task("emotion", split="test", n=4), loc.neuron_set(), n_random=2)
        >>> round(er.located_delta, 3), round(er.random_delta, 3), er.random_scores.shape      # (n_random, n_items)
        (0.0, 0.0, torch.Size([2, 4]))
    """
    cfg = EraseConfig.resolve(config, **overrides)
    if not len(neurons):
        raise EmptyNeuronSetError(f"the neuron set{f' of {source}' if source else ''} is empty (0 neurons): erasing it "
                                  "changes nothing; locate with a lower --sigma or on more samples")
    given = isinstance(base_accuracy, TaskAccuracy)
    r = erase_sets(model, task, samples, neurons, cfg, base=not given, run=run)
    if runs is not None:
        runs.append(r)
    if isinstance(base_accuracy, TaskAccuracy):
        base_scores = torch.tensor(base_accuracy.scores, dtype=torch.float64)
        base, skipped = base_accuracy.accuracy, base_accuracy.n_skipped
    else:
        assert r.base is not None
        base_scores, skipped = r.base, r.n_skipped
        base = float(base_accuracy) if base_accuracy is not None else float(r.base.mean())
    rnd = [float(x) for x in r.random.mean(1)] if cfg.n_random else []
    res = EraseResult(
        task=task, base_accuracy=base, located_accuracy=float(r.located.mean()), random_accuracy=_mean(rnd),
        random_accuracies=tuple(rnd), n_neurons=len(neurons), n_eval=len(samples), metric=r.metric,
        source=source or task, majority_share=_majority(r.golds), n_skipped=max(skipped, r.n_skipped),
        config=cfg.to_dict(), data=DataReport.of(samples, task).summary(),
        meta={"engine": "batched" if cfg.batched else "weights", "tokens": r.tokens, "seconds": r.seconds},
        base_scores=base_scores, located_scores=r.located, random_scores=r.random, random_seeds=r.seeds, items=r.items,
        ppl_nll=r.ppl_nll if r.ppl_nll is not None else _empty(0, 0),
        ppl_count=r.ppl_count if r.ppl_count is not None else _empty(0), ppl_texts=r.ppl_texts or {},
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
        """Base accuracy and one row per σ; empty sets listed in ``empty_sigmas``.

        Returns:
            A JSON-safe dict: task, source, metric, spread, counts, base accuracy, majority share, the σ values,
            ``empty_sigmas``, every :class:`SweepRow`, the data report and the config.
        """
        return {
            "task": self.task, "source": self.source, "metric": self.metric, "spread": self.spread, "n_eval": self.n_eval,
            "n_skipped": self.n_skipped, "n_random": self.n_random, "base_accuracy": self.base_accuracy,
            "majority_share": self.majority_share, "sigmas": [r.sigma for r in self.rows],
            "empty_sigmas": [r.sigma for r in self.rows if r.empty], "rows": [dataclasses.asdict(r) for r in self.rows],
            "data": dict(self.data), "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`SweepRow` per σ.

        Returns:
            A DataFrame of :class:`SweepRow` (set size, split-half stability, located / random accuracy and deltas).
        """
        return frame(self.rows, SweepRow)

    def figure(self) -> go.Figure:
        """Located vs random erased accuracy per σ, base accuracy as a line.

        Returns:
            The Plotly figure.
        """
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
        >>> from tlcap.data import load_task
        >>> from tlcap.experiments.cnl import cnl_locate
        >>> train = load_task("emotion", split="train", n=4)
        >>> loc = cnl_locate(model, "emotion", train, sigma=3, steps=2, run=RunControl(progress=False))
        >>> test = load_task("emotion", split="test", n=4)
        >>> sweep = erase_sweep(model, "emotion", test, loc, (3, 6), n_random=2)   # or CNLLocation.load(path)
        >>> sweep.to_frame()[["sigma", "n_neurons", "located_delta", "random_delta", "empty"]]
           sigma  n_neurons  located_delta  random_delta  empty
        0    3.0         12            0.0           0.0  False
        1    6.0          0            NaN           NaN   True
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
        er = erase_sets(model, task, samples, ns, cfg, base=False, run=RunControl(progress=progress))
        la, r = float(er.located.mean()), _mean([float(x) for x in er.random.mean(1)])
        rows.append(SweepRow(s, len(ns), ns.ratio(), ov, iou, la, r, la - base.accuracy,
                             r - base.accuracy if not math.isnan(r) else NAN, False))
    res = EraseSweep(
        task=task, base_accuracy=base.accuracy, rows=tuple(rows), spread=spread, source=location.task or task,
        metric=base.metric, n_eval=len(samples), n_random=cfg.n_random, majority_share=base.majority_share,
        n_skipped=base.n_skipped, config={**cfg.to_dict(), "sigmas": list(sigmas), "spread": spread},
        data=DataReport.of(samples, task).summary(),
    )
    return res.with_provenance(Provenance.collect(model, res.config, cfg.seed))


__all__ = ["EraseResult", "EraseRow", "EraseSweep", "SweepRow", "erase_effect", "erase_sweep", "located_accuracy"]
