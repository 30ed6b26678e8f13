"""Hook factories: small functions that build TransformerLens hook functions.

Every factory returns ``fn(activation, hook) -> activation`` that never edits its input in
place (it clones first), so the factories compose with autograd. Apply them with
:meth:`tlcap.models.Model.hooks`, a context manager that always removes them.

Selections are ``(pos, index)``: ``pos`` picks sequence positions (``None`` = all, an int,
a slice, a list or ``"last"``); ``index`` picks entries of the last axis (``None`` = all, an
int, a list or a LongTensor), e.g. neurons for ``mlp_post``. For head sites (``batch pos head
d``) pass ``head=`` to select heads.

Tensors a hook puts into an activation (values, sources, noise, factors) are moved to the
activation's device and dtype: on a model split over several devices (:mod:`tlcap.models.placement`)
layer l's activations live on layer l's device, not the input device where the tensors were made.

Shapes (jaxtyping, checked in the test run): an activation is ``Float[Tensor, " batch *dims"]``
(``batch pos d``, ``batch pos head d`` or ``batch head q k``); a hook returns a tensor of the
same shape unless its docstring says otherwise (:func:`last_position_only`,
:func:`expand_batch`), or ``None`` when it only records.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, NoReturn

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tlcap.errors import ShapeMismatchError

Index = int | slice | Sequence[int] | Tensor | str | None
Activation = Float[Tensor, " batch *dims"]
HookFn = Callable[[Tensor, Any], Tensor | None]
HookList = Sequence[tuple[str, Callable[..., Any]]]  # (hook name, fn(activation, hook)) pairs for Model.hooks


def _pos(pos: Index) -> Any:
    if pos is None:
        return slice(None)
    if pos == "last":
        return -1
    if isinstance(pos, (list, tuple)):
        return torch.tensor(pos, dtype=torch.long)
    return pos


def position_index(pos: Index) -> Any:
    """What ``act[:, position_index(pos)]`` indexes for a hook's ``pos`` (``None``: every position, ``"last"``: -1).

    Example:
        >>> position_index(None), position_index("last"), position_index([0, 2]).tolist()
        (slice(None, None, None), -1, [0, 2])
    """
    return _pos(pos)


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
        raise ShapeMismatchError(f"selector expects a [batch, pos, ...] activation, got shape {tuple(act.shape)}")
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


def scale(factor: float | Float[Tensor, "..."], pos: Index = None, index: Index = None, head: Index = None) -> HookFn:
    """Multiply the selected activations by ``factor`` (0 suppresses, 2 enhances)."""

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.clone()
        sel = _selector(act, pos, index, head)
        out[sel] = out[sel] * (factor.to(act.device) if isinstance(factor, Tensor) else factor)
        return out

    return hook


def set_to(value: float | Float[Tensor, "..."], pos: Index = None, index: Index = None, head: Index = None) -> HookFn:
    """Overwrite the selected activations with ``value`` (broadcast)."""

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.clone()
        out[_selector(act, pos, index, head)] = value.to(act.device) if isinstance(value, Tensor) else value
        return out

    return hook


def ablate(
    pos: Index = None, index: Index = None, head: Index = None, mean_over: Float[Tensor, "..."] | None = None
) -> HookFn:
    """Zero-ablate the selection, or set it to ``mean_over`` (e.g. a dataset mean activation)."""
    return set_to(0.0 if mean_over is None else mean_over, pos, index, head)


def patch(source: Float[Tensor, " src_batch *dims"], pos: Index = None, index: Index = None, head: Index = None) -> HookFn:
    """Copy the selection from ``source`` (e.g. a cached clean activation; batch broadcasts)."""

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.clone()
        sel = _selector(act, pos, index, head)
        src = source.to(act.device, act.dtype)
        src = src.expand_as(act) if source.shape != act.shape else src
        out[sel] = src[sel]
        return out

    return hook


def add_noise(noise: Float[Tensor, "..."] | float, pos: Index = None, seed: int | None = None) -> HookFn:
    """Add noise to the selected positions.

    Args:
        noise: A tensor broadcastable to the selection (fixed noise, reproducible) or a float
            standard deviation, drawn with ``seed`` on every call.
        pos: Positions to corrupt (e.g. the subject tokens).
        seed: Seed when ``noise`` is a float.
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.clone()
        sel = _selector(act, pos, None)
        if isinstance(noise, Tensor):
            out[sel] = out[sel] + noise.to(act.device, act.dtype)
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

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> None:
        k = key if key is not None else getattr(hook, "name", "act")
        val = act[:, _pos(pos)] if pos is not None else act
        store[k] = val.detach().clone() if detach else val
        return None

    return hook


def record_at(store: MutableMapping[str, Tensor], key: str, pos: Int[Tensor, " n"]) -> HookFn:
    """Record ``act[i, pos[i]]`` for the first ``len(pos)`` rows: one position of each row (e.g. its own last token
    in a right-padded batch), detached.

    Example:
        >>> store = {}
        >>> toks = model.encode_batch(["The capital of France is", "Hi"])
        >>> name = model.hook_name("mlp_post", 0)
        >>> _ = model.last_logits(toks, hooks=[(name, record_at(store, name, toks.lengths - 1))])
        >>> alone = model.last_position_activations(model.to_tokens("Hi"), [name])[0][0, 0]
        >>> store[name].shape[0], torch.allclose(store[name][1], alone, atol=1e-5)
        (2, True)
    """

    def hook(act: Float[Tensor, " batch pos *dims"], hook: Any = None) -> Float[Tensor, " batch pos *dims"]:
        idx = pos.to(act.device)
        store[key] = act[torch.arange(len(idx), device=act.device), idx].detach()
        return act

    return hook


def rms_norm_shares(store: MutableMapping[str, Tensor], key: str, gain: Float[Tensor, " d_model"]) -> HookFn:
    """At an RMSNorm's scale site: turn the terms recorded under ``key`` into their shares of its output.

    The terms (``[batch, pos, term, d]``, e.g. every head's write) sum to the norm's input ``x``;
    the norm outputs ``x / rms(x) ⊙ γ``, so term ``t``'s share is ``t / rms(x) ⊙ γ`` and the shares
    sum to the output exactly. The scale activation (``[batch, pos, 1]``, the RMS) is not changed.
    """

    def hook(act: Float[Tensor, "batch pos 1"], hook: Any = None) -> None:
        terms = store[key]
        store[key] = terms * (gain.to(terms.device, terms.dtype) / act.to(terms.device, terms.dtype)[..., None])
        return None

    return hook


def capture_grad(store: MutableMapping[str, Tensor], key: str | None = None, mean_rows: int = 0) -> HookFn:
    """Backward hook storing the gradient of the loss w.r.t. this activation.

    With ``mean_rows = k > 0`` only the mean over each run of ``k`` consecutive batch rows is
    kept (``[batch // k, *dims]``; ``k`` must divide the batch): a batch holding ``k``
    interpolation points per item then keeps one gradient row per item, not ``k``.
    """

    def hook(grad: Float[Tensor, " batch *dims"], hook: Any = None) -> None:
        k = key if key is not None else getattr(hook, "name", "grad")
        g = grad.detach()
        store[k] = g.unflatten(0, (-1, mean_rows)).mean(1) if mean_rows > 0 else g.clone()
        return None

    return hook


def replace_rows(rows: Int[Tensor, " n"] | slice, pos: Index, value: Float[Tensor, "..."]) -> HookFn:
    """Replace ``act[rows, pos, :]`` with ``value`` (kept in the graph: gradients flow to it).

    The building block of batched attribution: different batch rows carry different
    interventions (one layer's scaled neurons each), and ``value`` is the leaf tensor whose
    gradient is taken.
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.clone()
        out[rows, _pos(pos)] = value.to(act.device, act.dtype)
        return out

    return hook


def leaf(store: MutableMapping[str, Tensor] | None = None, key: str = "leaf") -> HookFn:
    """Cut the graph here: the activation becomes a fresh leaf that requires grad.

    With frozen parameters, a backward pass from a metric then reaches every hook point
    downstream of this one (and fires their backward hooks) without touching parameter
    gradients. The leaf is stored under ``key`` when ``store`` is given.
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.detach().clone().requires_grad_(True)
        if store is not None:
            store[key] = out
        return out

    return hook


def add_computed(delta_fn: Callable[[Tensor], Float[Tensor, "..."] | None]) -> HookFn:
    """Add ``delta_fn(act)`` to the activation (``None`` = leave it unchanged).

    The delta is computed when the hook fires, so it can depend on activations recorded
    earlier in the same forward pass (e.g. circuit-only evaluation rebuilding a reader's
    input from the upstream outputs of this run). Gradients flow through both terms.
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        delta = delta_fn(act)
        if delta is None:
            return act
        return act + delta.to(act.device, act.dtype)

    return hook


def scale_where(mask: Bool[Tensor, "..."], factor: float | Float[Tensor, "..."]) -> HookFn:
    """Multiply the entries where ``mask`` is True by ``factor`` (the others stay as they are).

    ``mask`` broadcasts against the activation without its batch axis, e.g. a ``[head, 1, k]``
    column mask on the ``attn_pattern`` site (``[batch, head, q, k]``) scales whole key columns of
    the chosen heads — the knowledge-synapse intervention of the QL paper (no renormalisation).
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        m = mask.to(act.device)
        f = torch.as_tensor(factor, dtype=act.dtype, device=act.device)
        return torch.where(m, act * f, act)

    return hook


def scale_rows(factor: Float[Tensor, "batch d"], pos: Index = None,
               starts: Int[Tensor, " batch"] | None = None) -> HookFn:
    """Per-row, per-unit scaling: ``act[b, pos, j] *= factor[b, j]`` (``pos=None``: every position).

    Each row carries its own intervention (e.g. its own neuron set erased: a 0/1 row on ``mlp_post``,
    :class:`tlcap.intervene.set_rows.SetFactors`), so one pass scores many sets. Packed rows hand it ``[rows, 1, d]``.
    ``starts`` (with ``pos=None``) scales row ``b`` only from position ``starts[b]`` on: the rows of right-padded
    prompts of different lengths each scaled at their own last token (``starts = lengths - 1``; the padding after
    it reaches no real position).

    Example:
        >>> toks = model.to_tokens("The capital of France is")
        >>> f = torch.ones(8, model.d_mlp); f[3, [5, 9]] = 0     # row 3 erases neurons 5 and 9
        >>> out = model.logits(toks.expand(8, -1), hooks=[(model.hook_name("mlp_post", 1), scale_rows(f))])
        >>> tuple(out.shape), torch.equal(out[0], out[1]), torch.equal(out[0], out[3])
        ((8, 5, 50257), True, False)
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        if act.ndim != 3 or act.shape[0] != factor.shape[0] or act.shape[2] != factor.shape[1]:
            raise ShapeMismatchError(f"scale_rows has factors {tuple(factor.shape)} for an activation of shape "
                                     f"{tuple(act.shape)}; give one factor row per batch row, one column per unit")
        f = factor.to(act.device, act.dtype)[:, None, :]
        if starts is not None:
            on = torch.arange(act.shape[1], device=act.device)[None, :, None] >= starts.to(act.device)[:, None, None]
            return torch.where(on, act * f, act)
        out, p = act.clone(), _pos(pos)
        out[:, p] *= f if isinstance(p, (slice, Tensor)) else f[:, 0]
        return out

    if starts is not None and pos is not None:
        raise ShapeMismatchError("scale_rows takes either pos= or starts=, not both")
    return hook


def patch_rows(source: Float[Tensor, " src_batch *dims"], rows: Int[Tensor, " n"], pos: int | Int[Tensor, " n"]) -> HookFn:
    """Per-row patching: ``act[rows[i], pos[i]] = source[rows[i] or 0, pos[i]]``.

    Different batch rows restore different positions from a cached (clean) activation, so one
    forward pass carries many restorations (batched causal tracing). ``source`` has batch 1
    (broadcast to every row) or the batch of the activation; ``pos`` is one int for every row
    or a LongTensor aligned with ``rows``.
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.clone()
        r = rows.to(act.device)
        p = pos.to(act.device) if isinstance(pos, Tensor) else torch.full_like(r, int(pos))
        src_rows = torch.zeros_like(r) if source.shape[0] == 1 else r
        out[r, p] = source.to(act.device, act.dtype)[src_rows, p]
        return out

    return hook


def add_rows(rows: Int[Tensor, " n"] | slice, pos: int | Int[Tensor, " n"], value: Float[Tensor, "..."]) -> HookFn:
    """Add ``value`` to ``act[rows[i], pos[i]]`` (gradients flow to ``value``).

    ``pos`` is one int for every row or a LongTensor aligned with ``rows``; ``value`` broadcasts
    to ``[len(rows), ...]`` (e.g. one ``[d_model]`` vector added at each row's own position —
    ROME's value optimisation on right-padded prompts of different lengths).
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        out = act.clone()
        r = torch.arange(act.shape[0], device=act.device)[rows] if isinstance(rows, slice) else rows.to(act.device)
        p = pos.to(act.device) if isinstance(pos, Tensor) else torch.full_like(r, int(pos))
        out[r, p] = out[r, p] + value.to(act.device, act.dtype)
        return out

    return hook


class StopForward(Exception):
    """Raised by :func:`stop_forward` to end a forward pass early (caught by the caller)."""


def stop_forward() -> HookFn:
    """Abort the forward pass at this hook (after earlier hooks recorded what they need).

    Wrap the call in ``try: ... except StopForward: pass``; ``Model.hooks`` removes every hook
    on the way out. Saves the layers above the last one a method reads (e.g. key statistics).
    :meth:`tlcap.models.Model.record` does all of this for recording hook points.
    """

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> NoReturn:
        raise StopForward(getattr(hook, "name", ""))

    return hook


def expand_batch(batch: int) -> HookFn:
    """Repeat a batch-1 activation ``batch`` times (start of a late-expanded batched run).

    Rows that differ only from layer ``l`` on can share one row below ``l``: run batch 1 up to
    the ``resid_pre`` site of layer ``l`` and expand there (see ``Model.logits(expand_at=...)``).
    """

    def hook(act: Float[Tensor, " in_batch *dims"], hook: Any = None) -> Float[Tensor, " out_batch *dims"]:
        if act.shape[0] == batch:
            return act
        return act.expand(batch, *act.shape[1:]).clone()

    return hook


def repeat_rows(counts: Int[Tensor, " rows"]) -> HookFn:
    """Repeat row ``g`` of a ``rows``-row activation ``counts[g]`` times (``repeat_interleave``).

    The start of a late-expanded batch of several contexts (``Model.continue_rows``): each
    context runs as one row below the expansion layer. An activation that already has
    ``sum(counts)`` rows is returned unchanged.
    """
    total = int(counts.sum())

    def hook(act: Float[Tensor, " in_batch *dims"], hook: Any = None) -> Float[Tensor, " out_batch *dims"]:
        if act.shape[0] == total:
            return act
        return act.repeat_interleave(counts.to(act.device), 0)

    return hook


from tlcap.runtime.position_hooks import gather_positions, last_position_only, select_positions  # noqa: E402,F401
