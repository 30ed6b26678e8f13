"""Ablation sources: what a non-circuit edge carries instead of its upstream node's output.

EAP scores an edge by the change its upstream output would undergo (``ablated_u - clean_u``),
and a circuit-only run feeds every dropped edge the ablated output. Both take that output
from an :class:`AblationSource`: anything with a ``name`` and a ``run(model, graph, task)``
returning the ablated upstream outputs of every item (and the metric of the fully ablated run
when it comes for free). Two sources exist:

* ``"corrupt"`` (:class:`CorruptedAblation`): the outputs on the item's corrupted prompt
  (Yao et al.'s knowledge circuits, Hanna et al.'s EAP);
* ``"zero"`` (:class:`ZeroAblation`): zeros;
* ``"mean"`` (:class:`MeanAblation`): each node's output averaged over every real (unpadded)
  position of every clean prompt of the dataset (one vector per node);
* ``"mean-positional"`` (``MeanAblation(positional=True)``): averaged over the dataset's clean
  prompts at each position separately (position ``p`` over the items that have a real token
  at ``p``; rows are right-padded, so positions count from the start of the prompt).

The mean sources are *fitted* on a dataset first (:meth:`MeanAblation.fit`, one recording
pass per batch of items; :func:`fit_source` does it for any source); a single prompt is a
dataset of one. Scoring and evaluation only call ``run``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice
from tlcap.errors import EmptyDatasetError, InvalidConfigError
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.passes import run_pass
from tlcap.locate.circuits.task import CircuitTask
from tlcap.models import Model


@dataclass(frozen=True)
class AblatedRun:
    """Ablated upstream outputs of every item of a task.

    Attributes:
        upstream: ``[item, n_up, pos, d_model]`` outputs that replace dropped edges' outputs.
        metric: The metric of the fully ablated run per item, when the source computed it
            (``None``: it is measured by a circuit-only run of the empty circuit).
    """

    upstream: Float[Tensor, "item n_up pos d_model"]
    metric: Float[Tensor, " item"] | None = None


@runtime_checkable
class AblationSource(Protocol):
    """What replaces a dropped edge's upstream output (module docstring)."""

    name: str

    def run(self, model: Model, graph: EdgeGraph, task: CircuitTask) -> AblatedRun:
        """The ablated upstream outputs of every item of ``task``.

        Args:
            model: The model.
            graph: The edge graph (its upstream nodes).
            task: The task whose items are ablated.

        Returns:
            An :class:`AblatedRun` with ``[item, n_up, pos, d_model]`` outputs.
        """
        ...


@dataclass(frozen=True)
class CorruptedAblation:
    """The upstream outputs on each item's corrupted prompt (one forward pass)."""

    name: str = "corrupt"

    def run(self, model: Model, graph: EdgeGraph, task: CircuitTask) -> AblatedRun:
        """Record every upstream output of the corrupted rows.

        Args:
            model: The model.
            graph: Its edge graph.
            task: A task with corrupted rows.

        Returns:
            The corrupted outputs and the corrupted run's metric.

        Raises:
            InvalidConfigError: the task has no corrupted prompt.
        """
        if task.corrupt is None:
            raise InvalidConfigError(
                "ablation 'corrupt' needs a corrupted prompt: give --corrupt-prompt or use --zero-ablate"
            )
        items = torch.arange(task.n_items, device=task.corrupt.device)
        out = run_pass(model, graph, task, task.corrupt, items=items, record_upstream=True)
        assert out.upstream is not None
        return AblatedRun(out.upstream, out.metric)


@dataclass(frozen=True)
class ZeroAblation:
    """Zeros for every upstream output."""

    name: str = "zero"

    def run(self, model: Model, graph: EdgeGraph, task: CircuitTask) -> AblatedRun:
        """Zeros ``[item, n_up, pos, d_model]``.

        Args:
            model: The model.
            graph: Its edge graph.
            task: The task.

        Returns:
            Zero outputs (the metric is left to an empty-circuit run).
        """
        n, pos = task.clean.shape
        return AblatedRun(torch.zeros(n, graph.n_upstream, pos, model.d_model, device=task.clean.device))


@dataclass(frozen=True)
class MeanAblation:
    """Each upstream node's output averaged over a dataset's clean prompts (per position with ``positional``).

    Attributes:
        positional: Average each position separately (``"mean-positional"``) instead of over all positions.
        mean: ``[n_up, pos, d_model]`` fitted means (``pos`` 1 without ``positional``); ``None`` until fitted.
        n_items: Items the means were fitted on.
    """

    positional: bool = False
    mean: Float[Tensor, "n_up pos d_model"] | None = None
    n_items: int = 0

    @property
    def name(self) -> str:
        return "mean-positional" if self.positional else "mean"

    def fit(self, model: Model, graph: EdgeGraph, tasks: Iterable[CircuitTask]) -> MeanAblation:
        """Average every upstream output over the real positions of the tasks' clean rows.

        Args:
            model: The model.
            graph: Its edge graph.
            tasks: Batches of items (streamed: one recording pass per batch).

        Returns:
            A fitted copy.

        Raises:
            EmptyDatasetError: no task.
        """
        total: Tensor | None = None
        count: Tensor | None = None
        n = 0
        for task in tasks:
            out = run_pass(model, graph, task, task.clean, items=torch.arange(task.n_items), record_upstream=True)
            assert out.upstream is not None
            real = task.real_positions().to(out.upstream.device)  # [b, pos]
            up = out.upstream.double() * real[:, None, :, None]
            s, c = up.sum(0), real.sum(0).double()  # [n_up, pos, d], [pos]
            if not self.positional:
                s, c = s.sum(1, keepdim=True), c.sum(0, keepdim=True)
            if total is None or count is None:
                total, count = s, c
            else:  # rows of different widths: grow to the longer one
                w = max(total.shape[1], s.shape[1])
                total = _grow(total, w) + _grow(s, w)
                count = _grow(count[None, :, None], w)[0, :, 0] + _grow(c[None, :, None], w)[0, :, 0]
            n += task.n_items
        if total is None or count is None:
            raise EmptyDatasetError("mean ablation needs at least one prompt to average over")
        mean = (total / count.clamp(min=1)[None, :, None]).to(model.dtype)
        return MeanAblation(self.positional, mean.cpu(), n)

    def run(self, model: Model, graph: EdgeGraph, task: CircuitTask) -> AblatedRun:
        """The fitted means broadcast to ``[item, n_up, pos, d_model]`` (a view; no copy).

        Args:
            model: The model (unused: the means are fitted).
            graph: The edge graph (unused: the means are fitted).
            task: The task whose items are ablated.

        Returns:
            An :class:`AblatedRun` whose ``upstream`` is the means (cut to the task's length when positional).

        Raises:
            InvalidConfigError: not fitted, or (positional) rows longer than any fitted prompt.
        """
        if self.mean is None:
            raise InvalidConfigError(f"ablation {self.name!r} must be fitted on a dataset first (fit_source)")
        n, pos = task.clean.shape
        m = self.mean.to(task.clean.device)
        if self.positional:
            if pos > m.shape[1]:
                raise InvalidConfigError(
                    f"mean-positional ablation was fitted on prompts of at most {m.shape[1]} tokens but this task "
                    f"has {pos}; fit it on the same dataset"
                )
            m = m[:, :pos]
        return AblatedRun(m[None].expand(n, -1, pos, -1))


def _grow(x: Tensor, width: int) -> Tensor:
    """Zero-pad dim 1 of ``x`` to ``width``."""
    if x.shape[1] == width:
        return x
    pad = torch.zeros(x.shape[0], width - x.shape[1], *x.shape[2:], dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], 1)


SOURCES: dict[str, AblationSource] = {
    "corrupt": CorruptedAblation(), "zero": ZeroAblation(), "mean": MeanAblation(),
    "mean-positional": MeanAblation(positional=True),
}


def fit_source(source: AblationSource, model: Model, graph: EdgeGraph, tasks: Iterable[CircuitTask]) -> AblationSource:
    """``source`` ready to run: a mean source fitted on ``tasks``, any other source as it is.

    Args:
        source: An ablation source.
        model: The model.
        graph: Its edge graph.
        tasks: The dataset's batches (only read by sources that need fitting).

    Returns:
        The source to call ``run`` on.
    """
    fit = getattr(source, "fit", None)
    return fit(model, graph, tasks) if fit is not None else source


def ablation_source(name: str) -> AblationSource:
    """The ablation source called ``name`` (``"corrupt"``, ``"zero"``, ``"mean"``, ``"mean-positional"``; mean ones unfitted).

    Args:
        name: A key of :data:`SOURCES`.

    Returns:
        The source.

    Raises:
        UnknownNameError: another name.
    """
    return SOURCES[check_choice("ablation", name, tuple(SOURCES), cli=None)]


__all__ = [
    "AblatedRun", "AblationSource", "CorruptedAblation", "MeanAblation", "SOURCES", "ZeroAblation", "ablation_source",
    "fit_source",
]
