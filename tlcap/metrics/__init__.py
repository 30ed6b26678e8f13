"""Metrics: located sets and their overlaps, probabilities, task accuracy, statistics."""

from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.probs import target_prob, token_probs
from tlcap.metrics.sets import NeuronSet
from tlcap.metrics.stats import cs1, cs2, otsu_threshold, welch_t_test

__all__ = ["NeuronSet", "target_prob", "token_probs", "task_accuracy", "cs1", "cs2", "otsu_threshold", "welch_t_test"]
