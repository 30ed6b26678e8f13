"""Shape-changing hooks that keep some positions of an activation (re-exported by :mod:`tlcap.runtime.hooks`).

Meant for the ``unembed_in`` site: the unembedding then runs on the kept positions only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

HookFn = Callable[[Tensor, Any], Tensor | None]


def last_position_only() -> HookFn:
    """Keep only the last position (``act[:, -1:]``): a *shape-changing* hook.

    Meant for the ``unembed_in`` site when only the next-token logits are needed: the
    unembedding (the largest matrix of small models) then runs on one position instead of all
    (see :meth:`tlcap.models.Model.last_logits`).

    Returns:
        A hook ``hook(act, hook=None)`` mapping ``[batch, pos, ...]`` to ``[batch, 1, ...]``.
    """

    def hook(act: Float[Tensor, " batch pos *dims"], hook: Any = None) -> Float[Tensor, " batch 1 *dims"]:
        return act[:, -1:]

    return hook


def select_positions(pos: Int[Tensor, " batch"]) -> HookFn:
    """Keep one position per row, ``act[r, pos[r]]``, as a ``[batch, 1, ...]`` activation.

    The per-row form of :func:`last_position_only` (a *shape-changing* hook), for batches
    whose rows end at different positions (right padding).

    Args:
        pos: ``[batch]`` position to keep in each row.

    Returns:
        A hook ``hook(act, hook=None)`` mapping ``[batch, pos, ...]`` to ``[batch, 1, ...]``.
    """

    def hook(act: Float[Tensor, " batch pos *dims"], hook: Any = None) -> Float[Tensor, " batch 1 *dims"]:
        p = pos.to(act.device)
        return act[torch.arange(act.shape[0], device=act.device), p][:, None]

    return hook


def gather_positions(pos: Int[Tensor, "batch k"]) -> HookFn:
    """Keep ``k`` positions per row, ``act[r, pos[r, i]]`` → ``[batch, k, ...]`` (shape-changing, as :func:`select_positions`).

    Args:
        pos: ``[batch, k]`` positions to keep in each row, in the order given.

    Returns:
        A hook ``hook(act, hook=None)`` mapping ``[batch, pos, ...]`` to ``[batch, k, ...]``.
    """

    def hook(act: Float[Tensor, " batch pos *dims"], hook: Any = None) -> Float[Tensor, " batch k *dims"]:
        return act[torch.arange(act.shape[0], device=act.device)[:, None], pos.to(act.device)]

    return hook


__all__ = ["last_position_only", "select_positions", "gather_positions"]
