"""The pass engine: one forward (and backward) pass over the edge graph.

:func:`run_pass` runs a batch of token rows (each row belongs to an item of a
:class:`~.task.CircuitTask`) and can, in the same pass,

* record every upstream node's output (``record_upstream``),
* replace the input node's output (``input_value``: EAP-IG's interpolation points),
* backpropagate the metric to every reader input (``grads``),
* run circuits alone (``keep`` + ``replacement``): every reader's input is rebuilt as

      input_v = (this run's residual at v) + sum_{u -> v not kept} (replacement_u - current_u)

  i.e. kept edges carry the upstream node's output *in this run* (which itself depends on the
  circuit), every other edge carries the replacement (an ablation source's output: the
  corrupted run, zeros, ...). The pre-norm residual is a plain sum of upstream outputs plus
  constant biases, so this is exact: keeping every edge reproduces the model, keeping none
  the ablated run. Each row may hold another circuit.

Scoring (:mod:`.eap`) and evaluation (:mod:`.evaluate`) are built on it; neither wires hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.graph import EdgeGraph, ReaderHook
from tlcap.locate.circuits.reader_grads import reader_grad_hook
from tlcap.locate.circuits.task import CircuitTask
from tlcap.models import Model
from tlcap.runtime import hooks as H


@dataclass(frozen=True)
class PassOutput:
    """What one pass returns.

    Attributes:
        logits: ``[batch, pos, d_vocab]`` (detached).
        metric: The task's metric per row.
        upstream: Every upstream output ``[batch, n_up, pos, d_model]`` (``record_upstream``).
        reader_grads: ``d metric / d reader input`` ``[batch, n_readers, pos, d_model]`` (``grads``;
            with ``mean_grads = k``: ``[batch // k, ...]``, the mean of each ``k`` consecutive rows).
        sites: Activations of the extra hook points (``record_sites``), by hook name.
        site_grads: ``d metric / d`` those activations (``record_sites`` with ``grads``).
    """

    logits: Float[Tensor, "batch pos d_vocab"]
    metric: Float[Tensor, " batch"]
    upstream: Float[Tensor, "batch n_up pos d_model"] | None = None
    reader_grads: Float[Tensor, "grad_rows n_readers pos d_model"] | None = None
    sites: dict[str, Tensor] | None = None
    site_grads: dict[str, Tensor] | None = None


def _as_nodes(act: Tensor) -> Tensor:
    """``[b, pos, head, d]`` → ``[b, head, pos, d]``; ``[b, pos, d]`` → ``[b, 1, pos, d]``."""
    return act.transpose(1, 2) if act.ndim == 4 else act[:, None]


def _stack_upstream(graph: EdgeGraph, store: dict[str, Tensor]) -> Tensor:
    return torch.cat([_as_nodes(store[name]) for name, _, _ in graph.upstream_hooks()], 1)


def _stack_readers(graph: EdgeGraph, store: dict[str, Tensor], batch: int, pos: int, d_model: int) -> Tensor:
    ref = next(iter(store.values()))
    parts = []
    for rh in graph.reader_hooks():
        g = store.get(rh.name)
        if g is None:  # a reader the metric does not depend on
            parts.append(torch.zeros(batch, rh.count, pos, d_model, dtype=ref.dtype, device=ref.device))
        else:
            parts.append(g.transpose(1, 2) if rh.per_head else g[:, None])
    return torch.cat(parts, 1)


def _ablation_hooks(
    graph: EdgeGraph, ups: dict[str, Tensor], keep: Tensor, replacement: Tensor
) -> list[tuple[str, Callable[..., Any]]]:
    """One hook per reader hook point adding ``sum over dropped edges (replacement_u - current_u)``."""
    valid = graph.valid_mask().to(keep.device)
    drop = (1.0 - keep.float()) * valid.float()  # [b, n_up, n_readers]
    order = graph.upstream_hooks()

    def make_delta(rh: ReaderHook) -> Callable[[Tensor], Tensor | None]:
        w = drop[:, : rh.n_avail, rh.start : rh.start + rh.count]
        if not bool((w != 0).any()):
            return lambda act: None

        def delta(act: Tensor) -> Tensor:
            parts = [_as_nodes(ups[name]) for name, start, _ in order if start < rh.n_avail]
            cur = torch.cat(parts, 1)[:, : rh.n_avail]  # [b, n_avail, pos, d]
            diff = replacement[:, : rh.n_avail].to(cur.dtype) - cur
            wt = w.to(cur.dtype)
            if rh.per_head:
                return torch.einsum("bupd,buc->bpcd", diff, wt)
            return torch.einsum("bupd,bu->bpd", diff, wt[..., 0])

        return delta

    return [(rh.name, H.add_computed(make_delta(rh))) for rh in graph.reader_hooks()]


def _post_norm_share_hooks(model: Model, graph: EdgeGraph, ups: dict[str, Tensor]) -> list[tuple[str, Callable[..., Any]]]:
    """Post-norm graphs: turn each layer's recorded head writes into their shares of ``ln1_post`` (:mod:`.graph`)."""
    if not graph.post_norm:
        return []
    return [(model.hook_name("attn_post_norm_scale", l),
             H.rms_norm_shares(ups, model.hook_name("head_result", l), model.attn_post_norm_gain(l)))
            for l in range(graph.n_layers)]


def run_pass(
    model: Model,
    graph: EdgeGraph,
    task: CircuitTask,
    tokens: Int[Tensor, "batch pos"],
    *,
    items: Int[Tensor, " batch"] | None = None,
    record_upstream: bool = False,
    input_value: Float[Tensor, "batch pos d_model"] | None = None,
    grads: bool = False,
    keep: Float[Tensor, "batch n_up n_readers"] | None = None,
    replacement: Float[Tensor, "#batch n_up pos d_model"] | None = None,
    grad_rows: list[int] | None = None,
    record_sites: tuple[str, ...] = (),
    mean_grads: int = 0,
    split_inputs: bool | None = None,
) -> PassOutput:
    """One forward (and optionally backward) pass on the edge graph.

    Args:
        model: The model.
        graph: Its edge graph.
        task: The task (its metric scores each row).
        tokens: ``[batch, pos]`` token ids.
        items: The task item of each row (default :meth:`CircuitTask.rows`).
        record_upstream: Return every upstream output.
        input_value: Replace the input node's output (the ``resid_pre`` site of layer 0).
        grads: Backpropagate the summed metric and return ``d metric / d reader input``.
        keep: Circuit-only run: ``keep[b, u, v]`` (0/1) says edge ``u -> v`` is in row
            ``b``'s circuit; every other valid edge carries ``replacement``.
        replacement: Upstream outputs replacing the dropped edges' (one row for every row,
            or one per row); needed with ``keep``.
        grad_rows: Backpropagate only these rows' metric (default: all rows).
        record_sites: More hook names to record (and, with ``grads``, to take the gradient at),
            e.g. the ``mlp_post`` sites for MLP-neuron nodes.
        mean_grads: ``k > 0``: keep only the mean of the reader gradients over each run of ``k``
            consecutive rows (``reader_grads`` is ``[batch // k, n_readers, pos, d_model]``;
            ``k`` divides the batch): EAP-IG's average over the ``k`` interpolation points of
            each item, taken in the backward hook so that the per-row gradients of every reader
            are never stored together.
        split_inputs: How the q/k/v readers' gradients are taken with ``grads`` (no ``keep``):
            ``True`` at the split per-head inputs; ``False`` from the projections' gradients
            (:mod:`.reader_grads`: no per-head copies of the residual in the forward, the same
            gradients); ``None`` (default): ``False`` where the model allows
            (:attr:`~tlcap.models.Model.grouped_reader_grads`). Circuit-only runs (``keep``)
            always split.

    Returns:
        A :class:`PassOutput`.
    """
    items = task.rows(tokens.shape[0]) if items is None else items
    grouped = grads and keep is None and (model.grouped_reader_grads if split_inputs is None else not split_inputs)
    fwd: list[tuple[str, Callable[..., Any]]] = []
    ups: dict[str, Tensor] = {}
    leaf_store: dict[str, Tensor] = {}
    input_hook = model.hook_name("resid_pre", 0)
    if input_value is not None:
        leaf_val = input_value.detach().clone().requires_grad_(grads)
        leaf_store["leaf"] = leaf_val
        fwd.append((input_hook, H.replace_rows(slice(None), None, leaf_val)))
    elif grads:
        fwd.append((input_hook, H.leaf(leaf_store)))
    if record_upstream or keep is not None:
        for name, _, _ in graph.upstream_hooks():
            fwd.append((name, H.record(ups, name, detach=not grads)))
        fwd += _post_norm_share_hooks(model, graph, ups)
    if keep is not None:
        if replacement is None:
            raise InvalidConfigError("run_pass(keep=...) needs replacement=")
        fwd += _ablation_hooks(graph, ups, keep, replacement)
    bwd: list[tuple[str, Callable[..., Any]]] = []
    gstore: dict[str, Tensor] = {}
    sites: dict[str, Tensor] = {}
    sgrads: dict[str, Tensor] = {}
    fwd += [(name, H.record(sites, name, detach=not grads)) for name in record_sites]
    if grads:
        saved: dict[str, Tensor] = {}
        for rh in graph.reader_hooks():
            if grouped and rh.site in ("q_input", "k_input", "v_input"):
                l, which = int(rh.layer), rh.site[0]
                if which == "q":  # the norm's input and scale, once per layer
                    fwd.append((model.hook_name("resid_pre", l), H.record(saved, f"x{l}", detach=True)))
                    fwd.append((model.hook_name("attn_norm_scale", l), H.record(saved, f"s{l}", detach=True)))
                bwd.append((model.hook_name(which, l), reader_grad_hook(model, l, which, gstore, rh.name, saved, mean_grads)))
            else:
                bwd.append((rh.name, H.capture_grad(gstore, rh.name, mean_rows=mean_grads)))
        bwd += [(name, H.capture_grad(sgrads, name)) for name in record_sites]
    with torch.set_grad_enabled(grads), model.edge_hooks(split_inputs=not grouped), model.hooks(fwd=fwd, bwd=bwd):
        logits = model.forward(tokens)
        metric = task.metric_rows(logits, items)
        if grads:
            sel = metric if grad_rows is None else metric[grad_rows]
            torch.autograd.grad(sel.sum(), [leaf_store["leaf"]])
    upstream = _stack_upstream(graph, ups).detach() if record_upstream else None
    reader_grads = None
    if grads:
        rows = tokens.shape[0] // mean_grads if mean_grads > 0 else tokens.shape[0]
        reader_grads = _stack_readers(graph, gstore, rows, tokens.shape[1], model.d_model)
    extra = {k: v.detach() for k, v in sites.items()} if record_sites else None
    return PassOutput(logits.detach(), metric.detach(), upstream, reader_grads, extra, sgrads if grads and record_sites else None)


__all__ = ["PassOutput", "run_pass"]
