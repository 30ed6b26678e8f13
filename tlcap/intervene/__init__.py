"""Interventions on activations (hook lists) and on weights (reversible edits)."""

from tlcap.intervene.activations import enhance, scale_neurons, suppress
from tlcap.intervene.weights import WeightEdit, erase_neurons

__all__ = ["enhance", "scale_neurons", "suppress", "WeightEdit", "erase_neurons"]
