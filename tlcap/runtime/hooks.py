"""Hook factories: small functions that build TransformerLens hook functions.

Every factory returns ``fn(activation, hook) -> activation`` that never edits its input in
place (it clones first), so the factories compose with autograd. Apply them with
:meth:`tlcap.models.Model.hooks`, a context manager that always removes them.

Selections are ``(pos, index)``: ``pos`` picks sequence positions (``None`` = all, an int,
a slice, a list or ``"last"``); ``index`` picks entries of the last axis (``None`` = all, an
int, a list or a LongTensor), e.g. neurons for ``mlp_post``. For head sites (``batch pos head
d``) pass ``head=`` to select heads.
"""

from __future__ import annotations

from typing import Any, Callable, MutableMapping, Sequence

import torch
from torch import Tensor

Index = int | slice | Sequence[int] | Tensor | str | None
HookFn = Callable[[Tensor, Any], Tensor]


def _pos(pos: Index) -> Any:
    if pos is None:
        return slice(None)
    if pos == "last":
        return -1
    if isinstance(pos, (list, tuple)):
        return torch.tensor(pos, dtype=torch.long)
    return pos


def _index(index: Index) -> Any:
    if index is None:
        return slice(None)
    if isinstance(index, (list, tuple)):
        return torch.tensor(index, dtype=torch.long)
    return index


def _selector(act: Tensor, pos: Index, index: Index, head: Index = None) -> tuple[Any, ...]:
    """Index tuple for ``act[batch, pos, (head,) ..., index]``."""
    p, i = _pos(pos), _index(index)
    if act.ndim == 3:
        sel: tuple[Any, ...] = (slice(None), p, i)
    elif act.ndim == 4:
        sel = (slice(None), p, _index(head), i)
    else:
        raise ValueError(f"selector expects a [batch, pos, ...] activation, got shape {tuple(act.shape)}")
    # Advanced indices in two slots would pair up element-wise; make them an outer product.
    adv = [k for k, s in enumerate(sel) if isinstance(s, Tensor)]
    if len(adv) > 1:
        shaped = list(sel)
        for n, k in enumerate(adv):
            shape = [1] * len(adv)
            shape[n] = -1
            shaped[k] = sel[k].reshape(shape)
        sel = tuple(shaped)
    return sel


def scale(factor: float | Tensor, pos: Index = None, index: Index = None, head: Index = None) -> HookFn:
    """Multiply the selected activations by ``factor`` (0 suppresses, 2 enhances)."""

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        out = act.clone()
        sel = _selector(act, pos, index, head)
        out[sel] = out[sel] * factor
        return out

    return hook


def set_to(value: float | Tensor, pos: Index = None, index: Index = None, head: Index = None) -> HookFn:
    """Overwrite the selected activations with ``value`` (broadcast)."""

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        out = act.clone()
        out[_selector(act, pos, index, head)] = value
        return out

    return hook


def ablate(pos: Index = None, index: Index = None, head: Index = None, mean_over: Tensor | None = None) -> HookFn:
    """Zero-ablate the selection, or set it to ``mean_over`` (e.g. a dataset mean activation)."""
    return set_to(0.0 if mean_over is None else mean_over, pos, index, head)


def patch(source: Tensor, pos: Index = None, index: Index = None, head: Index = None) -> HookFn:
    """Copy the selection from ``source`` (e.g. a cached clean activation; batch broadcasts)."""

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        out = act.clone()
        sel = _selector(act, pos, index, head)
        src = source.to(act.dtype).expand_as(act) if source.shape != act.shape else source.to(act.dtype)
        out[sel] = src[sel]
        return out

    return hook


def add_noise(noise: Tensor | float, pos: Index = None, seed: int | None = None) -> HookFn:
    """Add noise to the selected positions.

    Args:
        noise: A tensor broadcastable to the selection (fixed noise, reproducible) or a float
            standard deviation, drawn with ``seed`` on every call.
        pos: Positions to corrupt (e.g. the subject tokens).
        seed: Seed when ``noise`` is a float.
    """

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        out = act.clone()
        sel = _selector(act, pos, None)
        if isinstance(noise, Tensor):
            out[sel] = out[sel] + noise.to(act.dtype)
        else:
            g = torch.Generator(device="cpu")
            if seed is not None:
                g.manual_seed(seed)
            eps = torch.randn(out[sel].shape, generator=g).to(act.device, act.dtype)
            out[sel] = out[sel] + noise * eps
        return out

    return hook


def record(store: MutableMapping[str, Tensor], key: str | None = None, detach: bool = True, pos: Index = None) -> HookFn:
    """Store the activation (or the selected positions) under ``key`` (default: hook name)."""

    def hook(act: Tensor, hook: Any = None) -> None:
        k = key if key is not None else getattr(hook, "name", "act")
        val = act[:, _pos(pos)] if pos is not None else act
        store[k] = val.detach().clone() if detach else val
        return None

    return hook


def capture_grad(store: MutableMapping[str, Tensor], key: str | None = None) -> HookFn:
    """Backward hook storing the gradient of the loss w.r.t. this activation."""

    def hook(grad: Tensor, hook: Any = None) -> None:
        k = key if key is not None else getattr(hook, "name", "grad")
        store[k] = grad.detach().clone()
        return None

    return hook


def replace_rows(rows: Tensor | slice, pos: Index, value: Tensor) -> HookFn:
    """Replace ``act[rows, pos, :]`` with ``value`` (kept in the graph: gradients flow to it).

    The building block of batched attribution: different batch rows carry different
    interventions (one layer's scaled neurons each), and ``value`` is the leaf tensor whose
    gradient is taken.
    """

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        out = act.clone()
        out[rows, _pos(pos)] = value.to(act.dtype)
        return out

    return hook
