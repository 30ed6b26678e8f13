"""Split q/k/v inputs, per-head results and the MLP input hook for attention TransformerLens wraps generically.

TransformerLens 4.x runs GPT-J's attention through the generic ``AttentionBridge``: the HF module
computes attention itself, so ``use_split_qkv_input`` and ``use_attn_result`` are not available
and the ``q_input``/``k_input``/``v_input``, ``head_result`` and ``mlp_input`` hook points exist
but never fire. :func:`emulated_edge_hooks` makes them fire, with edits that reach the output,
by rebuilding the projections around them (forward hooks on the ``hook_out`` points of the HF
module's own linear layers, registered before any user hook there, so those see the rebuilt value):

- ``q``/``k``/``v``: the block's pre-norm input ``x`` (the ``ln1`` input) is copied per head and
  passed through ``hook_q_input`` (``[batch, pos, head, d_model]``); head ``h``'s projection is
  ``W_Q[h] · ln1(x_h) + b_Q[h]``, replacing the projection's output. Without edits this equals the
  original projection (the same norm and weights on the same input);
- ``head_result``: the merged heads entering the output projection are split, each head's write
  ``W_O[h] · z_h`` passes through ``hook_result`` (``[batch, pos, head, d_model]``), and their sum
  plus the bias replaces the projection's output;
- ``mlp_input``: the MLP's input is rebuilt as ``ln1(hook_mlp_in(x))`` (GPT-J's MLP reads the same
  ``ln_1`` output as its attention, so the pre-norm copy is the block input).

The norm and linear layers are called as the HF modules they wrap (``original_component``), so
no other hook point fires twice. Backward hooks on these points see the gradient of the copies,
as with TransformerLens' own split inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor


def _orig(module: Any) -> Any:
    return getattr(module, "original_component", module)


def _per_head(linear: Any, n_heads: int) -> tuple[Tensor, Tensor | None]:
    """``W [heads, d_head, d_model]`` and bias ``[heads, d_head]`` of a q/k/v projection (HF ``Linear``)."""
    lin = _orig(linear)
    w = lin.weight
    b = lin.bias
    return w.view(n_heads, w.shape[0] // n_heads, w.shape[1]), None if b is None else b.view(n_heads, -1)


def _project(x: Float[Tensor, "batch pos head d_model"], linear: Any, n_heads: int) -> Float[Tensor, "batch pos h_d"]:
    w, b = _per_head(linear, n_heads)
    out = torch.einsum("bphd,hed->bphe", x, w.to(x.dtype))
    if b is not None:
        out = out + b.to(x.dtype)
    return out.flatten(2)


def _set_flag(cfg: Any, name: str, value: bool) -> None:
    setter = getattr(cfg, "_set_bridge_managed_hook_flag", None)
    if setter is not None:
        setter(name, value)
    else:
        object.__setattr__(cfg, name, value)


def can_emulate(backend: Any) -> bool:
    """Whether :func:`emulated_edge_hooks` knows this backend's attention layout (q/k/v/o linears, ``ln1``, MLP).

    Args:
        backend: A TransformerBridge.

    Returns:
        True when the hooks can be emulated (and the block has no ``ln2``, i.e. parallel attention/MLP).
    """
    blocks = getattr(backend, "blocks", None)
    if not blocks:
        return False
    blk = blocks[0]
    attn = getattr(blk, "attn", None)
    if not (all(hasattr(attn, n) for n in ("q", "k", "v", "o")) and hasattr(blk, "ln1") and hasattr(blk, "mlp")):
        return False
    linears = all(isinstance(_orig(getattr(attn, n)), torch.nn.Linear) for n in ("q", "k", "v", "o"))
    return linears and not hasattr(blk, "ln2") and all(f"blocks.0.{n}" in backend.hook_dict for n in (
        "hook_q_input", "hook_k_input", "hook_v_input", "attn.hook_result", "hook_mlp_in"))


@contextlib.contextmanager
def emulated_edge_hooks(backend: Any, n_heads: int, split_inputs: bool = True) -> Iterator[None]:
    """Make the split-input, per-head result and MLP-input hook points fire (module docstring).

    Args:
        backend: A TransformerBridge whose blocks have a shared ``ln1`` before parallel attention
            and MLP (GPT-J) and attention linears ``q``, ``k``, ``v``, ``o``.
        n_heads: Attention heads (GPT-J has no grouped kv heads).
        split_inputs: Also split the q/k/v inputs (otherwise only results and MLP input).

    The module hooks are removed on exit, also when the body raises.

    Yields:
        None; the hook points fire during forwards in the ``with`` block.
    """
    hp = backend.hook_dict
    handles: list[Any] = []
    resid: dict[int, Tensor] = {}  # per layer: the block input (ln1's input)
    merged: dict[int, Tensor] = {}  # per layer: the heads entering the output projection
    cfg = backend.cfg
    flags = {"use_split_qkv_input": bool(split_inputs), "use_attn_result": True, "use_hook_mlp_in": True}
    saved = {f: bool(getattr(cfg, f, False)) for f in flags}
    try:
        for f, v in flags.items():  # TL refuses hooks on gated points: open the gates, not the setters (which
            _set_flag(cfg, f, v)  # would ask the generic attention to fork itself, and raise)
        for l, blk in enumerate(backend.blocks):
            ln = _orig(blk.ln1)

            def keep_input(module: Any, args: tuple, l: int = l) -> None:
                resid[l] = args[0]

            handles.append(blk.ln1.register_forward_pre_hook(keep_input))
            if split_inputs:
                for which in ("q", "k", "v"):
                    point, lin = hp[f"blocks.{l}.hook_{which}_input"], getattr(blk.attn, which)

                    def proj(module: Any, args: tuple, out: Tensor, l: int = l, point: Any = point, ln: Any = ln,
                             lin: Any = lin) -> Tensor:
                        x = resid[l]
                        split = point(x[:, :, None].expand(-1, -1, n_heads, -1).clone())
                        return _project(ln(split), lin, n_heads).to(out.dtype)

                    handles.append(lin.hook_out.register_forward_hook(proj))  # first of hook_out's hooks
            result_point, o_lin = hp[f"blocks.{l}.attn.hook_result"], blk.attn.o

            def keep_z(module: Any, args: tuple, l: int = l) -> None:
                merged[l] = args[0]  # the heads entering the HF projection: after any edit at o's hook_in

            def heads(module: Any, args: tuple, out: Tensor, l: int = l, point: Any = result_point, lin: Any = o_lin) -> Tensor:
                z = merged.pop(l)
                o = _orig(lin)
                w = o.weight  # [d_model, heads * d_head]
                per = torch.einsum("bphe,dhe->bphd", z.unflatten(-1, (n_heads, -1)), w.view(w.shape[0], n_heads, -1).to(z.dtype))
                total = point(per).sum(2)
                return (total if o.bias is None else total + o.bias.to(total.dtype)).to(out.dtype)

            handles.append(_orig(o_lin).register_forward_pre_hook(keep_z))
            handles.append(o_lin.hook_out.register_forward_hook(heads))
            mlp_point = hp[f"blocks.{l}.hook_mlp_in"]

            def mlp_in(module: Any, args: tuple, l: int = l, point: Any = mlp_point, ln: Any = ln) -> tuple:
                return (ln(point(resid[l])),) + tuple(args[1:])

            handles.append(blk.mlp.register_forward_pre_hook(mlp_in))
        yield
    finally:
        for h in handles:
            h.remove()
        resid.clear()
        merged.clear()
        for f, v in saved.items():
            _set_flag(cfg, f, v)


__all__ = ["can_emulate", "emulated_edge_hooks"]
