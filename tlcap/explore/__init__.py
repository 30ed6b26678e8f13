"""The researcher's workbench: neuron cards, the activation index, the logit lens, direct logit attribution.

See ``docs/explore.md``.
"""

from tlcap.explore.activation_index import ActivationIndex, activation_index, build_activation_index
from tlcap.explore.card import NeuronCard, inspect_neuron
from tlcap.explore.dla import DirectLogitAttribution, direct_logit_attribution
from tlcap.explore.explorer import NeuronExplorer, explore_neurons
from tlcap.explore.logit_lens import LogitLens, logit_lens

__all__ = [
    "ActivationIndex", "activation_index", "build_activation_index", "NeuronCard", "inspect_neuron",
    "DirectLogitAttribution", "direct_logit_attribution", "LogitLens", "logit_lens", "NeuronExplorer",
    "explore_neurons",
]
