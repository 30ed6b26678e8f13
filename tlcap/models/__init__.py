"""Models: loading by name, the architecture adapter, random test models."""

from tlcap.models.adapter import HookList, Model, transformer_bridge_class
from tlcap.models.cache import PrefixCache
from tlcap.models.families import FAMILIES, make_tiny
from tlcap.models.loading import REGISTRY, cache_dir, load_model, smollm2_float32_dir
from tlcap.models.params import ParameterGroups, ParamGroup, ParamPart
from tlcap.models.tiny import gpt2_tokenizer, make_gpt2, make_llama
from tlcap.models.tokens import SubjectSpan, TokenBatch
from tlcap.models.weights import WeightSlice

__all__ = [
    "HookList", "Model", "PrefixCache", "ParameterGroups", "ParamGroup", "ParamPart", "SubjectSpan", "TokenBatch",
    "WeightSlice", "REGISTRY", "cache_dir", "load_model", "smollm2_float32_dir", "gpt2_tokenizer", "make_gpt2",
    "make_llama", "make_tiny", "FAMILIES", "transformer_bridge_class",
]
