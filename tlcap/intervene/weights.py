"""Weight interventions with exact undo: erase neurons, and a general edit handle.

Every edit snapshots the parameters it touches before changing them; ``undo()`` (or leaving
the ``with`` block, also by an exception) copies the snapshots back bit for bit, so nothing leaks
into later calls. An edit whose function raises half-way is undone before the error propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model, WeightSlice


class WeightEdit:
    """A reversible set of in-place parameter edits.

    Example:
        >>> from tlcap.metrics import target_prob
        >>> neurons = NeuronSet(((0, 250), (1, 192)), shape=(model.n_layers, model.d_mlp))
        >>> w = model.mlp_out_weight(1).neuron_view().clone()
        >>> with erase_neurons(model, neurons):
        ...     p = target_prob(model, "The capital of France is", " Paris")
        ...     model.mlp_out_weight(1).neuron_view()[192].abs().sum().item()
        0.0
        >>> torch.equal(model.mlp_out_weight(1).neuron_view(), w)      # weights restored exactly here
        True
    """

    def __init__(self, *, host: bool = False) -> None:
        """Args:
            host: Keep the snapshots of parameters on an accelerator in host memory (fine-tuning: the snapshot of
                every MLP matrix would otherwise take device memory for the whole run; copied once each way).
        """
        self._saved: dict[int, tuple[torch.nn.Parameter, Tensor]] = {}
        self.active = True
        self.meta: dict = {}
        self.host = host

    def touch(self, param: torch.nn.Parameter) -> Tensor:
        """Snapshot ``param`` (once) and return its data for in-place editing.

        Args:
            param: A parameter about to be edited in place (its original data is kept for the undo).

        Returns:
            ``param.data`` (the live tensor, not a copy).
        """
        if id(param) not in self._saved:
            on_host = self.host and param.device.type not in ("cpu", "meta")
            self._saved[id(param)] = (param, param.data.to("cpu", copy=True) if on_host else param.data.clone())
        return param.data

    def apply(self, fn: Callable[[WeightEdit], None]) -> WeightEdit:
        """Run ``fn(self)`` without gradients; if it raises, every touched parameter is restored first.

        Args:
            fn: Edits parameters through :meth:`touch`.

        Returns:
            ``self``.
        """
        try:
            with torch.no_grad():
                fn(self)
        except BaseException:
            self.undo()
            raise
        return self

    def undo(self) -> None:
        """Restore every touched parameter exactly."""
        with torch.no_grad():
            for param, data in self._saved.values():
                param.data.copy_(data)
        self._saved.clear()
        self.active = False

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for p, _ in self._saved.values()]

    def __enter__(self) -> WeightEdit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _set_neurons(edit: WeightEdit, ws: WeightSlice, idx: list[int], value: float | Tensor) -> None:
    data = edit.touch(ws.param)
    view = data.movedim(ws.neuron_dim, 0)
    view[torch.tensor(idx, dtype=torch.long)] = value


def erase_neurons(
    model: Model,
    neurons: NeuronSet | Iterable[tuple[int, int]],
    include_input: bool = False,
    edit: WeightEdit | None = None,
) -> WeightEdit:
    """Zero the located neurons' down-projection rows (their write into the residual).

    Args:
        model: The model (edited in place, reversibly).
        neurons: The neurons to erase.
        include_input: Also zero their input weights/biases (the neuron then never fires).
        edit: An existing :class:`WeightEdit` to record into (default a new one).

    Returns:
        The edit; ``undo()`` or leaving ``with`` restores the weights exactly.

    Example:
        >>> from tlcap.data.tasks import load_task
        >>> from tlcap.metrics.accuracy import task_accuracy
        >>> test = load_task("emotion", split="test", n=4)
        >>> located = NeuronSet(((0, 1), (1, 2)), shape=(model.n_layers, model.d_mlp))
        >>> with erase_neurons(model, located):
        ...     acc = task_accuracy(model, "emotion", test)
        >>> acc.metric, len(acc.scores)
        ('label by likelihood', 4)
    """
    ns = neurons if isinstance(neurons, NeuronSet) else NeuronSet.from_list(neurons, (model.n_layers, model.d_mlp))
    edit = edit if edit is not None else WeightEdit()

    def fn(e: WeightEdit) -> None:
        for l, idx in ns.by_layer().items():
            _set_neurons(e, model.mlp_out_weight(l), idx, 0.0)
            if include_input:
                for ws in model.mlp_in_weights(l):
                    _set_neurons(e, ws, idx, 0.0)

    return edit.apply(fn)
