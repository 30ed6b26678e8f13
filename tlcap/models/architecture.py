"""Architecture facts methods check before they wire hooks: block layout and patchable attention.

:class:`tlcap.models.Model` mixes :class:`ArchitectureMixin` in. Families differ in how a block
is laid out (GPT-J/NeoX: attention and MLP read the same input; Gemma-2: post-norms) and in
whether TransformerLens computes attention itself (its hook points are then editable) or wraps
the HF module (GPT-J on TL 4.x: hooks fire after the fact).
"""

from __future__ import annotations

from typing import Any

from tlcap.errors import UnsupportedModelError

# TransformerBridge attention classes that compute the pattern themselves (hook edits reach the output).
_OWN_ATTENTION = frozenset({"JointQKVAttentionBridge", "PositionEmbeddingsAttentionBridge"})


class ArchitectureMixin:
    """Block-layout facts of :class:`tlcap.models.Model` (see the class for attributes)."""

    backend: Any
    cfg: Any
    is_bridge: bool
    name: str
    architecture: str

    @property
    def parallel_attn_mlp(self) -> bool:
        """Whether attention and MLP read the same block input (GPT-J, NeoX) instead of in sequence."""
        return bool(getattr(self.cfg, "parallel_attn_mlp", False))

    @property
    def post_norm_blocks(self) -> bool:
        """Whether each block normalises its attention and MLP outputs before the residual add (Gemma-2)."""
        if bool(getattr(self.cfg, "use_normalization_before_and_after", False)):
            return True
        blocks = getattr(self.backend, "blocks", None)
        return bool(blocks) and hasattr(blocks[0], "ln1_post")

    @property
    def attention_internals_patchable(self) -> bool:
        """Whether the attention's internal hook points (``attn_pattern``, split q/k/v inputs) can be patched.

        TL 3.9 ``HookedTransformer`` and the bridge's own attention implementations
        (``JointQKVAttentionBridge``, ``PositionEmbeddingsAttentionBridge``: GPT-2, NeoX, Llama,
        Qwen2, Gemma-2) compute attention through these hooks. The generic ``AttentionBridge``
        (GPT-J on TL 4.x) runs the HF module and fires ``hook_pattern`` after the fact: an edit
        there does not reach the output, and there are no split q/k/v inputs.
        """
        if not self.is_bridge:
            return True
        attn = self.backend.blocks[0].attn
        own = {c.__name__ for c in type(attn).__mro__} & _OWN_ATTENTION
        return bool(own) or bool(getattr(getattr(attn, "original_component", None), "accepts_pattern_fn", False))

    def require_patchable_attention(self, what: str) -> None:
        """Raise :class:`UnsupportedModelError` naming ``what`` unless :attr:`attention_internals_patchable`."""
        if not self.attention_internals_patchable:
            raise UnsupportedModelError(
                f"{what} needs an editable attention pattern; {self.name} ({self.architecture}) runs the HF attention "
                "module inside TransformerLens' generic AttentionBridge, which fires hook_pattern after the fact, so an "
                "edit there would silently change nothing; use a GPT-2, NeoX, Llama, Qwen2 or Gemma-2 model"
            )


__all__ = ["ArchitectureMixin"]
