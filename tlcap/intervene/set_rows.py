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
- **Update** (``writes=``, factor 1): the QL Update edit ``W[:, p] += c_p·δ`` of the down projection's
  columns (:func:`tlcap.intervene.update.update_neurons`) makes the MLP write ``(Σ_p a_p c_p)·δ`` more at every
  position, ``a_p`` the neurons' post-activations there; a row adds exactly that to its ``mlp_out``, so different
  rows carry different updates. Not for post-norm blocks (Gemma-2), whose ``mlp_out`` is after ``ln2_post``.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import InvalidConfigError, ShapeMismatchError
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import HookList, Model
from tlcap.runtime import hooks as H


@dataclass(frozen=True)
class SetFactors:
    """Per-set, per-neuron factors of the layers any set touches.

    Attributes:
        factors: Layer → ``[n_sets, d_mlp]`` multipliers (``factor`` at a set's neurons, 1 elsewhere).
        n_sets: Number of sets (a set may be empty: it changes nothing).
        writes: Layer → ``([n_sets, d_mlp] coefficients c, [n_sets, d_model] directions δ)``, float32: the MLP of
            a row of set ``k`` writes ``(Σ_p a_p c[k, p])·δ[k]`` more (an Update edit as rows; empty: none).
        touched: Layer → ``(scaled, written)``, host bool ``[n_sets]``: which sets change that layer's factors or
            write there, so :meth:`hooks` picks a batch's layers without reading device values (on a GPU each read
            waits for the queued work); empty: read ``factors`` / ``writes`` instead.
    """

    factors: dict[int, Tensor]
    n_sets: int
    writes: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    touched: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        model: Model,
        sets: Sequence[NeuronSet],
        factor: float | Sequence[float] = 0.0,
        writes: Sequence[tuple[Mapping[Any, Any], Float[Tensor, " d_model"]] | None] | None = None,
    ) -> SetFactors:
        """The factors of ``sets`` (each of the model's shape).

        Args:
            model: The model.
            sets: The neuron sets, one per set index.
            factor: Multiplier of a set's neurons (0 erases, 2 doubles), or one per set.
            writes: Per set ``None`` or an Update edit ``({(layer, neuron): c}, δ)`` as
                :func:`tlcap.intervene.update.update_write` returns it, or ``({layer: [d_mlp] c}, δ)`` (a rank-one
                update ``W += δ ⊗ c`` of that layer's down projection, e.g. ROME's); give that set the factor 1.

        Returns:
            The :class:`SetFactors`.

        Raises:
            ShapeMismatchError: a set of another model's shape, or not one factor / write per set.
            InvalidConfigError: writes on a model with post-norm blocks.

        Example:
            >>> from tlcap.intervene.update import update_neurons, update_write
            >>> kns = NeuronSet(((0, 250), (1, 192)), shape=(model.n_layers, model.d_mlp))
            >>> edit = update_write(model, kns, 11, 22)
            >>> plan = SetFactors.of(model, [kns, kns], factor=[0.0, 1.0], writes=[None, edit])   # erase, update
            >>> toks = model.to_tokens("The capital of France is").expand(2, -1)
            >>> rows = model.logits(toks, hooks=plan.hooks(model, torch.arange(2)))
            >>> with update_neurons(model, kns, 11, 22):                   # the weight edit of row 1
            ...     torch.allclose(rows[1], model.logits(toks[:1])[0], atol=1e-4)
            True
        """
        shape = (model.n_layers, model.d_mlp)
        out: dict[int, Tensor] = {}
        per = [float(factor)] * len(sets) if isinstance(factor, (int, float)) else [float(f) for f in factor]
        if len(per) != len(sets):
            raise ShapeMismatchError(f"{len(per)} factors for {len(sets)} neuron sets; give one factor or one per set")
        S = len(sets)
        scaled: dict[int, Tensor] = {}
        for k, ns in enumerate(sets):
            if tuple(ns.shape) != shape:
                raise ShapeMismatchError(f"neuron set {k} has shape {tuple(ns.shape)}, the model {shape}; use sets "
                                         "located on this model")
            for l, idx in ns.by_layer().items():
                if per[k] == 1.0 or not idx:
                    continue
                if l not in out:
                    out[l] = torch.ones(S, model.d_mlp, dtype=model.dtype, device=model.device)
                    scaled[l] = torch.zeros(S, dtype=torch.bool)
                out[l][k, idx] = per[k]
                scaled[l][k] = True
        w, written = _writes(model, S, writes)
        none = torch.zeros(S, dtype=torch.bool)
        touched = {l: (scaled.get(l, none), written.get(l, none)) for l in sorted(set(out) | set(w))}
        return cls(dict(sorted(out.items())), S, w, touched)

    def __len__(self) -> int:
        return self.n_sets

    @property
    def first_layer(self) -> int | None:
        """The lowest layer any set touches (``None``: every set is empty)."""
        layers = set(self.factors) | set(self.writes)
        return min(layers) if layers else None

    def hooks(self, model: Model, row_set: Int[Tensor, " rows"], pos: H.Index = None,
              starts: Int[Tensor, " rows"] | None = None) -> HookList:
        """Hooks giving batch row ``r`` the factors of set ``row_set[r]`` at ``pos`` (default: every position).

        Layers where no row of this batch changes anything get no hook.

        Args:
            model: The model (names the sites).
            row_set: The set index of each batch row.
            pos: Positions scaled (see :mod:`tlcap.runtime.hooks`).
            starts: Instead of ``pos``, row ``r`` is scaled from position ``starts[r]`` on
                (:func:`tlcap.runtime.hooks.scale_rows`; factors only, not writes).

        Returns:
            A hook list for ``model.logits(..., hooks=...)`` or ``model.hooks(...)``.

        Raises:
            InvalidConfigError: ``starts`` with writes.
        """
        if starts is not None and self.writes:
            raise InvalidConfigError("per-row start positions (starts=) scale neurons only; these sets carry writes")
        out = []
        on_host = row_set.cpu()
        for l in sorted(set(self.factors) | set(self.writes)):
            f = self.factors.get(l)
            rows = f[row_set.to(f.device)] if f is not None else None
            hit = self.touched.get(l)
            if rows is None:
                scale = None
            elif hit is not None:  # which sets change what: known on the host
                scale = H.scale_rows(rows, pos, starts) if bool(hit[0][on_host].any()) else None
            else:
                scale = H.scale_rows(rows, pos, starts) if bool((rows != 1).any()) else None
            if l in self.writes:
                coef, delta = (w[row_set.to(w.device)] for w in self.writes[l])
                if bool(hit[1][on_host].any()) if hit is not None else bool((coef != 0).any()):
                    out += _write_hooks(model, l, scale, coef, delta, pos)
                    continue
            if scale is not None:
                out.append((model.hook_name("mlp_post", l), scale))
        return out


def _writes(model: Model, n_sets: int,
            writes: Sequence[Any] | None) -> tuple[dict[int, tuple[Tensor, Tensor]], dict[int, Tensor]]:
    """Layer → ``([n_sets, d_mlp] c, [n_sets, d_model] δ)`` of the sets' Update edits (module docstring), and layer →
    host bool ``[n_sets]``: the sets that write there."""
    if not writes or all(w is None for w in writes):
        return {}, {}
    if len(writes) != n_sets:
        raise ShapeMismatchError(f"{len(writes)} writes for {n_sets} neuron sets; give one (or None) per set")
    if model.post_norm_blocks:
        raise InvalidConfigError(f"{model.name} normalises the MLP's output (post-norm blocks): an Update edit as rows "
                                 "would add after that norm; edit the weights (update_neurons) instead")
    out: dict[int, tuple[Tensor, Tensor]] = {}
    written: dict[int, Tensor] = {}
    for k, w in enumerate(writes):
        if w is None:
            continue
        coef, delta = w
        for key, c in coef.items():
            l, p = (key, slice(None)) if isinstance(key, int) else key  # a layer's dense coefficients, or one neuron's
            if l not in out:
                out[l] = (torch.zeros(n_sets, model.d_mlp, device=model.device),
                          torch.zeros(n_sets, model.d_model, device=model.device))
                written[l] = torch.zeros(n_sets, dtype=torch.bool)
            out[l][0][k, p] = c.to(out[l][0]) if isinstance(c, Tensor) else float(c)
            out[l][1][k] = delta.to(out[l][1])
            written[l][k] = True
    return dict(sorted(out.items())), written


def _write_hooks(model: Model, layer: int, scale: Any, coef: Tensor, delta: Tensor, pos: H.Index) -> HookList:
    """Hooks of one layer: ``mlp_post`` scaled (``scale``, optional) and kept, ``mlp_out`` += ``(a·c[row])·δ[row]``."""
    box: dict[str, Tensor] = {}

    def post(act: Tensor, hook: Any = None) -> Tensor:
        out = scale(act) if scale is not None else act
        box["a"] = out
        return out

    def write(out: Tensor, hook: Any = None) -> Tensor:
        a = box.pop("a")
        if a.shape[0] != coef.shape[0]:
            raise ShapeMismatchError(f"an Update write has {coef.shape[0]} rows for a batch of {a.shape[0]}")
        add = ((a.float() * coef.to(a.device)[:, None, :]).sum(-1, keepdim=True) * delta.to(a.device)[:, None, :])
        res, p = out.clone(), H.position_index(pos)
        res[:, p] += add[:, p].to(out.dtype)
        return res

    return [(model.hook_name("mlp_post", layer), post), (model.hook_name("mlp_out", layer), write)]


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
