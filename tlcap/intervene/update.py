"""The QL paper's Update edit (eq. 2): rewrite knowledge neurons' value vectors, reversibly.

``W_{l,p} ← W_{l,p} + c_{l,p}·δ`` with ``δ = −λ1·E(o) + λ2·E(o')`` for every knowledge neuron
``(l, p)``: ``W_{l,p}`` is the neuron's column of the MLP down projection (what it writes into the
residual stream), ``E`` the input embedding of the object's first token, ``o`` the old and ``o'``
the new object. Two rules for the coefficients ``c``:

- ``rule="paper"`` (QL eq. 2 as printed): ``c = 1``. At the query the KNs then write
  ``(Σ_p a_p)·δ`` more, ``a_p`` their activations. With GPT-2's GELU every KN has ``a_p ≥ 0`` and
  this is the intended push from ``o`` to ``o'``; on a gated MLP (SwiGLU) KNs with ``a_p < 0``
  write ``−δ`` and *reinforce* ``o``.
- ``rule="activation"`` (default of the modification experiment; documented variant): the KNs
  write, at the query, ``ρ·δ`` with ``ρ = size·‖Σ_p a_p W_p‖ / ‖δ‖`` — an added write as large as
  ``size`` times what the KNs write at the query now (default ``size = 1``), pointing along the
  paper's ``δ``. Rescaled this way, λ1 and λ2 only set the direction (their ratio); their size,
  which the paper chose for GPT-2's embedding scale, drops out. Among the column changes ``c_p·δ``
  that write ``ρ·δ`` at the query the smallest (least squares) is ``c_p = ρ·a_p / Σ_q a_q²``: the
  sign follows each neuron's activation at the query (a KN with ``a_p < 0`` gets ``−δ``, which it
  turns into ``+δ``), and neurons barely active at the query are barely changed. The literal
  write ``(Σ_p a_p)·δ`` is sized by the object embeddings, not by the model's activations: on
  SmolLM2 (SwiGLU) it is many times the KNs' own output, and the neurons that fire on most tokens
  then push ``o'`` everywhere (perplexity ×10³–10⁸); ``ρ`` ties the write to the KNs' own scale.

Example:
    >>> from tlcap.metrics import target_prob
    >>> q = "The capital of France is"
    >>> kns = tlcap.integrated_gradients(model, q, " Paris", steps=2).select(threshold=0.5)
    >>> old_id, new_id = model.target_ids(q, " Paris")[0], model.target_ids(q, " Rome")[0]
    >>> mlp_post_names = [model.hook_name("mlp_post", l) for l in range(model.n_layers)]
    >>> acts = model.last_position_activations(model.to_tokens(q), mlp_post_names)[0][0]   # [n_layers, d_mlp]
    >>> p_old = target_prob(model, q, " Rome")
    >>> with update_neurons(model, kns, old_id, new_id, rule="activation", activations=acts):
    ...     p_new = target_prob(model, q, " Rome")
    >>> p_new > p_old, target_prob(model, q, " Rome") == p_old       # weights restored after the block
    (True, True)
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
    neurons: NeuronSet,
    activations: Float[Tensor, "layer d_mlp"] | None,
    rule: str = "activation",
    write_scale: float | None = None,
) -> dict[tuple[int, int], float]:
    """The coefficient ``c`` of ``δ`` added to each KN's value vector.

    Args:
        neurons: The knowledge neurons.
        activations: ``[n_layers, d_mlp]`` neuron activations at the query's last position
            (needed by ``rule="activation"``).
        rule: ``"activation"`` or ``"paper"`` (see the module docstring).
        write_scale: ``ρ`` of ``rule="activation"``: the KNs then write ``ρ·δ`` at the query
            (:func:`update_neurons` passes ``size·‖Σ_p a_p W_p‖ / ‖δ‖``).

    Returns:
        ``{(layer, neuron): c}``.

    Raises:
        UnknownNameError: unknown rule.
        InvalidConfigError: ``rule="activation"`` without activations or write_scale.
    """
    check_choice("update_rule", rule, UPDATE_RULES)
    if rule == "paper":
        return {n: 1.0 for n in neurons.neurons}
    if activations is None or write_scale is None:
        raise InvalidConfigError("update rule 'activation' needs the KNs' activations at the query (activations=...) "
                                 "and the write scale (write_scale=...; update_neurons computes it)")
    a = torch.tensor([float(activations[l, p]) for l, p in neurons.neurons], dtype=torch.float64)
    sq = float((a * a).sum())
    if sq == 0.0:
        return {n: 0.0 for n in neurons.neurons}
    return {n: float(x) * float(write_scale) / sq for n, x in zip(neurons.neurons, a.tolist())}


def kn_write(model: Model, neurons: NeuronSet, activations: Float[Tensor, "layer d_mlp"]) -> Float[Tensor, " d_model"]:
    """What the KNs write into the residual stream at the query: ``Σ_p a_p W_p`` (float32).

    Args:
        model: The model.
        neurons: The knowledge neurons.
        activations: ``[n_layers, d_mlp]`` activations at the query's last position.

    Returns:
        ``[d_model]`` the summed writes of the KNs' value vectors.
    """
    out = torch.zeros(model.d_model, dtype=torch.float32)
    for l, idx in neurons.by_layer().items():
        ws = model.mlp_out_weight(l)
        cols = ws.param.detach().movedim(ws.neuron_dim, 0)[torch.tensor(idx, dtype=torch.long)].float().cpu()
        out += (activations[l, idx].float().cpu()[:, None] * cols).sum(0)
    return out


def update_write(
    model: Model,
    neurons: NeuronSet,
    old_id: int,
    new_id: int,
    lambda1: float = 2.0,
    lambda2: float = 2.0,
    *,
    rule: str = "paper",
    activations: Float[Tensor, "layer d_mlp"] | None = None,
    size: float = 1.0,
) -> tuple[dict[tuple[int, int], float], Float[Tensor, " d_model"]]:
    """The Update edit as numbers: each KN's coefficient ``c_p`` and the direction ``δ`` (float32).

    :func:`update_neurons` adds ``c_p·δ`` to each KN's value vector; the same edit as rows of one pass
    (:class:`tlcap.intervene.set_rows.SetFactors` with ``writes=``) adds ``(Σ_p a_p c_p)·δ`` to the MLP's output.

    Args:
        model, neurons, old_id, new_id, lambda1, lambda2, rule, activations, size: As in :func:`update_neurons`.

    Returns:
        ``({(layer, neuron): c}, δ [d_model])``.

    Example:
        >>> kns = NeuronSet(((0, 250), (1, 192)), shape=(model.n_layers, model.d_mlp))
        >>> coef, delta = update_write(model, kns, 11, 22, lambda1=1.0, lambda2=3.0)
        >>> coef, torch.allclose(delta, 3 * model.W_E[22] - model.W_E[11])
        ({(0, 250): 1.0, (1, 192): 1.0}, True)
    """
    E = model.W_E.detach()
    delta = (-lambda1 * E[old_id] + lambda2 * E[new_id]).float()
    scale = None
    if rule == "activation" and activations is not None:
        norm = float(delta.norm())
        scale = float(size) * float(kn_write(model, neurons, activations).norm()) / norm if norm > 0 else 0.0
    return update_coefficients(neurons, activations, rule, scale), delta


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
    size: float = 1.0,
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
        size: ``rule="activation"``: the added write at the query, in units of the KNs' own output
            there (``‖Σ_p a_p W_p‖``); ``1`` = as large as what they write now.

    Returns:
        The applied :class:`~tlcap.intervene.weights.WeightEdit` (restores the weights bit for bit).

    Example:
        >>> from tlcap.metrics import target_prob
        >>> q = "The capital of France is"
        >>> kns = NeuronSet(((0, 250), (1, 192)), shape=(model.n_layers, model.d_mlp))
        >>> with update_neurons(model, kns, model.target_ids(q, " Paris")[0], model.target_ids(q, " Rome")[0]) as edit:
        ...     edit.active, target_prob(model, q, " Rome") > target_prob(model, q, " Paris")
        (True, True)
        >>> edit.active
        False
    """
    coef, delta = update_write(model, neurons, old_id, new_id, lambda1, lambda2, rule=rule, activations=activations,
                               size=size)
    edit = WeightEdit()

    def fn(e: WeightEdit) -> None:
        for l, idx in neurons.by_layer().items():
            ws = model.mlp_out_weight(l)
            view = e.touch(ws.param).movedim(ws.neuron_dim, 0)
            ix = torch.tensor(idx, dtype=torch.long)
            c = torch.tensor([coef[(l, p)] for p in idx], dtype=torch.float32)
            view[ix] = view[ix] + (c[:, None] * delta[None].cpu()).to(device=view.device, dtype=view.dtype)

    return edit.apply(fn)


__all__ = ["UPDATE_RULES", "kn_write", "update_coefficients", "update_neurons", "update_write"]
