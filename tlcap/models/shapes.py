"""Random-weight models of real architectures' exact shapes, for timing and memory runs.

``load_model("smollm2-135m-shape")`` and ``load_model("llama-7b-shape")`` build a Llama with the
real model's config (layers, widths, heads, GQA, vocabulary) and random weights, directly on the
target device and in the target dtype (a 7B model is never materialised in float32 on the CPU).
Fixed-step methods (exact IG, causal tracing, EAP) cost the same on random weights as on the
real ones, so these give real timings without the checkpoint; their scores mean nothing.

The tokenizer is SmolLM2's when its files are in the tlcap cache (``$TLCAP_CACHE``), else the
vendored GPT-2 BPE; the vocabulary is widened to the tokenizer's when that is larger.
"""

from __future__ import annotations

from typing import Any

import torch

from tlcap.errors import UnknownModelError
from tlcap.models.adapter import Model, transformer_bridge_class
from tlcap.models.paths import cache_dir
from tlcap.models.placement import Placement, dispatch
from tlcap.models.tiny import gpt2_tokenizer

# The real configs (SmolLM2-135M-Instruct, Llama-2-7b-hf, Meta-Llama-3-8B, Llama-3.2-1B config.json).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m-shape": dict(
        boot_name="HuggingFaceTB/SmolLM2-135M-Instruct", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
    ),
    "llama-7b-shape": dict(
        boot_name="meta-llama/Llama-2-7b-hf", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, head_dim=128, max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    ),
    "llama3-8b-shape": dict(  # Meta-Llama-3-8B config.json: GQA 32/8, the full 128,256-token vocabulary
        boot_name="meta-llama/Meta-Llama-3-8B", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
    ),
    "llama-1b-shape": dict(  # Llama-3.2-1B (GQA 32/8), vocabulary cut to the tokenizer's
        boot_name="meta-llama/Llama-3.2-1B", vocab_size=32000, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
    ),
}


def shape_tokenizer() -> Any | None:
    """SmolLM2's tokenizer when its files are cached, else the vendored GPT-2 BPE (or ``None``)."""
    from transformers import AutoTokenizer

    d = cache_dir() / "smollm2-135m-f32"
    if (d / "tokenizer.json").exists():
        try:
            return AutoTokenizer.from_pretrained(d)
        except (OSError, ValueError):
            pass
    return gpt2_tokenizer()


def make_shape(name: str, seed: int = 0, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
               n_layers: int | None = None, placement: Placement | None = None) -> Model:
    """A random-weight Llama of a real model's shape (see :data:`SHAPES`).

    Args:
        name: A key of :data:`SHAPES` (``"smollm2-135m-shape"``, ``"llama-7b-shape"``, ``"llama3-8b-shape"``,
            ``"llama-1b-shape"``).
        seed: Seed of the random initialisation.
        device: Where the weights are created (default CPU).
        dtype: Parameter dtype.
        n_layers: Keep only this many layers (a cheaper slice of the same widths); default all.
        placement: Dispatch the blocks over devices (:mod:`tlcap.models.placement`); the weights are
            drawn on the CPU first (in ``dtype``), then moved.

    Returns:
        A :class:`Model` named ``<name>-random-seed<seed>``.

    Example:
        >>> from tlcap.models import load_model     # "llama-7b-shape" with device="cuda" for a 7B timing run
        >>> m = load_model("smollm2-135m-shape", dtype="bfloat16", n_layers=1)
        >>> m.name, m.n_layers, m.d_mlp, m.n_heads, m.n_kv_heads, next(m.backend.parameters()).dtype
        ('smollm2-135m-shape-random-seed0', 1, 1536, 9, 3, torch.bfloat16)
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if name not in SHAPES:
        raise UnknownModelError(f"unknown shape {name!r}; choose one of: {', '.join(SHAPES)}")
    spec = dict(SHAPES[name])
    boot_name = spec.pop("boot_name")
    rope_theta = spec.pop("rope_theta")
    tok = shape_tokenizer()
    if tok is not None:
        spec["vocab_size"] = max(spec["vocab_size"], len(tok))
    if n_layers is not None:
        spec["num_hidden_layers"] = int(n_layers)
    cfg = LlamaConfig(**spec, rope_parameters={"rope_theta": rope_theta, "rope_type": "default"})
    dev = torch.device(device) if device is not None and placement is None else torch.device("cpu")
    torch.manual_seed(seed)
    with torch.device(dev):
        hf = LlamaForCausalLM._from_config(cfg, dtype=dtype).eval()
    if placement is not None:
        hf = dispatch(hf, placement, dtype)
    bridge = transformer_bridge_class().boot_transformers(boot_name, hf_model=hf, tokenizer=tok,
                                                          device=None if placement is not None else dev, dtype=dtype)
    return Model(bridge, tok, name=f"{name}-random-seed{seed}")
