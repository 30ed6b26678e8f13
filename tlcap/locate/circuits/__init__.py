"""Knowledge circuits (Yao et al. 2024): edge attribution patching and circuit-only evaluation.

Modules, bottom up (each imports only the ones above it):

=======================  ==============================================================
``config``               :class:`EAPConfig`, the validated settings; task-string checks
``graph``                :class:`EdgeGraph`: nodes, readers, edges, parameter groups
``circuit``              :class:`Circuit`, selection and pruning (depends only on the graph)
``task``                 :class:`CircuitTask` (items, targets, metric), :func:`make_task`
``passes``               :func:`run_pass`, the pass engine (record, gradients, circuit-only runs)
``ablation``             ablation sources: corrupted run, zero, mean, mean-positional (pluggable)
``dataset``              :class:`CircuitDataset`: ParaRel / known facts / user files, corrupted pairs
``scoring``              :func:`batch_scores`: EAP / EAP-IG score sums of a batch of items
``eap``                  :func:`edge_attribution` (EAP, EAP-IG) → :class:`EdgeScores`
``evaluate``             circuit-only evaluation → :class:`CircuitEvaluation`
``sweep``                :func:`size_sweep` → :class:`SizeSweep`
``knowledge_circuit``    :func:`knowledge_circuit`: all of it for one fact (``tlcap circuit``)
``nodes``                :func:`node_attribution` → :class:`NodeScores` (node granularity)
=======================  ==============================================================

Example:
    >>> from tlcap.locate.circuits import edge_attribution, evaluate_circuit
    >>> scores = edge_attribution(model, "The capital of France is", " Paris",
    ...                           corrupt_prompt="The capital of Italy is", steps=5)
    >>> scores.n_edges                         # the tiny 2-layer graph; SmolLM2's has ~10^5 edges
    110
    >>> circuit = scores.select(top_n=20)      # top_n=300 on SmolLM2
    >>> circuit.summary()["n_selected"], circuit.summary()["n_edges"]   # edges left once dead ends are pruned
    (20, 19)
    >>> ev = evaluate_circuit(model, circuit)    # " Paris" under the circuit alone (SmolLM2: near the top)
    >>> type(ev.circuit_target_rank).__name__, ev.hit_at_10
    ('int', False)
"""

from tlcap.locate.circuits.ablation import (
    AblatedRun,
    AblationSource,
    CorruptedAblation,
    MeanAblation,
    ZeroAblation,
    ablation_source,
    fit_source,
)
from tlcap.locate.circuits.circuit import Circuit, EdgeRow, prune_dead, select_edges
from tlcap.locate.circuits.config import EAPConfig, check_circuit_inputs
from tlcap.locate.circuits.dataset import CircuitDataset, load_circuit_dataset
from tlcap.locate.circuits.eap import EdgeScores, edge_attribution
from tlcap.locate.circuits.evaluate import CircuitEvaluation, evaluate_circuit, evaluate_circuits, evaluate_masks
from tlcap.locate.circuits.graph import EdgeGraph, NodeRow, UnsupportedModelError
from tlcap.locate.circuits.knowledge_circuit import KnowledgeCircuit, knowledge_circuit
from tlcap.locate.circuits.nodes import NodeScoreRow, NodeScores, node_attribution
from tlcap.locate.circuits.passes import PassOutput, run_pass
from tlcap.locate.circuits.sweep import SizeSweep, SweepRow, size_sweep
from tlcap.locate.circuits.task import CircuitItem, CircuitTask, make_items_task, make_task

__all__ = [
    "CircuitDataset", "CircuitItem", "MeanAblation", "fit_source", "load_circuit_dataset", "make_items_task",
    "AblatedRun", "AblationSource", "Circuit", "CircuitEvaluation", "CircuitTask", "CorruptedAblation", "EAPConfig",
    "EdgeGraph", "EdgeRow", "EdgeScores", "KnowledgeCircuit", "NodeRow", "PassOutput", "SizeSweep", "SweepRow",
    "UnsupportedModelError", "ZeroAblation", "ablation_source", "check_circuit_inputs", "edge_attribution",
    "evaluate_circuit", "evaluate_circuits", "evaluate_masks", "knowledge_circuit", "make_task",
    "prune_dead", "run_pass", "select_edges", "size_sweep", "NodeScoreRow", "NodeScores", "node_attribution",
]
