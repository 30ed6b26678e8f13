"""Checks of options whose range depends on the model, run before the model is loaded.

Each command calls these right after building its config: :func:`spec` reads the model's shapes
from its configuration (:func:`tlcap.models.spec.model_spec`, no weights), so ``--layers 40`` on
a 30-layer model, ``--trace-k`` above the layer count or a ``--neurons`` file of another model
fail in a second, before the load and before any data is drawn or scanned. When the shapes
cannot be known without loading (a hub model not downloaded yet) the checks pass here and the
same checks run after the load, before any work.

Example:
    >>> s = spec("gpt2-tiny")
    >>> layers_fit(s, [0, 5], "layers", "--layers")
    Traceback (most recent call last):
        ...
    tlcap.errors.InvalidConfigError: layers (--layers) [5] out of range for gpt2-tiny (2 layers: 0..1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tlcap.config import check_layers_below
from tlcap.errors import DataFormatError, InvalidConfigError, ShapeMismatchError
from tlcap.models.spec import ModelSpec, model_spec


def spec(model: str) -> ModelSpec | None:
    """The shapes of ``model`` without loading it (``None``: unknown until the load)."""
    return model_spec(model)


def layers_fit(s: ModelSpec | None, layers: int | Sequence[int] | None, name: str, option: str) -> None:
    """Refuse layers the model does not have (``None``: all layers, always fine)."""
    if s is not None and layers is not None:
        check_layers_below(name, layers, s.n_layers, s.name, cli=option)


def trace_k_fits(s: ModelSpec | None, k: int) -> None:
    """``--trace-top-k`` must leave layers out: with ``k >= n_layers`` every rewrite locates every layer."""
    if s is not None and k >= s.n_layers:
        raise InvalidConfigError(
            f"trace.top_k (--trace-top-k) must be below the {s.n_layers} layers of {s.name}, got {k}: with every layer "
            "located for every rewrite the overlap is 1 by construction; use a smaller --trace-top-k (the paper: 3)")


def neuron_pairs(neurons: Any, where: str) -> list[tuple[int, int]]:
    """``[[layer, neuron], ...]`` from a summary, checked to be pairs of integers >= 0.

    Raises:
        DataFormatError: not a list of pairs of non-negative integers (names the first bad entry).
    """
    if not isinstance(neurons, list):
        raise DataFormatError(f"{where}: 'neurons' is a {type(neurons).__name__}, not a list of [layer, neuron] pairs; "
                              "pass the summary.json written by `tlcap cnl locate`")
    out = []
    for k, pair in enumerate(neurons):
        ok = (isinstance(pair, (list, tuple)) and len(pair) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair))
        if not ok:
            raise DataFormatError(f"{where}: 'neurons' entry {k} is {pair!r}, not a [layer, neuron] pair of integers >= 0; "
                                  "pass the summary.json written by `tlcap cnl locate`")
        out.append((int(pair[0]), int(pair[1])))
    return out


def neurons_fit(s: ModelSpec | None, pairs: Sequence[tuple[int, int]], where: str) -> None:
    """Refuse neurons outside the model's ``n_layers × d_mlp`` (a file located on another model)."""
    if s is None or not pairs:
        return
    top_layer = max(l for l, _ in pairs)
    top_neuron = max(i for _, i in pairs)
    if top_layer >= s.n_layers or top_neuron >= s.d_mlp:
        raise ShapeMismatchError(
            f"the neurons in {where} reach layer {top_layer} and neuron {top_neuron}, but {s.name} has {s.n_layers} layers "
            f"of {s.d_mlp} neurons; locate them on the same model (or pass --model of the locate run)")


__all__ = ["spec", "layers_fit", "trace_k_fits", "neuron_pairs", "neurons_fit"]
