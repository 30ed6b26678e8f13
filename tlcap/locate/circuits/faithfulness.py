"""Faithfulness curves: circuits from a handful of edges (or nodes) to the whole graph, and their areas.

For a circuit ``C`` of the scores' graph, with ``m`` the task metric averaged over the items
(MatchNLL or logit difference), ``N`` the full model and ``∅`` the empty circuit (every edge
ablated)::

    f(C) = (m(C) - m(∅)) / (m(N) - m(∅))          normalised faithfulness: 0 ablated, 1 full model

evaluated for circuits of growing size ``k`` (fraction ``x`` of the graph's edges, or nodes,
kept after pruning). The areas under the curve over ``x`` (trapezoid rule, over the evaluated
points sorted by ``x``) are MIB's

* **CPR** = ``∫ f(C_x) dx`` (higher is better) and
* **CMD** = ``∫ |1 - f(C_x)| dx`` (lower is better),

and ``complement_area`` = ``∫ f(N \\ C_x) dx``: the same curve for the *complement* of each
circuit (every edge except the circuit's; low when the circuit is necessary).

**Selection and pruning** (stated in every result, :data:`PRUNING`):

* ``top_n``: the ``n`` valid edges of largest ``|score|``, then :func:`~.circuit.prune_dead`
  repeatedly removes edges out of nodes with no incoming circuit edge and edges into readers
  whose nodes reach neither the logits nor a circuit edge, so a circuit holds *at most* ``n``
  edges and ``n`` (the reported size) counts what is left;
* ``greedy`` (:func:`greedy_order`): starting from the logits, each step adds the
  largest-``|score|`` edge into a reader of a node already in the circuit (every edge then
  reaches the logits), then the same pruning (edges out of nodes that no path from the input
  reaches);
* ``node``: the ``n`` nodes (input, heads, MLPs) of largest ``|node score|`` (sum of the node's
  out-edge scores: the first-order effect of ablating the node); a node outside the circuit has
  every out-edge ablated; no pruning.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tlcap.config import check_choice, check_int, check_sequence
from tlcap.locate.circuits.circuit import prune_dead, select_edges
from tlcap.locate.circuits.dataset import CircuitDataset, dataset_batch_size
from tlcap.locate.circuits.dataset_eval import circuit_metrics, ready_source
from tlcap.locate.circuits.eap import EdgeScores
from tlcap.locate.circuits.evaluate import task_for
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.models import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.runtime.batching import run_auto_batched
from tlcap.viz.circuit import faithfulness_figure

SELECTIONS: tuple[str, ...] = ("top_n", "greedy", "node")
PRUNING = {
    "top_n": "top-n edges by |score|, then dead edges pruned (out of nodes without an incoming circuit edge, into "
             "readers whose nodes reach neither the logits nor a circuit edge), repeatedly; n = edges left (<= top-n)",
    "greedy": "greedy from the logits: each step adds the largest-|score| edge into a reader of a node already in the "
              "circuit; then dead edges pruned as for top-n; n = edges left",
    "node": "top-n nodes (input, heads, MLPs) by |sum of out-edge scores|; a node outside the circuit has every "
            "out-edge ablated; no pruning; n = nodes",
}
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def curve_area(x: Sequence[float], y: Sequence[float]) -> float:
    """Trapezoid area under ``y(x)`` over the points sorted by ``x`` (0 for fewer than two points).

    Args:
        x: The x values.
        y: The y values, one per ``x``.

    Returns:
        The area.
    """
    pts = sorted(zip(x, y))
    return float(sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:])))


def default_sizes(total: int) -> list[int]:
    """0 and MIB's fractions of ``total`` (0.1 % … 100 %), rounded, at least 1, without repeats.

    Args:
        total: Edges (or nodes) in the graph.

    Returns:
        The sizes, increasing.
    """
    return sorted({0} | {max(1, round(f * total)) for f in MIB_FRACTIONS})


def greedy_order(graph: EdgeGraph, scores: Float[Tensor, "n_up n_readers"]) -> Int[Tensor, " n_edges"]:
    """Every valid edge (flat index into ``[n_up, n_readers]``) in greedy order (module docstring).

    Args:
        graph: The graph.
        scores: Edge scores.

    Returns:
        Flat edge indices; the greedy circuit of ``n`` edges is the first ``n``.
    """
    valid = graph.valid_mask()
    a = scores.abs().masked_fill(~valid, -1.0)
    rn = graph.reader_nodes()  # [n_readers, n_nodes]
    nr = graph.n_readers
    heap: list[tuple[float, int]] = []
    active = torch.zeros(nr, dtype=torch.bool)

    def activate(node: int) -> None:
        for v in torch.nonzero(rn[:, node] & ~active).flatten().tolist():
            active[v] = True
            for u in torch.nonzero(valid[:, v]).flatten().tolist():
                heapq.heappush(heap, (-float(a[u, v]), u * nr + v))

    in_circuit = torch.zeros(len(graph.nodes), dtype=torch.bool)
    in_circuit[-1] = True
    activate(len(graph.nodes) - 1)
    order: list[int] = []
    while heap:
        _, idx = heapq.heappop(heap)
        order.append(idx)
        u = idx // nr
        if not in_circuit[u]:
            in_circuit[u] = True
            activate(u)
    return torch.tensor(order, dtype=torch.long)


def node_scores(scores: Float[Tensor, "n_up n_readers"]) -> Float[Tensor, " n_up"]:
    """Each upstream node's score: the sum of its out-edge scores (first-order effect of ablating it everywhere).

    Args:
        scores: ``[n_up, n_readers]`` edge scores.

    Returns:
        ``[n_up]`` node scores (summed in float64, returned as float32).
    """
    return scores.double().sum(1).float()


def circuit_masks(
    graph: EdgeGraph, scores: Float[Tensor, "n_up n_readers"], sizes: Sequence[int], selection: str
) -> tuple[Bool[Tensor, "size n_up n_readers"], list[int]]:
    """The circuit of each size under ``selection`` (module docstring) and its size after pruning.

    Args:
        graph: The edge graph.
        scores: ``[n_up, n_readers]`` edge scores.
        sizes: Requested sizes (edges, or nodes for ``"node"``).
        selection: ``"top_n"``, ``"greedy"`` or ``"node"``.

    Returns:
        ``[size, n_up, n_readers]`` edge masks and each circuit's size (edges after pruning; nodes kept).
    """
    valid = graph.valid_mask()
    masks = []
    if selection == "node":
        order = node_scores(scores).abs().argsort(descending=True, stable=True)
        for n in sizes:
            keep = torch.zeros(graph.n_upstream, dtype=torch.bool)
            keep[order[:n]] = True
            masks.append(valid & keep[:, None])
        return torch.stack(masks), [min(n, graph.n_upstream) for n in sizes]
    order = greedy_order(graph, scores) if selection == "greedy" else None
    for n in sizes:
        if order is None:
            m = select_edges(scores, valid, top_n=n)
        else:
            m = torch.zeros(valid.numel(), dtype=torch.bool)
            m[order[:n]] = True
            m = m.view_as(valid)
        masks.append(prune_dead(graph, m))
    return torch.stack(masks), [int(m.sum()) for m in masks]


@dataclass(frozen=True)
class FaithfulnessRow:
    """One size of a :class:`FaithfulnessCurve`."""

    n_requested: int
    n: int
    fraction: float
    circuit_metric: float
    complement_metric: float
    faithfulness: float
    complement_faithfulness: float


@dataclass(frozen=True)
class FaithfulnessCurve(Result):
    """Normalised faithfulness of circuits of growing size and of their complements (module docstring).

    Attributes:
        n_requested: Requested sizes; n: edges (nodes) after pruning; total: edges (nodes) in the graph.
        circuit_metric, complement_metric: Task metric (mean over items) of each circuit and its complement.
        full_metric, ablated_metric: Of the full model and of the empty circuit.
        selection: ``"top_n"``, ``"greedy"`` or ``"node"`` (:data:`PRUNING` says what it means).
        ablation, metric, n_items, dataset, model_name: The run.
    """

    n_requested: tuple[int, ...]
    n: tuple[int, ...]
    total: int
    circuit_metric: tuple[float, ...]
    complement_metric: tuple[float, ...]
    full_metric: float
    ablated_metric: float
    selection: str = "top_n"
    ablation: str = ""
    metric: str = "nll"
    n_items: int = 1
    dataset: str = ""
    model_name: str = ""

    @classmethod
    def from_metrics(cls, n_requested: Sequence[int], n: Sequence[int], total: int, circuit_metric: Sequence[float],
                     complement_metric: Sequence[float], full_metric: float, ablated_metric: float,
                     **fields: Any) -> FaithfulnessCurve:
        """Build a curve from metric values (what :func:`faithfulness_curve` measures).

        Args:
            n_requested: Requested sizes.
            n: Edges (nodes) of each circuit after pruning.
            total: Edges (nodes) in the graph.
            circuit_metric: Task metric of each circuit run alone.
            complement_metric: Task metric of each circuit's complement.
            full_metric: Metric of the full model.
            ablated_metric: Metric of the empty circuit.
            **fields: The other fields (``selection``, ``ablation``, ``metric``, ``n_items``, ``dataset``, ``model_name``).

        Returns:
            The curve, values converted to ``int`` / ``float`` tuples.
        """
        return cls(tuple(int(v) for v in n_requested), tuple(int(v) for v in n), int(total),
                   tuple(float(v) for v in circuit_metric), tuple(float(v) for v in complement_metric),
                   float(full_metric), float(ablated_metric), **fields)

    def _f(self, m: float) -> float:
        gap = self.full_metric - self.ablated_metric
        return (m - self.ablated_metric) / gap if gap else float("nan")

    @property
    def fraction(self) -> tuple[float, ...]:
        """Share of the graph's edges (nodes) in each circuit."""
        return tuple(n / self.total for n in self.n)

    @property
    def faithfulness(self) -> tuple[float, ...]:
        """``(m(C) - m(∅)) / (m(N) - m(∅))`` per size."""
        return tuple(self._f(m) for m in self.circuit_metric)

    @property
    def complement_faithfulness(self) -> tuple[float, ...]:
        """The same for each circuit's complement."""
        return tuple(self._f(m) for m in self.complement_metric)

    @property
    def cpr(self) -> float:
        """Area under the faithfulness curve over the fraction kept (MIB's CPR; higher is better)."""
        return curve_area(self.fraction, self.faithfulness)

    @property
    def cmd(self) -> float:
        """Area under ``|1 - faithfulness|`` (MIB's CMD; lower is better)."""
        return curve_area(self.fraction, [abs(1 - f) for f in self.faithfulness])

    @property
    def complement_area(self) -> float:
        """Area under the complements' faithfulness (low: the circuit is necessary)."""
        return curve_area(self.fraction, self.complement_faithfulness)

    @property
    def pruning(self) -> str:
        """What the selection and pruning do (:data:`PRUNING`)."""
        return PRUNING[self.selection]

    def rows(self) -> list[FaithfulnessRow]:
        """One row per size.

        Returns:
            One :class:`FaithfulnessRow` per size, in the order measured.
        """
        return [FaithfulnessRow(*v) for v in zip(self.n_requested, self.n, self.fraction, self.circuit_metric,
                                                 self.complement_metric, self.faithfulness, self.complement_faithfulness)]

    def summary(self) -> dict[str, Any]:
        """Areas (CPR, CMD, complement), the selection and its pruning, and the curve as lists.

        Returns:
            A JSON-ready dict (``unit`` is ``"nodes"`` or ``"edges"``; ``curve`` as column lists).
        """
        return {
            "cpr": self.cpr, "cmd": self.cmd, "complement_area": self.complement_area, "selection": self.selection,
            "pruning": self.pruning, "unit": "nodes" if self.selection == "node" else "edges", "total": self.total,
            "full_metric": self.full_metric, "ablated_metric": self.ablated_metric, "metric": self.metric,
            "ablation": self.ablation, "n_items": self.n_items, "dataset": self.dataset, "model": self.model_name,
            "curve": self.to_frame().to_dict(orient="list"),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`FaithfulnessRow` per size.

        Returns:
            A DataFrame of :class:`FaithfulnessRow`.
        """
        return frame(self.rows(), FaithfulnessRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """Faithfulness of the circuits and their complements vs the fraction kept (:func:`faithfulness_figure`).

        Args:
            title: Figure title (default: selection, ablation, items, CPR and CMD).

        Returns:
            The plotly figure.
        """
        unit = "nodes" if self.selection == "node" else "edges"
        return faithfulness_figure(
            self.to_frame(), title or f"Faithfulness ({self.selection}, {self.ablation} ablation, {self.n_items} items"
            f"{', ' + self.dataset if self.dataset else ''}): CPR {self.cpr:.3f}, CMD {self.cmd:.3f}", unit)


def faithfulness_curve(
    model: Model,
    scores: EdgeScores,
    dataset: CircuitDataset | None = None,
    *,
    sizes: Sequence[int] | None = None,
    selection: str = "top_n",
    batch_size: int | str = "auto",
    max_memory: Any = None,
) -> FaithfulnessCurve:
    """Evaluate circuits of several sizes (and their complements) over the items the scores came from.

    Args:
        model: The model.
        scores: Edge scores (of a prompt pair, or of ``dataset``).
        dataset: The items to evaluate on (default: the scores' prompt pair); the scores' ablation is used.
        sizes: Circuit sizes in edges (nodes for ``selection="node"``), each ``>= 0``;
            default :func:`default_sizes` (0, then 0.1 % … 100 % of the graph).
        selection: ``"top_n"``, ``"greedy"`` or ``"node"`` (module docstring).
        batch_size: Items per pass, or ``"auto"`` (:func:`~tlcap.locate.circuits.dataset.dataset_batch_size`,
            halved and rerun on out-of-memory); exact: results do not depend on it.
        max_memory: Memory budget of ``batch_size="auto"`` (default: free memory).

    Returns:
        The :class:`FaithfulnessCurve`, with provenance.

    Example:
        >>> from tlcap.locate.circuits import edge_attribution, load_circuit_dataset
        >>> dataset = load_circuit_dataset("pararel", relation="P36", n=8, model=model)
        >>> scores = edge_attribution(model, dataset, steps=5)
        >>> curve = faithfulness_curve(model, scores, dataset, selection="greedy")
        >>> round(curve.cpr, 3), round(curve.cmd, 3)
        (0.902, 0.105)
        >>> fig = curve.figure()
    """
    check_choice("selection", selection, SELECTIONS, cli="--selection")
    if batch_size == "auto":
        size = dataset_batch_size(model, dataset, "auto", 1, max_memory, circuit_runs=True) if dataset is not None else 1
        return run_auto_batched(lambda b: faithfulness_curve(model, scores, dataset, sizes=sizes, selection=selection,
                                                             batch_size=b), size, model.device,
                                asked={"sizes": sizes, "selection": selection, "batch_size": batch_size})
    check_int("batch_size", batch_size, min=1)
    g = scores.graph
    total = g.n_upstream if selection == "node" else scores.n_edges
    sizes = list(check_sequence("sizes", list(default_sizes(total) if sizes is None else sizes), min_len=1,
                                cli="--sweep", item=lambda n, x: check_int(n, x, min=0, cli="--sweep")))
    if dataset is not None:
        d = dataset if scores.ablation == "corrupt" else dataset.without_corrupt()
        tasks = d.tasks(model, batch_size, scores.metric)
    else:
        tasks = [task_for(model, scores)]
    masks, n = circuit_masks(g, scores.scores, sizes, selection)
    valid = g.valid_mask()
    allm = torch.cat([torch.stack([valid, torch.zeros_like(valid)]), masks, valid[None] & ~masks])
    source = ready_source(model, g, tasks, scores.ablation or "zero")
    met = circuit_metrics(model, g, tasks, allm, source)["metric"]
    assert isinstance(met, Tensor)
    mean = met.double().mean(1).tolist()
    k = len(sizes)
    return FaithfulnessCurve.from_metrics(
        sizes, n, total, mean[2 : 2 + k], mean[2 + k :], mean[0], mean[1], selection=selection,
        ablation=scores.ablation, metric=scores.metric, n_items=sum(t.n_items for t in tasks), dataset=scores.dataset,
        model_name=model.name,
        provenance=Provenance.collect(model, config={"sizes": sizes, "selection": selection, "batch_size": batch_size}),
    )


__all__ = [
    "FaithfulnessCurve", "FaithfulnessRow", "MIB_FRACTIONS", "PRUNING", "SELECTIONS", "circuit_masks", "curve_area",
    "default_sizes", "faithfulness_curve", "greedy_order", "node_scores",
]
