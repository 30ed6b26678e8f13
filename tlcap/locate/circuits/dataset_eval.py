"""Circuit-only runs over a dataset: every circuit on every item, streamed one batch of items at a time.

For each batch of items the ablation source's outputs are computed once (the corrupted run,
zeros, or the fitted dataset means, :mod:`.ablation`) and every circuit runs on the batch with
:func:`~.passes.run_pass` (``keep`` = its edges, ``replacement`` = those outputs). Exactness is
that of the pass engine: the full circuit reproduces the model on every item and the empty
circuit the ablated model (every node's output replaced by its ablated value), whatever the
scheme; right padding changes no real position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Bool
from torch import Tensor

from tlcap.locate.circuits.ablation import AblationSource, ablation_source, fit_source
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.passes import run_pass
from tlcap.locate.circuits.task import CircuitTask
from tlcap.models import Model


def ready_source(model: Model, graph: EdgeGraph, tasks: Sequence[CircuitTask], ablation: str) -> AblationSource:
    """The ablation source called ``ablation``, fitted on ``tasks`` when it needs fitting (the mean schemes).

    Args:
        model: The model.
        graph: The edge graph.
        tasks: The tasks the means are fitted on.
        ablation: An ablation name (``"zero"``, ``"corrupt"``, ``"mean"``, ``"mean-positional"``, ...).

    Returns:
        The ready :class:`AblationSource`.
    """
    return fit_source(ablation_source(ablation), model, graph, tasks)


def circuit_metrics(
    model: Model,
    graph: EdgeGraph,
    tasks: Sequence[CircuitTask],
    masks: Bool[Tensor, "n_circuits n_up n_readers"],
    source: AblationSource,
    return_logits: bool = False,
) -> dict[str, Tensor | list[Tensor]]:
    """The task metric, target NLL and rank of every circuit on every item.

    Args:
        model: The model.
        graph: Its edge graph.
        tasks: Batches of items (:meth:`~.dataset.CircuitDataset.tasks`).
        masks: One edge mask per circuit.
        source: A ready ablation source (:func:`ready_source`).
        return_logits: Also return each batch's logits ``[n_circuits, batch, pos, d_vocab]`` (a list).

    Returns:
        ``metric``, ``nll``, ``rank``: ``[n_circuits, n_items]`` (items in dataset order), and
        ``logits`` with ``return_logits``.
    """
    out: dict[str, list[Tensor]] = {"metric": [], "nll": [], "rank": []}
    logits: list[Tensor] = []
    for task in tasks:
        rep = source.run(model, graph, task).upstream
        items = torch.arange(task.n_items, device=task.clean.device)
        per: dict[str, list[Tensor]] = {k: [] for k in out}
        lg = []
        for m in masks:
            keep = m.to(model.device).float()[None].expand(task.n_items, -1, -1)
            res = run_pass(model, graph, task, task.clean, items=items, keep=keep, replacement=rep)
            st = task.target_stats(res.logits, items)
            per["metric"].append(res.metric.cpu())
            per["nll"].append(st["nll"].cpu())
            per["rank"].append(st["rank"].cpu())
            if return_logits:
                lg.append(res.logits.cpu())
        for k in out:
            out[k].append(torch.stack(per[k]))
        if return_logits:
            logits.append(torch.stack(lg))
    res_d: dict[str, Tensor | list[Tensor]] = {k: torch.cat(v, 1) for k, v in out.items()}
    if return_logits:
        res_d["logits"] = logits
    return res_d


__all__ = ["circuit_metrics", "ready_source"]
