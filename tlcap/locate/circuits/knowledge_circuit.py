"""The knowledge circuit of one fact: score, select, evaluate alone, compare with random, sweep sizes.

A composition of the circuit pieces (what ``tlcap circuit`` runs): :func:`edge_attribution`
→ :meth:`EdgeScores.select` → circuit-only evaluation of the circuit and of a random circuit
of the same size (:func:`evaluate_circuits`) → optionally :func:`size_sweep`. Everything is in
one :class:`KnowledgeCircuit` result, whose :meth:`~KnowledgeCircuit.summary` is the command's
``summary.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Bool, Float
from torch import Tensor

from tlcap.locate.circuits.circuit import Circuit
from tlcap.locate.circuits.config import EAPConfig, check_circuit_inputs
from tlcap.locate.circuits.eap import EdgeScores, edge_attribution
from tlcap.locate.circuits.evaluate import CircuitEvaluation, evaluate_circuits
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.run import CircuitRun, CircuitRunFields
from tlcap.locate.circuits.sweep import SizeSweep, size_sweep
from tlcap.locate.circuits.task import make_task
from tlcap.models import Model
from tlcap.provenance import Provenance
from tlcap.results import Result


@dataclass(frozen=True)
class KnowledgeCircuit(CircuitRunFields, Result):
    """A fact's edge scores, its circuit, the circuit-only evaluation and the size sweep.

    Attributes:
        scores: ``[n_upstream, n_readers]`` edge scores (:attr:`edge_scores` rebuilds the :class:`EdgeScores`).
        mask: ``[n_upstream, n_readers]`` the circuit's edges (:attr:`circuit` rebuilds the :class:`Circuit`).
        graph: The :class:`EdgeGraph`.
        n_selected, selection: How the circuit was selected (before pruning).
        evaluation: The circuit alone vs the full model and the fully ablated run.
        random_evaluation: A random circuit with as many edges (seed ``config["seed"]``).
        sweep: Circuits of several sizes (``None`` when not run).
        run: The task and the method, as in :class:`EdgeScores`
            (:class:`~tlcap.locate.circuits.run.CircuitRun`; its fields read on the result too).
    """

    scores: Float[Tensor, "n_up n_readers"]
    mask: Bool[Tensor, "n_up n_readers"]
    graph: EdgeGraph
    n_selected: int
    selection: str
    evaluation: CircuitEvaluation
    random_evaluation: CircuitEvaluation
    sweep: SizeSweep | None = None
    run: CircuitRun = field(default_factory=CircuitRun)

    @property
    def edge_scores(self) -> EdgeScores:
        """The :class:`EdgeScores` the circuit was selected from."""
        return EdgeScores(scores=self.scores, valid=self.graph.valid_mask(), graph=self.graph, run=self.run,
                          provenance=self.provenance)

    @property
    def circuit(self) -> Circuit:
        """The selected (pruned) :class:`Circuit`."""
        return Circuit(mask=self.mask, scores=self.scores, graph=self.graph, n_selected=self.n_selected,
                       selection=self.selection, run=self.run, provenance=self.provenance)

    def summary(self) -> dict[str, Any]:
        """The ``tlcap circuit`` summary: task, method, circuit size, evaluation, random control, sweep.

        Returns:
            A JSON-ready dict (the sweep as column lists, or None without one).
        """
        c, ev, rnd = self.circuit, self.evaluation, self.random_evaluation
        return {
            "model": self.model_name, "prompt": self.prompt, "target": self.target,
            "corrupt_prompt": self.corrupt_prompt, "corrupt_target": self.corrupt_target, "ablation": self.ablation,
            "method": self.method, "ig_steps": self.steps, "metric": self.metric, "direction": self.direction,
            "selection": self.selection, "n_selected": self.n_selected, "n_edges": c.n_edges, "n_nodes": c.n_nodes,
            "total_edges": int(self.graph.valid_mask().sum()),
            "param_fraction": c.param_fraction, "n_block_params": c.n_block_params, "block_params": self.graph.block_params,
            "param_fraction_with_embeddings": c.param_fraction_with_embeddings,
            "full_nll": ev.full_nll, "circuit_nll": ev.circuit_nll, "ablated_nll": ev.ablated_nll,
            "full_target_rank": ev.full_target_rank, "circuit_target_rank": ev.circuit_target_rank,
            "ablated_target_rank": ev.ablated_target_rank, "hit_at_1": ev.hit_at_1, "hit_at_10": ev.hit_at_10,
            "logit_diff_vs_full": ev.logit_diff_vs_full, "recovered": ev.recovered,
            "full_metric": ev.full_metric, "circuit_metric": ev.circuit_metric,
            "random_circuit_nll": rnd.circuit_nll, "random_circuit_target_rank": rnd.circuit_target_rank,
            "nodes": list(c.nodes), "edges": [[u, v, s] for u, v, s in c.edges],
            "sweep": None if self.sweep is None else self.sweep.to_frame().to_dict(orient="list"),
            "config": dict(self.config),
        }

    def to_frame(self) -> pd.DataFrame:
        """The circuit's edges (:meth:`Circuit.to_frame`).

        Returns:
            A DataFrame of :class:`EdgeRow`, by decreasing ``|score|``.
        """
        return self.circuit.to_frame()

    def figure(self) -> go.Figure:
        """The circuit graph (:meth:`Circuit.figure`).

        Returns:
            The plotly figure of the circuit.
        """
        return self.circuit.figure()

    def figures(self) -> dict[str, go.Figure]:
        """Every figure, by file stem: ``circuit``, ``edge_scores`` and (with a sweep) ``size_sweep``.

        Returns:
            File stem → plotly figure.
        """
        figs = {"circuit": self.figure(), "edge_scores": self.edge_scores.heatmap()}
        if self.sweep is not None:
            figs["size_sweep"] = self.sweep.figure()
        return figs


def knowledge_circuit(
    model: Model,
    prompt: str,
    target: str,
    corrupt_prompt: str | None = None,
    *,
    corrupt_target: str | None = None,
    config: EAPConfig | None = None,
    log: Callable[[str], None] | None = None,
    **overrides: Any,
) -> KnowledgeCircuit:
    """Find the knowledge circuit of a fact and evaluate it alone, against a random circuit.

    Args:
        model: The model.
        prompt: Clean prompt, e.g. ``"The capital of France is"``.
        target: Answer with its leading space, e.g. ``" Paris"``.
        corrupt_prompt: Same relation, another subject of the same token length; ``None`` = zero ablation.
        corrupt_target: The corrupted prompt's answer (``metric="logit_diff"``).
        config: An :class:`EAPConfig` (default: its defaults).
        log: Called with a line before each phase (scoring, evaluation, sweep), e.g. ``print``.
        **overrides: :class:`EAPConfig` fields overriding ``config`` (``steps=5``, ``top_n=100``...).

    Returns:
        A :class:`KnowledgeCircuit` with its config and provenance.

    Raises:
        InvalidConfigError: an invalid option or task string (before any forward pass).
        ShapeMismatchError: clean and corrupted prompts of different token lengths.
        TargetTokenizationError: a target that does not tokenize cleanly after its prompt.

    Example:
        >>> res = knowledge_circuit(model, "The capital of France is", " Paris",
        ...                         "The capital of Italy is", steps=5, top_n=20)    # top_n=300 on SmolLM2
        >>> type(res.summary()["circuit_target_rank"]).__name__
        'int'
        >>> fig = res.figure()
    """
    cfg = check_circuit_inputs(prompt, target, corrupt_prompt, corrupt_target, EAPConfig.resolve(config, **overrides))
    say = log or (lambda _: None)
    task = make_task(model, prompt, target, corrupt_prompt, cfg.metric, corrupt_target)
    say(f"scoring all edges ({f'EAP-IG, {cfg.steps} steps' if cfg.steps > 1 else 'EAP'}, {cfg.ablation} ablation) ...")
    scores = edge_attribution(model, prompt, target, corrupt_prompt, corrupt_target=corrupt_target, task=task, config=cfg)
    rule, value = cfg.selection
    circ = scores.select(top_n=int(value), prune=cfg.prune) if rule == "top_n" else \
        scores.select(threshold=float(value), prune=cfg.prune)
    say(f"evaluating the circuit ({circ.n_edges} edges) alone and a random circuit of the same size ...")
    ev, rnd = evaluate_circuits(model, [circ, circ.random_like(cfg.seed)], task, batch=cfg.eval_batch)
    sweep = None
    if cfg.sweep:
        say("size sweep ...")
        sweep = size_sweep(model, scores, cfg.sweep_sizes, seed=cfg.seed, task=task, batch=cfg.eval_batch)
    return KnowledgeCircuit(
        scores=scores.scores, mask=circ.mask, graph=scores.graph, n_selected=circ.n_selected, selection=circ.selection,
        evaluation=ev, random_evaluation=rnd, sweep=sweep, run=scores.run,
        provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


__all__ = ["KnowledgeCircuit", "knowledge_circuit"]
