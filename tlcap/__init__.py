"""tlcap: localize knowledge and capabilities inside language models.

One TransformerLens hook runtime under every method: knowledge neurons (integrated gradients),
causal tracing and ROME, knowledge circuits, CNL, and the Query Localization analyses.

Example (``model`` is any loaded model: ``tlcap.load_model("smollm2-135m")`` for SmolLM2, or the tiny
random GPT-2 of :func:`tlcap.models.make_gpt2` as here; on SmolLM2 the located neurons concentrate in
the upper MLP layers):
    >>> import tlcap
    >>> attr = tlcap.integrated_gradients(model, "The capital of France is", " Paris", steps=2)
    >>> tuple(attr.scores.shape)                  # (layers, MLP neurons)
    (2, 256)
    >>> neurons = attr.select(threshold=0.2)      # score > 0.2 · max
    >>> len(neurons), neurons.neurons[:2]
    (34, ((0, 55), (0, 79)))
    >>> fig = attr.heatmap(highlight=neurons)     # a plotly Figure: fig.show() in a notebook
"""

from tlcap.attribution import IGConfig, NeuronAttribution, integrated_gradients
from tlcap.errors import TlcapError
from tlcap.explore import (
    ActivationIndex,
    DirectLogitAttribution,
    LogitLens,
    NeuronCard,
    activation_index,
    direct_logit_attribution,
    explore_neurons,
    inspect_neuron,
    logit_lens,
)
from tlcap.method_registry import localize, methods
from tlcap.metrics import NeuronSet, target_prob, token_probs
from tlcap.models import Model, load_model
from tlcap.results import Result, load_result
from tlcap.runtime.run_control import RunControl

__version__ = "0.1.0"

__all__ = [
    "IGConfig", "NeuronAttribution", "integrated_gradients", "TlcapError", "NeuronSet", "target_prob",
    "token_probs", "Model", "load_model", "Result", "load_result", "__version__", "ActivationIndex",
    "DirectLogitAttribution", "LogitLens", "NeuronCard", "activation_index", "direct_logit_attribution",
    "explore_neurons", "inspect_neuron", "logit_lens", "localize", "methods", "RunControl",
]
