"""Circuits: sets of edges of the graph, how they are selected and pruned, and their size.

Depends only on the graph (:mod:`.graph`): a :class:`Circuit` is a value (an edge mask over an
:class:`~.graph.EdgeGraph` with the scores it came from); running it is :mod:`.evaluate`'s job.

**Size.** :attr:`Circuit.param_fraction` (the headline, the quantity the CNL paper reports) is
the share of the transformer blocks' parameters that the circuit uses: the exact union of the
parameter groups of its heads and MLPs (:meth:`~.graph.EdgeGraph.count_params`) over every
block parameter. A circuit head brings its W_Q/b_Q/W_O slices, its kv group's W_K/W_V slices
(under GQA shared by the group's query heads: counted once, in full, however many of them are
in) and its layer's ``b_O``/``ln1``; an MLP brings its weights and ``ln2``. Embeddings, the
final norm and the unembedding are not block parameters.
:attr:`Circuit.param_fraction_with_embeddings` is the older, secondary number: every node the
circuit touches, input embedding and logits included, each with its even share of shared
groups (:attr:`~.graph.EdgeGraph.node_params`), over all of the model's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tlcap.config import check_float, check_int
from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.graph import BOUNDARY_NODES, EdgeGraph
from tlcap.locate.circuits.run import CircuitRun, CircuitRunFields
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.circuit import circuit_graph


@dataclass(frozen=True)
class EdgeRow:
    """One edge: upstream node, reader, score (rows of :meth:`Circuit.to_frame` and ``EdgeScores.to_frame``)."""

    upstream: str
    reader: str
    score: float


def prune_dead(graph: EdgeGraph, mask: Bool[Tensor, "n_up n_readers"]) -> Bool[Tensor, "n_up n_readers"]:
    """Drop edges that cannot matter, until nothing changes.

    An edge ``u -> v`` is dropped when ``u`` (not the input) has no incoming circuit edge
    into any of its readers, or when no node fed by ``v`` (the logits, or a node with an
    outgoing circuit edge that survives) uses its output. A GQA kv reader feeds every head of
    its group.

    Args:
        graph: The graph.
        mask: Edge mask.

    Returns:
        The pruned mask.
    """
    rn = graph.reader_nodes()  # [n_readers, n_nodes]
    n_up = graph.n_upstream
    mask = mask.clone() & graph.valid_mask()
    logits_node = len(graph.nodes) - 1
    while True:
        incoming = (mask.any(0).float() @ rn.float()) > 0  # node has an incoming edge
        incoming[0] = True  # input
        outgoing = torch.zeros(len(graph.nodes), dtype=torch.bool)
        outgoing[:n_up] = mask.any(1)
        outgoing[logits_node] = True
        reader_alive = (rn.float() @ outgoing.float()) > 0
        new = mask & incoming[:n_up, None] & reader_alive[None, :]
        if torch.equal(new, mask):
            return new
        mask = new


def select_edges(
    scores: Float[Tensor, "n_up n_readers"],
    valid: Bool[Tensor, "n_up n_readers"],
    top_n: int | None = None,
    threshold: float | None = None,
) -> Bool[Tensor, "n_up n_readers"]:
    """The ``top_n`` valid edges by ``|score|``, or those with ``|score| > threshold``.

    Args:
        scores: Edge scores.
        valid: Which entries are edges.
        top_n: How many edges to keep (``>= 0``; more than there are keeps all).
        threshold: Keep edges above it instead (``> 0``).

    Returns:
        The edge mask.

    Raises:
        InvalidConfigError: both or neither of ``top_n`` and ``threshold``, or one out of range.
    """
    if (top_n is None) == (threshold is None):
        raise InvalidConfigError("give --top-n or --threshold, not both (exactly one of top_n, threshold)")
    a = scores.abs().masked_fill(~valid, -1.0)
    if threshold is not None:
        return (a > check_float("threshold", threshold, gt=0)) & valid
    k = min(check_int("top_n", top_n, min=0), int(valid.sum()))
    mask = torch.zeros_like(valid)
    if k:
        mask.view(-1)[a.flatten().topk(k).indices] = True
    return mask


@dataclass(frozen=True)
class Circuit(CircuitRunFields, Result):
    """A set of edges of the graph (a knowledge circuit).

    Attributes:
        mask: ``[n_upstream, n_readers]`` bool, ``True`` for circuit edges.
        scores: The edge scores it was selected from.
        graph: The :class:`EdgeGraph`.
        n_selected: Edges selected before pruning dead nodes.
        selection: How it was selected (``"top_n=300"``).
        run: The task and method the scores were computed with
            (:class:`~tlcap.locate.circuits.run.CircuitRun`; its fields read on the circuit too).
    """

    mask: Bool[Tensor, "n_up n_readers"]
    scores: Float[Tensor, "n_up n_readers"]
    graph: EdgeGraph
    n_selected: int = 0
    selection: str = ""
    run: CircuitRun = field(default_factory=CircuitRun)

    @property
    def n_edges(self) -> int:
        """Edges in the circuit."""
        return int(self.mask.sum())

    @property
    def nodes(self) -> tuple[str, ...]:
        """Nodes touched by a circuit edge (upstream ends and the nodes readers feed)."""
        rn = self.graph.reader_nodes()
        alive = torch.zeros(len(self.graph.nodes), dtype=torch.bool)
        alive[: self.graph.n_upstream] = self.mask.any(1)
        alive |= (self.mask.any(0).float() @ rn.float()) > 0
        return tuple(n for n, a in zip(self.graph.nodes, alive.tolist()) if a)

    @property
    def n_nodes(self) -> int:
        """Number of :attr:`nodes`."""
        return len(self.nodes)

    @property
    def block_nodes(self) -> tuple[str, ...]:
        """The circuit's heads and MLPs (:attr:`nodes` without ``input`` and ``logits``)."""
        return tuple(n for n in self.nodes if n not in BOUNDARY_NODES)

    @property
    def n_block_params(self) -> int:
        """Exact number of transformer-block parameters the circuit's heads and MLPs use (module docstring)."""
        return self.graph.count_params(self.block_nodes)

    @property
    def param_fraction(self) -> float:
        """Share of the transformer blocks' parameters in the circuit (the headline size; module docstring)."""
        total = self.graph.block_params
        return self.n_block_params / total if total else float("nan")

    @property
    def param_fraction_with_embeddings(self) -> float:
        """Share of all parameters held by the touched nodes, input embedding and logits included (secondary)."""
        params = dict(zip(self.graph.nodes, self.graph.node_params))
        return sum(params[n] for n in self.nodes) / max(1, sum(self.graph.node_params))

    @property
    def edges(self) -> list[tuple[str, str, float]]:
        """``(upstream, reader, score)`` of every circuit edge, by decreasing ``|score|``."""
        us, vs = torch.nonzero(self.mask, as_tuple=True)
        sc = self.scores[us, vs]
        order = sc.abs().argsort(descending=True)
        return [(self.graph.upstream[int(us[i])], self.graph.readers[int(vs[i])], float(sc[i])) for i in order]

    def node_importance(self) -> dict[str, float]:
        """Sum of ``|score|`` of the circuit edges touching each circuit node (a kv edge split over its heads).

        Returns:
            Node name → importance, for every circuit node (0.0 for one no edge touches).
        """
        imp = {n: 0.0 for n in self.nodes}
        for u, v, s in self.edges:
            imp[u] = imp.get(u, 0.0) + abs(s)
            ends = self.graph.reader_node_names(v)
            for n in ends:
                if n in imp:
                    imp[n] += abs(s) / len(ends)
        return imp

    def random_like(self, seed: int = 0) -> Circuit:
        """A circuit of as many edges drawn uniformly from the valid edges (no pruning).

        Args:
            seed: Seed of the draw.

        Returns:
            The random :class:`Circuit` (``selection="random(seed=...)"``).
        """
        valid = self.graph.valid_mask().flatten()
        idx = torch.nonzero(valid).flatten()
        g = torch.Generator().manual_seed(seed)
        pick = idx[torch.randperm(len(idx), generator=g)[: self.n_edges]]
        mask = torch.zeros_like(valid)
        mask[pick] = True
        return Circuit(mask=mask.view_as(self.mask), scores=self.scores, graph=self.graph, n_selected=self.n_edges,
                       selection=f"random(seed={seed})", run=self.run)

    def summary(self) -> dict[str, Any]:
        """Selection, size (edges, nodes, parameter shares) and the edges themselves.

        Returns:
            A JSON-ready dict (edges as ``[upstream, reader, score]`` lists).
        """
        return {
            "model": self.model_name, "prompt": self.prompt, "target": self.target,
            "corrupt_prompt": self.corrupt_prompt, "ablation": self.ablation, "metric": self.metric,
            "selection": self.selection, "n_selected": self.n_selected, "n_edges": self.n_edges,
            "n_nodes": self.n_nodes, "total_edges": int(self.graph.valid_mask().sum()),
            "param_fraction": self.param_fraction, "n_block_params": self.n_block_params,
            "block_params": self.graph.block_params,
            "param_fraction_with_embeddings": self.param_fraction_with_embeddings,
            "nodes": list(self.nodes), "edges": [[u, v, s] for u, v, s in self.edges],
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`EdgeRow` per circuit edge, by decreasing ``|score|``.

        Returns:
            A DataFrame of :class:`EdgeRow`.
        """
        return frame([EdgeRow(*e) for e in self.edges], EdgeRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """The circuit as a plotly graph (:func:`tlcap.viz.circuit.circuit_graph`).

        Args:
            title: Figure title (default: edges, nodes, parameter share, prompt and target).

        Returns:
            A plotly figure: layers as columns, nodes sized by importance, edge width by ``|score|``.
        """
        edges = self.edges
        g = self.graph
        return circuit_graph(
            edges, {v: g.reader_node_names(v) for _, v, _ in edges}, self.node_importance(), g.n_layers, g.n_heads,
            title or f"Knowledge circuit: {self.n_edges} edges, {self.n_nodes} nodes "
                     f"({100 * self.param_fraction:.1f}% of block parameters) — {self.prompt!r} → {self.target!r}",
        )


__all__ = ["Circuit", "EdgeRow", "prune_dead", "select_edges"]
