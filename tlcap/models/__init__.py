"""Models: loading by name, the architecture adapter, random test models."""

from tlcap.models.adapter import Model, PrefixCache, WeightSlice
from tlcap.models.loading import REGISTRY, cache_dir, load_model, smollm2_float32_dir
from tlcap.models.tiny import gpt2_tokenizer, make_gpt2, make_llama

__all__ = [
    "Model", "PrefixCache", "WeightSlice", "REGISTRY", "cache_dir", "load_model",
    "smollm2_float32_dir", "gpt2_tokenizer", "make_gpt2", "make_llama",
]
