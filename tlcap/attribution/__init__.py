"""Attribution methods: integrated gradients on neurons and its estimators."""

from tlcap.attribution.ig import NeuronAttribution, integrated_gradients, quadrature
from tlcap.attribution.reference import reference_ig

__all__ = ["NeuronAttribution", "integrated_gradients", "quadrature", "reference_ig"]
