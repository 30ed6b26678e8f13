"""The exact speed-ups of integrated gradients: batched runs with scaled last-position neurons.

How it is made fast (exact, not approximate):

- Only the last position is scaled and attention is causal, so every earlier position is
  identical to the clean run: the prefix's keys/values are computed once
  (:meth:`Model.prefix_cache`) and each step recomputes only the last token.
- Steps of *all* layers go into the same batch: row r scales layer ``l(r)`` by ``α(r)``; the
  rows are independent, so one backward pass gives every row's gradient.
- Rows that scale layer l are identical to the clean run below l: a batch runs as a single row
  up to its lowest scaled layer and is expanded there (``Model.logits(expand_at=...)``).
- Parameters are frozen; the only leaf with a gradient is the batch of scaled activations.

These are the building blocks of :func:`tlcap.attribution.integrated_gradients`; every result
they give is checked against the slow per-layer, per-step loop
(:func:`tlcap.attribution.reference_ig`) in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import PromptTooLongError
from tlcap.models.adapter import Model, PrefixCache
from tlcap.runtime import hooks as H


def layer_chunks(n_layers: int, rows_per_layer: int, batch_rows: int, n_chunks: int) -> list[tuple[int, int]]:
    """Row ranges of the batches: whole layers, consecutive, ≤ ``batch_rows`` rows when possible.

    Args:
        n_layers: Layers scored.
        rows_per_layer: Rows each layer needs (its quadrature points plus the baseline row).
        batch_rows: Most rows per batch.
        n_chunks: Split the layers into at least this many groups.

    Returns:
        ``(start, stop)`` row ranges covering ``n_layers · rows_per_layer`` rows.
    """
    per = max(1, min(math.ceil(n_layers / max(n_chunks, 1)), batch_rows // rows_per_layer or 1))
    out = []
    for first in range(0, n_layers, per):
        last = min(first + per, n_layers)
        lo, hi = first * rows_per_layer, last * rows_per_layer
        # a single layer with more rows than batch_rows is split further
        step = batch_rows if per == 1 and rows_per_layer > batch_rows else hi - lo
        out.extend((s, min(s + step, hi)) for s in range(lo, hi, step))
    return out


def fact_tokens(model: Model, prompt: str, target: str | Sequence[int]) -> tuple[list[int], list[int]]:
    """Prompt ids and target ids (tokenized in context, see :meth:`Model.target_ids`).

    Args:
        model: The model.
        prompt: The query.
        target: The answer (tokenized after ``prompt``) or its token ids (used as given).

    Returns:
        ``(prompt ids, target ids)``.

    Raises:
        PromptTooLongError: prompt + target do not fit the context window.
        TargetTokenizationError: a token-boundary problem between prompt and target.
    """
    p_ids = model.encode(prompt)
    t_ids = model.target_ids(prompt, target) if isinstance(target, str) else [int(t) for t in target]
    if len(p_ids) + len(t_ids) - 1 > model.n_ctx:
        raise PromptTooLongError(
            f"Prompt + target is {len(p_ids) + len(t_ids)} tokens; {model.name} has a context of {model.n_ctx}."
        )
    return p_ids, t_ids


def clean_last(
    model: Model, context: Sequence[int], hook_names: Sequence[str], prefix_reuse: bool
) -> tuple[Float[Tensor, "n_hooks d"], Float[Tensor, " d_vocab"], PrefixCache | None]:
    """Clean activations at the last position for the given hooks, last-position logits, prefix.

    Args:
        model: The model.
        context: Token ids of the clean run (prompt and any answer tokens before the scored one).
        hook_names: The hooks read at the last position.
        prefix_reuse: Cache the keys/values of ``context[:-1]`` and run the last token alone after them.

    Returns:
        ``(acts, logits, prefix)``: ``[n_hooks, d]`` activations, ``[d_vocab]`` logits, and the prefix cache
        (``None`` without ``prefix_reuse``).
    """
    toks = torch.tensor([list(context)], device=model.device)
    prefix = model.prefix_cache(toks[:, :-1]) if prefix_reuse else None
    run = toks[:, -1:] if prefix_reuse else toks
    acts, logits = model.last_position_activations(run, hook_names, prefix=prefix)
    return acts[0], logits[0], prefix


def scaled_batch(
    model: Model,
    context: Sequence[int],
    prefix: PrefixCache | None,
    hook_names: Sequence[str],
    row_layer: Int[Tensor, " rows"],
    values: Float[Tensor, " rows *d"],
    target_id: int,
    need_grad: bool = True,
    layer_ids: Sequence[int] = (),
    late_expand: bool = True,
) -> tuple[Float[Tensor, " rows"], Float[Tensor, " rows *d"] | None]:
    """Run rows where row r's activations at hook ``row_layer[r]`` (last position) are ``values[r]``.

    Args:
        model: The model.
        context: Token ids of the run (prompt, then the teacher-forced target tokens so far).
        prefix: The cache of ``context[:-1]`` (``None``: run the whole context).
        hook_names: The neuron site's hook name of each scored layer.
        row_layer: Index into ``hook_names`` of the layer each row scales; ``-1`` for every row
            means "set every hook" (joint scaling: ``values`` is ``[rows, n_hooks, d]``).
        values: ``[rows, d]`` (one layer per row) or ``[rows, n_hooks, d]`` (joint).
        target_id: The token whose probability is taken.
        need_grad: Also return d prob / d values.
        layer_ids: ``layer_ids[i]`` is the model layer of ``hook_names[i]``.
        late_expand: Share one row below the lowest scaled layer (exact, cheaper).

    Returns:
        The target probability per row and, if ``need_grad``, its gradient w.r.t. ``values``.
    """
    rows = values.shape[0]
    leaf = values.detach().clone().requires_grad_(need_grad)
    fwd = []
    for i, name in enumerate(hook_names):
        if leaf.ndim == 3:
            fwd.append((name, H.replace_rows(slice(None), -1, leaf[:, i])))
        else:
            sel = (row_layer == i).nonzero().flatten()
            if len(sel) == 0:
                continue
            fwd.append((name, H.replace_rows(sel, -1, leaf[sel])))
    toks = torch.tensor([list(context)], device=model.device)
    run = toks[:, -1:] if prefix is not None else toks
    # rows differ only from their lowest scaled layer on: share the layers below it
    lowest = min(layer_ids) if leaf.ndim == 3 else min(layer_ids[int(i)] for i in row_layer.unique())
    with torch.set_grad_enabled(need_grad):
        logits = model.last_logits(run, hooks=fwd, prefix=prefix, expand_at=lowest if late_expand else None, batch=rows)
        probs = logits.float().softmax(-1)[:, target_id]
        grad = torch.autograd.grad(probs.sum(), leaf)[0] if need_grad else None
    return probs.detach(), grad


__all__ = ["layer_chunks", "fact_tokens", "clean_last", "scaled_batch"]
