"""CNL enhance (CNL paper §5.4 "Proving I", Table 2): fine-tune chosen neurons, held-out accuracy.

Modes (:data:`~tlcap.experiments.cnl.config.ENHANCE_MODES`), as the paper defines them:

- ``located``: train only the located neurons' MLP in/out weights (paper: 0.15 % of the neuron
  parameters);
- ``random``: as many random neurons (same count per layer, never a located one);
- ``wo_located`` ("W/o located"): *"mask the located neurons (set their parameter to 0) and
  fine-tune all other neurons"* — the located neurons are erased (input and output weights zeroed)
  and stay 0 while every other neuron trains (99.85 %);
- ``except_frozen``: every other neuron trains while the located ones keep their original values
  (what tlcap's "except" did before; not the paper's).

Attention and embeddings stay frozen in every mode. Every mode runs inside :func:`tuned`, which
restores the weights exactly when it ends, by success or by any exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice
from tlcap.data.sample import DataReport, Sample
from tlcap.data.tasks import get_task
from tlcap.errors import EmptyNeuronSetError, InvalidConfigError
from tlcap.experiments.cnl.config import ENHANCE_MODES, EnhanceConfig
from tlcap.intervene.finetune import masked_finetune, trained_fraction
from tlcap.intervene.weights import WeightEdit, erase_neurons
from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.set_scores import scored_items
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import RowFields, frame
from tlcap.viz.cnl import enhance_figure


def mode_neurons(neurons: NeuronSet, mode: str, seed: int = 0, *, draw: int = 0) -> tuple[NeuronSet, str]:
    """The neuron set and :func:`masked_finetune` mode a CNL enhance mode trains.

    Args:
        neurons: The located neurons.
        mode: An enhance mode of ``ENHANCE_MODES``.
        seed: Seed of the random set (mode ``"random"``).
        draw: Which random set (mode ``"random"``): set ``draw`` is drawn with seed ``seed + draw``.

    Returns:
        ``(neurons, finetune mode)``: ``random`` trains a random set of the same per-layer counts; ``located``
        trains ``neurons``; the other modes train every neuron except ``neurons`` (``"except"``).

    Raises:
        InvalidConfigError: an unknown mode.
    """
    check_choice("mode", mode, ENHANCE_MODES, cli="--modes")
    if mode == "random":
        return neurons.random_like(seed=seed + draw), "located"
    return neurons, "located" if mode == "located" else "except"


@contextmanager
def tuned(
    model: Model,
    train: Sequence[Sample],
    neurons: NeuronSet,
    mode: str,
    *,
    epochs: int = 1,
    lr: float = 1e-5,
    seed: int = 0,
    max_answer_tokens: int | None = 16,
    on_epoch: Callable[[int], None] | None = None,
    progress: bool = True,
    draw: int = 0,
) -> Iterator[WeightEdit]:
    """Fine-tune ``model`` in a CNL enhance ``mode`` (module docstring) for the ``with`` block.

    Args:
        model: The model (restored exactly when the block ends, also by an exception).
        train: Training samples.
        neurons: The located neurons.
        mode: ``located``, ``random``, ``wo_located`` or ``except_frozen``.
        epochs: Epochs.
        lr: Adam learning rate.
        seed: Seed of the random neurons and the sample order.
        max_answer_tokens: Answer tokens in the loss.
        on_epoch: Called after each epoch (e.g. to evaluate).
        progress: Progress bars.
        draw: Mode ``random``: which random set (seed ``seed + draw``; the sample order stays ``seed``'s).

    Yields:
        The :class:`WeightEdit` (for inspection; it is undone on exit).

    Example:
        >>> from tlcap.data import load_task
        >>> from tlcap.experiments.cnl import cnl_locate
        >>> train = load_task("emotion", split="train", n=4)
        >>> from tlcap import RunControl
        >>> loc = cnl_locate(model, "emotion", train, sigma=3, steps=2, run=RunControl(progress=False))
        >>> test = load_task("emotion", split="test", n=4)
        >>> with tuned(model, train, loc.neuron_set(), "wo_located", epochs=1, progress=False):
        ...     acc = task_accuracy(model, "emotion", test)
        >>> type(acc).__name__
        'TaskAccuracy'
    """
    ns, ft_mode = mode_neurons(neurons, mode, seed, draw=draw)
    edit = WeightEdit(host=True)  # the snapshots of every MLP matrix in host memory, not beside the Adam state
    try:
        if mode == "wo_located":
            erase_neurons(model, neurons, include_input=True, edit=edit)
        masked_finetune(model, train, ns, mode=ft_mode, epochs=epochs, lr=lr, seed=seed, on_epoch=on_epoch,  # type: ignore[arg-type]
                        max_answer_tokens=max_answer_tokens, edit=edit, progress=progress,
                        label=f"random set {draw}" if mode == "random" else mode)
        yield edit
    finally:
        edit.undo()


@dataclass(frozen=True)
class EnhanceRow:
    """Held-out accuracy of one mode after one epoch."""

    mode: str
    epoch: int
    accuracy: float


@dataclass(frozen=True)
class EnhanceResult(RowFields, Result):
    """Held-out accuracy after masked fine-tuning epochs, per mode (CNL Table 2).

    Attributes:
        rows: One :class:`EnhanceRow` per (mode, evaluated epoch).
        trained_fraction: Mode → share of the MLP-neuron parameters it trains.
        base_scores: ``[item]`` per-item score of the unedited model on the held-out items (0/1,
            or the token accuracy for code; empty in results saved before tlcap kept them).
        item_scores: ``[row, item]`` per-item score after each row's mode and epoch (row ``k`` is
            ``rows[k]``), on the same items: located vs random can be compared item by item
            (McNemar, paired bootstrap).
        items: Positions of the scored items among the held-out samples.
        random_scores: ``[draw, epoch, item]`` per-item scores after fine-tuning each random set (``config``'s
            ``n_random``; draw 0 is the ``random`` rows' set) at each evaluated epoch (ascending); empty without
            mode ``random`` and in results saved before tlcap kept them.
    """

    _row_types: ClassVar[dict[str, type]] = {"rows": EnhanceRow}

    task: str
    base_accuracy: float
    rows: tuple[EnhanceRow, ...] = ()
    n_neurons: int = 0
    n_train: int = 0
    n_eval: int = 0
    lr: float = 1e-5
    metric: str = ""
    source: str = ""
    meta: dict = field(default_factory=dict)
    trained_fraction: dict = field(default_factory=dict)
    majority_share: float = float("nan")
    config: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    base_scores: Float[Tensor, " item"] = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    item_scores: Float[Tensor, "row item"] = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.float64))
    items: tuple[int, ...] = ()
    random_scores: Float[Tensor, "draw epoch item"] = field(
        default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.float64))

    @property
    def n_random(self) -> int:
        """Random sets fine-tuned (the draws of :attr:`random_scores`; 1 for older results with a random row)."""
        if self.random_scores.numel():
            return int(self.random_scores.shape[0])
        return int(any(r.mode == "random" for r in self.rows))

    @property
    def random_epochs(self) -> tuple[int, ...]:
        """The evaluated epochs of the random fine-tunes, ascending (the epoch axis of :attr:`random_scores`)."""
        return tuple(sorted({r.epoch for r in self.rows if r.mode == "random"}))

    def random_draw_accuracy(self) -> dict[int, list[float]]:
        """Each random draw's accuracy per evaluated epoch (empty when the result keeps no random draws).

        Returns:
            ``{epoch: [accuracy of draw 0, draw 1, ...]}``, the epochs ascending.
        """
        if not self.random_scores.numel():
            return {}
        return {e: self.random_scores[:, k].mean(1).tolist() for k, e in enumerate(self.random_epochs)}

    def random_draws(self, epoch: int) -> Float[Tensor, "draw item"]:
        """Per-item scores of every random draw after ``epoch``.

        Args:
            epoch: An evaluated epoch.

        Returns:
            ``[draw, item]`` float64 scores (draw 0 equals ``scores("random", epoch)``).

        Raises:
            InvalidConfigError: the result keeps no random draws, or ``epoch`` was not evaluated.
        """
        epochs = list(self.random_epochs)
        if not self.random_scores.numel() or epoch not in epochs or len(epochs) != self.random_scores.shape[1]:
            raise InvalidConfigError(f"no random draws at epoch {epoch}; evaluated: {epochs}, random_scores shape "
                                     f"{tuple(self.random_scores.shape)}")
        return self.random_scores[:, epochs.index(epoch)]

    def scores(self, mode: str, epoch: int) -> Float[Tensor, " item"]:
        """Per-item scores of one (mode, epoch) row.

        Args:
            mode: A trained mode (``ENHANCE_MODES``), e.g. ``"located"``.
            epoch: The epoch of the row.

        Returns:
            ``[item]`` float64 scores of the held-out items (:attr:`items`).

        Raises:
            InvalidConfigError: no such row (or a result saved without per-item scores).
        """
        for k, r in enumerate(self.rows):
            if r.mode == mode and r.epoch == epoch and k < self.item_scores.shape[0]:
                return self.item_scores[k]
        raise InvalidConfigError(f"no per-item scores for mode {mode!r} at epoch {epoch}; rows: "
                                 f"{[(r.mode, r.epoch) for r in self.rows]}")

    def to_frame(self) -> pd.DataFrame:
        """One :class:`EnhanceRow` per (mode, epoch).

        Returns:
            A DataFrame of :class:`EnhanceRow` (mode, epoch, accuracy).
        """
        return frame(self.rows, EnhanceRow)

    def table(self) -> pd.DataFrame:
        """Modes × epochs accuracy table.

        Returns:
            A DataFrame indexed by mode with one accuracy column per epoch (the empty frame without rows).
        """
        df = self.to_frame()
        return df.pivot(index="mode", columns="epoch", values="accuracy") if len(df) else df

    def summary(self) -> dict[str, Any]:
        """Base accuracy, accuracy per mode and epoch, trained fractions.

        Returns:
            A JSON-safe dict: task, source, metric, base accuracy, majority share, counts, ``lr``, modes, trained
            fractions, every row, ``accuracy[mode][epoch]``, the random draws' accuracies per epoch
            (``random_draw_accuracy[epoch]``), the data report and the config.
        """
        modes = list(dict.fromkeys(r.mode for r in self.rows))
        return {"task": self.task, "source": self.source, "metric": self.metric, "base_accuracy": self.base_accuracy,
                "majority_share": self.majority_share, "n_neurons": self.n_neurons, "n_train": self.n_train,
                "n_eval": self.n_eval, "lr": self.lr, "modes": modes, "trained_fraction": dict(self.trained_fraction),
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "accuracy": {m: {str(r.epoch): r.accuracy for r in self.rows if r.mode == m} for m in modes},
                "n_random": self.n_random,
                "random_draw_accuracy": {str(e): v for e, v in self.random_draw_accuracy().items()},
                "data": dict(self.data), "config": dict(self.config)}

    def figure(self) -> go.Figure:
        """Accuracy vs epoch, one line per mode (with several random sets: each draw and their mean too).

        Returns:
            The Plotly figure, starting at the base accuracy.
        """
        return enhance_figure(self.to_frame(), self.base_accuracy, metric=self.metric,
                              random_draws=self.random_draw_accuracy(),
                              title=f"CNL enhance: fine-tune {self.source or self.task} neurons → {self.task} (lr {self.lr:g})")


def enhance_effect(
    model: Model,
    task: str,
    train: Sequence[Sample],
    test: Sequence[Sample],
    neurons: NeuronSet,
    *,
    config: EnhanceConfig | None = None,
    source: str = "",
    progress: bool = True,
    **overrides: Any,
) -> EnhanceResult:
    """Fine-tune located vs random vs W/o-located neurons; held-out accuracy after ``eval_epochs``.

    Args:
        model: The model (restored exactly after each mode, also on errors).
        task: The task (training and evaluation).
        train: Training samples.
        test: Held-out evaluation samples.
        neurons: The located neurons.
        config: An :class:`EnhanceConfig` (epochs, eval_epochs, lr, modes, ...).
        source: Where the neurons come from (recorded; default ``task``).
        progress: Progress bars.
        **overrides: :class:`EnhanceConfig` fields.

    Returns:
        An :class:`EnhanceResult` with provenance.

    Raises:
        EmptyNeuronSetError: ``neurons`` is empty.

    Example:
        >>> from tlcap.data import load_task
        >>> from tlcap.experiments.cnl import cnl_locate
        >>> train = load_task("emotion", split="train", n=4)
        >>> from tlcap import RunControl
        >>> loc = cnl_locate(model, "emotion", train, sigma=3, steps=2, run=RunControl(progress=False))
        >>> test = load_task("emotion", split="test", n=4)
        >>> res = enhance_effect(model, "emotion", train, test, loc.neuron_set(), epochs=2, eval_epochs=(1, 2),
        ...                      progress=False)
        >>> res.table()
        epoch         1    2
        mode
        located     0.0  0.0
        random      0.0  0.0
        wo_located  0.0  0.0
    """
    cfg = EnhanceConfig.resolve(config, **overrides)
    if not len(neurons):
        raise EmptyNeuronSetError(f"the neuron set{f' of {source}' if source else ''} is empty (0 neurons): there is "
                                  "nothing to fine-tune; locate with a lower --sigma or on more samples")
    base = task_accuracy(model, task, test, progress=progress)
    rows: list[EnhanceRow] = []
    per_item: list[tuple[float, ...]] = []
    draws: list[list[tuple[float, ...]]] = []  # [draw][evaluated epoch] per-item scores of the random sets
    fractions = {}
    for mode in cfg.modes:
        for draw in range(cfg.n_random if mode == "random" else 1):
            ns, ft_mode = mode_neurons(neurons, mode, cfg.seed, draw=draw)
            if draw == 0:
                fractions[mode] = trained_fraction(model, ns, ft_mode)  # type: ignore[arg-type]
            if mode == "random":
                draws.append([])

            def evaluate(epoch: int, mode: str = mode, draw: int = draw) -> None:
                if epoch in cfg.evaluated_epochs:
                    acc = task_accuracy(model, task, test, progress=progress)
                    if mode == "random":
                        draws[draw].append(acc.scores)
                    if draw == 0:
                        rows.append(EnhanceRow(mode, epoch, acc.accuracy))
                        per_item.append(acc.scores)

            with tuned(model, train, neurons, mode, epochs=cfg.epochs, lr=cfg.lr, seed=cfg.seed, on_epoch=evaluate,
                       max_answer_tokens=cfg.max_answer_tokens, progress=progress, draw=draw):
                pass
    res = EnhanceResult(
        task=task, base_accuracy=base.accuracy, rows=tuple(rows), n_neurons=len(neurons), n_train=len(train),
        n_eval=len(test), lr=cfg.lr, metric=base.metric, source=source or task, trained_fraction=fractions,
        majority_share=base.majority_share, config=cfg.to_dict(),
        data={"train": DataReport.of(train, task, "train").summary(), "test": DataReport.of(test, task, "test").summary()},
        base_scores=torch.tensor(base.scores, dtype=torch.float64),
        item_scores=torch.tensor(per_item, dtype=torch.float64).reshape(len(per_item), len(base.scores)),
        items=tuple(i for i, _, _ in scored_items(model, get_task(task), test)),
        random_scores=torch.tensor(draws, dtype=torch.float64).reshape(
            len(draws), len(draws[0]) if draws else 0, len(base.scores)),
    )
    return res.with_provenance(Provenance.collect(model, cfg, cfg.seed))


__all__ = ["EnhanceResult", "EnhanceRow", "enhance_effect", "tuned", "mode_neurons"]
