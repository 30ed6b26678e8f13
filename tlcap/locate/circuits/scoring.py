"""The EAP / EAP-IG score sums of a batch of items (the core of :func:`~tlcap.locate.circuits.edge_attribution`).

For every item ``i`` of a :class:`~.task.CircuitTask` (one row each) and every edge ``u -> v``::

    score_i(u -> v) = sum_pos (ablated_u - clean_u)[i] . d metric_i / d input_v[i]

and :func:`batch_scores` returns ``sum_i score_i`` (one matrix product per item, accumulated in
float64), with each item's clean and fully ablated metric. A dataset's scores are that sum over
every batch divided by the number of items (:mod:`.dataset_eap`): the mean of the per-item
scores, whatever the batch size. Rows are independent in a forward pass (no normalisation
across the batch), so backpropagating the summed metric gives each row its own gradient; pad
positions (right padding) have zero gradient (module :mod:`.task`).

Neuron scores (``neurons=True``) use the same passes: each MLP neuron is a node whose output
is its activation times its ``W_out`` row, so its score is
``sum_pos (ablated_act - clean_act) * d metric / d act`` at the ``mlp_post`` site.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.ablation import AblationSource
from tlcap.locate.circuits.config import EAPConfig
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.passes import run_pass
from tlcap.locate.circuits.task import CircuitTask
from tlcap.models import Model


@dataclass(frozen=True)
class BatchScores:
    """Score sums of one batch of items.

    Attributes:
        scores: ``[n_up, n_readers]`` sum over the batch's items of the per-item edge scores (float64), or
            ``[item, n_up, n_readers]`` each item's own (``per_item``).
        clean_metric: ``[item]`` the metric of each item's clean run.
        ablated_metric: ``[item]`` the metric of each item's fully ablated run.
    """

    scores: Float[Tensor, "*item n_up n_readers"]
    clean_metric: Float[Tensor, " item"]
    ablated_metric: Float[Tensor, " item"]


_ACCUMULATE_BYTES = 64 * 2**20  # float64 copies of one position block at most (the 1B shape: 2 positions)


def _accumulate(diff: Tensor, grad: Tensor, per_item: bool = False) -> Tensor:
    """``sum_i diff[i] (n_up x pos*d) @ grad[i].T`` in float64, in blocks of positions (``per_item``: each
    item's own matrix, ``[item, n_up, n_readers]``).

    The float64 copies of a whole item would be the pass's peak on large models (1B shape,
    16 tokens: 344 MB); a block of positions bounds them by ``_ACCUMULATE_BYTES``.
    """
    out = torch.zeros(diff.shape[0] if per_item else 1, diff.shape[1], grad.shape[1], dtype=torch.float64,
                      device=diff.device)
    per_pos = (diff.shape[1] + grad.shape[1]) * diff.shape[-1] * 8
    step = max(1, _ACCUMULATE_BYTES // max(per_pos, 1))
    for i in range(diff.shape[0]):
        for p in range(0, diff.shape[2], step):
            d, g = diff[i, :, p : p + step].flatten(1).double(), grad[i, :, p : p + step].flatten(1).double()
            out[i if per_item else 0] += d @ g.T
    return out if per_item else out[0]


def batch_scores(model: Model, graph: EdgeGraph, task: CircuitTask, cfg: EAPConfig, source: AblationSource,
                 per_item: bool = False) -> BatchScores:
    """EAP (``cfg.steps == 1``) or EAP-IG score sums over the items of ``task``.

    Args:
        model: The model.
        graph: Its edge graph.
        task: A batch of items.
        cfg: The settings (``steps``, ``direction``).
        source: A ready (fitted) ablation source.
        per_item: Keep each item's scores (``scores`` is then ``[item, n_up, n_readers]``).

    Returns:
        The :class:`BatchScores` (edges that do not exist score 0).

    Raises:
        InvalidConfigError: ``direction="denoising"`` with ``steps=1`` on a task without corrupted rows.
    """
    n = task.n_items
    items = torch.arange(n, device=task.clean.device)
    if cfg.direction == "denoising" and cfg.steps == 1:
        if task.corrupt is None:
            raise InvalidConfigError("direction 'denoising' with steps=1 needs a corrupted prompt (not zero ablation)")
        noisy = run_pass(model, graph, task, task.corrupt, items=items, record_upstream=True, grads=True)
        clean = run_pass(model, graph, task, task.clean, items=items, record_upstream=True)
        assert noisy.upstream is not None and clean.upstream is not None and noisy.reader_grads is not None
        s = _accumulate(clean.upstream - noisy.upstream, noisy.reader_grads, per_item)
        return BatchScores(_mask(s, graph), clean.metric, noisy.metric)
    ablated = source.run(model, graph, task)
    abl_up = ablated.upstream
    if cfg.steps == 1:
        out = run_pass(model, graph, task, task.clean, items=items, record_upstream=True, grads=True)
        assert out.upstream is not None and out.reader_grads is not None
        clean_up, grad = out.upstream, out.reader_grads
    else:
        # EAP-IG: the gradient averaged along the straight input path from the ablated to the clean input.
        out = run_pass(model, graph, task, task.clean, items=items, record_upstream=True)
        assert out.upstream is not None
        clean_up = out.upstream
        k = cfg.steps
        alphas = ((torch.arange(k, dtype=torch.float32) + 0.5) / k).to(clean_up.device, clean_up.dtype)
        a0 = abl_up[:, 0].to(clean_up.dtype)  # [n, pos, d] the ablated input node
        x = a0[:, None] + alphas[None, :, None, None] * (clean_up[:, 0] - a0)[:, None]  # [n, k, pos, d]
        rows = items.repeat_interleave(k)  # item i's k points are rows i*k .. i*k+k-1
        # each item's k gradients are averaged inside the backward hook (never stored together)
        ig = run_pass(model, graph, task, task.clean[rows], items=rows, input_value=x.flatten(0, 1), grads=True,
                      mean_grads=k)
        assert ig.reader_grads is not None
        grad = ig.reader_grads  # [n, n_readers, pos, d]
    diff = abl_up.to(clean_up.dtype) - clean_up
    if cfg.direction == "denoising":
        diff = -diff
    if ablated.metric is not None:
        abl_metric = ablated.metric
    else:  # the fully ablated run: the empty circuit
        keep = torch.zeros(n, graph.n_upstream, graph.n_readers, device=task.clean.device)
        abl_metric = run_pass(model, graph, task, task.clean, items=items, keep=keep, replacement=abl_up).metric
    return BatchScores(_mask(_accumulate(diff, grad, per_item), graph), out.metric, abl_metric)


def _mask(scores: Tensor, graph: EdgeGraph) -> Tensor:
    return (scores * graph.valid_mask().to(scores.device)).cpu()


__all__ = ["BatchScores", "batch_scores"]
