"""Staged rows: packed rows that join one forward pass at different layers.

Exact integrated gradients scales one layer's neurons at a time, so a row that scales layer ``l``
is the clean run below ``l``. :mod:`tlcap.models.packed_rows` shares those lower layers by running
a batch as one position per context up to its *lowest* scaled layer and expanding there (``expand_at``);
rows of higher layers then run every layer from that lowest one, and a row set spread over many
layers is cut into layer groups, one forward and one backward pass each.

A staged run gives every piece of rows its own start: pieces are sorted by their *join layer*
``j``; at the ``resid_pre`` site of each join layer the pieces that join there are appended to the
batch, each starting from its context's clean residual stream at that layer (``states``, recorded by
the caller's clean run: :meth:`tlcap.models.Model.context_run`). Layer ``l`` therefore runs exactly the
pieces that joined at or below it (``Staging.active``), one forward pass holds rows of every layer, and
the backward pass is as short: nothing below a piece's join layer depends on its rows. The layers below
the first join run one position per context; their output is replaced at the first join.

Layout (as in :mod:`tlcap.models.packed_rows`): a piece is one batch row whose ``width`` query positions
are rows of one context; every position carries the context's last token at its position id and attends
to the context's prefix (its real positions, within a sliding window) and to its own key only. Pieces
with fewer real rows than ``width`` carry padding positions, dropped before the unembedding. Contexts
may share a prefix row with different lengths (the answer tokens of one sample: each sees the first
``length`` positions of the sample's cached run).

Hooks are handed the packed activation ``[active pieces, width, ...]`` of their layer; the caller knows
the layout (:class:`Staging`). Only position-major sites (neurons, residual stream) can be hooked, as
for packed rows (:func:`tlcap.models.packed_rows.packable`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import UnsupportedModelError
from tlcap.models.cache import fresh_cache
from tlcap.models.packed_rows import _mask, _widen, attention_windows
from tlcap.runtime.hooks import HookList
from tlcap.runtime.sites import get_site


@dataclass(frozen=True)
class Staging:
    """The pieces of a staged run: their context, join layer and real rows, and the common width.

    Attributes:
        ctx: Context (index into the call's contexts) of each piece.
        join: Layer at whose ``resid_pre`` site each piece joins; non-decreasing.
        fill: Real rows of each piece (``1 <= fill <= width``; the rest are padding positions).
        width: Query positions of every piece.
    """

    ctx: Int[Tensor, " piece"]
    join: Int[Tensor, " piece"]
    fill: Int[Tensor, " piece"]
    width: int

    @property
    def pieces(self) -> int:
        return int(self.ctx.numel())

    def active(self, layer: int) -> int:
        """Pieces present at ``layer`` (those that joined at or below it: the first ones).

        Args:
            layer: The layer.

        Returns:
            The number of pieces whose ``join`` is ``<= layer``.
        """
        return int(torch.searchsorted(self.join, torch.tensor([int(layer)]), right=True)[0])

    def keep(self) -> Int[Tensor, " rows"]:
        """Flat indices (``piece · width + slot``) of the real positions, piece-major.

        Returns:
            A ``[rows]`` long tensor of the real positions' flat indices.
        """
        return (torch.arange(self.width)[None, :] < self.fill[:, None]).flatten().nonzero().flatten()


@contextlib.contextmanager
def _attention_inputs(attn_modules: Sequence[Any], masks: Sequence[Tensor], ctxs: Sequence[Tensor | None],
                      n_ctx: int, width: int) -> Iterator[None]:
    """Give attention layer ``l`` the mask ``masks[l]`` and, where ``ctxs[l]`` is set, its position inputs
    widened from one position per context to the layer's pieces."""

    def pre(l: int) -> Any:
        def fn(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            kw = dict(kwargs)
            x = args[0] if args and isinstance(args[0], Tensor) else kw.get("hidden_states")
            kw["attention_mask"] = masks[l].to(x.device) if isinstance(x, Tensor) else masks[l]  # the layer's device
            ctx = ctxs[l]
            if ctx is not None:
                for k in ("position_embeddings", "position_ids"):
                    if k in kw:
                        kw[k] = _widen(kw[k], ctx, n_ctx, width)
            return args, kw
        return fn

    handles = [m.register_forward_pre_hook(pre(l), with_kwargs=True) for l, m in enumerate(attn_modules)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def continue_staged(model: Any, prefix: Any, rows: Int[Tensor, " ctx"], lengths: Int[Tensor, " ctx"],
                    last: Int[Tensor, " ctx"], staging: Staging, states: Float[Tensor, "piece d_model"],
                    hooks: HookList = (), normed: bool = False) -> Float[Tensor, "rows d_out"]:
    """Logits (or the states the unembedding reads) of the real positions of a staged run (module docstring),
    piece-major.

    Args:
        model: The :class:`tlcap.models.Model` (TransformerBridge backend).
        prefix: A :class:`tlcap.models.rows.PaddedPrefix` of the contexts' prefix rows.
        rows: Prefix row of each context.
        lengths: Prefix length each context sees (``<= `` its row's length).
        last: The token after each context's prefix (at position ``lengths``).
        staging: The pieces (:class:`Staging`).
        states: Each piece's clean ``resid_pre`` at its join layer (its context's last position).
        hooks: Forward hooks on position-major sites, handed ``[active pieces, width, ...]``.
        normed: Return the states after the final norm (the unembedding's input, ``[real rows, d_model]``)
            and skip the unembedding (:func:`tlcap.models.unembedding.target_probs` reads them out).

    Returns:
        ``[real rows, d_vocab]`` logits (``[real rows, d_model]`` states with ``normed``) in the order of
        :meth:`Staging.keep`.

    Raises:
        UnsupportedModelError: ``normed`` on a backend without an unembedding input hook.
    """
    if normed and model._cut_name is None:
        raise UnsupportedModelError("this backend has no unembedding input hook to stop a staged run at")
    dev, n, width = model.device, int(prefix.n_tokens), staging.width
    n_ctx = int(rows.numel())
    joins = sorted({int(j) for j in staging.join.tolist()})
    first = joins[0]
    active = [staging.active(l) if l >= first else 0 for l in range(model.n_layers)]
    ctx_d = staging.ctx.to(dev)
    piece_rows = rows[staging.ctx]
    cache = None
    if prefix.cache is not None:
        cache = fresh_cache(prefix.cache)
        rows_d, piece_rows_d = rows.to(dev), piece_rows.to(dev)
        for l, layer in enumerate(cache.layers):
            if getattr(layer, "keys", None) is None or not layer.keys.numel():
                continue
            idx = (rows_d if l < first else piece_rows_d[: active[l]]).to(layer.keys.device)  # layers may sit apart
            layer.keys, layer.values = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)
    base_lengths, piece_lengths = lengths, lengths[staging.ctx]
    built: dict[tuple[bool, int | None], Tensor] = {}
    masks, ctxs = [], []
    for l, w in enumerate(attention_windows(model.hf_model.config, model.n_layers)):
        staged = l >= first
        if (staged, w) not in built:
            built[(staged, w)] = (_mask(piece_lengths, n, width, w, model.dtype, dev) if staged
                                  else _mask(base_lengths, n, 1, w, model.dtype, dev))
        masks.append(built[(staged, w)][: active[l]] if staged else built[(staged, w)])
        ctxs.append(ctx_d[: active[l]] if staged else None)
    fwd: list = []
    for j in joins:
        a, b = staging.active(j - 1) if j > first else 0, staging.active(j)
        fwd.append((get_site("resid_pre").hook_name(j), _join(states[a:b], width, replace=j == first)))
    fwd += list(hooks)
    keep = staging.keep().to(dev)
    stash: list[Tensor] = []

    def cut(act: Tensor, hook: Any = None) -> Tensor:
        real = act.reshape(-1, *act.shape[2:]).index_select(0, keep.to(act.device))[:, None]
        if not normed:
            return real
        stash.append(real[:, 0])
        return real[:0]  # the unembedding runs on no rows

    if model._cut_name is not None:
        fwd.append((model._cut_name, cut))
    kw: dict[str, Any] = {"attention_mask": torch.ones(n_ctx, n + 1, dtype=torch.long, device=dev),
                          "position_ids": lengths[:, None].to(dev)}
    if cache is not None:
        kw["past_key_values"] = cache
    attn = [model.backend.blocks[l].attn for l in range(model.n_layers)]
    with _attention_inputs(attn, masks, ctxs, n_ctx, width), model.hooks(fwd=fwd):
        out = model.backend(last[:, None].to(dev), **kw)
    if normed:
        return stash[0]
    if model._cut_name is None:
        return out.reshape(-1, out.shape[-1]).index_select(0, keep)
    return out.reshape(out.shape[0], out.shape[-1])  # a view: its backward allocates nothing


def _join(states: Tensor, width: int, replace: bool) -> Any:
    """The ``resid_pre`` hook where pieces join: ``states`` widened to ``width`` positions, appended
    to the pieces already running (or replacing the one-position-per-context run below the first join)."""

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        new = states.to(act.device, act.dtype)[:, None, :].expand(states.shape[0], width, states.shape[-1])
        return new.contiguous() if replace else torch.cat([act, new])

    return hook


__all__ = ["Staging", "continue_staged"]
