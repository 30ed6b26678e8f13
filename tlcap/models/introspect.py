"""What a test needs to see of a model's state: hooks left attached, the weights by name.

Used by :mod:`tlcap.testing` (``assert_hooks_clean``, ``assert_weights_unchanged``); the
backend's modules are visited here so that nothing outside :mod:`tlcap.models` touches them.

Example:
    >>> active_hooks(model)                  # [] when every method cleaned up after itself
    []
    >>> weights = named_weights(model)       # {"transformer.h.0.attn.o.bias": tensor, ...}
    >>> len(weights), sorted(weights)[0]
    (28, 'transformer.h.0.attn.o.bias')
"""

from __future__ import annotations

from torch import Tensor

from tlcap.models.adapter import Model


def active_hooks(model: Model) -> list[str]:
    """Hook points of ``model`` that have forward or backward hooks attached.

    Only TransformerLens hook points count: the TransformerBridge wires its own capture hooks
    into some norm modules once and keeps them, which is not a leak.

    Args:
        model: The model.

    Returns:
        Hook names (one per hook point; an aliased hook point is listed once), sorted.
    """
    names: dict[int, str] = {}
    for name, hp in getattr(model.backend, "hook_dict", {}).items():
        n = len(hp._forward_hooks) + len(hp._forward_pre_hooks) + len(hp._backward_hooks)
        n += len(getattr(hp, "_backward_pre_hooks", {}))
        n += len(getattr(hp, "fwd_hooks", []) or []) + len(getattr(hp, "bwd_hooks", []) or [])
        if n and (id(hp) not in names or len(name) < len(names[id(hp)])):
            names[id(hp)] = name  # the shortest alias (blocks.0.mlp.hook_post, not ...mlp.out.hook_in)
    return sorted(names.values())


def named_weights(model: Model) -> dict[str, Tensor]:
    """Every parameter of ``model`` by name, each storage once.

    Tensors that share storage (tied embeddings; the bridge's GPT-2 ``q``/``k``/``v``, which are
    views of the fused ``qkv``) are given once, as the largest of them, so that the returned
    tensors together cover every weight exactly once.

    Args:
        model: The model.

    Returns:
        Parameter name (without ``._original_component``) → tensor, sorted by name.
    """
    best: dict[int, tuple[str, Tensor]] = {}
    for name, p in model.backend.named_parameters(remove_duplicate=False):
        key = p.untyped_storage().data_ptr()
        if key not in best or p.numel() > best[key][1].numel():
            best[key] = (name.replace("._original_component", ""), p)
    return dict(sorted(best.values(), key=lambda kv: kv[0]))


__all__ = ["active_hooks", "named_weights"]
