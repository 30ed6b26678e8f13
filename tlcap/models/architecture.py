"""Architecture facts methods check before they wire hooks: block layout and patchable attention.

:class:`tlcap.models.Model` mixes :class:`ArchitectureMixin` in. Families differ in how a block
is laid out (GPT-J/NeoX: attention and MLP read the same input; Gemma-2: post-norms) and in
whether TransformerLens computes attention itself (its hook points are then editable) or wraps
the HF module (GPT-J on TL 4.x: hooks fire after the fact).
"""

from __future__ import annotations

from typing import Any

import torch

from tlcap.errors import UnsupportedModelError
from tlcap.models.placement import materialized
from tlcap.models.split_inputs import can_emulate

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

    @property
    def emulated_split_inputs(self) -> bool:
        """Whether :meth:`edge_hooks` rebuilds the split-input / per-head hook points itself.

        True for attention TransformerLens 4.x wraps generically (GPT-J) when the block layout is
        one :mod:`tlcap.models.split_inputs` knows (a shared ``ln1`` before parallel attention and
        MLP, q/k/v/o linears): circuits then run there, while pattern edits stay refused.
        """
        return self.is_bridge and not self.attention_internals_patchable and can_emulate(self.backend)

    @property
    def grouped_reader_grads(self) -> bool:
        """Whether the q/k/v readers' input gradients can come from the projections' gradients.

        True on TransformerBridge models with an LN or RMS attention norm, per-head ``W_Q``,
        ``W_K``, ``W_V`` (kv heads for GQA) and editable attention: a head's reader gradient is
        then ``J_ln1ᵀ W_Q[h] ∂m/∂q_h`` (:mod:`tlcap.locate.circuits.reader_grads`), and the
        forward needs no per-head copies of the residual.
        """
        if not self.is_bridge or self.post_norm_blocks or not self.attention_internals_patchable:
            return False
        attn = self.backend.blocks[0].attn
        kind = getattr(self.cfg, "normalization_type", None)
        return kind in ("LN", "LNPre", "RMS", "RMSPre") and all(getattr(attn, f"W_{s}", None) is not None for s in "QKV")

    def qkv_weight(self, layer: int, which: str) -> Any:
        """``W_Q`` / ``W_K`` / ``W_V`` of ``layer`` as ``[heads, d_model, d_head]`` (kv heads for k/v), detached.

        Args:
            layer: The layer.
            which: ``"q"``, ``"k"`` or ``"v"``.

        Returns:
            The weight tensor (real values even when the layer is offloaded).
        """
        with materialized(self.backend.blocks[layer].attn) as attn:  # an offloaded layer's real weights
            return getattr(attn, f"W_{which.upper()}").detach()

    def attn_norm(self, layer: int) -> tuple[str, Any]:
        """``(kind, γ)`` of the norm before ``layer``'s attention: ``"LN"`` or ``"RMS"`` and its weight (``None`` when folded).

        Args:
            layer: The layer.

        Returns:
            The norm kind and its detached weight, or None.
        """
        kind = "RMS" if str(getattr(self.cfg, "normalization_type", "")).startswith("RMS") else "LN"
        with materialized(self.backend.blocks[layer].ln1) as ln1:
            for name, p in ln1.named_parameters():
                if name.split(".")[-1] in ("weight", "w"):
                    return kind, p.detach()
        return kind, None

    def attn_post_norm_gain(self, layer: int) -> Any:
        """γ of the RMSNorm after ``layer``'s attention on post-norm blocks: it outputs ``x / rms(x) ⊙ γ``.

        Read from the module itself (``γ = norm(1) · sqrt(1 + ε)``), so a family's weight
        convention (Gemma's ``1 + w``) needs no special case.

        Args:
            layer: The layer.

        Returns:
            The detached ``[d_model]`` gain γ.

        Raises:
            UnsupportedModelError: the blocks have no post-norm, it is not an RMSNorm, or the
                attention output has a bias (its share would not be a constant).
        """
        if not self.post_norm_blocks or not str(getattr(self.cfg, "normalization_type", "")).startswith("RMS"):
            raise UnsupportedModelError(f"{self.name} has no RMS post-norm after its attention")
        b_o = getattr(self.backend.blocks[layer].attn, "b_O", None)
        if b_o is not None and bool((b_o != 0).any()):
            raise UnsupportedModelError(f"{self.name}: the attention output of layer {layer} has a bias before its post-norm")
        norm = self.backend.blocks[layer].ln1_post
        mod = getattr(norm, "original_component", norm)
        eps = float(getattr(mod, "eps", getattr(mod, "variance_epsilon", getattr(self.cfg, "eps", 0.0))))
        with materialized(mod), torch.no_grad():
            w = next(mod.parameters())
            return (mod(torch.ones(w.shape[-1], device=w.device, dtype=w.dtype)) * (1.0 + eps) ** 0.5).detach()

    def require_patchable_attention(self, what: str) -> None:
        """Raise :class:`UnsupportedModelError` naming ``what`` unless :attr:`attention_internals_patchable`.

        Args:
            what: The feature that needs it, named in the error (e.g. ``"scaling knowledge synapses"``).
        """
        if not self.attention_internals_patchable:
            raise UnsupportedModelError(
                f"{what} needs an editable attention pattern; {self.name} ({self.architecture}) runs the HF attention "
                "module inside TransformerLens' generic AttentionBridge, which fires hook_pattern after the fact, so an "
                "edit there would silently change nothing; use a GPT-2, NeoX, Llama, Qwen2 or Gemma-2 model"
            )


__all__ = ["ArchitectureMixin"]
