"""Circuit-only evaluation: run the model with every non-circuit edge ablated.

Circuit-only runs are :func:`~.passes.run_pass` with ``keep`` = the circuit's edges and
``replacement`` = an ablation source's outputs (:mod:`.ablation`): exact, so the full circuit
reproduces the clean model and the empty circuit the ablated run. Many circuits are
evaluated as one batch (one row per circuit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tlcap.locate.circuits.ablation import ablation_source, fit_source
from tlcap.locate.circuits.circuit import Circuit
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.passes import run_pass
from tlcap.locate.circuits.task import CircuitTask, make_task
from tlcap.models import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.viz.circuit import evaluation_figure


def ablated_upstream(
    model: Model, graph: EdgeGraph, task: CircuitTask, ablation: str | None = None
) -> Float[Tensor, "item n_up pos d_model"]:
    """The upstream outputs that replace dropped edges (:mod:`.ablation`).

    Args:
        model: The model.
        graph: Its edge graph.
        task: The task.
        ablation: ``"corrupt"``, ``"zero"``, ``"mean"`` or ``"mean-positional"`` (the means over
            this task's prompts); default ``corrupt`` when the task has corrupted rows, else ``zero``.

    Returns:
        ``[item, n_up, pos, d_model]`` replacement outputs.
    """
    name = ablation or ("corrupt" if task.corrupt is not None else "zero")
    return fit_source(ablation_source(name), model, graph, [task]).run(model, graph, task).upstream


def evaluate_masks(
    model: Model,
    graph: EdgeGraph,
    task: CircuitTask,
    masks: Bool[Tensor, "n_circuits n_up n_readers"],
    batch: int = 8,
    replacement: Float[Tensor, "item n_up pos d_model"] | None = None,
    return_logits: bool = False,
    ablation: str | None = None,
) -> dict[str, Tensor]:
    """Circuit-only runs of many circuits on a one-item task.

    Args:
        model: The model.
        graph: Its edge graph.
        task: The task (one item).
        masks: One edge mask per circuit.
        batch: Circuits per forward pass (exact: results do not depend on it).
        replacement: Ablated upstream outputs (default: :func:`ablated_upstream`).
        return_logits: Also return the logits ``[n_circuits, pos, d_vocab]``.
        ablation: The ablation source when ``replacement`` is not given.

    Returns:
        Per circuit: ``nll``, ``rank`` (1-based, of the first target token), ``target_logit``,
        ``metric`` (and ``logits``).
    """
    if replacement is None:
        replacement = ablated_upstream(model, graph, task, ablation)
    out: dict[str, list[Tensor]] = {"nll": [], "rank": [], "target_logit": [], "metric": [], "logits": []}
    for i in range(0, masks.shape[0], batch):
        m = masks[i : i + batch].to(model.device)
        toks = task.clean.expand(m.shape[0], -1)
        res = run_pass(model, graph, task, toks, keep=m.float(), replacement=replacement[:1])
        st = task.target_stats(res.logits)
        for k in ("nll", "rank", "target_logit"):
            out[k].append(st[k].cpu())
        out["metric"].append(res.metric.cpu())
        if return_logits:
            out["logits"].append(res.logits.cpu())
    return {k: torch.cat(v) for k, v in out.items() if v}


@dataclass(frozen=True)
class CircuitEvaluation(Result):
    """The circuit alone vs the full model and the fully ablated run.

    NLLs are MatchNLL of the target; ranks are 1-based ranks of the (first) target token;
    ``logit_diff_vs_full`` is the target logit with the circuit alone minus with the full
    model; ``recovered`` = (ablated NLL - circuit NLL) / (ablated NLL - full NLL).
    ``param_fraction`` is the share of the transformer-block parameters in the circuit,
    ``param_fraction_with_embeddings`` the older all-parameter share (:class:`Circuit`).
    """

    n_edges: int
    n_nodes: int
    param_fraction: float
    param_fraction_with_embeddings: float
    ablation: str
    full_nll: float
    circuit_nll: float
    ablated_nll: float
    full_target_rank: int
    circuit_target_rank: int
    ablated_target_rank: int
    hit_at_1: bool
    hit_at_10: bool
    full_target_logit: float
    circuit_target_logit: float
    logit_diff_vs_full: float
    recovered: float
    metric: str = "nll"
    full_metric: float = float("nan")
    circuit_metric: float = float("nan")
    selection: str = ""

    def summary(self) -> dict[str, Any]:
        """Every field (the headline numbers of a circuit-only run).

        Returns:
            :meth:`to_dict`.
        """
        return self.to_dict()

    def to_frame(self) -> pd.DataFrame:
        """One row with every field.

        Returns:
            A one-row DataFrame.
        """
        return pd.DataFrame([self.to_dict()])

    def figure(self, title: str | None = None) -> go.Figure:
        """Target NLL and rank: full model, circuit alone, every edge ablated.

        Args:
            title: Figure title (default: edges, selection and ablation).

        Returns:
            A plotly figure of the three runs' NLL and target rank.
        """
        return evaluation_figure(
            ["full model", "circuit alone", "all edges ablated"], [self.full_nll, self.circuit_nll, self.ablated_nll],
            [self.full_target_rank, self.circuit_target_rank, self.ablated_target_rank],
            title or f"Circuit alone ({self.n_edges} edges, {self.selection or 'selected'}; {self.ablation} ablation)",
        )


def task_for(model: Model, obj: Any) -> CircuitTask:
    """Rebuild the :class:`CircuitTask` an :class:`EdgeScores` or :class:`Circuit` was computed on.

    Args:
        model: The model.
        obj: Anything with ``prompt``, ``target``, ``corrupt_prompt``, ``metric`` and ``corrupt_target``.

    Returns:
        The task.
    """
    return make_task(model, obj.prompt, obj.target, obj.corrupt_prompt, obj.metric, obj.corrupt_target)


def evaluate_circuits(
    model: Model, circuits: Sequence[Circuit], task: CircuitTask | None = None, batch: int = 8
) -> list[CircuitEvaluation]:
    """Evaluate several circuits of the same scores in one batch (with the full and the empty circuit).

    Args:
        model: The model.
        circuits: Circuits over the same graph and task.
        task: The task (default: rebuilt from the first circuit).
        batch: Circuits per forward pass.

    Returns:
        One :class:`CircuitEvaluation` per circuit, with provenance.
    """
    first = circuits[0]
    task = task or task_for(model, first)
    full = torch.ones_like(first.mask)
    masks = torch.stack([full, torch.zeros_like(first.mask)] + [c.mask for c in circuits])
    r = evaluate_masks(model, first.graph, task, masks, batch=batch, ablation=first.ablation or None)
    nll, rank, tl, met = r["nll"].tolist(), r["rank"].tolist(), r["target_logit"].tolist(), r["metric"].tolist()
    gap = nll[1] - nll[0]
    out = []
    prov = Provenance.collect(model, config={"batch": batch, "metric": task.metric}, seed=None)
    for i, c in enumerate(circuits, start=2):
        out.append(CircuitEvaluation(
            n_edges=c.n_edges, n_nodes=c.n_nodes, param_fraction=c.param_fraction,
            param_fraction_with_embeddings=c.param_fraction_with_embeddings,
            ablation=c.ablation or ("corrupt" if task.corrupt is not None else "zero"),
            full_nll=nll[0], circuit_nll=nll[i], ablated_nll=nll[1],
            full_target_rank=int(rank[0]), circuit_target_rank=int(rank[i]), ablated_target_rank=int(rank[1]),
            hit_at_1=bool(rank[i] == 1), hit_at_10=bool(rank[i] <= 10),
            full_target_logit=tl[0], circuit_target_logit=tl[i], logit_diff_vs_full=tl[i] - tl[0],
            recovered=(nll[1] - nll[i]) / gap if gap != 0 else float("nan"),
            metric=task.metric, full_metric=met[0], circuit_metric=met[i], selection=c.selection, provenance=prov,
        ))
    return out


def evaluate_circuit(model: Model, circuit: Circuit, task: CircuitTask | None = None) -> CircuitEvaluation:
    """Run the model with every non-circuit edge ablated and compare with the full / ablated runs.

    Args:
        model: The model.
        circuit: The circuit.
        task: The task (default: rebuilt from the circuit's strings).

    Returns:
        The :class:`CircuitEvaluation`, with provenance.

    Example:
        >>> from tlcap.locate.circuits import edge_attribution
        >>> scores = edge_attribution(model, "The capital of France is", " Paris", "The capital of Italy is")
        >>> ev = evaluate_circuit(model, scores.select(top_n=20))
        >>> ev.hit_at_10                 # is " Paris" in the circuit's top 10? (not on a random model)
        False
    """
    return evaluate_circuits(model, [circuit], task)[0]


__all__ = ["CircuitEvaluation", "ablated_upstream", "evaluate_circuit", "evaluate_circuits", "evaluate_masks", "task_for"]
