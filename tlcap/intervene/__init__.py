"""Interventions on activations (hook lists) and on weights (reversible edits, ROME, masked fine-tuning)."""

from tlcap.intervene.activations import enhance, scale_neurons, suppress
from tlcap.intervene.finetune import masked_finetune
from tlcap.intervene.rome import evaluate_rome, rome_edit, rome_sweep
from tlcap.intervene.weights import WeightEdit, erase_neurons

__all__ = [
    "enhance", "scale_neurons", "suppress", "masked_finetune", "evaluate_rome", "rome_edit", "rome_sweep",
    "WeightEdit", "erase_neurons",
]
