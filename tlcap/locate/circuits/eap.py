"""Edge attribution patching (EAP, EAP-IG): every edge score from a few passes.

For an edge ``u -> v`` (upstream output into reader input, see :mod:`.graph`), EAP estimates
the effect on the metric of replacing ``u``'s contribution to ``v``'s input with its
corrupted value by a first-order Taylor expansion::

    score(u -> v) = sum_pos (corrupt_u - clean_u) . d metric / d input_v     ("noising")

The gradient is taken on the clean run (Hanna et al. 2024; the knowledge-circuits code):
one forward over the corrupted input records ``corrupt_u``; one forward over the clean input
records ``clean_u`` and one backward gives ``d metric / d input_v`` for every reader at once.
All scores are then one matrix product ``[n_upstream, pos*d] @ [pos*d, n_readers]``.

* ``steps > 1`` (EAP-IG): the gradient is averaged over ``steps`` points on the straight line
  between the corrupted and the clean input embeddings (midpoint rule), all in one batched
  forward + backward.
* ``direction="denoising"`` takes the gradient on the corrupted run and the difference
  ``clean_u - corrupt_u`` (the convention of TransformerLens' ``attribution_patch``); with
  EAP-IG both directions give the same scores up to sign.
* Zero ablation (``corrupt_prompt=None``): ``corrupt_u = 0`` for every upstream node.

The metric is MatchNLL of the target (mean NLL over its tokens, teacher-forced), or the
logit difference ``logit(target) - logit(corrupt_target)``. With MatchNLL a positive score
means that corrupting the edge raises the NLL: the edge carries the fact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import ShapeMismatchError, TargetTokenizationError
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.models import Model
from tlcap.results import Result
from tlcap.runtime import hooks as H

MetricName = Literal["nll", "logit_diff"]


# ---------------------------------------------------------------------------- the task
def _hi(x: Tensor) -> Tensor:
    """At least float32 (float64 models stay float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


@dataclass(frozen=True)
class CircuitTask:
    """A clean prompt, its target, and how it is corrupted.

    Build with :func:`make_task`. ``clean`` is the prompt followed by all but the last target
    token (teacher forcing); the metric reads the logits at ``positions``.

    Attributes:
        clean: Clean token ids ``[1, pos]``.
        corrupt: Corrupted token ids ``[1, pos]`` (same length), or ``None`` for zero ablation.
        positions: Positions whose next-token logits score the target tokens.
        target_ids: Target token ids, one per position.
        corrupt_target_ids: Token ids of the corrupted answer (logit difference), or ``None``.
        metric: ``"nll"`` (MatchNLL) or ``"logit_diff"``.
    """

    clean: Int[Tensor, "1 pos"]
    corrupt: Int[Tensor, "1 pos"] | None
    positions: tuple[int, ...]
    target_ids: tuple[int, ...]
    corrupt_target_ids: tuple[int, ...] | None = None
    metric: MetricName = "nll"

    @property
    def ablation(self) -> str:
        return "zero" if self.corrupt is None else "corrupt"

    def metric_rows(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, " batch"]:
        """The metric of every batch row (MatchNLL, or logit difference)."""
        pos = list(self.positions)
        sel = _hi(logits[:, pos])  # [b, m, V]
        ids = torch.tensor(self.target_ids, device=logits.device)
        if self.metric == "nll":
            lp = sel.log_softmax(-1)
            return -lp.gather(-1, ids[None, :, None].expand(sel.shape[0], -1, 1))[..., 0].mean(-1)
        assert self.corrupt_target_ids is not None
        cids = torch.tensor(self.corrupt_target_ids, device=logits.device)
        tgt = sel.gather(-1, ids[None, :, None].expand(sel.shape[0], -1, 1))[..., 0]
        cor = sel.gather(-1, cids[None, :, None].expand(sel.shape[0], -1, 1))[..., 0]
        return (tgt - cor).mean(-1)

    def target_stats(self, logits: Float[Tensor, "batch pos d_vocab"]) -> dict[str, Tensor]:
        """NLL, 1-based rank and logit of the first target token for every row."""
        first = _hi(logits[:, self.positions[0]])
        tid = self.target_ids[0]
        tl = first[:, tid]
        rank = (first > tl[:, None]).sum(-1) + 1
        lp = _hi(logits[:, list(self.positions)]).log_softmax(-1)
        ids = torch.tensor(self.target_ids, device=logits.device)
        nll = -lp.gather(-1, ids[None, :, None].expand(lp.shape[0], -1, 1))[..., 0].mean(-1)
        return {"nll": nll, "rank": rank, "target_logit": tl}


def make_task(
    model: Model,
    prompt: str,
    target: str,
    corrupt_prompt: str | None = None,
    metric: MetricName = "nll",
    corrupt_target: str | None = None,
) -> CircuitTask:
    """Tokenize a circuit task and check that clean and corrupted inputs align.

    Args:
        model: The model.
        prompt: Clean prompt, e.g. ``"The capital of France is"``.
        target: Answer, e.g. ``" Paris"`` (multi-token answers are teacher-forced).
        corrupt_prompt: Same-relation prompt with another subject of the same token length
            (``"The capital of Italy is"``), or ``None`` for zero ablation.
        metric: ``"nll"`` (MatchNLL) or ``"logit_diff"`` (needs ``corrupt_target``).
        corrupt_target: The corrupted prompt's answer (``" Rome"``) for ``logit_diff``.

    Raises:
        ShapeMismatchError: the corrupted prompt has a different number of tokens.
        TargetTokenizationError: the target does not tokenize cleanly after the prompt.
    """
    if metric not in ("nll", "logit_diff"):
        raise ValueError(f"metric must be 'nll' or 'logit_diff', got {metric!r}")
    p_ids = model.encode(prompt)
    t_ids = model.target_ids(prompt, target)
    clean = p_ids + t_ids[:-1]
    positions = tuple(range(len(p_ids) - 1, len(p_ids) - 1 + len(t_ids)))
    cor = None
    if corrupt_prompt is not None:
        c_ids = model.encode(corrupt_prompt)
        if len(c_ids) != len(p_ids):
            raise ShapeMismatchError(
                f"The corrupted prompt is {len(c_ids)} tokens {model.to_str_tokens(c_ids)} but the "
                f"clean prompt is {len(p_ids)} tokens {model.to_str_tokens(p_ids)}; edge patching "
                "aligns them position by position. Pick a subject with the same token length, "
                "or use zero ablation (corrupt_prompt=None / --zero-ablate)."
            )
        cor = torch.tensor([c_ids + t_ids[:-1]], dtype=torch.long, device=model.device)
    cids = None
    if metric == "logit_diff":
        if corrupt_target is None:
            raise TargetTokenizationError("metric='logit_diff' needs corrupt_target (the corrupted prompt's answer).")
        cids = tuple(model.target_ids(corrupt_prompt or prompt, corrupt_target, single_token=True))
        if len(t_ids) != 1:
            raise TargetTokenizationError("metric='logit_diff' needs a single-token target.")
    return CircuitTask(
        torch.tensor([clean], dtype=torch.long, device=model.device), cor, positions, tuple(t_ids), cids, metric
    )


# ---------------------------------------------------------------------------- one pass
@dataclass
class PassOutput:
    logits: Tensor
    upstream: Tensor | None  # [b, n_up, pos, d]
    reader_grads: Tensor | None  # [b, n_readers, pos, d]
    metric: Tensor  # [b]


def _stack_upstream(graph: EdgeGraph, store: dict[str, Tensor]) -> Float[Tensor, "batch n_up pos d"]:
    parts = []
    for name, _, count in graph.upstream_hooks():
        act = store[name]
        parts.append(act.transpose(1, 2) if act.ndim == 4 else act[:, None])
    return torch.cat(parts, 1)


def _stack_readers(graph: EdgeGraph, store: dict[str, Tensor], like: Tensor) -> Float[Tensor, "batch n_readers pos d"]:
    parts = []
    for rh in graph.reader_hooks():
        g = store.get(rh.name)
        if g is None:  # a reader the metric does not depend on
            shape = (like.shape[0], rh.count, like.shape[-2], like.shape[-1])
            parts.append(torch.zeros(shape, dtype=like.dtype, device=like.device))
        else:
            parts.append(g.transpose(1, 2) if rh.per_head else g[:, None])
    return torch.cat(parts, 1)


def run_pass(
    model: Model,
    graph: EdgeGraph,
    task: CircuitTask,
    tokens: Int[Tensor, "batch pos"],
    *,
    record_upstream: bool = False,
    input_value: Tensor | None = None,
    grads: bool = False,
    ablate: tuple[Tensor, Tensor] | None = None,
    grad_rows: list[int] | None = None,
) -> PassOutput:
    """One forward (and optionally backward) pass on the edge graph.

    Args:
        model, graph, task: The model, its edge graph and the task (for the metric).
        tokens: ``[batch, pos]`` token ids.
        record_upstream: Return every upstream output ``[batch, n_up, pos, d_model]``.
        input_value: Replace the input node's output (the ``resid_pre`` site of layer 0) with this
            ``[batch, pos, d_model]`` tensor (EAP-IG interpolation points).
        grads: Backpropagate the summed metric and return ``d metric / d reader input``
            ``[batch, n_readers, pos, d_model]``.
        ablate: ``(keep, replacement)``: circuit-only run. ``keep[b, u, v]`` (float 0/1) says
            edge ``u -> v`` is in row ``b``'s circuit; every other valid edge carries
            ``replacement[u]`` (``[n_up, pos, d]``: corrupted outputs, or zeros) instead of
            this run's own output of ``u``.
        grad_rows: Backpropagate only these rows' metric (default: all rows).
    """
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
    keep_graph = grads
    if record_upstream or ablate is not None:
        for name, _, _ in graph.upstream_hooks():
            fwd.append((name, H.record(ups, name, detach=not keep_graph)))
    if ablate is not None:
        keep, repl = ablate
        valid = graph.valid_mask().to(keep.device)
        drop = (1.0 - keep.float()) * valid.float()  # [b, n_up, n_readers]
        order = graph.upstream_hooks()

        def make_delta(rh: Any) -> Callable[[Tensor], Tensor | None]:
            w = drop[:, : rh.n_avail, rh.start : rh.start + rh.count]
            if not bool((w != 0).any()):
                return lambda act: None

            def delta(act: Tensor) -> Tensor:
                parts = []
                for name, start, count in order:
                    if start >= rh.n_avail:
                        break
                    a = ups[name]
                    parts.append(a.transpose(1, 2) if a.ndim == 4 else a[:, None])
                cur = torch.cat(parts, 1)[:, : rh.n_avail]  # [b, n_avail, pos, d]
                diff = repl[None, : rh.n_avail].to(cur.dtype) - cur
                wt = w.to(cur.dtype)
                if rh.per_head:
                    return torch.einsum("bupd,buc->bpcd", diff, wt)
                return torch.einsum("bupd,bu->bpd", diff, wt[..., 0])

            return delta

        for rh in graph.reader_hooks():
            fwd.append((rh.name, H.add_computed(make_delta(rh))))
    bwd: list[tuple[str, Callable[..., Any]]] = []
    gstore: dict[str, Tensor] = {}
    if grads:
        bwd = [(rh.name, H.capture_grad(gstore, rh.name)) for rh in graph.reader_hooks()]
    with torch.set_grad_enabled(grads), model.edge_hooks(), model.hooks(fwd=fwd, bwd=bwd):
        logits = model.forward(tokens)
        metric = task.metric_rows(logits)
        if grads:
            sel = metric if grad_rows is None else metric[grad_rows]
            torch.autograd.grad(sel.sum(), [leaf_store["leaf"]])
    upstream = _stack_upstream(graph, ups).detach() if record_upstream else None
    reader_grads = None
    if grads:
        like = torch.zeros(tokens.shape[0], 1, tokens.shape[1], model.d_model, device=logits.device)
        reader_grads = _stack_readers(graph, gstore, like)
    return PassOutput(logits.detach(), upstream, reader_grads, metric.detach())


def corrupted_upstream(model: Model, graph: EdgeGraph, task: CircuitTask) -> tuple[Tensor, PassOutput | None]:
    """Upstream outputs of the corrupted run ``[n_up, pos, d]`` (zeros for zero ablation)."""
    if task.corrupt is None:
        z = torch.zeros(graph.n_upstream, task.clean.shape[1], model.d_model, device=model.device)
        return z, None
    out = run_pass(model, graph, task, task.corrupt, record_upstream=True)
    return out.upstream[0], out


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class EdgeScores(Result):
    """Scores of every edge of the graph for one task (a dense ``[upstream x reader]`` matrix).

    Attributes:
        scores: ``[n_upstream, n_readers]`` edge scores (0 where there is no edge).
        valid: ``[n_upstream, n_readers]`` bool, ``True`` where ``u -> v`` is an edge.
        graph: The :class:`EdgeGraph` (node / reader names, parameter counts).
        model_name, prompt, target, corrupt_prompt, corrupt_target: The task
            (``corrupt_prompt`` ``None`` = zero ablation).
        metric: ``"nll"`` or ``"logit_diff"``.
        method: ``"eap"`` or ``"eap-ig"``; steps: interpolation steps (1 for EAP).
        direction: ``"noising"`` (gradient on the clean run) or ``"denoising"``.
        clean_metric, corrupt_metric: The metric on the clean and the fully corrupted run.

    Example:
        >>> sc = edge_attribution(model, "The capital of France is", " Paris",
        ...                       corrupt_prompt="The capital of Italy is")
        >>> circuit = sc.select(top_n=300)
    """

    scores: Tensor
    valid: Tensor
    graph: EdgeGraph
    model_name: str = ""
    prompt: str = ""
    target: str = ""
    corrupt_prompt: str | None = None
    corrupt_target: str | None = None
    metric: str = "nll"
    method: str = "eap"
    steps: int = 1
    direction: str = "noising"
    clean_metric: float = float("nan")
    corrupt_metric: float = float("nan")

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def top_edges(self, k: int | None = None) -> list[tuple[str, str, float]]:
        """Edges ``(upstream, reader, score)`` by decreasing ``|score|``."""
        flat = self.scores.abs().masked_fill(~self.valid, -1.0).flatten()
        k = self.n_edges if k is None else min(k, self.n_edges)
        idx = flat.topk(k).indices.tolist() if k > 0 else []
        nr = self.graph.n_readers
        return [(self.graph.upstream[i // nr], self.graph.readers[i % nr], float(self.scores.flatten()[i])) for i in idx]

    def select(self, top_n: int | None = None, threshold: float | None = None, prune: bool = True) -> "Circuit":
        """The circuit of the ``top_n`` edges by ``|score|`` (or ``|score| > threshold``).

        Dead nodes are pruned (``prune``): edges out of nodes with no incoming circuit edge
        and edges into nodes whose output reaches no circuit edge are dropped repeatedly.
        """
        from tlcap.locate.circuits.evaluate import Circuit, prune_dead

        if (top_n is None) == (threshold is None):
            raise ValueError("give exactly one of top_n or threshold")
        a = self.scores.abs().masked_fill(~self.valid, -1.0)
        mask = torch.zeros_like(self.valid)
        if top_n is not None:
            k = max(0, min(int(top_n), self.n_edges))
            if k:
                mask.view(-1)[a.flatten().topk(k).indices] = True
        else:
            mask = (a > float(threshold)) & self.valid
        selected = int(mask.sum())
        if prune:
            mask = prune_dead(self.graph, mask)
        return Circuit(mask=mask, scores=self.scores.clone(), graph=self.graph, n_selected=selected,
                       selection=f"top_n={top_n}" if top_n is not None else f"threshold={threshold}",
                       model_name=self.model_name, prompt=self.prompt, target=self.target,
                       corrupt_prompt=self.corrupt_prompt)

    def to_frame(self) -> pd.DataFrame:
        """One row per edge: upstream, reader, score (sorted by ``|score|``)."""
        rows = self.top_edges()
        return pd.DataFrame(rows, columns=["upstream", "reader", "score"])

    def heatmap(self, title: str | None = None):  # noqa: ANN201 - plotly Figure
        """The ``[upstream x reader]`` score matrix as a plotly heatmap."""
        from tlcap.viz.circuit import edge_score_heatmap

        return edge_score_heatmap(self, title=title)


def edge_attribution(
    model: Model,
    prompt: str,
    target: str,
    corrupt_prompt: str | None = None,
    *,
    steps: int = 1,
    metric: MetricName = "nll",
    corrupt_target: str | None = None,
    direction: Literal["noising", "denoising"] = "noising",
    task: CircuitTask | None = None,
) -> EdgeScores:
    """Score every edge of the circuit graph with EAP (``steps=1``) or EAP-IG (``steps>1``).

    Args:
        model: The model (GPT-2 or Llama-family, grouped-query attention included).
        prompt: Clean prompt.
        target: Answer (leading space: ``" Paris"``).
        corrupt_prompt: Same-length prompt with another subject; ``None`` = zero ablation.
        steps: Interpolation steps of EAP-IG (1 = plain EAP).
        metric: ``"nll"`` (MatchNLL) or ``"logit_diff"`` (needs ``corrupt_target``).
        corrupt_target: The corrupted prompt's answer, for ``logit_diff``.
        direction: ``"noising"`` (gradient at the clean run; default) or ``"denoising"``
            (gradient at the corrupted run, difference clean - corrupted).
        task: A prepared :class:`CircuitTask` (overrides the strings).

    Returns:
        :class:`EdgeScores` with the dense ``[n_upstream, n_readers]`` score matrix.

    Example:
        >>> sc = edge_attribution(model, "The capital of France is", " Paris",
        ...                       corrupt_prompt="The capital of Italy is", steps=5)
        >>> sc.top_edges(5)
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if direction not in ("noising", "denoising"):
        raise ValueError(f"direction must be 'noising' or 'denoising', got {direction!r}")
    if task is None:
        task = make_task(model, prompt, target, corrupt_prompt, metric, corrupt_target)
    graph = EdgeGraph.from_model(model)
    corrupt_metric = None
    if steps == 1 and task.corrupt is not None:
        # One batched pass over [clean, corrupted]: outputs of both, gradient of one row.
        g_row = 0 if direction == "noising" else 1
        out = run_pass(model, graph, task, torch.cat([task.clean, task.corrupt]), record_upstream=True,
                       grads=True, grad_rows=[g_row])
        clean_up, corrupt_up, grad = out.upstream[0], out.upstream[1], out.reader_grads[g_row]
        clean_metric, corrupt_metric = float(out.metric[0]), float(out.metric[1])
    elif steps == 1:
        if direction == "denoising":
            raise ValueError("direction='denoising' with steps=1 needs a corrupted prompt (not zero ablation).")
        out = run_pass(model, graph, task, task.clean, record_upstream=True, grads=True)
        clean_up, grad, clean_metric = out.upstream[0], out.reader_grads[0], float(out.metric[0])
        corrupt_up = torch.zeros_like(clean_up)
    else:
        # EAP-IG: outputs of both runs, then the gradient averaged along the input path.
        toks = task.clean if task.corrupt is None else torch.cat([task.clean, task.corrupt])
        out = run_pass(model, graph, task, toks, record_upstream=True)
        clean_up, clean_metric = out.upstream[0], float(out.metric[0])
        if task.corrupt is None:
            corrupt_up = torch.zeros_like(clean_up)
        else:
            corrupt_up, corrupt_metric = out.upstream[1], float(out.metric[1])
        alphas = (torch.arange(steps, dtype=torch.float32) + 0.5) / steps
        a = alphas.to(clean_up.device)[:, None, None]
        x = corrupt_up[0][None] + a * (clean_up[0] - corrupt_up[0])[None]
        grad = run_pass(model, graph, task, task.clean.expand(steps, -1), input_value=x, grads=True).reader_grads.mean(0)
    diff = corrupt_up - clean_up if direction == "noising" else clean_up - corrupt_up
    scores = diff.flatten(1).double() @ grad.flatten(1).double().T
    valid = graph.valid_mask()
    scores = (scores.float() * valid).cpu()
    if corrupt_metric is None:  # zero ablation: the all-zero run
        empty = torch.zeros(1, *valid.shape)
        corrupt_metric = float(run_pass(model, graph, task, task.clean, ablate=(empty, corrupt_up)).metric[0])
    return EdgeScores(
        scores=scores, valid=valid, graph=graph, model_name=model.name, prompt=prompt, target=target,
        corrupt_prompt=corrupt_prompt, corrupt_target=corrupt_target, metric=task.metric,
        method="eap" if steps == 1 else "eap-ig", steps=steps, direction=direction,
        clean_metric=clean_metric, corrupt_metric=corrupt_metric,
    )


def tl_edge_matrix(graph: EdgeGraph, edge_scores: dict) -> Tensor:
    """Dense ``[n_upstream, n_readers]`` matrix from TransformerLens ``attribution_patch`` edges.

    TransformerLens 4.x (``transformer_lens.tools.analysis.attribution_patching``) scores
    ``(writer, reader)`` pairs per sequence position; this sums them over positions and maps
    its node kinds onto this graph (``embed`` -> ``input``, ``attn_head_out`` -> ``a{l}.h{h}``,
    ``mlp_out`` -> ``m{l}``, ``q/k/v_input`` -> ``a{l}.h{h}<q/k/v>`` (``a{l}.kv{g}<k/v>`` when a
    GQA edge list uses kv-head indices), ``mlp_in`` -> ``m{l}``, ``logits`` -> ``logits``).
    Compare with ``edge_attribution(..., direction="denoising")``, its convention.
    """
    up = {n: i for i, n in enumerate(graph.upstream)}
    rd = {n: i for i, n in enumerate(graph.readers)}
    gqa = graph.n_kv_heads != graph.n_heads
    out = torch.zeros(graph.n_upstream, graph.n_readers, dtype=torch.float64)

    def wname(n: Any) -> str:
        return {"embed": "input", "mlp_out": f"m{n.layer}"}.get(n.kind, f"a{n.layer}.h{n.head}")

    def rname(n: Any) -> str:
        if n.kind == "logits":
            return "logits"
        if n.kind == "mlp_in":
            return f"m{n.layer}"
        kind = n.kind[0]
        if gqa and kind in "kv":
            return f"a{n.layer}.kv{n.head}<{kind}>"
        return f"a{n.layer}.h{n.head}<{kind}>"

    for (w, r), s in edge_scores.items():
        out[up[wname(w)], rd[rname(r)]] += float(s)
    return out


__all__ = ["tl_edge_matrix", "CircuitTask", "EdgeScores", "edge_attribution", "make_task", "run_pass", "corrupted_upstream"]
