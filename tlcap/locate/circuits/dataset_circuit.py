"""The circuit of a dataset (a relation, a task): score, select, faithfulness curve (``tlcap circuit --dataset``).

A composition of the circuit pieces: :func:`edge_attribution` over a :class:`CircuitDataset`
(scores = mean of the per-item scores) → a circuit of ``top_n`` edges (top-n or greedy
selection, pruned; with ``granularity="node"`` the ``top_n`` nodes of largest ``|node score|``
and all their out-edges, no pruning) → :func:`faithfulness_curve` over the same items (in edges,
or in nodes), whose sizes include the selected circuit's, so its faithfulness is one point of
the curve. Everything is in one
:class:`DatasetCircuit` result, whose :meth:`~DatasetCircuit.summary` is the command's
``summary.json`` (with CPR, CMD and the pruning semantics).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Bool, Float
from torch import Tensor

from tlcap.config import check_choice
from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.circuit import Circuit
from tlcap.locate.circuits.config import DEFAULT_TOP_N, DEFAULT_TOP_NODES, EAPConfig, check_node_selection
from tlcap.locate.circuits.dataset import CircuitDataset
from tlcap.locate.circuits.eap import EdgeScores, check_dataset_config, edge_attribution
from tlcap.locate.circuits.faithfulness import FaithfulnessCurve, circuit_masks, default_sizes, faithfulness_curve
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.run import CircuitRun, CircuitRunFields
from tlcap.locate.circuits.task import CircuitItem
from tlcap.models import Model
from tlcap.provenance import Provenance
from tlcap.results import Result


@dataclass(frozen=True)
class DatasetCircuit(CircuitRunFields, Result):
    """A dataset's mean edge scores, its circuit and the faithfulness curve.

    Attributes:
        scores: ``[n_upstream, n_readers]`` mean edge scores over the items.
        mask: ``[n_upstream, n_readers]`` the selected circuit's edges (after pruning).
        graph: The :class:`EdgeGraph`.
        top_n: Edges requested (nodes for ``selection="node"``); selection: ``"top_n"``, ``"greedy"`` or
            ``"node"`` (:data:`~.faithfulness.PRUNING`).
        curve: The :class:`FaithfulnessCurve` (its sizes include ``top_n``).
        run: The run (:class:`~tlcap.locate.circuits.run.CircuitRun`: dataset, items, metric, method,
            steps, ablation, the metric on the clean and the ablated runs, the :class:`EAPConfig`; its
            fields read on the result too).
        items: The dataset's :class:`~tlcap.locate.circuits.task.CircuitItem` s.
    """

    scores: Float[Tensor, "n_up n_readers"]
    mask: Bool[Tensor, "n_up n_readers"]
    graph: EdgeGraph
    top_n: int
    selection: str
    curve: FaithfulnessCurve
    run: CircuitRun = field(default_factory=CircuitRun)
    items: tuple[CircuitItem, ...] = ()

    _row_types: ClassVar[dict[str, type]] = {"run": CircuitRun, "items": CircuitItem}

    @property
    def circuit(self) -> Circuit:
        """The selected :class:`Circuit` (its run's ``prompt`` holds the dataset's name)."""
        return Circuit(mask=self.mask, scores=self.scores, graph=self.graph, n_selected=self.top_n,
                       selection=f"{self.selection}={self.top_n}", run=dataclasses.replace(self.run, prompt=self.dataset),
                       provenance=self.provenance)

    @property
    def edge_scores(self) -> EdgeScores:
        """The mean :class:`EdgeScores`."""
        return EdgeScores(scores=self.scores, valid=self.graph.valid_mask(), graph=self.graph, run=self.run)

    @property
    def circuit_faithfulness(self) -> float:
        """Normalised faithfulness of the selected circuit (its point of the curve)."""
        return self.curve.faithfulness[self.curve.n_requested.index(self.top_n)]

    def summary(self) -> dict[str, Any]:
        """Dataset, method, the circuit (size, faithfulness), the curve's areas and pruning, the edges.

        Returns:
            A JSON-ready dict (the faithfulness curve as column lists, edges as ``[upstream, reader, score]``).
        """
        c = self.circuit
        return {
            "model": self.model_name, "dataset": self.dataset, "n_items": self.n_items, "method": self.method,
            "ig_steps": self.steps, "metric": self.metric, "ablation": self.ablation,
            "clean_metric": self.clean_metric, "ablated_metric": self.corrupt_metric,
            "selection": self.selection, "top_n": self.top_n, "n_edges": c.n_edges, "n_nodes": c.n_nodes,
            "total_edges": int(self.graph.valid_mask().sum()), "param_fraction": c.param_fraction,
            "circuit_faithfulness": self.circuit_faithfulness, "cpr": self.curve.cpr, "cmd": self.curve.cmd,
            "complement_area": self.curve.complement_area, "pruning": self.curve.pruning,
            "faithfulness_curve": self.curve.to_frame().to_dict(orient="list"),
            "nodes": list(c.nodes), "edges": [[u, v, s] for u, v, s in c.edges], "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """The circuit's edges (:meth:`Circuit.to_frame`).

        Returns:
            A DataFrame of :class:`EdgeRow`, by decreasing ``|score|``.
        """
        return self.circuit.to_frame()

    def figure(self) -> go.Figure:
        """The faithfulness curve (:meth:`FaithfulnessCurve.figure`).

        Returns:
            The plotly faithfulness figure.
        """
        return self.curve.figure()

    def figures(self) -> dict[str, go.Figure]:
        """Every figure by file stem: ``faithfulness``, ``circuit``, ``edge_scores``.

        Returns:
            File stem → plotly figure.
        """
        return {"faithfulness": self.figure(), "circuit": self.circuit.figure(
            title=f"{self.dataset} circuit: {self.circuit.n_edges} edges ({self.selection}), {self.n_items} items"),
            "edge_scores": self.edge_scores.heatmap(title=f"Mean edge scores over {self.n_items} items of {self.dataset}")}


def dataset_circuit(
    model: Model,
    dataset: CircuitDataset,
    *,
    config: EAPConfig | None = None,
    granularity: str = "edge",
    log: Callable[[str], None] | None = None,
    **overrides: Any,
) -> DatasetCircuit:
    """Find the circuit of a dataset and its faithfulness curve.

    Args:
        model: The model.
        dataset: The items (:func:`~.dataset.load_circuit_dataset`).
        config: An :class:`EAPConfig` (``steps``, ``ablation``, ``top_n``, ``greedy``, ``batch_size``,
            ``sweep_sizes`` = the curve's sizes).
        granularity: ``"edge"`` (``top_n`` edges, top-n or greedy) or ``"node"`` (``top_n`` nodes, default
            :data:`~.config.DEFAULT_TOP_NODES`; the curve's sizes are in nodes; not with ``greedy``).
        log: Called with a line before each phase.
        **overrides: :class:`EAPConfig` fields overriding ``config``.

    Returns:
        The :class:`DatasetCircuit`, with provenance.

    Example:
        >>> from tlcap.locate.circuits import load_circuit_dataset
        >>> ds = load_circuit_dataset("pararel", relation="P36", n=8, model=model)
        >>> res = dataset_circuit(model, ds, steps=5, top_n=20)      # n=100, top_n=300 on SmolLM2
        >>> round(res.summary()["cpr"], 3)
        0.929
        >>> fig = res.figure()
    """
    cfg = check_dataset_config(dataset, EAPConfig.resolve(config, **overrides))
    if cfg.threshold is not None:
        raise InvalidConfigError("a dataset circuit is selected by size: give --top-n (and --greedy), not --threshold")
    check_choice("granularity", granularity, ("edge", "node"))
    check_node_selection(granularity, cfg.greedy)
    say = log or (lambda _: None)
    say(f"scoring all edges over {len(dataset)} items of {dataset.name} "
        f"({f'EAP-IG, {cfg.steps} steps' if cfg.steps > 1 else 'EAP'}, {cfg.ablation} ablation) ...")
    sc = edge_attribution(model, dataset, config=cfg)
    selection = "node" if granularity == "node" else "greedy" if cfg.greedy else "top_n"
    top_n = cfg.top_n if cfg.top_n is not None else DEFAULT_TOP_NODES if selection == "node" else DEFAULT_TOP_N
    mask = circuit_masks(sc.graph, sc.scores, [top_n], selection)[0][0]
    total = sc.graph.n_upstream if selection == "node" else sc.n_edges
    sizes = sorted(set(cfg.sweep_sizes or default_sizes(total)) | {top_n})
    say(f"faithfulness curve ({len(sizes)} sizes in {'nodes' if selection == 'node' else 'edges'}, circuits and "
        "complements) ...")
    curve = faithfulness_curve(model, sc, dataset, sizes=sizes, selection=selection, batch_size=cfg.batch_size,
                               max_memory=cfg.max_memory)
    return DatasetCircuit(
        scores=sc.scores, mask=mask, graph=sc.graph, top_n=top_n, selection=selection, curve=curve,
        run=dataclasses.replace(sc.run, dataset=dataset.name, n_items=len(dataset), config=cfg.to_dict()),
        items=tuple(dataset.items), provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


__all__ = ["DatasetCircuit", "dataset_circuit"]
