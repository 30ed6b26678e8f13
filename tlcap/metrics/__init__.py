"""Metrics: located sets and their overlaps, probabilities, task accuracy, statistics."""

from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.bootstrap import WeightedStatistic, bootstrap_ci, crossed_ci, paired_difference_ci
from tlcap.metrics.coincidence import CoincidenceRates, coincidence_rates
from tlcap.metrics.estimate import Estimate, StatisticsError, TooFewSamplesError
from tlcap.metrics.localization import (
    MIN_IPP_DRAWS,
    PairwiseOverlap,
    iou,
    ipp,
    ipp_ci,
    mean_pairwise_overlap,
    overlap,
)
from tlcap.metrics.permutation import (
    MIN_NULL_DRAWS,
    RandomControlTest,
    located_vs_random,
    permutation_p_value,
    require_draws,
)
from tlcap.metrics.probs import target_prob, token_probs
from tlcap.metrics.sensitivity import SensitivityCurve, threshold_curve
from tlcap.metrics.sets import NeuronSet
from tlcap.metrics.shares import share_ci, wilson_interval
from tlcap.metrics.stats import cs1, cs2, otsu_threshold, welch_t_test

__all__ = [
    "MIN_IPP_DRAWS",
    "MIN_NULL_DRAWS",
    "CoincidenceRates",
    "Estimate",
    "NeuronSet",
    "PairwiseOverlap",
    "RandomControlTest",
    "SensitivityCurve",
    "StatisticsError",
    "TooFewSamplesError",
    "WeightedStatistic",
    "bootstrap_ci",
    "coincidence_rates",
    "crossed_ci",
    "cs1",
    "cs2",
    "iou",
    "ipp",
    "ipp_ci",
    "located_vs_random",
    "mean_pairwise_overlap",
    "otsu_threshold",
    "overlap",
    "paired_difference_ci",
    "permutation_p_value",
    "require_draws",
    "share_ci",
    "target_prob",
    "task_accuracy",
    "threshold_curve",
    "token_probs",
    "welch_t_test",
    "wilson_interval",
]
