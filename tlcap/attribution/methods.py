"""One interface over the three knowledge-localization methods of the QL paper.

=========  ===========================================  ==================================
method     what                                         baseline of the neurons
=========  ===========================================  ==================================
``ig``     Dai et al. 2022 integrated gradients         zero
``sig``    Enguehard 2023 sequential IG (per word)      prompt with word i masked, per i
``amig``   Chen et al. 2024 architecture-adapted IG     all-<eos> sentence, normalised
=========  ===========================================  ==================================

All three run on the batched runtime of :func:`tlcap.attribution.integrated_gradients` and
return a :class:`NeuronAttribution`; select knowledge neurons with ``.select(threshold)``
(``score > t · max``, scale-free so normalisation does not change the selection).

Example:
    >>> attr = localize(model, "The capital of France is", " Paris", method="amig", steps=10)
    >>> kns = attr.select(0.2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from tlcap.attribution.amig import amig
from tlcap.attribution.ig import NeuronAttribution, integrated_gradients
from tlcap.attribution.sig import sig
from tlcap.models.adapter import Model

LocalizeMethod = Literal["ig", "sig", "amig"]
METHODS: tuple[str, ...] = ("ig", "sig", "amig")


def localize(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    method: str = "ig",  # one of LocalizeMethod; validated below with a clear error
    *,
    steps: int = 20,
    layers: Sequence[int] | None = None,
    rule: str = "midpoint",
    batch_rows: int = 256,
    progress: bool = False,
) -> NeuronAttribution:
    """Attribute every MLP neuron for ``prompt → target`` with ``method`` (``ig``, ``sig``, ``amig``).

    Args:
        model: The model.
        prompt: The query.
        target: The answer (``" Paris"``) or its token ids.
        method: ``"ig"`` (Dai), ``"sig"`` (Enguehard) or ``"amig"`` (Chen et al.).
        steps: Riemann steps per layer (per word for SIG).
        layers: Layers to attribute (default all).
        rule: Quadrature rule.
        batch_rows: Rows per forward pass.
        progress: Progress bar.

    Raises:
        ValueError: unknown method.
    """
    kw = dict(layers=layers, steps=steps, rule=rule, batch_rows=batch_rows, progress=progress)
    if method == "ig":
        return integrated_gradients(model, prompt, target, **kw)  # type: ignore[arg-type]
    if method == "sig":
        return sig(model, prompt, target, **kw)  # type: ignore[arg-type]
    if method == "amig":
        return amig(model, prompt, target, **kw)  # type: ignore[arg-type]
    raise ValueError(f"unknown localization method {method!r}; use one of {', '.join(METHODS)}")
