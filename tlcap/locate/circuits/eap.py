"""Edge attribution patching (EAP, EAP-IG): every edge score from a few passes.

For an edge ``u -> v`` (upstream output into reader input, see :mod:`.graph`), EAP estimates
the effect on the metric of replacing ``u``'s contribution to ``v``'s input with its ablated
value (:mod:`.ablation`: the corrupted run's, or zero) by a first-order Taylor expansion::

    score(u -> v) = sum_pos (ablated_u - clean_u) . d metric / d input_v     ("noising")

The gradient is taken on the clean run (Hanna et al. 2024; the knowledge-circuits code):
one pass records the ablated outputs; one forward over the clean input records ``clean_u``
and one backward gives ``d metric / d input_v`` for every reader at once. All scores are then
one matrix product ``[n_upstream, pos*d] @ [pos*d, n_readers]``.

* ``steps > 1`` (EAP-IG): the gradient is averaged over ``steps`` points on the straight line
  between the ablated and the clean input embeddings (midpoint rule), all in one batched
  forward + backward.
* ``direction="denoising"`` takes the gradient on the corrupted run and the difference
  ``clean_u - corrupt_u`` (the convention of TransformerLens' ``attribution_patch``); with
  EAP-IG both directions give the same scores up to sign.

The metric is MatchNLL of the target (mean NLL over its tokens, teacher-forced), or the
logit difference ``logit(target) - logit(corrupt_target)``. With MatchNLL a positive score
means that ablating the edge raises the NLL: the edge carries the fact.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tlcap.config import check_int
from tlcap.errors import InvalidConfigError, TlcapWarning
from tlcap.locate.circuits.ablation import ablation_source, fit_source
from tlcap.locate.circuits.circuit import Circuit, EdgeRow, prune_dead, select_edges
from tlcap.locate.circuits.config import EAPConfig, check_circuit_inputs
from tlcap.locate.circuits.dataset import CircuitDataset, dataset_batch_size
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.run import CircuitRun, CircuitRunFields
from tlcap.locate.circuits.scoring import batch_scores
from tlcap.locate.circuits.task import CircuitTask, make_task
from tlcap.models import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.runtime.batching import run_auto_batched
from tlcap.viz.circuit import edge_score_heatmap


@dataclass(frozen=True)
class EdgeScores(CircuitRunFields, Result):
    """Scores of every edge of the graph for one task (a dense ``[upstream x reader]`` matrix).

    Attributes:
        scores: ``[n_upstream, n_readers]`` edge scores (0 where there is no edge).
        valid: ``[n_upstream, n_readers]`` bool, ``True`` where ``u -> v`` is an edge.
        graph: The :class:`EdgeGraph` (node / reader names, parameter counts).
        run: The task and the method (:class:`~tlcap.locate.circuits.run.CircuitRun`: prompt, target,
            corrupted prompt, metric, EAP / EAP-IG and its steps, direction, the metric on the clean
            and the fully ablated run, ablation, dataset and items, the :class:`EAPConfig`); its
            fields read on the result too (``scores.prompt``).

    Example:
        >>> sc = edge_attribution(model, "The capital of France is", " Paris",
        ...                       corrupt_prompt="The capital of Italy is")
        >>> circuit = sc.select(top_n=300)
    """

    scores: Float[Tensor, "n_up n_readers"]
    valid: Bool[Tensor, "n_up n_readers"]
    graph: EdgeGraph
    run: CircuitRun = field(default_factory=CircuitRun)

    @property
    def n_edges(self) -> int:
        """Edges in the graph."""
        return int(self.valid.sum())

    def top_edges(self, k: int | None = None) -> list[tuple[str, str, float]]:
        """Edges ``(upstream, reader, score)`` by decreasing ``|score|`` (all, or the first ``k``).

        Args:
            k: How many edges (None: every edge of the graph).

        Returns:
            ``(upstream name, reader name, signed score)`` tuples.
        """
        flat = self.scores.abs().masked_fill(~self.valid, -1.0).flatten()
        k = self.n_edges if k is None else min(k, self.n_edges)
        idx = flat.topk(k).indices.tolist() if k > 0 else []
        nr = self.graph.n_readers
        return [(self.graph.upstream[i // nr], self.graph.readers[i % nr], float(self.scores.flatten()[i])) for i in idx]

    def select(self, top_n: int | None = None, threshold: float | None = None, prune: bool = True) -> Circuit:
        """The circuit of the ``top_n`` edges by ``|score|`` (or ``|score| > threshold``).

        Args:
            top_n: Edges to keep, ``>= 1``.
            threshold: Keep the edges with ``|score| > threshold`` instead, ``> 0``.
            prune: Drop dead edges (:func:`prune_dead`): edges out of nodes with no incoming
                circuit edge and edges into nodes whose output reaches no circuit edge, repeatedly.

        Returns:
            The :class:`Circuit`.

        Raises:
            InvalidConfigError: both or neither of ``top_n`` and ``threshold``, or one out of range.

        Warns:
            TlcapWarning: ``top_n`` larger than the graph's number of edges (all are kept).
        """
        if top_n is not None:
            check_int("top_n", top_n, min=1)
            if top_n > self.n_edges:
                warnings.warn(
                    f"top_n={top_n} is more than the {self.n_edges} edges of the graph: the circuit holds all of them "
                    f"(requested {top_n}, selected {self.n_edges}; recorded as selection and n_selected)",
                    TlcapWarning, stacklevel=2,
                )
        mask = select_edges(self.scores, self.valid, top_n, threshold)
        selected = int(mask.sum())
        if prune:
            mask = prune_dead(self.graph, mask)
        return Circuit(mask=mask, scores=self.scores.clone(), graph=self.graph, n_selected=selected,
                       selection=f"top_n={top_n}" if top_n is not None else f"threshold={threshold}", run=self.run)

    def summary(self, top: int = 20) -> dict[str, Any]:
        """The task, the method, the metric on the clean and ablated runs, and the ``top`` edges.

        Args:
            top: How many top edges to list.

        Returns:
            A JSON-ready dict (``top_edges`` as ``[upstream, reader, score]`` lists, the config as a dict).
        """
        return {
            "model": self.model_name, "prompt": self.prompt, "target": self.target,
            "corrupt_prompt": self.corrupt_prompt, "corrupt_target": self.corrupt_target, "ablation": self.ablation,
            "method": self.method, "ig_steps": self.steps, "metric": self.metric, "direction": self.direction,
            "dataset": self.dataset, "n_items": self.n_items, "total_edges": self.n_edges,
            "clean_metric": self.clean_metric, "corrupt_metric": self.corrupt_metric,
            "top_edges": [[u, v, s] for u, v, s in self.top_edges(top)], "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`EdgeRow` per edge, by decreasing ``|score|``.

        Returns:
            A DataFrame of :class:`EdgeRow` for every edge of the graph.
        """
        return frame([EdgeRow(*e) for e in self.top_edges()], EdgeRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """The ``[upstream x reader]`` score matrix as a heatmap (:meth:`heatmap`).

        Args:
            title: Figure title (default: method, metric, direction, prompt and target).

        Returns:
            The plotly heatmap.
        """
        return self.heatmap(title)

    def heatmap(self, title: str | None = None) -> go.Figure:
        """The ``[upstream x reader]`` score matrix as a plotly heatmap (non-edges blank).

        Args:
            title: Figure title (default: method, metric, direction, prompt and target).

        Returns:
            A plotly figure, upstream nodes as rows and readers as columns.
        """
        z = self.scores.detach().double().numpy().copy()
        z[~self.valid.numpy()] = float("nan")
        return edge_score_heatmap(
            z, self.graph.upstream, self.graph.readers,
            title or f"Edge scores ({self.method}, {self.metric}, {self.direction}) — {self.prompt!r} → {self.target!r}",
        )


def score_tasks(
    model: Model, graph: EdgeGraph, tasks: Sequence[CircuitTask], cfg: EAPConfig
) -> tuple[Tensor, float, float, int]:
    """Mean per-item scores over a stream of batches, with the mean clean and fully ablated metrics.

    Memory: only running sums are kept across batches (one ``[n_up, n_readers]`` float64
    matrix and two numbers), so what stays alive does not grow with the number of items; the
    peak is the peak of one batch, which grows with ``batch_size`` and with the batch's padded
    width (its longest row, :func:`~.task.make_items_task`), not with the number of batches.

    Args:
        model: The model.
        graph: Its edge graph.
        tasks: Batches of items (:meth:`CircuitDataset.tasks`); activations live one batch at a time.
        cfg: The settings (``ablation`` resolved).

    Returns:
        ``(scores [n_up, n_readers], clean metric, ablated metric, n_items)``.
    """
    source = fit_source(ablation_source(str(cfg.ablation)), model, graph, tasks)
    total = torch.zeros(graph.n_upstream, graph.n_readers, dtype=torch.float64)
    clean = abl = 0.0
    n = 0
    for task in tasks:
        b = batch_scores(model, graph, task, cfg, source)
        total += b.scores
        clean += float(b.clean_metric.double().sum())
        abl += float(b.ablated_metric.double().sum())
        n += task.n_items
    return (total / n).float(), clean / n, abl / n, n


def edge_attribution(
    model: Model,
    prompt: str | CircuitDataset,
    target: str | None = None,
    corrupt_prompt: str | None = None,
    *,
    corrupt_target: str | None = None,
    task: CircuitTask | None = None,
    config: EAPConfig | None = None,
    **overrides: Any,
) -> EdgeScores:
    """Score every edge of the circuit graph with EAP (``steps=1``) or EAP-IG (``steps>1``).

    Given a :class:`CircuitDataset` instead of a prompt, the scores are the mean over its items
    of the per-item scores, streamed in batches of ``batch_size`` items (exact: the batch size
    does not change them; right padding adds nothing, :func:`~.task.make_items_task`).

    Args:
        model: The model (GPT-2 or Llama-family, grouped-query attention included).
        prompt: Clean prompt, or a :class:`CircuitDataset` (then ``target`` etc. are not given).
        target: Answer (leading space: ``" Paris"``).
        corrupt_prompt: Same-length prompt with another subject; ``None`` = zero ablation.
        corrupt_target: The corrupted prompt's answer, for ``metric="logit_diff"``.
        task: A prepared :class:`CircuitTask` of these strings (skips tokenization).
        config: An :class:`EAPConfig` (default: its defaults).
        **overrides: :class:`EAPConfig` fields overriding ``config`` (``steps=5``,
            ``metric="logit_diff"``, ``direction="denoising"``...).

    Returns:
        :class:`EdgeScores` with the dense ``[n_upstream, n_readers]`` score matrix, its
        config and provenance.

    Raises:
        InvalidConfigError: an invalid option or task string (before any forward pass).
        ShapeMismatchError: clean and corrupted prompts of different token lengths.
        TargetTokenizationError: a target that does not tokenize cleanly after its prompt.

    Example:
        >>> sc = edge_attribution(model, "The capital of France is", " Paris",
        ...                       corrupt_prompt="The capital of Italy is", steps=5)
        >>> [(up, reader) for up, reader, score in sc.top_edges(3)]
        [('input', 'a1.h0<v>'), ('a1.h0', 'logits'), ('m1', 'logits')]
    """
    graph = EdgeGraph.from_model(model)
    if isinstance(prompt, CircuitDataset):
        cfg = check_dataset_config(prompt, EAPConfig.resolve(config, **overrides))
        if cfg.batch_size == "auto":  # most items in the budget, rerun at half on out-of-memory: same scores
            size = dataset_batch_size(model, prompt, "auto", cfg.steps, cfg.max_memory)
            return run_auto_batched(lambda b: edge_attribution(model, prompt, config=cfg.replace(batch_size=b)), size,
                                    model.device, asked=cfg)
        tasks = prompt.tasks(model, cfg.batch_size, cfg.metric)
        strings: dict[str, Any] = {"prompt": "", "target": "", "corrupt_prompt": None, "corrupt_target": None}
        n_items, name = len(prompt), prompt.name
    else:
        if target is None:
            raise InvalidConfigError("edge_attribution needs a target (the answer, e.g. ' Paris') with a prompt")
        cfg = check_circuit_inputs(prompt, target, corrupt_prompt, corrupt_target, EAPConfig.resolve(config, **overrides))
        tasks = [task or make_task(model, prompt, target, corrupt_prompt, cfg.metric, corrupt_target)]
        strings = {"prompt": prompt, "target": target, "corrupt_prompt": corrupt_prompt, "corrupt_target": corrupt_target}
        n_items, name = 1, ""
    scores, clean_metric, corrupt_metric, _ = score_tasks(model, graph, tasks, cfg)
    run = CircuitRun(model_name=model.name, **strings, metric=cfg.metric, method="eap" if cfg.steps == 1 else "eap-ig",
                     steps=cfg.steps, direction=cfg.direction, clean_metric=clean_metric, corrupt_metric=corrupt_metric,
                     ablation=str(cfg.ablation), dataset=name, n_items=n_items, config=cfg.to_dict())
    return EdgeScores(scores=scores, valid=graph.valid_mask(), graph=graph, run=run,
                      provenance=Provenance.collect(model, config=cfg, seed=cfg.seed))


def check_dataset_config(dataset: CircuitDataset, cfg: EAPConfig) -> EAPConfig:
    """``cfg`` with its ablation resolved for ``dataset`` (``corrupt`` when it has corrupted prompts, else ``zero``).

    Args:
        dataset: The circuit dataset.
        cfg: The EAP configuration (``ablation`` None: choose by the dataset).

    Returns:
        ``cfg`` itself when its ablation is already set, else a copy with the ablation filled in.

    Raises:
        InvalidConfigError: corrupted-prompt ablation (or denoising EAP) on a dataset without corrupted prompts.
    """
    ablation = cfg.ablation or ("corrupt" if dataset.has_corrupt else "zero")
    if (ablation == "corrupt" or (cfg.direction == "denoising" and cfg.steps == 1)) and not dataset.has_corrupt:
        raise InvalidConfigError(
            f"dataset {dataset.name!r} has no corrupted prompts: load it with corrupt=True (pairs same-length "
            "prompts of the same relation) or use ablation 'zero', 'mean' or 'mean-positional'"
        )
    return cfg if cfg.ablation == ablation else cfg.replace(ablation=ablation)


__all__ = ["EdgeScores", "check_dataset_config", "edge_attribution", "score_tasks"]
