"""Tiny random-weight models of the other architecture families: GPT-J, GPT-NeoX, Qwen2, Gemma-2.

Each is a real HF architecture (the ``transformers`` class of that family) at unit-test size,
booted through TransformerBridge like :func:`tlcap.models.make_gpt2` and
:func:`tlcap.models.make_llama`, with the vendored GPT-2 BPE tokenizer. They exercise what the
GPT-2 and Llama configs do not:

=============  ==========================================================================
family         what it adds
=============  ==========================================================================
``gptj``       parallel attention/MLP blocks sharing one ``ln_1``; partial rotary; no
               attention biases (TL 4.x's GPT-J bridge has no split q/k/v inputs: the adapter
               rebuilds them for circuits, :mod:`tlcap.models.split_inputs`)
``neox``       parallel attention/MLP blocks with two norms; partial rotary; fused qkv
``qwen2``      grouped-query attention with q/k/v biases; RMSNorm; SwiGLU
``gemma2``     post-norms (attention and MLP outputs normalised before the residual add),
               attention and final-logit soft-capping, GQA, ``(1 + w)`` RMSNorm, GeGLU,
               embeddings scaled by ``sqrt(d_model)`` (circuits: a head's output is its share of
               the post-norm's output, :mod:`tlcap.locate.circuits.graph`)
=============  ==========================================================================
"""

from __future__ import annotations

from typing import Any

import torch

from tlcap.errors import UnknownModelError
from tlcap.models.adapter import Model, transformer_bridge_class
from tlcap.models.placement import Placement, dispatch
from tlcap.models.tiny import gpt2_tokenizer

VOCAB = 50257  # the vendored GPT-2 BPE


def _config(family: str) -> tuple[Any, Any]:
    """The HF config and model class of a tiny ``family`` model (2 layers, d_model 64, 4 heads)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, max_position_embeddings=128)
    if family == "gptj":
        return tf.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=128,
                             n_positions=128), tf.GPTJForCausalLM
    if family == "neox":
        return tf.GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                rotary_pct=0.25, **common), tf.GPTNeoXForCausalLM
    if family == "qwen2":
        return tf.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              intermediate_size=128, tie_word_embeddings=True, **common), tf.Qwen2ForCausalLM
    if family == "gemma2":
        return tf.Gemma2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, intermediate_size=128, sliding_window=64, attn_logit_softcapping=50.0,
                               final_logit_softcapping=30.0, **common), tf.Gemma2ForCausalLM
    raise UnknownModelError(f"unknown tiny family {family!r}; use one of {sorted(FAMILIES)}")


def tiny_config(family: str) -> Any:
    """The HF config a tiny ``family`` model is built from (its shapes without building it).

    Args:
        family: ``"gptj"``, ``"neox"``, ``"qwen2"`` or ``"gemma2"``.

    Returns:
        The transformers config object (2 layers, d_model 64, 4 heads).
    """
    return _config(family)[0]


# Family -> hub name of a real model of that family (the bridge's model name; nothing is downloaded).
FAMILIES: dict[str, str] = {
    "gptj": "EleutherAI/gpt-j-6B",
    "neox": "EleutherAI/pythia-70m",
    "qwen2": "Qwen/Qwen2-0.5B",
    "gemma2": "google/gemma-2-2b",
}


def make_tiny(
    family: str, seed: int = 0, device: str | torch.device | None = None, dtype: torch.dtype = torch.float32,
    placement: Placement | None = None,
) -> Model:
    """A tiny random-weight model of ``family`` (2 layers, d_model 64, 4 heads, d_mlp 128).

    Args:
        family: ``"gptj"``, ``"neox"``, ``"qwen2"`` or ``"gemma2"`` (the module table).
        seed: Seed of the random initialisation (same seed, same weights).
        device: Torch device.
        dtype: Parameter dtype (weights are drawn in float32, then cast).
        placement: Dispatch the blocks over devices (:mod:`tlcap.models.placement`) instead of ``device``.

    Returns:
        A :class:`Model` named ``<family>-tiny-random-seed<seed>``.

    Raises:
        UnknownModelError: ``family`` is not one of the table.

    Example:
        >>> m = make_tiny("neox")
        >>> m.parallel_attn_mlp
        True
    """
    cfg, cls = _config(family)
    tok = gpt2_tokenizer()
    torch.manual_seed(seed)
    hf = cls(cfg).eval()
    hf = dispatch(hf.to(dtype=dtype), placement, dtype) if placement is not None else hf.to(device=device, dtype=dtype)
    device = None if placement is not None else device  # a dispatched model stays where the map put it
    bridge = transformer_bridge_class().boot_transformers(
        FAMILIES[family], hf_model=hf, tokenizer=tok, device=device, dtype=dtype
    )
    return Model(bridge, tok, name=f"{family}-tiny-random-seed{seed}")


__all__ = ["FAMILIES", "make_tiny", "tiny_config"]
