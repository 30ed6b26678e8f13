"""The QL paper's Update edit (eq. 2): rewrite knowledge neurons' value vectors, reversibly.

``W_{l,p} ← W_{l,p} + c_{l,p}·δ`` with ``δ = −λ1·E(o) + λ2·E(o')`` for every knowledge neuron
``(l, p)``: ``W_{l,p}`` is the neuron's column of the MLP down projection (what it writes into the
residual stream), ``E`` the input embedding of the object's first token, ``o`` the old and ``o'``
the new object. Two rules for the coefficients ``c``:

- ``rule="paper"`` (QL eq. 2 as printed): ``c = 1``. At the query the KNs then write
  ``(Σ_p a_p)·δ`` more, ``a_p`` their activations. With GPT-2's GELU every KN has ``a_p ≥ 0`` and
  this is the intended push from ``o`` to ``o'``; on a gated MLP (SwiGLU) KNs with ``a_p < 0``
  write ``−δ`` and *reinforce* ``o``.
- ``rule="activation"`` (default, documented variant): ``c_p = a_p · Σ_q |a_q| / Σ_q a_q²`` — the
  smallest change of the columns (least squares) whose write at the query is ``(Σ_p |a_p|)·δ``,
  i.e. the paper's write had every activation been non-negative. The sign follows each neuron's
  activation at the query, and neurons barely active at the query are barely changed (so
  neurons that fire on every token do not flood the rest of the text). Both rules are the same
  when every activation is equal and positive.

Example:
    >>> acts = model.last_position_activations(model.to_tokens(q), mlp_post_names)[0][0]
    >>> with update_neurons(model, kns, old_id, new_id, activations=acts):
    ...     p_new = target_prob(model, q, " Rome")
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice
from tlcap.errors import InvalidConfigError
from tlcap.intervene.weights import WeightEdit
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model

UPDATE_RULES: tuple[str, ...] = ("activation", "paper")


def update_coefficients(
    neurons: NeuronSet, activations: Float[Tensor, "layer d_mlp"] | None, rule: str = "activation"
) -> dict[tuple[int, int], float]:
    """The coefficient ``c`` of ``δ`` added to each KN's value vector.

    Args:
        neurons: The knowledge neurons.
        activations: ``[n_layers, d_mlp]`` neuron activations at the query's last position
            (needed by ``rule="activation"``).
        rule: ``"activation"`` or ``"paper"`` (see the module docstring).

    Returns:
        ``{(layer, neuron): c}``.

    Raises:
        UnknownNameError: unknown rule.
        InvalidConfigError: ``rule="activation"`` without activations.
    """
    check_choice("update_rule", rule, UPDATE_RULES)
    if rule == "paper":
        return {n: 1.0 for n in neurons.neurons}
    if activations is None:
        raise InvalidConfigError("update rule 'activation' needs the KNs' activations at the query (activations=...)")
    a = torch.tensor([float(activations[l, p]) for l, p in neurons.neurons], dtype=torch.float64)
    sq = float((a * a).sum())
    if sq == 0.0:
        return {n: 0.0 for n in neurons.neurons}
    scale = float(a.abs().sum()) / sq
    return {n: float(x) * scale for n, x in zip(neurons.neurons, a.tolist())}


def update_neurons(
    model: Model,
    neurons: NeuronSet,
    old_id: int,
    new_id: int,
    lambda1: float = 2.0,
    lambda2: float = 2.0,
    *,
    rule: str = "paper",
    activations: Float[Tensor, "layer d_mlp"] | None = None,
) -> WeightEdit:
    """QL eq. 2 (Update): each KN's value vector ``W[:, p] += c_p·(−λ1·E(o) + λ2·E(o'))``.

    Args:
        model: The model (edited in place; undo with the returned edit or a ``with`` block).
        neurons: The knowledge neurons to edit.
        old_id: Token id of the old object (its first token).
        new_id: Token id of the new object.
        lambda1: Weight of the old object's embedding removed (paper: 2).
        lambda2: Weight of the new object's embedding added (paper: 2).
        rule: ``"paper"`` (``c = 1``, eq. 2 as printed; the default of this low-level function)
            or ``"activation"`` (``c`` from the activations at the query; the default of the
            modification experiment).
        activations: ``[n_layers, d_mlp]`` activations at the query's last position (``rule="activation"``).

    Returns:
        The applied :class:`~tlcap.intervene.weights.WeightEdit` (restores the weights bit for bit).

    Example:
        >>> with update_neurons(model, kns, model.target_ids(q, " Paris")[0], model.target_ids(q, " Rome")[0]):
        ...     ...
    """
    coef = update_coefficients(neurons, activations, rule)
    E = model.W_E.detach()
    delta = (-lambda1 * E[old_id] + lambda2 * E[new_id]).float()
    edit = WeightEdit()

    def fn(e: WeightEdit) -> None:
        for l, idx in neurons.by_layer().items():
            ws = model.mlp_out_weight(l)
            view = e.touch(ws.param).movedim(ws.neuron_dim, 0)
            ix = torch.tensor(idx, dtype=torch.long)
            c = torch.tensor([coef[(l, p)] for p in idx], dtype=torch.float32)
            view[ix] = view[ix] + (c[:, None] * delta[None].cpu()).to(device=view.device, dtype=view.dtype)

    return edit.apply(fn)


__all__ = ["UPDATE_RULES", "update_coefficients", "update_neurons"]
