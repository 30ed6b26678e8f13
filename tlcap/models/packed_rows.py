"""Packed rows: the rows of one context run as query positions of that context, not as batch rows.

:meth:`tlcap.models.Model.continue_rows` runs ``counts[g]`` rows after each cached prefix
``g``; every row recomputes one token at position ``len(prefix_g)``. Laid out as batch rows,
each row needs its own copy of the prefix's keys/values in every layer (and, under grouped-query
attention, a second copy per query head), and its attention is a matrix-vector product: for a
50-token prefix that copying, and its backward, cost as much as the MLPs.

Packed, context ``g`` is one batch row whose query positions are its rows:
every position carries the same token at the same position id, attends to the prefix and to its
own key only (a ``[R, n + R]`` mask: the prefix's real positions, then the diagonal), so each
row sees exactly what it sees alone. The prefix's keys/values are used once per context, the
attention is a matrix-matrix product, and no gradient flows into the prefix. A context with
many rows after a short prefix is split into pieces of ``W = max(n, 8)`` positions
(:func:`pieces`), each with its own copy of the prefix, so the masked block of the positions
among themselves never outweighs the prefix (and scores stay ``W · (n + W)`` per piece however
many rows a batch holds). Pieces with fewer than ``W`` rows carry padding positions that are
computed and dropped.

Forward hooks see the rows layout they would see unpacked: an activation ``[G, R, ...]`` is
handed to a hook as ``[rows, 1, ...]`` (a view when no context is padded) and put back. Only hooks
at position-major sites (MLP neurons and residual-stream sites, whose shape is
``batch pos ...``) can be translated like this; :func:`packable` says when packing applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.runtime.hooks import HookFn, HookList
from tlcap.runtime.sites import SITES, get_site

PACKED_KINDS = ("neuron", "resid")
"""Site kinds whose activations are ``batch pos ...`` (hooks on them can be handed the rows layout)."""


def position_major_names(n_layers: int) -> frozenset[str]:
    """Hook names of every position-major site (:data:`PACKED_KINDS`) at every layer.

    Args:
        n_layers: Number of layers.

    Returns:
        The hook names.
    """
    per_layer = [s for s in SITES.values() if s.kind in PACKED_KINDS and s.per_layer]
    return frozenset(s.hook_name(l) for s in per_layer for l in range(n_layers))


def _rows_view(fn: HookFn, counts: Tensor, width: int) -> HookFn:
    """Hand ``fn`` a packed ``[G, R, ...]`` activation as ``[rows, 1, ...]``; pass other shapes through."""
    g = int(counts.numel())
    full = bool((counts == width).all())
    idx = None if full else (torch.arange(width)[None, :] < counts[:, None]).flatten().nonzero().flatten()

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        if act.ndim < 2 or act.shape[0] != g or act.shape[1] != width or width == 1:
            return fn(act, hook)
        flat = act.reshape(g * width, 1, *act.shape[2:])
        rows = flat if idx is None else flat[idx.to(act.device)]
        out = fn(rows, hook)
        out = rows if out is None else out  # a hook may edit its input in place and return None
        if idx is None:
            return out.reshape(act.shape)
        return flat.index_copy(0, idx.to(act.device), out.to(flat.dtype)).reshape(act.shape)

    return hook


def attention_windows(config: Any, n_layers: int) -> list[int | None]:
    """Each layer's sliding attention window (``None``: full causal attention) from a HF config.

    ``layer_types`` marks the sliding layers where the config has it (Gemma-2 alternates); a
    ``sliding_window`` without it applies to every layer (Mistral).

    Args:
        config: The HF config (a multimodal one's text config is read).
        n_layers: Number of layers.

    Returns:
        One window size (``int``) or None per layer.
    """
    if hasattr(config, "get_text_config"):  # multimodal configs (Gemma-3) keep the text model's in a sub-config
        config = config.get_text_config()
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None:
        return [None] * n_layers
    if types is None:
        return [int(window)] * n_layers
    return [int(window) if t == "sliding_attention" else None for t in types]


def _mask(lengths: Tensor, n: int, q: int, window: int | None, dtype: torch.dtype,
          device: torch.device) -> Float[Tensor, "g 1 q k"]:
    """Additive mask: query i of context g sees the prefix's real positions and key ``n + i``.

    With a sliding ``window`` w, the query (at position ``len_g``) sees prefix keys ``j > len_g - w``
    only, as HF's sliding-window mask does.
    """
    keep = torch.zeros(len(lengths), q, n + q, dtype=torch.bool)
    j = torch.arange(n)[None, :]
    real = j < lengths[:, None]
    if window is not None:
        real &= j > lengths[:, None] - window
    keep[:, :, :n] = real[:, None, :]
    keep[:, :, n:] = torch.eye(q, dtype=torch.bool)[None]
    zero = torch.zeros((), dtype=dtype)
    return torch.where(keep, zero, torch.finfo(dtype).min)[:, None].to(device)


def _widen(x: Any, ctx: Tensor, g: int, width: int) -> Any:
    """A one-position ``[G, 1, ...]`` tensor (or a tuple of them) as ``[pieces, width, ...]``: piece i's rows
    are its context ``ctx[i]``'s (a batch-broadcast ``[1, 1, ...]`` with ``G > 1`` stays broadcast)."""
    if isinstance(x, Tensor) and x.ndim >= 2 and x.shape[1] == 1:
        rows = x[ctx.to(x.device)] if x.shape[0] == g else x
        return rows.expand(rows.shape[0], width, *x.shape[2:])
    if isinstance(x, tuple):
        return tuple(_widen(y, ctx, g, width) for y in x)
    return x


@contextlib.contextmanager
def attention_inputs(attn_modules: Sequence[Any], masks: Sequence[Tensor], widen_from: int | None, ctx: Tensor,
                     g: int, width: int) -> Iterator[None]:
    """Give attention layer ``l`` the mask ``masks[l]``; from ``widen_from`` on, its position inputs as pieces
    (:func:`_widen`)."""

    def pre(l: int) -> Any:
        def fn(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            kw = dict(kwargs)
            x = args[0] if args and isinstance(args[0], Tensor) else kw.get("hidden_states")
            kw["attention_mask"] = masks[l].to(x.device) if isinstance(x, Tensor) else masks[l]  # the layer's device
            if widen_from is not None and l >= widen_from:
                for k in ("position_embeddings", "position_ids"):
                    if k in kw:
                        kw[k] = _widen(kw[k], ctx, g, width)
            return args, kw
        return fn

    handles = [m.register_forward_pre_hook(pre(l), with_kwargs=True) for l, m in enumerate(attn_modules)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


PACKED_POSITIONS = ("rotary", "standard")
"""Position encodings a packed run reproduces (from position ids); ALiBi biases by key index do not."""


def packable(model: Any, hooks: HookList, new_tokens: int) -> bool:
    """Whether a run of rows after cached prefixes can be packed (exactly).

    One new token; every hook of the call at a position-major site; no hook left on the backend
    by an enclosing ``with model.hooks(...)`` block (it would see the packed layout); positions
    encoded from position ids (rotary or learned), not ALiBi.

    Args:
        model: The model.
        hooks: The hooks of the call.
        new_tokens: New tokens per row.

    Returns:
        True when every condition above holds (and the model allows ``packed_rows``).
    """
    if new_tokens != 1 or not bool(model.packed_rows) or not model.is_bridge:
        return False
    if getattr(model.backend.cfg, "positional_embedding_type", None) not in PACKED_POSITIONS:
        return False
    if any(hp._forward_hooks or hp._backward_hooks for hp in model.backend.hook_dict.values()):
        return False
    return all(name in model.position_major_names for name, _ in hooks)


MIN_WIDTH = 8
"""Fewest query positions of a packed piece (:func:`pieces`)."""


def pieces(counts: Int[Tensor, " g"], n: int) -> tuple[Int[Tensor, " p"], Int[Tensor, " p"], int]:
    """Split each context's rows into pieces of at most ``W = max(n, MIN_WIDTH)`` positions.

    A piece's attention costs ``W · (n + W)`` scores, ``W²`` of them for the masked block of the
    positions among themselves; each piece carries one copy of the prefix's keys/values. At
    ``W ≈ n`` neither exceeds what the rows need: at most twice the useful scores, one prefix copy
    per ``n`` rows (a short prompt's many rows would otherwise spend most of the work in that block).

    Args:
        counts: ``[g]`` rows of each context.
        n: Padded prefix length (``W`` is also capped by the largest count).

    Returns:
        ``(context of each piece, rows of each piece, W)``.
    """
    width = max(1, min(max(n, MIN_WIDTH), int(counts.max())))
    per = (counts + width - 1) // width
    ctx = torch.repeat_interleave(torch.arange(len(counts)), per)
    first = torch.cumsum(per, 0) - per  # index of each context's first piece
    k = torch.arange(len(ctx)) - first[ctx]  # piece number within its context
    return ctx, torch.clamp(counts[ctx] - k * width, max=width), width


def continue_packed(model: Any, last: Int[Tensor, " g"], cache: Any, lengths: Int[Tensor, " g"], n: int,
                    counts: Int[Tensor, " g"], hooks: HookList, expand_at: int) -> Float[Tensor, "rows d_vocab"]:
    """Packed :meth:`~tlcap.models.Model.continue_rows` (module docstring) of contexts with ``counts >= 1``.

    Args:
        model: The :class:`tlcap.models.Model` (TransformerBridge backend).
        last: The token after each prefix.
        cache: A backend cache of the ``[G, n]`` padded prefixes that this call may change
            (:func:`tlcap.models.cache.fresh_cache`; ``None`` when ``n == 0``).
        lengths: Real prefix lengths.
        n: Padded prefix length.
        counts: Rows of each context (all ``>= 1``).
        hooks: Forward hooks in the rows layout (position-major sites only).
        expand_at: Run one position per context below this layer (0: every layer packed).

    Returns:
        ``[sum(counts), d_vocab]`` logits, context-major.
    """
    g, dev = int(counts.numel()), model.device
    ctx, pc, width = pieces(counts, n)
    n_p = int(ctx.numel())
    ctx_d = ctx.to(dev)
    if expand_at > 0:
        toks, pos, q_top = last[:, None].to(dev), lengths[:, None].to(dev), 1
    else:
        toks, pos, q_top = last[ctx][:, None].expand(n_p, width).to(dev), lengths[ctx][:, None].expand(n_p, width).to(dev), width
    if cache is not None:
        for i, layer in enumerate(cache.layers):
            if i >= expand_at and getattr(layer, "keys", None) is not None and layer.keys.numel() and n_p != g:
                idx = ctx_d.to(layer.keys.device)  # each layer's cache sits on that layer's device
                layer.keys, layer.values = layer.keys[idx], layer.values[idx]
    built: dict[tuple[int, int | None], Tensor] = {}
    masks = []
    for l, w in enumerate(attention_windows(model.hf_model.config, model.n_layers)):
        q = 1 if l < expand_at else width
        if (q, w) not in built:
            built[(q, w)] = _mask(lengths if q == 1 and expand_at > 0 else lengths[ctx], n, q, w, model.dtype, dev)
        masks.append(built[(q, w)])
    fwd: list = [(name, _rows_view(fn, pc, width)) for name, fn in hooks]
    if expand_at > 0:
        def expand(act: Tensor, hook: Any = None) -> Tensor:  # a copy, as batch rows' repeat: hooks may write to it
            return act if act.shape[0] == n_p and act.shape[1] == width else _widen(act, ctx_d, g, width).contiguous()

        fwd.insert(0, (get_site("resid_pre").hook_name(expand_at), expand))
    kw: dict[str, Any] = {"attention_mask": torch.ones(toks.shape[0], n + q_top, dtype=torch.long, device=dev),
                          "position_ids": pos}
    if cache is not None:
        kw["past_key_values"] = cache
    attn = [model.backend.blocks[l].attn for l in range(model.n_layers)]
    with attention_inputs(attn, masks, expand_at if expand_at > 0 else None, ctx_d, g, width), model.hooks(fwd=fwd):
        out = model.backend(toks, **kw)
    keep = (torch.arange(width)[None, :] < pc[:, None]).flatten().nonzero().flatten().to(out.device)
    return out.reshape(n_p * width, -1)[keep]


__all__ = ["continue_packed", "pieces", "MIN_WIDTH", "PACKED_POSITIONS", "attention_windows", "packable",
           "position_major_names", "PACKED_KINDS"]
