"""Activation interventions on located neurons, as hook lists for ``Model.hooks``.

Example:
    >>> with model.hooks(suppress(model, neurons)):
    ...     p = target_prob(model, prompt, target)
"""

from __future__ import annotations

from typing import Any

from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import HookList, Model
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site


def scale_neurons(model: Model, neurons: NeuronSet, factor: float, pos: Any = "last", site: str = "mlp_post") -> HookList:
    """Hooks multiplying the neurons' activations by ``factor`` at ``pos`` ("last" or None = all)."""
    s = get_site(site)
    return [(s.hook_name(l), H.scale(factor, pos=pos, index=idx)) for l, idx in neurons.by_layer().items()]


def suppress(model: Model, neurons: NeuronSet, pos: Any = "last", site: str = "mlp_post") -> HookList:
    """Set the neurons' activations to 0 (Dai et al.'s suppression)."""
    return scale_neurons(model, neurons, 0.0, pos, site)


def enhance(model: Model, neurons: NeuronSet, factor: float = 2.0, pos: Any = "last", site: str = "mlp_post") -> HookList:
    """Multiply the neurons' activations by ``factor`` (default doubles them)."""
    return scale_neurons(model, neurons, factor, pos, site)
