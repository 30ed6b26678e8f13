"""The QL paper's Update edit (eq. 2): rewrite knowledge neurons' value vectors, reversibly.

``W_{l,p} ← W_{l,p} − λ1·E(o) + λ2·E(o')`` for every knowledge neuron ``(l, p)``: ``W_{l,p}`` is the
neuron's column of the MLP down projection (what it writes into the residual stream), ``E`` the
input embedding of the object's first token, ``o`` the old and ``o'`` the new object.

Example:
    >>> with update_neurons(model, kns, old_id, new_id):
    ...     p_new = target_prob(model, "The capital of France is", " Rome")
"""

from __future__ import annotations

import torch

from tlcap.intervene.weights import WeightEdit
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model


def update_neurons(
    model: Model,
    neurons: NeuronSet,
    old_id: int,
    new_id: int,
    lambda1: float = 2.0,
    lambda2: float = 2.0,
) -> WeightEdit:
    """QL eq. 2 (Update): each KN's value vector ``W[:, p] += −λ1·E(o) + λ2·E(o')``.

    Args:
        model: The model (edited in place; undo with the returned edit or a ``with`` block).
        neurons: The knowledge neurons to edit.
        old_id: Token id of the old object (its first token).
        new_id: Token id of the new object.
        lambda1: Weight of the old object's embedding removed (paper: 2).
        lambda2: Weight of the new object's embedding added (paper: 2).

    Returns:
        The applied :class:`~tlcap.intervene.weights.WeightEdit` (restores the weights bit for bit).

    Example:
        >>> with update_neurons(model, kns, model.target_ids(q, " Paris")[0], model.target_ids(q, " Rome")[0]):
        ...     ...
    """
    E = model.W_E.detach()
    delta = (-lambda1 * E[old_id] + lambda2 * E[new_id]).float()
    edit = WeightEdit()

    def fn(e: WeightEdit) -> None:
        for l, idx in neurons.by_layer().items():
            ws = model.mlp_out_weight(l)
            view = e.touch(ws.param).movedim(ws.neuron_dim, 0)
            ix = torch.tensor(idx, dtype=torch.long)
            view[ix] = view[ix] + delta.to(view.dtype)[None]

    return edit.apply(fn)


__all__ = ["update_neurons"]
