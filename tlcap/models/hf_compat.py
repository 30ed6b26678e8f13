"""Keeping the TransformerLens 4.x bridge right under newer transformers releases.

transformers 5.24 renamed the key/value cache argument of every decoder layer and attention
module from ``past_key_values`` to ``cache`` (the old name is still taken by the models' entry
points, deprecated until 5.40). TransformerLens 4.3's attention bridge re-implements attention
and looks for the cache under ``past_key_values`` (or ``layer_past``) only, so under 5.24 every
forward pass that continues a cached prefix silently dropped the prefix: each position attended
to the new tokens alone. Full passes were unaffected. Measured on SmolLM2 (``P(' Paris' | 'The
capital of France is')``): 0.7725 without a cache under both releases, 0.7725 after a cached
prefix under 5.23, 3.0e-8 under 5.24 — so exact IG (which reuses the prefix) scored another
computation in float32 and bfloat16 alike, and the two agreed on only 9 of their top-20 neurons.

:func:`install` makes the bridge's cache update read ``cache`` as well (idempotent, a no-op where
the bridge already does, or on TL 3.9), and silences the deprecation warning the bridge's own
``past_key_values`` argument raises under 5.24 (nothing a tlcap user can act on). The adapter
calls it whenever it wraps a bridge; ``tests/unit/test_adapter.py`` pins it.

:func:`fuse_gelu` swaps transformers' ``NewGELUActivation`` (GPT-2, GPT-J: ``gelu_new``, seven elementwise
kernels forward and more backward) for its own ``GELUTanh`` (``gelu_pytorch_tanh``: torch's fused
``gelu(x, approximate="tanh")``, the same formula). Measured on a 2-core CPU over the MLP rows of one
GPT-2-small knowledge-neuron attribution (20 steps, 12 layers): 28.7 ms forward + backward vs 13.4 ms; both
are as close to the float64 function (max error 5.9e-7 on 1,000 × 3,072 normal inputs). Results change at
float rounding only (``docs/deviations.md``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

_MARK = "_tlcap_cache_compat"


def _attention_bridge_class() -> Any:
    try:
        from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    except ImportError:  # TL 3.9 or a layout without it: nothing to adapt
        return None
    return AttentionBridge


def install() -> bool:
    """Let the bridge's attention find the KV cache under transformers' new ``cache`` name; returns whether it did.

    Returns:
        True when the patch is in place (idempotent), False when the bridge has no ``_update_kv_cache``.
    """
    cls = _attention_bridge_class()
    update = getattr(cls, "_update_kv_cache", None) if cls is not None else None
    if update is None:
        return False
    if not getattr(update, _MARK, False):

        @functools.wraps(update)
        def update_kv_cache(self: Any, k: Any, v: Any, **kwargs: Any) -> Any:
            if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
                kwargs["past_key_values"] = kwargs["cache"]  # transformers >= 5.24 passes the cache as `cache`
            return update(self, k, v, **kwargs)

        setattr(update_kv_cache, _MARK, True)
        cls._update_kv_cache = update_kv_cache
        warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
    return True


def fuse_gelu(hf_model: Any) -> int:
    """Replace every ``NewGELUActivation`` module of ``hf_model`` by the fused ``GELUTanh`` (module docstring).

    Args:
        hf_model: A transformers model (the bridge's ``original_model``).

    Returns:
        How many activation modules were replaced (0 where there are none, or on transformers without them).
    """
    try:
        from transformers.activations import GELUTanh, NewGELUActivation
    except ImportError:
        return 0
    n = 0
    for module in hf_model.modules():
        for name, child in list(module.named_children()):
            if type(child) is NewGELUActivation:
                setattr(module, name, GELUTanh())
                n += 1
    return n


__all__ = ["fuse_gelu", "install"]
