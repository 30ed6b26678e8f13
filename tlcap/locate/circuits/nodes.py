"""Node granularity: the input embedding, every head and every MLP scored as one node of the edge graph.

A node's score is the sum of its out-edge scores (:func:`~.faithfulness.node_scores`, the
ranking of ``faithfulness_curve(selection="node")``)::

    score(u) = sum_v score(u -> v) = sum_pos (ablated_u - clean_u) . sum_v d metric / d input_v

Every reader after ``u`` reads the residual stream ``u`` writes into, so ``sum_v d metric / d
input_v`` is the gradient of the metric with respect to ``u``'s output: with plain EAP a node's
score is the first-order effect of patching its output from clean to ablated (in every reader at
once), tested against finite-difference patching; with EAP-IG it is the sum of the edges'
integrated-gradient scores. With MatchNLL a positive score means that ablating the node raises
the NLL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float
from torch import Tensor

from tlcap.locate.circuits.eap import EdgeScores
from tlcap.locate.circuits.faithfulness import node_scores
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.circuit import node_kind


@dataclass(frozen=True)
class NodeScoreRow:
    """One node of :meth:`NodeScores.to_frame`: name, kind (``input``, ``head``, ``MLP``), layer (input -1),
    score, and rank (1 = largest ``|score|``; the order of ``faithfulness_curve(selection="node")``)."""

    node: str
    kind: str
    layer: int
    score: float
    rank: int


@dataclass(frozen=True)
class NodeScores(Result):
    """Scores of the graph's upstream nodes (input, heads, MLPs): the sums of their out-edge scores.

    Attributes:
        scores: ``[n_upstream]`` node scores, in :attr:`EdgeGraph.upstream` order.
        graph: The :class:`EdgeGraph` (node names).
        model_name, dataset, n_items, ablation, metric, method, steps: The edge scores' run.

    Example:
        >>> from tlcap.locate.circuits import edge_attribution, load_circuit_dataset
        >>> dataset = load_circuit_dataset("pararel", relation="P36", n=8, model=model)
        >>> ns = node_attribution(edge_attribution(model, dataset, steps=5))
        >>> [name for name, score in ns.top(3)]
        ['input', 'm0', 'a1.h1']
        >>> ns.to_frame().head(2)
            node   kind  layer     score  rank
        0  input  input     -1  0.010804     1
        1     m0    MLP      0  0.004656     2
    """

    scores: Float[Tensor, " n_up"]
    graph: EdgeGraph
    model_name: str = ""
    dataset: str = ""
    n_items: int = 1
    ablation: str = ""
    metric: str = "nll"
    method: str = "eap"
    steps: int = 1

    @property
    def order(self) -> list[int]:
        """Upstream indices by decreasing ``|score|`` (ties in graph order), as the node selection ranks them."""
        return self.scores.abs().argsort(descending=True, stable=True).tolist()

    def top(self, k: int | None = None) -> list[tuple[str, float]]:
        """``(node, score)`` of the ``k`` nodes of largest ``|score|`` (all when ``k`` is ``None``).

        Args:
            k: How many nodes (None: all).

        Returns:
            ``(upstream node name, signed score)`` pairs, by decreasing ``|score|``.
        """
        flat = self.scores.tolist()
        return [(self.graph.upstream[i], flat[i]) for i in self.order[:k]]

    def summary(self, top: int = 20) -> dict[str, Any]:
        """The run and the ``top`` nodes as ``[node, score]``.

        Args:
            top: How many top nodes to list.

        Returns:
            A JSON-ready dict.
        """
        return {"model": self.model_name, "dataset": self.dataset, "n_items": self.n_items, "ablation": self.ablation,
                "metric": self.metric, "method": self.method, "ig_steps": self.steps,
                "n_nodes": self.graph.n_upstream, "top_nodes": [[n, s] for n, s in self.top(top)]}

    def to_frame(self) -> pd.DataFrame:
        """One :class:`NodeScoreRow` per node, by rank.

        Returns:
            A DataFrame of :class:`NodeScoreRow` (node, kind, layer, score, rank).
        """
        flat = self.scores.tolist()
        g = self.graph
        rows = [NodeScoreRow(g.upstream[i], node_kind(g.upstream[i]), g.layer_of(g.upstream[i]), flat[i], r)
                for r, i in enumerate(self.order, 1)]
        return frame(rows, NodeScoreRow)

    def figure(self) -> go.Figure:
        """Node scores in computation order (bars).

        Returns:
            A plotly bar figure.
        """
        fig = go.Figure(go.Bar(x=list(self.graph.upstream), y=self.scores.double().tolist()))
        fig.update_layout(title=f"Node scores ({self.method}, {self.ablation} ablation, {self.n_items} items"
                                f"{', ' + self.dataset if self.dataset else ''})",
                          xaxis_title="node", yaxis_title="score (sum of out-edge scores)", template="plotly_white")
        return fig


def node_attribution(scores: EdgeScores) -> NodeScores:
    """Score every upstream node (input, heads, MLPs) as the sum of its out-edge scores (module docstring).

    Args:
        scores: Edge scores (of a prompt pair or a dataset).

    Returns:
        The :class:`NodeScores`, with the edge scores' provenance.

    Example:
        >>> from tlcap.locate.circuits import edge_attribution
        >>> sc = edge_attribution(model, "The capital of France is", " Paris", "The capital of Italy is")
        >>> node_attribution(sc).top(3)
        [('input', -0.0181...), ('a1.h0', -0.0170...), ('m1', -0.0106...)]
    """
    s = node_scores(scores.scores)  # the definition faithfulness_curve(selection="node") ranks by
    return NodeScores(scores=s, graph=scores.graph, model_name=scores.model_name, dataset=scores.dataset,
                      n_items=scores.n_items, ablation=scores.ablation, metric=scores.metric, method=scores.method,
                      steps=scores.steps, provenance=scores.provenance)


__all__ = ["NodeScoreRow", "NodeScores", "node_attribution"]
