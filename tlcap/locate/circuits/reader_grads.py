"""q/k/v reader gradients without per-head copies of the residual (grouped readers).

With split inputs every head reads its own pre-norm copy of the residual, so a forward with
gradients holds ``(n_heads + 2·n_kv_heads)`` copies of the residual and of the norm's
intermediates per layer. The gradient at head ``h``'s copy is

    ∂m/∂x_h = J_ln1(x)ᵀ W_Q[h] ∂m/∂q_h

(``q_h`` the head's query projection, ``J_ln1`` the Jacobian of the attention norm at the shared
input ``x``; the same for a kv head's ``W_K``/``W_V``), so it can be computed in the backward hook
of the ``q``/``k``/``v`` projection sites from the recorded ``x`` and the norm's scale, one layer at a
time; the forward keeps one residual per layer, as without hooks. Equal to the split-input
gradients to float rounding (``tests/unit/test_circuit_reader_grads.py``).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor


def norm_vjp(
    x: Float[Tensor, "batch pos d_model"],
    scale: Float[Tensor, "batch pos 1"],
    gamma: Float[Tensor, " d_model"] | None,
    w: Float[Tensor, "batch pos heads d_model"],
    kind: str,
) -> Float[Tensor, "batch pos heads d_model"]:
    """``J_norm(x)ᵀ w`` for every head's ``w``: LayerNorm (``"LN"``) or RMSNorm (``"RMS"``).

    Args:
        x: The norm's input.
        scale: Its scale as the model computed it (the ``attn_norm_scale`` site: the standard deviation of the
            centred input for LN, the root mean square for RMS, eps included).
        gamma: The norm's weight (``None``: folded into the projections).
        w: The gradients with respect to the norm's output, one per head.
        kind: ``"LN"`` or ``"RMS"``.

    Returns:
        The gradients with respect to the input, one per head.
    """
    u = w * gamma if gamma is not None else w
    x, s = x[:, :, None, :], scale[:, :, None, :]
    if kind == "RMS":
        xh = x / s
        return u / s - xh * (u * xh).mean(-1, keepdim=True) / s
    xh = (x - x.mean(-1, keepdim=True)) / s
    return (u - u.mean(-1, keepdim=True) - xh * (u * xh).mean(-1, keepdim=True)) / s


def reader_grad_hook(model: Any, layer: int, which: str, store: MutableMapping[str, Tensor], key: str,
                     saved: MutableMapping[str, Tensor], mean_rows: int = 0) -> Callable[..., None]:
    """Backward hook on the ``q``/``k``/``v`` site of ``layer`` storing the readers' input gradients.

    Args:
        model: The model (:meth:`~tlcap.models.Model.qkv_weight`, :meth:`~tlcap.models.Model.attn_norm`).
        layer: The layer.
        which: ``"q"``, ``"k"`` or ``"v"``.
        store: Where the ``[batch, pos, heads, d_model]`` gradient goes (under ``key``), as a
            split-input ``capture_grad`` would store it.
        key: Its key (the split-input hook name the reader stands for).
        saved: The forward's records: ``x{layer}`` (the norm's input) and ``s{layer}`` (its scale).
        mean_rows: As :func:`tlcap.runtime.hooks.capture_grad` (EAP-IG's mean over each item's rows).

    Returns:
        The backward hook (TransformerLens ``(grad, hook)`` signature); it writes ``store[key]`` and returns None.
    """
    kind, gamma = model.attn_norm(layer)
    W = model.qkv_weight(layer, which)

    def hook(grad: Tensor, hook: Any = None) -> None:
        g = grad.detach().float()
        w = torch.einsum("bphe,hde->bphd", g, W.float())
        out = norm_vjp(saved[f"x{layer}"].float(), saved[f"s{layer}"].float(),
                       None if gamma is None else gamma.float(), w, kind).to(grad.dtype)
        store[key] = out.unflatten(0, (-1, mean_rows)).mean(1) if mean_rows > 0 else out
        return None

    return hook


__all__ = ["norm_vjp", "reader_grad_hook"]
