"""Metrics: located sets and their overlaps, probabilities, statistics."""

from tlcap.metrics.probs import target_prob, token_probs
from tlcap.metrics.sets import NeuronSet

__all__ = ["NeuronSet", "target_prob", "token_probs"]
