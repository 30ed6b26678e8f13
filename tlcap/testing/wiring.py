"""The weight surgery behind planted models: a mover head, gated MLP neurons and a read-out.

Every piece writes weights of a GPT-2-architecture model through
:class:`tlcap.models.hand_weights.HandWeights` (TransformerLens orientation, ``x @ W``), using
residual dimensions reserved for the purpose. How a planted fact travels (for prompt
``"The capital of France is"``):

1. **Scaffold.** Every position embedding gets a constant ``c`` on one reserved dimension
   ``one``. LayerNorm divides by the residual's spread; without a dominant component it would
   blow the random embeddings' small entries (std 0.02) up to unit size and every reserved
   dimension would read noise. With it, a reserved dimension of an ordinary token reads
   about ``-0.1 ± 0.2`` after LayerNorm, and a marked one about ``+5``.
2. **Marks.** The subject token's embedding gets 1 on a shared ``key`` dimension and a code on
   its own ``subject`` dimensions.
3. **Mover head** (layer ``h_l``, head ``h``; all its other weights zeroed). Its query is a
   constant (``b_Q``), its key reads ``key``: every later position attends to the marked token
   (softmax weight > 0.99). Its value/output map copies the subject code into ``moved``
   dimensions of the attending position.
4. **Gated neurons** (layer ``L > h_l``; their other weights zeroed). Neuron ``j`` reads one
   ``moved`` direction, ``pre_j = w_j · (LN(x)·r_j − θ)``: off (GELU of about ``−θ w_j``) unless the
   code is there, on (about ``(5 − θ) w_j``) when it is. It writes ``u_j`` along an ``answer``
   dimension.
5. **Read-out.** The target token's (tied) embedding gets ``E`` on the ``answer`` dimension, so
   the final LayerNorm's large ``answer`` component becomes a large target logit.

Everything else keeps its random initialisation. Zeroing the gated neurons' activations removes
the ``answer`` component and with it the target's logit; random neurons of the same layer write
only their random (std ≈ 0.02/√(2·n_layers)) rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tlcap.models.hand_weights import HandWeights

QUERY_GAIN = 4.0  # constant query: attention score ≈ QUERY_GAIN · LN(x)[key] / sqrt(d_head)


def scaffold(hw: HandWeights, dim: int, value: float = 1.0) -> None:
    """Add ``value`` to dimension ``dim`` of every position embedding (see the module docstring).

    Args:
        hw: The weights (edited in place).
        dim: The residual dimension.
        value: Added to that dimension of every position.
    """
    hw.W_pos[:, dim] += value


def mark_token(hw: HandWeights, token: int, values: dict[int, float]) -> None:
    """Set ``W_E[token, d] = v`` for each ``d: v`` of ``values``.

    Args:
        hw: The weights (edited in place).
        token: The token id.
        values: Residual dimension -> value of the token's embedding.
    """
    for d, v in values.items():
        hw.W_E[token, d] = float(v)


def mover_head(hw: HandWeights, layer: int, head: int, key_dim: int, copies: Sequence[tuple[int, int]],
               gain: float) -> None:
    """Make one head attend to marked tokens and copy their code (module docstring, step 3).

    Args:
        hw: The weights.
        layer, head: The head.
        key_dim: The residual dimension marked tokens carry (read by the key).
        copies: ``(source, destination)`` residual dimensions; head dimension ``1 + i`` carries
            pair ``i`` (dimension 0 is the key/query match).
        gain: Output scale of the copy.
    """
    h = hw.head(layer, head)
    h.zero_()
    h.b_Q[0] = QUERY_GAIN
    h.W_K[key_dim, 0] = 1.0
    for i, (src, dst) in enumerate(copies):
        h.W_V[src, 1 + i] = 1.0
        h.W_O[1 + i, dst] = gain


def gated_neuron(hw: HandWeights, layer: int, neuron: int, read: dict[int, float], write: dict[int, float],
                 threshold: float) -> None:
    """Wire one MLP neuron: ``pre = Σ_d read[d] · LN(x)[d] − threshold · |read|₁``, writes ``write``.

    Args:
        hw: The weights.
        layer, neuron: The neuron.
        read: Residual dimension → input weight (the sign chooses the direction it fires for).
        write: Residual dimension → output weight.
        threshold: How far along the read direction (in LayerNorm units) the input must be
            before the neuron fires.
    """
    mlp = hw.mlp(layer)
    mlp.W_in[:, neuron] = 0.0
    mlp.W_out[neuron, :] = 0.0
    for d, w in read.items():
        mlp.W_in[d, neuron] = float(w)
    mlp.b_in[neuron] = -threshold * sum(abs(float(w)) for w in read.values())
    for d, u in write.items():
        mlp.W_out[neuron, d] = float(u)


def read_out(hw: HandWeights, token: int, direction: dict[int, float]) -> None:
    """The (tied) unembedding of ``token`` reads ``direction``: ``W_U[d, token] = v``.

    Args:
        hw: The weights (edited in place; the unembedding is tied to ``W_E``).
        token: The token id.
        direction: Residual dimension -> weight read for the token's logit.
    """
    mark_token(hw, token, direction)


def pick(generator: torch.Generator, n: int, k: int) -> list[int]:
    """``k`` distinct integers of ``range(n)``, seeded.

    Args:
        generator: The seeded generator.
        n: Size of the range.
        k: How many integers, ``<= n``.

    Returns:
        ``k`` distinct integers in ``[0, n)`` in random order.
    """
    return [int(i) for i in torch.randperm(n, generator=generator)[:k]]


__all__ = ["QUERY_GAIN", "scaffold", "mark_token", "mover_head", "gated_neuron", "read_out", "pick"]
