"""CNL across datasets (CNL paper §5.4 "Commonality Across Datasets", Fig. 5, App. G).

For datasets A (whose neurons) and B (evaluated on): the overlap / IoU of their located sets,
the accuracy change on B when A's neurons are erased (vs random draws), and, with training data,
the enhance transfer:

- ``train_on="source"`` (default, the paper's App. G): fine-tune A's neurons on **A's** training
  data (modes ``located``, ``random``, ``wo_located``), then evaluate on every B. The off-diagonal
  mean is App. G's "performance improvement on other datasets not involved in training";
- ``train_on="target"``: fine-tune A's neurons on **B's** training data and evaluate on B (what
  tlcap did before; not the paper's experiment).

Every fine-tuning runs inside :func:`~tlcap.experiments.cnl.enhance.tuned`: the weights are
restored exactly afterwards, also when an evaluation raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.data.sample import DataReport, Sample
from tlcap.errors import EmptyNeuronSetError, InvalidConfigError
from tlcap.experiments.cnl.config import ENHANCE_MODES, CrossConfig, EraseConfig
from tlcap.experiments.cnl.enhance import tuned
from tlcap.experiments.cnl.erase import erase_effect
from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.runtime.run_control import RunControl
from tlcap.viz.cnl import cross_matrix_figure

NAN = float("nan")


def _empty(*shape: int) -> Tensor:
    return torch.zeros(*shape, dtype=torch.float64)


@dataclass(frozen=True)
class CrossRow:
    """One (neurons of A, evaluated on B) cell of :class:`CrossResult`; enhance columns NaN when not run."""

    neurons_of: str
    evaluated_on: str
    overlap: float
    iou: float
    erase_delta: float
    random_delta: float
    enhance_located: float
    enhance_random: float
    enhance_wo_located: float
    enhance_except_frozen: float


@dataclass(frozen=True)
class CrossResult(Result):
    """Cross-dataset matrices: rows = neurons of dataset A, columns = evaluated dataset B.

    Attributes:
        overlap / iou: ``[k, k]`` between the datasets' neuron sets.
        erase_delta: ``[k, k]`` accuracy change on B after erasing A's neurons.
        random_delta: ``[k, k]`` the same for random neurons of A's count (mean of draws; NaN
            without draws).
        enhance_delta: ``[modes, k, k]`` accuracy change on B after fine-tuning with A's neurons
            in each of ``enhance_modes`` (``[0, k, k]`` if not run); training data per ``train_on``.
        base_scores: ``[k, item]`` per-item score of the unedited model on each dataset B (row ``j``
            holds ``n_items[j]`` scores, NaN after them).
        erase_scores: ``[k, k, set, item]`` per-item score on B with A's neurons erased (set 0)
            and with each random draw of A's count erased (sets 1..``n_random``); NaN-padded like
            ``base_scores``.
        n_items: Scored items per dataset.
    """

    names: tuple[str, ...]
    overlap: Float[Tensor, "k k"]
    iou: Float[Tensor, "k k"]
    erase_delta: Float[Tensor, "k k"]
    random_delta: Float[Tensor, "k k"]
    enhance_delta: Float[Tensor, "mode k k"]
    base_accuracy: tuple[float, ...] = ()
    n_neurons: tuple[int, ...] = ()
    meta: dict = field(default_factory=dict)
    enhance_modes: tuple[str, ...] = ()
    train_on: str = "source"
    config: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    base_scores: Float[Tensor, "dataset item"] = field(default_factory=lambda: _empty(0, 0))
    erase_scores: Float[Tensor, "source dataset set item"] = field(default_factory=lambda: _empty(0, 0, 0, 0))
    n_items: tuple[int, ...] = ()

    def enhance(self, mode: str) -> Float[Tensor, "k k"]:
        """The ``[k, k]`` enhance matrix of one mode.

        Args:
            mode: One of :attr:`enhance_modes`.

        Returns:
            Row ``i``, column ``j``: the accuracy change on dataset ``j`` after fine-tuning with dataset ``i``'s neurons.

        Raises:
            InvalidConfigError: ``mode`` was not run.
        """
        if mode not in self.enhance_modes:
            raise InvalidConfigError(f"no enhance run for mode {mode!r}; this result has {list(self.enhance_modes) or 'none'}")
        return self.enhance_delta[self.enhance_modes.index(mode)]

    def transfer(self) -> dict[str, float]:
        """Mean accuracy change on the datasets *not* trained on (off-diagonal; App. G), per mode.

        Only meaningful with ``train_on="source"``; empty otherwise.

        Returns:
            Mode -> mean off-diagonal accuracy change; ``{}`` unless ``train_on="source"`` with two datasets or more.
        """
        k = len(self.names)
        if self.train_on != "source" or k < 2:
            return {}
        off = ~torch.eye(k, dtype=torch.bool)
        return {m: float(self.enhance(m)[off].mean()) for m in self.enhance_modes}

    def in_domain(self) -> dict[str, float]:
        """Mean accuracy change on the dataset whose neurons (and data) were trained, per mode.

        Returns:
            Mode -> mean diagonal accuracy change (``{}`` without enhance runs).
        """
        return {m: float(self.enhance(m).diagonal().mean()) for m in self.enhance_modes}

    def summary(self) -> dict[str, Any]:
        """The matrices, base accuracies, and the enhance transfer (App. G) per mode.

        Returns:
            A JSON-safe dict: names, set sizes, base accuracies, the overlap / IoU / erase / random matrices
            (NaN as ``None``), the enhance matrices, transfer and in-domain means per mode (``None`` without
            enhance runs), the data report and the config.
        """
        return {
            "names": list(self.names), "n_neurons": list(self.n_neurons), "base_accuracy": list(self.base_accuracy),
            "overlap": self.overlap.tolist(), "iou": self.iou.tolist(), "erase_delta": self.erase_delta.tolist(),
            "random_delta": [[None if math.isnan(v) else v for v in row] for row in self.random_delta.tolist()],
            "enhance_modes": list(self.enhance_modes), "train_on": self.train_on if self.enhance_modes else None,
            "enhance_delta": {m: self.enhance(m).tolist() for m in self.enhance_modes} or None,
            "enhance_transfer": self.transfer() or None, "enhance_in_domain": self.in_domain() or None,
            "data": dict(self.data), "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`CrossRow` per (A, B).

        Returns:
            A DataFrame of :class:`CrossRow`, ``k²`` rows (NaN for the enhance modes not run).
        """
        rows = []
        for i, a in enumerate(self.names):
            for j, b in enumerate(self.names):
                en = {m: (float(self.enhance(m)[i, j]) if m in self.enhance_modes else NAN) for m in ENHANCE_MODES}
                rows.append(CrossRow(a, b, float(self.overlap[i, j]), float(self.iou[i, j]), float(self.erase_delta[i, j]),
                                     float(self.random_delta[i, j]), en["located"], en["random"], en["wo_located"],
                                     en["except_frozen"]))
        return frame(rows, CrossRow)

    def figure(self) -> go.Figure:
        """The overlap matrix (CNL Fig. 5c).

        Returns:
            The Plotly heatmap of :meth:`matrix_figure` ``("overlap")``.
        """
        return self.matrix_figure("overlap")

    def matrix_figure(self, which: str = "overlap") -> go.Figure:
        """One matrix: ``overlap``, ``iou``, ``erase_delta``, ``random_delta`` or ``enhance_<mode>``.

        Args:
            which: The matrix: an attribute name or ``"enhance_"`` followed by a mode of :attr:`enhance_modes`.

        Returns:
            The Plotly ``[k, k]`` heatmap, datasets as rows (A) and columns (B).
        """
        if which.startswith("enhance_"):
            z = self.enhance(which[len("enhance_"):])
            title = f"CNL cross-dataset: enhance ({which[len('enhance_'):]}, trained on {self.train_on} data)"
        else:
            z, title = getattr(self, which), None
        return cross_matrix_figure(z.float().numpy(), self.names, which, title=title)


def _check_inputs(located: Mapping[str, NeuronSet], eval_sets: Mapping[str, Sequence[Sample]],
                  train_sets: Mapping[str, Sequence[Sample]] | None) -> None:
    for name, ns in located.items():
        if not len(ns):
            raise EmptyNeuronSetError(f"the neuron set of {name} is empty (0 neurons); locate it with a lower --sigma "
                                      "or on more samples")
        if name not in eval_sets:
            raise InvalidConfigError(f"no evaluation samples for {name}; pass eval_sets[{name!r}]")
        if train_sets is not None and name not in train_sets:
            raise InvalidConfigError(f"no training samples for {name}; pass train_sets[{name!r}]")


def cross_dataset(
    model: Model,
    located: Mapping[str, NeuronSet],
    eval_sets: Mapping[str, Sequence[Sample]],
    *,
    train_sets: Mapping[str, Sequence[Sample]] | None = None,
    config: CrossConfig | None = None,
    progress: bool = False,
    **overrides: Any,
) -> CrossResult:
    """Overlap matrix, and erase (and, with ``train_sets``, enhance) effects of every dataset's
    neurons on every dataset (tasks named by the keys).

    Args:
        model: The model (weights restored exactly after every edit, also on errors).
        located: Dataset → its located neurons.
        eval_sets: Dataset → held-out samples.
        train_sets: Dataset → training samples; enables the enhance matrices.
        config: A :class:`CrossConfig` (``n_random``, ``train_on``, ``epochs``, ``lr``, ``modes``...).
        progress: Progress bars.
        **overrides: :class:`CrossConfig` fields.

    Returns:
        A :class:`CrossResult` with provenance.

    Example:
        >>> from tlcap.data import load_task
        >>> from tlcap.experiments.cnl import cnl_locate
        >>> names = ("emotion", "svamp")
        >>> trains = {t: load_task(t, split="train", n=4) for t in names}
        >>> tests = {t: load_task(t, split="test", n=4) for t in names}
        >>> located = {t: cnl_locate(model, t, trains[t], steps=2, run=RunControl(progress=False)).neuron_set() for t in names}
        >>> res = cross_dataset(model, located, tests, train_sets=trains, epochs=1, n_random=2)
        >>> res.transfer()    # App. G: mean change on the datasets not trained on, per mode
        {'located': 0.0, 'random': 0.0, 'wo_located': 0.0}
    """
    cfg = CrossConfig.resolve(config, **overrides)
    _check_inputs(located, eval_sets, train_sets)
    names = tuple(located)
    k = len(names)
    ov, io, ed, rd = (torch.zeros(k, k, dtype=torch.float64) for _ in range(4))
    modes = cfg.modes if train_sets is not None else ()
    en = torch.zeros(len(modes), k, k, dtype=torch.float64)
    base_acc = {b: task_accuracy(model, b, eval_sets[b], progress=progress) for b in names}
    base = {b: a.accuracy for b, a in base_acc.items()}
    width = max(len(a.scores) for a in base_acc.values())
    bs = torch.full((k, width), NAN, dtype=torch.float64)
    es = torch.full((k, k, 1 + cfg.n_random, width), NAN, dtype=torch.float64)
    erase_cfg = EraseConfig(n_random=cfg.n_random, seed=cfg.seed)
    for j, b in enumerate(names):
        bs[j, : len(base_acc[b].scores)] = torch.tensor(base_acc[b].scores, dtype=torch.float64)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            ov[i, j] = located[a].overlap(located[b])
            io[i, j] = located[a].iou(located[b])
            er = erase_effect(model, b, eval_sets[b], located[a], config=erase_cfg, base_accuracy=base_acc[b], source=a,
                              run=RunControl(progress=progress))
            ed[i, j], rd[i, j] = er.located_delta, er.random_delta
            n = er.located_scores.shape[0]
            es[i, j, 0, :n] = er.located_scores
            es[i, j, 1:, :n] = er.random_scores
    tune = dict(epochs=cfg.epochs, lr=cfg.lr, seed=cfg.seed, max_answer_tokens=cfg.max_answer_tokens, progress=progress)
    for m, mode in enumerate(modes):
        for i, a in enumerate(names):
            if cfg.train_on == "source":
                with tuned(model, train_sets[a], located[a], mode, **tune):  # type: ignore[index]
                    for j, b in enumerate(names):
                        en[m, i, j] = task_accuracy(model, b, eval_sets[b], progress=progress).accuracy - base[b]
            else:
                for j, b in enumerate(names):
                    with tuned(model, train_sets[b], located[a], mode, **tune):  # type: ignore[index]
                        en[m, i, j] = task_accuracy(model, b, eval_sets[b], progress=progress).accuracy - base[b]
    data = {b: DataReport.of(eval_sets[b], b, "test").summary() for b in names}
    res = CrossResult(names=names, overlap=ov, iou=io, erase_delta=ed, random_delta=rd, enhance_delta=en,
                      base_accuracy=tuple(base[b] for b in names), n_neurons=tuple(len(located[a]) for a in names),
                      enhance_modes=tuple(modes), train_on=cfg.train_on, config=cfg.to_dict(), data=data,
                      base_scores=bs, erase_scores=es, n_items=tuple(len(base_acc[b].scores) for b in names))
    return res.with_provenance(Provenance.collect(model, cfg, cfg.seed))


__all__ = ["CrossResult", "CrossRow", "cross_dataset"]
