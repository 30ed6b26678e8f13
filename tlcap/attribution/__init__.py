"""Attribution methods: integrated gradients on neurons (+ estimators), SIG, AMIG, dataset streaming."""

from tlcap.attribution.config import IGConfig
from tlcap.attribution.dataset import score_dataset
from tlcap.attribution.ig import NeuronAttribution, integrated_gradients, integrated_gradients_facts, quadrature
from tlcap.attribution.methods import localize
from tlcap.attribution.reference import reference_ig

__all__ = ["IGConfig", "NeuronAttribution", "integrated_gradients", "integrated_gradients_facts", "quadrature", "reference_ig",
           "localize", "score_dataset"]

