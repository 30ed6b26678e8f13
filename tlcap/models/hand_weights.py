"""Weights written by hand: views of a model's parameters in TransformerLens orientation.

Planted ground-truth models (:mod:`tlcap.testing.planted`) wire chosen heads and MLP neurons by
writing weights. They need the parameters in one convention whatever the backend stores:
TransformerLens' ``x @ W`` orientation (``W_Q`` is ``[d_model, d_head]``, ``W_O`` is
``[d_head, d_model]``, ``W_in`` is ``[d_model, d_mlp]``, ``W_out`` is ``[d_mlp, d_model]``). The
views here write through to the model's parameters (HF ``Linear`` weights are ``[out, in]`` and
are transposed; ``Conv1D`` weights are already ``[in, out]``).

Example (on a model of its own: the writes change its weights):
    >>> from tlcap.models import make_gpt2
    >>> planted = make_gpt2("tiny", seed=0)
    >>> hw = hand_weights(planted)
    >>> head = hw.head(0, 1)
    >>> tuple(head.W_K.shape), tuple(head.W_O.shape)      # [d_model, d_head], [d_head, d_model]
    ((64, 16), (16, 64))
    >>> head.W_K[5, 0] = 1.0          # head 1 of layer 0 keys on residual dimension 5
    >>> hw.mlp(1).W_out[17, 9] = 0.5  # neuron 17 of layer 1 writes dimension 9
    >>> hand_weights(planted).head(0, 1).W_K[5, 0].item(), planted.mlp_out_weight(1).neuron_view()[17, 9].item()
    (1.0, 0.5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxtyping import Float
from torch import Tensor

from tlcap.errors import UnsupportedModelError
from tlcap.models.adapter import Model


@dataclass(frozen=True)
class HeadWeights:
    """One attention head's parameters (views; TransformerLens orientation).

    Attributes:
        W_Q, W_K, W_V: ``[d_model, d_head]`` projections of the (normalised) residual.
        b_Q, b_K, b_V: ``[d_head]`` biases.
        W_O: ``[d_head, d_model]`` output projection of this head.
    """

    W_Q: Float[Tensor, "d_model d_head"]
    b_Q: Float[Tensor, " d_head"]
    W_K: Float[Tensor, "d_model d_head"]
    b_K: Float[Tensor, " d_head"]
    W_V: Float[Tensor, "d_model d_head"]
    b_V: Float[Tensor, " d_head"]
    W_O: Float[Tensor, "d_head d_model"]

    def zero_(self) -> None:
        """Set every parameter of the head to 0 (the head then writes nothing)."""
        for t in (self.W_Q, self.b_Q, self.W_K, self.b_K, self.W_V, self.b_V, self.W_O):
            t.zero_()


@dataclass(frozen=True)
class MLPWeights:
    """One layer's MLP parameters (views; TransformerLens orientation).

    Attributes:
        W_in: ``[d_model, d_mlp]``: column ``j`` is what neuron ``j`` reads.
        b_in: ``[d_mlp]`` input biases.
        W_out: ``[d_mlp, d_model]``: row ``j`` is what neuron ``j`` writes.
    """

    W_in: Float[Tensor, "d_model d_mlp"]
    b_in: Float[Tensor, " d_mlp"]
    W_out: Float[Tensor, "d_mlp d_model"]


def _tl(module: Any) -> Tensor:
    """The weight of an HF ``Linear`` (``[out, in]``) or ``Conv1D`` (``[in, out]``) as ``[in, out]`` data."""
    w = module.weight.data
    return w if type(module).__name__ == "Conv1D" else w.T


def _component(obj: Any) -> Any:
    return getattr(obj, "_original_component", obj)


class HandWeights:
    """Write access to a GPT-2-architecture ``TransformerBridge`` model's weights (module docstring).

    Args:
        model: A :class:`Model` of architecture ``gpt2`` on the TransformerBridge backend.

    Raises:
        UnsupportedModelError: another architecture or backend.
    """

    def __init__(self, model: Model):
        if model.architecture != "gpt2" or not model.is_bridge:
            raise UnsupportedModelError(
                f"hand-written weights are mapped for GPT-2 TransformerBridge models only, got {model.architecture!r}"
            )
        self.model = model
        self._backend = model.backend

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        """Token embeddings (GPT-2 ties them to the unembedding: ``W_U = W_E.T``)."""
        return self.model.W_E.data

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """The unembedding (a view of the tied ``W_E``)."""
        return self.model.W_U.data

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        """Learned position embeddings."""
        return _component(self._backend.pos_embed).weight.data

    def head(self, layer: int, head: int) -> HeadWeights:
        """The parameters of ``head`` in ``layer``.

        Args:
            layer: The layer.
            head: The head.

        Returns:
            The head's :class:`HeadWeights` (views: writes change the model).
        """
        attn = self._backend.blocks[layer].attn
        dh = self.model.d_head
        sl = slice(head * dh, (head + 1) * dh)
        parts = {}
        for letter in "qkv":
            mod = _component(getattr(attn, letter))
            parts[f"W_{letter.upper()}"] = _tl(mod)[:, sl]
            parts[f"b_{letter.upper()}"] = mod.bias.data[sl]
        return HeadWeights(W_O=_tl(_component(attn.o))[sl, :], **parts)

    def mlp(self, layer: int) -> MLPWeights:
        """The MLP parameters of ``layer``.

        Args:
            layer: The layer.

        Returns:
            The layer's :class:`MLPWeights` (views: writes change the model).
        """
        ins = self.model.mlp_in_weights(layer)
        w_in = next(s for s in ins if s.role == "in").neuron_view().T
        b_in = next(s for s in ins if s.role == "bias").neuron_view()
        return MLPWeights(W_in=w_in, b_in=b_in, W_out=self.model.mlp_out_weight(layer).neuron_view())


def hand_weights(model: Model) -> HandWeights:
    """:class:`HandWeights` of ``model`` (see the module docstring).

    Args:
        model: The model.

    Returns:
        A :class:`HandWeights` whose views write through to ``model``.
    """
    return HandWeights(model)


__all__ = ["HandWeights", "HeadWeights", "MLPWeights", "hand_weights"]
