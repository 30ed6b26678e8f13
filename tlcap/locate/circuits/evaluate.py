"""Circuits (edge sets) and circuit-only evaluation.

Circuit-only run: every reader's input is rebuilt as

    input_v = (this run's residual at v) + sum_{u -> v not in circuit} (replacement_u - current_u)

i.e. circuit edges carry the upstream node's output *in this run* (which itself depends on
the circuit), every other edge carries the node's corrupted output (or zero). Because the
pre-norm residual is a plain sum of upstream outputs plus constant biases, this is exact:
the full circuit reproduces the clean model and the empty circuit reproduces the corrupted
(or all-zero) run. Many circuits are evaluated as one batch (one row per circuit).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from tlcap.locate.circuits.eap import CircuitTask, EdgeScores, corrupted_upstream, make_task, run_pass
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.models import Model
from tlcap.results import Result


def prune_dead(graph: EdgeGraph, mask: Bool[Tensor, "n_up n_readers"]) -> Bool[Tensor, "n_up n_readers"]:
    """Drop edges that cannot matter, until nothing changes.

    An edge ``u -> v`` is dropped when ``u`` (not the input) has no incoming circuit edge
    into any of its readers, or when no node fed by ``v`` (the logits, or a node with an
    outgoing circuit edge that survives) uses its output. A GQA kv reader feeds every head of
    its group.
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


@dataclass(frozen=True)
class Circuit(Result):
    """A set of edges of the graph (a knowledge circuit).

    Attributes:
        mask: ``[n_upstream, n_readers]`` bool, ``True`` for circuit edges.
        scores: The edge scores it was selected from.
        graph: The :class:`EdgeGraph`.
        n_selected: Edges selected before pruning dead nodes.
        selection: How it was selected (``"top_n=300"``).
        model_name, prompt, target, corrupt_prompt: The task.
    """

    mask: Tensor
    scores: Tensor
    graph: EdgeGraph
    n_selected: int = 0
    selection: str = ""
    model_name: str = ""
    prompt: str = ""
    target: str = ""
    corrupt_prompt: str | None = None

    @property
    def n_edges(self) -> int:
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
        return len(self.nodes)

    @property
    def param_fraction(self) -> float:
        """Share of the model's parameters held by the circuit's nodes."""
        params = dict(zip(self.graph.nodes, self.graph.node_params))
        return sum(params[n] for n in self.nodes) / max(1, sum(self.graph.node_params))

    @property
    def param_fraction_blocks(self) -> float:
        """Share of the transformer blocks' parameters (heads and MLPs; embeddings excluded)."""
        params = dict(zip(self.graph.nodes, self.graph.node_params))
        blocks = [n for n in self.graph.nodes if n not in ("input", "logits")]
        inside = sum(params[n] for n in self.nodes if n in blocks)
        return inside / max(1, sum(params[n] for n in blocks))

    @property
    def edges(self) -> list[tuple[str, str, float]]:
        """``(upstream, reader, score)`` of every circuit edge, by decreasing ``|score|``."""
        us, vs = torch.nonzero(self.mask, as_tuple=True)
        sc = self.scores[us, vs]
        order = sc.abs().argsort(descending=True)
        return [(self.graph.upstream[int(us[i])], self.graph.readers[int(vs[i])], float(sc[i])) for i in order]

    def node_importance(self) -> dict[str, float]:
        """Sum of ``|score|`` of the circuit edges touching each circuit node."""
        imp = {n: 0.0 for n in self.nodes}
        for u, v, s in self.edges:
            imp[u] = imp.get(u, 0.0) + abs(s)
            for n in self.graph.reader_node_names(v):
                if n in imp:
                    imp[n] += abs(s) / len(self.graph.reader_node_names(v))
        return imp

    def random_like(self, seed: int = 0) -> "Circuit":
        """A circuit of as many edges drawn uniformly from the valid edges (no pruning)."""
        valid = self.graph.valid_mask().flatten()
        idx = torch.nonzero(valid).flatten()
        g = torch.Generator().manual_seed(seed)
        pick = idx[torch.randperm(len(idx), generator=g)[: self.n_edges]]
        mask = torch.zeros_like(valid)
        mask[pick] = True
        return Circuit(mask=mask.view_as(self.mask), scores=self.scores, graph=self.graph, n_selected=self.n_edges,
                       selection=f"random(seed={seed})", model_name=self.model_name, prompt=self.prompt,
                       target=self.target, corrupt_prompt=self.corrupt_prompt)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.edges, columns=["upstream", "reader", "score"])

    def figure(self, title: str | None = None):  # noqa: ANN201 - plotly Figure
        """The circuit as a plotly graph (see :func:`tlcap.viz.circuit.circuit_graph`)."""
        from tlcap.viz.circuit import circuit_graph

        return circuit_graph(self, title=title)


def evaluate_masks(
    model: Model,
    graph: EdgeGraph,
    task: CircuitTask,
    masks: Bool[Tensor, "n_circuits n_up n_readers"],
    batch: int = 8,
    corrupt_up: Tensor | None = None,
    return_logits: bool = False,
) -> dict[str, Tensor]:
    """Circuit-only runs of many circuits; per circuit: ``nll``, ``rank``, ``target_logit``, ``metric``.

    ``rank`` is the 1-based rank of the (first) target token. With ``return_logits`` the
    logits ``[n_circuits, pos, d_vocab]`` are returned too.
    """
    if corrupt_up is None:
        corrupt_up, _ = corrupted_upstream(model, graph, task)
    out: dict[str, list[Tensor]] = {"nll": [], "rank": [], "target_logit": [], "metric": [], "logits": []}
    for i in range(0, masks.shape[0], batch):
        m = masks[i : i + batch].to(model.device)
        toks = task.clean.expand(m.shape[0], -1)
        res = run_pass(model, graph, task, toks, ablate=(m.float(), corrupt_up))
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
    """

    n_edges: int
    n_nodes: int
    param_fraction: float
    param_fraction_blocks: float
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

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.to_dict()])


def task_for(model: Model, obj: EdgeScores | Circuit, metric: str = "nll", corrupt_target: str | None = None) -> CircuitTask:
    """Rebuild the :class:`CircuitTask` a score matrix or circuit was computed on."""
    metric = getattr(obj, "metric", metric)
    corrupt_target = getattr(obj, "corrupt_target", corrupt_target)
    return make_task(model, obj.prompt, obj.target, obj.corrupt_prompt, metric, corrupt_target)  # type: ignore[arg-type]


def evaluate_circuit(model: Model, circuit: Circuit, task: CircuitTask | None = None) -> CircuitEvaluation:
    """Run the model with every non-circuit edge ablated and compare with the full / ablated runs.

    Example:
        >>> ev = evaluate_circuit(model, scores.select(top_n=300))
        >>> ev.circuit_target_rank, ev.hit_at_10
    """
    task = task or task_for(model, circuit)
    graph = circuit.graph
    full = torch.ones_like(circuit.mask)
    masks = torch.stack([full, circuit.mask, torch.zeros_like(circuit.mask)])
    r = evaluate_masks(model, graph, task, masks)
    nll, rank, tl, met = r["nll"].tolist(), r["rank"].tolist(), r["target_logit"].tolist(), r["metric"].tolist()
    gap = nll[2] - nll[0]
    return CircuitEvaluation(
        n_edges=circuit.n_edges, n_nodes=circuit.n_nodes, param_fraction=circuit.param_fraction,
        param_fraction_blocks=circuit.param_fraction_blocks, ablation=task.ablation, full_nll=nll[0], circuit_nll=nll[1], ablated_nll=nll[2],
        full_target_rank=int(rank[0]), circuit_target_rank=int(rank[1]), ablated_target_rank=int(rank[2]),
        hit_at_1=bool(rank[1] == 1), hit_at_10=bool(rank[1] <= 10),
        full_target_logit=tl[0], circuit_target_logit=tl[1], logit_diff_vs_full=tl[1] - tl[0],
        recovered=(nll[2] - nll[1]) / gap if gap != 0 else float("nan"),
        metric=task.metric, full_metric=met[0], circuit_metric=met[1],
    )


@dataclass(frozen=True)
class SizeSweep(Result):
    """Faithfulness of circuits of growing size (top-n edges, pruned).

    Attributes:
        top_n: Requested sizes; n_edges / n_nodes / param_fraction: after pruning.
        nll, rank, hit_at_1, hit_at_10, recovered: Per size (circuit alone).
        random_nll, random_rank: Random circuits with the same number of edges.
        full_nll, ablated_nll: The full model and the fully ablated run.
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

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "top_n": self.top_n, "n_edges": self.n_edges, "n_nodes": self.n_nodes,
            "param_fraction": self.param_fraction, "nll": self.nll, "rank": self.rank,
            "hit_at_1": self.hit_at_1, "hit_at_10": self.hit_at_10, "recovered": self.recovered,
            "random_nll": self.random_nll, "random_rank": self.random_rank,
        })

    def figure(self, title: str | None = None):  # noqa: ANN201 - plotly Figure
        from tlcap.viz.circuit import size_sweep_figure

        return size_sweep_figure(self, title=title)


def size_sweep(model: Model, scores: EdgeScores, sizes: list[int] | None = None, seed: int = 0) -> SizeSweep:
    """Evaluate the top-n circuits for several ``n`` (and random circuits of equal size).

    Args:
        sizes: Values of ``n``; default: a log-spaced grid from 10 to all edges.
    """
    total = scores.n_edges
    if sizes is None:
        sizes = sorted({int(round(x)) for x in torch.logspace(1, torch.log10(torch.tensor(float(total))), 10).tolist()})
    sizes = [min(int(n), total) for n in sizes]
    task = task_for(model, scores)
    circuits = [scores.select(top_n=n) for n in sizes]
    randoms = [c.random_like(seed + i) for i, c in enumerate(circuits)]
    masks = torch.stack([torch.ones_like(scores.valid), torch.zeros_like(scores.valid)]
                        + [c.mask for c in circuits] + [c.mask for c in randoms])
    r = evaluate_masks(model, scores.graph, task, masks)
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
    )
