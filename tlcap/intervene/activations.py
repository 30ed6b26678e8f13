"""Activation interventions on located neurons, as hook lists for ``Model.hooks`` / ``hooks=``.

Every intervention acts at the positions ``pos`` names (:mod:`tlcap.runtime.positions`); the
default ``"target"`` is every position that predicts a target token of the run being scored —
the positions the neurons were located at. :func:`tlcap.metrics.target_prob` and
:func:`~tlcap.metrics.token_probs` declare them, so for a multi-token target (teacher forcing)
the neurons are suppressed at the last prompt position *and* at each later predicting position;
a plain forward pass (no declaration) predicts one next token, at the last position. The
literal Dai et al. intervention (last position only) is ``pos="last"``.

Example:
    >>> from tlcap.metrics import target_prob
    >>> neurons = NeuronSet(((0, 250), (1, 192)), shape=(model.n_layers, model.d_mlp))   # e.g. attr.select()
    >>> p = target_prob(model, "The city of", " New York", hooks=suppress(model, neurons))
    >>> with model.hooks(suppress(model, neurons)):       # the same positions
    ...     p_with = target_prob(model, "The city of", " New York")
    >>> p_with == p, p == target_prob(model, "The city of", " New York")
    (True, False)
"""

from __future__ import annotations

from typing import Any

from jaxtyping import Float
from torch import Tensor

from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import HookList, Model
from tlcap.runtime import hooks as H
from tlcap.runtime.positions import Positions, check_positions, resolve_positions
from tlcap.runtime.sites import get_site


def scale_at(factor: float, pos: Positions, index: list[int]) -> H.HookFn:
    """Hook multiplying ``act[:, positions, index]`` by ``factor``, positions resolved when it fires.

    Args:
        factor: 0 suppresses, 2 doubles.
        pos: A position spec (see :mod:`tlcap.runtime.positions`), resolved at every call so
            ``"target"`` follows the run being scored.
        index: Neuron indices on the last axis.

    Returns:
        A hook function ``fn(activation, hook)``.
    """
    pos = check_positions(pos)

    def hook(act: Float[Tensor, " batch *dims"], hook: Any = None) -> Float[Tensor, " batch *dims"]:
        return H.scale(factor, pos=resolve_positions(pos), index=index)(act, hook)

    return hook


def scale_neurons(
    model: Model, neurons: NeuronSet, factor: float, pos: Positions = "target", site: str = "mlp_post"
) -> HookList:
    """Hooks multiplying the neurons' activations by ``factor`` at ``pos``.

    Args:
        model: The model (its sites name the hooks).
        neurons: The neurons ``(layer, index)``.
        factor: Multiplier: 0 suppresses, 2 enhances, 1 changes nothing.
        pos: ``"target"`` (default: every position predicting a target token of the scored run;
            the last position in a plain forward), ``"last"``, ``"all"``/``None``, an int, a list
            or a slice (:mod:`tlcap.runtime.positions`).
        site: Neuron site (``mlp_post`` or ``mlp_pre``).

    Returns:
        One ``(hook name, fn)`` per layer the set touches.

    Example:
        >>> neurons = NeuronSet(((0, 250), (1, 192)), shape=(model.n_layers, model.d_mlp))
        >>> hooks = scale_neurons(model, neurons, 0.5)      # halve them where the target is predicted
        >>> [name for name, fn in hooks] == [model.hook_name("mlp_post", l) for l in (0, 1)]  # one per layer
        True
    """
    s = get_site(site)
    return [(s.hook_name(l), scale_at(factor, pos, idx)) for l, idx in neurons.by_layer().items()]


def suppress(model: Model, neurons: NeuronSet, pos: Positions = "target", site: str = "mlp_post") -> HookList:
    """Set the neurons' activations to 0 (Dai et al.'s suppression) at ``pos``.

    Args:
        model: The model.
        neurons: The located neurons.
        pos: Position spec, default every position predicting a target token (see
            :func:`scale_neurons`).
        site: Neuron site.

    Returns:
        The hook list.

    Example:
        >>> from tlcap.metrics import target_prob
        >>> attr = tlcap.integrated_gradients(model, "The capital of France is", " Paris", steps=2)
        >>> neurons = attr.select(threshold=0.5)
        >>> p = target_prob(model, "The capital of France is", " Paris", hooks=suppress(model, neurons))
        >>> round(p / target_prob(model, "The capital of France is", " Paris"), 2)   # share of P(Paris) kept
        0.91
    """
    return scale_neurons(model, neurons, 0.0, pos, site)


def enhance(
    model: Model, neurons: NeuronSet, factor: float = 2.0, pos: Positions = "target", site: str = "mlp_post"
) -> HookList:
    """Multiply the neurons' activations by ``factor`` (default doubles them) at ``pos``.

    Args:
        model: The model.
        neurons: The located neurons.
        factor: Multiplier (Dai et al.: 2).
        pos: Position spec, default every position predicting a target token (see
            :func:`scale_neurons`).
        site: Neuron site.

    Returns:
        The hook list.
    """
    return scale_neurons(model, neurons, factor, pos, site)


__all__ = ["enhance", "scale_at", "scale_neurons", "suppress"]
