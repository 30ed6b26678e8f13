"""Many neuron sets in one forward pass: each batch row scales its own set's neurons.

A batch whose rows are ``(set, item)`` pairs carries one intervention per row through a per-row
factor on the ``mlp_post`` site (:func:`tlcap.runtime.hooks.scale_rows`): row ``r`` multiplies
the neurons of set ``row_set[r]`` by ``factor`` and leaves every other neuron unchanged.

- **Erase** (``factor=0``, every position): a neuron's post-activation is the input of the down
  projection, so zeroing it at every position removes exactly its down-projection row's write —
  the same model as :func:`tlcap.intervene.weights.erase_neurons` (``include_input=False``; with
  ``include_input=True`` the neuron's activation is ``act(0) = 0`` as well, for GELU/SiLU
  families), without editing any weight, so different rows erase different sets.
- **Enhance / suppress at the scored positions** (``factor=2`` / ``0``): the batched form of
  :func:`tlcap.intervene.activations.scale_neurons` when the hooked run holds only the scored
  positions (a cached prefix before them).

Example:
    >>> located = NeuronSet(((0, 5), (1, 9)), shape=(model.n_layers, model.d_mlp))
    >>> randoms = [located.random_like(seed=s) for s in range(2)]
    >>> items = torch.cat([model.to_tokens("The capital of France is"), model.to_tokens("The capital of Italy is")])
    >>> plan = SetFactors.of(model, [located, *randoms], factor=0.0)
    >>> n_items = len(items)
    >>> rows = torch.arange(len(plan)).repeat_interleave(n_items)       # set-major rows
    >>> rows.tolist()
    [0, 0, 1, 1, 2, 2]
    >>> tokens = items.repeat(len(plan), 1)                             # row r: item r % n_items
    >>> logits = model.logits(tokens, hooks=plan.hooks(model, rows))
    >>> from tlcap.intervene.weights import erase_neurons
    >>> with erase_neurons(model, located):                             # the same model as rows 0-1
    ...     torch.allclose(logits[:2], model.logits(items), atol=1e-5)
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from tlcap.errors import ShapeMismatchError
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import HookList, Model
from tlcap.runtime import hooks as H


@dataclass(frozen=True)
class SetFactors:
    """Per-set, per-neuron factors of the layers any set touches.

    Attributes:
        factors: Layer → ``[n_sets, d_mlp]`` multipliers (``factor`` at a set's neurons, 1 elsewhere).
        n_sets: Number of sets (a set may be empty: it changes nothing).
    """

    factors: dict[int, Tensor]
    n_sets: int

    @classmethod
    def of(cls, model: Model, sets: Sequence[NeuronSet], factor: float | Sequence[float] = 0.0) -> SetFactors:
        """The factors of ``sets`` (each of the model's shape).

        Args:
            model: The model.
            sets: The neuron sets, one per set index.
            factor: Multiplier of a set's neurons (0 erases, 2 doubles), or one per set.

        Returns:
            The :class:`SetFactors`.

        Raises:
            ShapeMismatchError: a set of another model's shape.
        """
        shape = (model.n_layers, model.d_mlp)
        out: dict[int, Tensor] = {}
        per = [float(factor)] * len(sets) if isinstance(factor, (int, float)) else [float(f) for f in factor]
        if len(per) != len(sets):
            raise ShapeMismatchError(f"{len(per)} factors for {len(sets)} neuron sets; give one factor or one per set")
        for k, ns in enumerate(sets):
            if tuple(ns.shape) != shape:
                raise ShapeMismatchError(f"neuron set {k} has shape {tuple(ns.shape)}, the model {shape}; use sets "
                                         "located on this model")
            for l, idx in ns.by_layer().items():
                if l not in out:
                    out[l] = torch.ones(len(sets), model.d_mlp, dtype=model.dtype, device=model.device)
                out[l][k, idx] = per[k]
        return cls(dict(sorted(out.items())), len(sets))

    def __len__(self) -> int:
        return self.n_sets

    @property
    def first_layer(self) -> int | None:
        """The lowest layer any set touches (``None``: every set is empty)."""
        return min(self.factors) if self.factors else None

    def hooks(self, model: Model, row_set: Int[Tensor, " rows"], pos: H.Index = None) -> HookList:
        """Hooks giving batch row ``r`` the factors of set ``row_set[r]`` at ``pos`` (default: every position).

        Layers where no row of this batch changes anything get no hook.

        Args:
            model: The model (names the sites).
            row_set: The set index of each batch row.
            pos: Positions scaled (see :mod:`tlcap.runtime.hooks`).

        Returns:
            A hook list for ``model.logits(..., hooks=...)`` or ``model.hooks(...)``.
        """
        out = []
        for l, f in self.factors.items():
            rows = f[row_set.to(f.device)]
            if bool((rows != 1).any()):
                out.append((model.hook_name("mlp_post", l), H.scale_rows(rows, pos)))
        return out


def set_major_rows(n_sets: int, per_set: int) -> Int[Tensor, " rows"]:
    """Set index of each row of a set-major batch: ``[0]*per_set + [1]*per_set + ...``.

    Args:
        n_sets: Number of sets.
        per_set: Rows of each set.

    Returns:
        ``[n_sets * per_set]`` int64 set indices.
    """
    return torch.arange(n_sets).repeat_interleave(per_set)


__all__ = ["SetFactors", "set_major_rows"]
