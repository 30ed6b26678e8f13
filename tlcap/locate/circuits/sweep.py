"""Circuit size vs faithfulness: the top-n circuits of one score matrix for several n."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from tlcap.config import check_int, check_sequence
from tlcap.errors import TlcapWarning
from tlcap.locate.circuits.circuit import Circuit, prune_dead, select_edges
from tlcap.locate.circuits.eap import EdgeScores
from tlcap.locate.circuits.evaluate import evaluate_masks, task_for
from tlcap.locate.circuits.task import CircuitTask
from tlcap.models import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.circuit import size_sweep_figure


@dataclass(frozen=True)
class SweepRow:
    """One size of a :class:`SizeSweep`."""

    top_n: int
    n_edges: int
    n_nodes: int
    param_fraction: float
    nll: float
    rank: int
    hit_at_1: bool
    hit_at_10: bool
    recovered: float
    random_nll: float
    random_rank: int


@dataclass(frozen=True)
class SizeSweep(Result):
    """Faithfulness of circuits of growing size (top-n edges, pruned).

    Attributes:
        top_n: Requested sizes; n_edges / n_nodes / param_fraction: after pruning
            (``param_fraction``: share of the transformer-block parameters, :attr:`Circuit.param_fraction`).
        nll, rank, hit_at_1, hit_at_10, recovered: Per size (circuit alone).
        random_nll, random_rank: Random circuits with the same number of edges.
        full_nll, ablated_nll: The full model and the fully ablated run.
        total_edges: Edges in the graph.
    """

    top_n: tuple[int, ...]
    n_edges: tuple[int, ...]
    n_nodes: tuple[int, ...]
    param_fraction: tuple[float, ...]
    nll: tuple[float, ...]
    rank: tuple[int, ...]
    hit_at_1: tuple[bool, ...]
    hit_at_10: tuple[bool, ...]
    recovered: tuple[float, ...]
    random_nll: tuple[float, ...]
    random_rank: tuple[int, ...]
    full_nll: float
    ablated_nll: float
    total_edges: int

    def rows(self) -> list[SweepRow]:
        """One :class:`SweepRow` per size.

        Returns:
            The rows, in increasing size.
        """
        return [SweepRow(*vals) for vals in zip(self.top_n, self.n_edges, self.n_nodes, self.param_fraction, self.nll,
                                                self.rank, self.hit_at_1, self.hit_at_10, self.recovered,
                                                self.random_nll, self.random_rank)]

    def summary(self) -> dict[str, Any]:
        """Every size's row (as lists per column), the full and ablated NLL, the graph's edge count.

        Returns:
            A JSON-ready dict: the :meth:`to_frame` columns plus ``full_nll``, ``ablated_nll`` and ``total_edges``.
        """
        return {**self.to_frame().to_dict(orient="list"), "full_nll": self.full_nll, "ablated_nll": self.ablated_nll,
                "total_edges": self.total_edges}

    def to_frame(self) -> pd.DataFrame:
        """One :class:`SweepRow` per size.

        Returns:
            A DataFrame of :class:`SweepRow`, in increasing size.
        """
        return frame(self.rows(), SweepRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """NLL and rank of the circuit alone vs its size, with random circuits of equal size.

        Args:
            title: Figure title (default: the graph's edge count).

        Returns:
            A plotly figure of NLL and target rank vs circuit size.
        """
        return size_sweep_figure(self.to_frame(), self.full_nll, self.ablated_nll,
                                 title or f"Circuit size vs faithfulness ({self.total_edges} edges in the graph)")


def default_sizes(total: int) -> list[int]:
    """10 log-spaced sizes from 10 to ``total`` edges.

    Args:
        total: Edges in the graph.

    Returns:
        The distinct sizes, increasing.
    """
    return sorted({int(round(x)) for x in torch.logspace(1, torch.log10(torch.tensor(float(total))), 10).tolist()})


def size_sweep(
    model: Model,
    scores: EdgeScores,
    sizes: Sequence[int] | None = None,
    seed: int = 0,
    task: CircuitTask | None = None,
    batch: int = 8,
) -> SizeSweep:
    """Evaluate the top-n circuits for several ``n`` (and random circuits of equal size).

    Args:
        model: The model.
        scores: The edge scores.
        sizes: Values of ``n`` (``>= 0``; 0 = the fully ablated run); default :func:`default_sizes`.
        seed: Seed of the random circuits (size ``i`` uses ``seed + i``).
        task: The task (default: rebuilt from ``scores``).
        batch: Circuits per forward pass.

    Returns:
        The :class:`SizeSweep`, with provenance (its sizes and seed).

    Warns:
        TlcapWarning: a size above the graph's number of edges (it keeps every edge).

    Example:
        >>> from tlcap.locate.circuits import edge_attribution
        >>> scores = edge_attribution(model, "The capital of France is", " Paris", "The capital of Italy is")
        >>> sweep = size_sweep(model, scores, [10, 30, 100])
        >>> sweep.to_frame()[["top_n", "n_edges", "n_nodes"]]
           top_n  n_edges  n_nodes
        0     10        6        5
        1     30       27       11
        2    100      100       12
        >>> fig = sweep.figure()
    """
    total = scores.n_edges
    if sizes is None:
        sizes = default_sizes(total)
    sizes = list(check_sequence("sweep_sizes", sizes, min_len=1, cli="--sweep",
                                item=lambda n, x: check_int(n, x, min=0, cli="--sweep")))
    beyond = [n for n in sizes if n > total]
    if beyond:
        warnings.warn(
            f"sweep sizes {beyond} are more than the {total} edges of the graph: each keeps all of them "
            "(top_n records the requested size, n_edges the edges kept)", TlcapWarning, stacklevel=2,
        )
    task = task or task_for(model, scores)
    circuits = []
    for n in sizes:
        mask = prune_dead(scores.graph, select_edges(scores.scores, scores.valid, top_n=n))
        circuits.append(Circuit(mask=mask, scores=scores.scores, graph=scores.graph, n_selected=min(n, total),
                                selection=f"top_n={n}", run=scores.run))
    randoms = [c.random_like(seed + i) for i, c in enumerate(circuits)]
    masks = torch.stack([torch.ones_like(scores.valid), torch.zeros_like(scores.valid)]
                        + [c.mask for c in circuits] + [c.mask for c in randoms])
    r = evaluate_masks(model, scores.graph, task, masks, batch=batch, ablation=scores.ablation or None)
    nll, rank = r["nll"].tolist(), r["rank"].tolist()
    full, abl = nll[0], nll[1]
    k = len(sizes)
    c_nll, c_rank = nll[2 : 2 + k], rank[2 : 2 + k]
    gap = abl - full
    return SizeSweep(
        top_n=tuple(sizes), n_edges=tuple(c.n_edges for c in circuits), n_nodes=tuple(c.n_nodes for c in circuits),
        param_fraction=tuple(c.param_fraction for c in circuits), nll=tuple(c_nll), rank=tuple(int(x) for x in c_rank),
        hit_at_1=tuple(x == 1 for x in c_rank), hit_at_10=tuple(x <= 10 for x in c_rank),
        recovered=tuple((abl - x) / gap if gap else float("nan") for x in c_nll),
        random_nll=tuple(nll[2 + k :]), random_rank=tuple(int(x) for x in rank[2 + k :]),
        full_nll=full, ablated_nll=abl, total_edges=total,
        provenance=Provenance.collect(model, config={"sweep_sizes": list(sizes), "batch": batch}, seed=seed),
    )


__all__ = ["SizeSweep", "SweepRow", "default_sizes", "size_sweep"]
