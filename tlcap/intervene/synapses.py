"""Knowledge-synapse interventions (QL §3.2): scale attention-pattern columns, no renormalisation.

A knowledge synapse is a key column ``c`` of head ``h`` in layer ``l`` (see
:mod:`tlcap.locate.synapses`). Enhancing multiplies that column of the ``attn_pattern`` site by a
factor (2 in the paper), suppressing by 0; the rows are not renormalised, as in the paper.

Example (α = 0.1: the tiny random model's attention is too flat for the paper's 0.3):
    >>> from tlcap.locate.synapses import locate_synapses
    >>> from tlcap.metrics import target_prob
    >>> ks = locate_synapses(model, "The capital of France is", alpha=0.1)
    >>> with model.hooks(scale_synapses(ks.mask, 0.0)):      # suppress the synapses
    ...     p = target_prob(model, "The capital of France is", " Paris")
    >>> p < target_prob(model, "The capital of France is", " Paris")
    True
"""

from __future__ import annotations

from jaxtyping import Bool
from torch import Tensor

from tlcap.runtime import hooks as H
from tlcap.runtime.hooks import HookList
from tlcap.runtime.sites import get_site


def scale_synapses(mask: Bool[Tensor, "layer head key"], factor: float) -> HookList:
    """``attn_pattern`` hooks multiplying the masked key columns of each (layer, head) by ``factor``.

    Args:
        mask: ``[n_layers, n_heads, n_keys]``: True at the columns to scale (``n_keys`` = the
            prompt length the hooks will see).
        factor: Scale of the selected pattern entries (0 suppresses, 2 enhances).

    Returns:
        A hook list for :meth:`tlcap.models.Model.hooks` (one hook per layer with a synapse).

    Example:
        >>> from tlcap.locate.synapses import locate_synapses
        >>> ks = locate_synapses(model, "The capital of France is", alpha=0.1)
        >>> tuple(ks.mask.shape), len(scale_synapses(ks.mask, 2.0))      # [layer, head, key]; 1 hook per layer
        ((2, 4, 5), 2)
        >>> with model.hooks(scale_synapses(ks.mask, 2.0)):
        ...     logits = model.last_logits(model.to_tokens(ks.prompt))
        >>> tuple(logits.shape)
        (1, 50257)
    """
    site = get_site("attn_pattern")
    out = []
    for l in range(mask.shape[0]):
        if mask[l].any():
            out.append((site.hook_name(l), H.scale_where(mask[l][:, None, :], factor)))
    return out



__all__ = ["scale_synapses"]
