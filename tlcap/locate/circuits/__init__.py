"""Knowledge circuits (Yao et al. 2024): edge attribution patching and circuit-only evaluation.

Example:
    >>> from tlcap.locate.circuits import edge_attribution, evaluate_circuit
    >>> scores = edge_attribution(model, "The capital of France is", " Paris",
    ...                           corrupt_prompt="The capital of Italy is")
    >>> circuit = scores.select(top_n=300)
    >>> evaluate_circuit(model, circuit).circuit_target_rank
"""

from tlcap.locate.circuits.eap import CircuitTask, EdgeScores, edge_attribution, make_task
from tlcap.locate.circuits.evaluate import (
    Circuit,
    CircuitEvaluation,
    SizeSweep,
    evaluate_circuit,
    evaluate_masks,
    prune_dead,
    size_sweep,
)
from tlcap.locate.circuits.graph import EdgeGraph, edge_hooks_enabled

__all__ = [
    "Circuit", "CircuitEvaluation", "CircuitTask", "EdgeGraph", "EdgeScores", "SizeSweep",
    "edge_attribution", "edge_hooks_enabled", "evaluate_circuit", "evaluate_masks", "make_task",
    "prune_dead", "size_sweep",
]
