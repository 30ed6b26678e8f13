"""Knowledge-synapse interventions (QL §3.2): scale attention-pattern columns, no renormalisation.

A knowledge synapse is a key column ``c`` of head ``h`` in layer ``l`` (see
:mod:`tlcap.locate.synapses`). Enhancing multiplies that column of the ``attn_pattern`` site by a
factor (2 in the paper), suppressing by 0; the rows are not renormalised, as in the paper.

Example (α = 0.1: the tiny random model's attention is too flat for the paper's 0.3):
    >>> from tlcap.locate.synapses import locate_synapses
    >>> from tlcap.metrics import target_prob
    >>> ks = locate_synapses(model, "The capital of France is", alpha=0.1)
    >>> with model.hooks(scale_synapses(ks.mask, 0.0)):      # suppress the synapses
    ...     p = target_prob(model, "The capital of France is", " Paris")
    >>> p < target_prob(model, "The capital of France is", " Paris")
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tlcap.errors import ShapeMismatchError
from tlcap.runtime import hooks as H
from tlcap.runtime.hooks import HookList
from tlcap.runtime.sites import get_site


def scale_synapses(mask: Bool[Tensor, "layer head key"], factor: float) -> HookList:
    """``attn_pattern`` hooks multiplying the masked key columns of each (layer, head) by ``factor``.

    Args:
        mask: ``[n_layers, n_heads, n_keys]``: True at the columns to scale (``n_keys`` = the
            prompt length the hooks will see).
        factor: Scale of the selected pattern entries (0 suppresses, 2 enhances).

    Returns:
        A hook list for :meth:`tlcap.models.Model.hooks` (one hook per layer with a synapse).

    Example:
        >>> from tlcap.locate.synapses import locate_synapses
        >>> ks = locate_synapses(model, "The capital of France is", alpha=0.1)
        >>> tuple(ks.mask.shape), len(scale_synapses(ks.mask, 2.0))      # [layer, head, key]; 1 hook per layer
        ((2, 4, 5), 2)
        >>> with model.hooks(scale_synapses(ks.mask, 2.0)):
        ...     logits = model.last_logits(model.to_tokens(ks.prompt))
        >>> tuple(logits.shape)
        (1, 50257)
    """
    site = get_site("attn_pattern")
    out = []
    for l in range(mask.shape[0]):
        if mask[l].any():
            out.append((site.hook_name(l), H.scale_where(mask[l][:, None, :], factor)))
    return out


def scale_synapses_rows(masks: Sequence[Bool[Tensor, "layer head key"] | None],
                        factors: Sequence[float]) -> HookList:
    """The batched form of :func:`scale_synapses`: batch row ``r`` scales the columns of ``masks[r]`` by ``factors[r]``.

    The rows are one prompt's (every mask has its ``n_keys``); a row whose mask is ``None`` runs unchanged. Row
    ``r`` equals a run of its own with ``scale_synapses(masks[r], factors[r])``: the pattern is multiplied by
    ``factors[r]`` at the masked entries and by 1 elsewhere.

    Args:
        masks: Per row, ``[n_layers, n_heads, n_keys]`` (True at the columns to scale), or ``None``.
        factors: Per row, the scale of its masked entries.

    Returns:
        A hook list (one hook per layer where some row has a synapse) for a batch of ``len(masks)`` rows.

    Raises:
        ShapeMismatchError: a factor count other than the mask count, or masks of different shapes.

    Example:
        >>> from tlcap.locate.synapses import locate_synapses
        >>> ks = locate_synapses(model, "The capital of France is", alpha=0.1)
        >>> toks = model.to_tokens(ks.prompt)
        >>> rows = model.last_logits(toks.expand(3, -1), hooks=scale_synapses_rows([None, ks.mask, ks.mask], [1, 2, 0]))
        >>> with model.hooks(scale_synapses(ks.mask, 0.0)):
        ...     alone = model.last_logits(toks)
        >>> torch.allclose(rows[2], alone[0], atol=1e-5), torch.allclose(rows[0], model.last_logits(toks)[0], atol=1e-5)
        (True, True)
    """
    if len(masks) != len(factors):
        raise ShapeMismatchError(f"{len(factors)} factors for {len(masks)} synapse masks; give one per row")
    shapes = {tuple(m.shape) for m in masks if m is not None}
    if len(shapes) > 1:
        raise ShapeMismatchError(f"synapse masks of one batch share a shape (one prompt), got {sorted(shapes)}")
    if not shapes:
        return []
    n_layers, n_heads, n_keys = shapes.pop()
    site = get_site("attn_pattern")
    out = []
    for l in range(n_layers):
        if not any(m is not None and bool(m[l].any()) for m in masks):
            continue
        f = torch.ones(len(masks), n_heads, 1, n_keys)
        for r, (m, x) in enumerate(zip(masks, factors)):
            if m is not None:
                f[r, :, 0][m[l].cpu()] = float(x)
        out.append((site.hook_name(l), _times(f)))
    return out


def _times(f: Float[Tensor, "row head 1 key"]) -> H.HookFn:
    """A hook multiplying the ``[row, head, query, key]`` pattern by ``f`` (1 where a row changes nothing)."""
    def hook(act: Float[Tensor, "row head query key"], hook: Any = None) -> Float[Tensor, "row head query key"]:
        if act.shape[0] != f.shape[0] or act.shape[1] != f.shape[1] or act.shape[-1] != f.shape[-1]:
            raise ShapeMismatchError(f"scale_synapses_rows has factors {tuple(f.shape)} for a pattern of shape "
                                     f"{tuple(act.shape)}; one row per batch row, the prompt's keys")
        return act * f.to(act.device, act.dtype)
    return hook


__all__ = ["scale_synapses", "scale_synapses_rows"]
