"""Ablation sources: what a non-circuit edge carries instead of its upstream node's output.

EAP scores an edge by the change its upstream output would undergo (``ablated_u - clean_u``),
and a circuit-only run feeds every dropped edge the ablated output. Both take that output
from an :class:`AblationSource`: anything with a ``name`` and a ``run(model, graph, task)``
returning the ablated upstream outputs of every item (and the metric of the fully ablated run
when it comes for free). Two sources exist:

* ``"corrupt"`` (:class:`CorruptedAblation`): the outputs on the item's corrupted prompt
  (Yao et al.'s knowledge circuits, Hanna et al.'s EAP);
* ``"zero"`` (:class:`ZeroAblation`): zeros.

A new scheme (mean over a dataset, mean per position) is one more class and one more entry in
:data:`SOURCES`; scoring and evaluation stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice
from tlcap.errors import InvalidConfigError
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
        """The ablated upstream outputs of every item of ``task``."""
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


SOURCES: dict[str, AblationSource] = {"corrupt": CorruptedAblation(), "zero": ZeroAblation()}


def ablation_source(name: str) -> AblationSource:
    """The ablation source called ``name`` (``"corrupt"`` or ``"zero"``).

    Args:
        name: A key of :data:`SOURCES`.

    Returns:
        The source.

    Raises:
        UnknownNameError: another name.
    """
    return SOURCES[check_choice("ablation", name, tuple(SOURCES), cli=None)]


__all__ = ["AblatedRun", "AblationSource", "CorruptedAblation", "SOURCES", "ZeroAblation", "ablation_source"]
