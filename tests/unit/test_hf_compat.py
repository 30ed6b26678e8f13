"""The bridge's attention finds the KV cache under transformers' new argument name (tlcap.models.hf_compat).

transformers 5.24 passes a decoder layer's cache to attention as ``cache=``; TransformerLens 4.3's
attention bridge only read ``past_key_values=``, so every pass after a cached prefix ignored the
prefix (exact IG on SmolLM2 scored P(' Paris') = 3e-8 instead of 0.77). These tests hold under any
transformers release: the first calls the cache update the way 5.24 does, the second compares a
cached-prefix pass with a full pass through the installed release.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tlcap.models import hf_compat


def test_the_attention_bridge_reads_the_cache_under_its_new_name(tiny_llama):
    assert hf_compat.install() and hf_compat.install()  # idempotent
    attn = tiny_llama.backend.blocks[1].attn
    k, v = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    cache = DynamicCache()
    k2, v2 = attn._update_kv_cache(k, v, cache=cache)  # how transformers >= 5.24 hands it over
    assert cache.get_seq_length(1) == 3 and torch.equal(k2, k)
    k3, _ = attn._update_kv_cache(k, v, cache=cache)
    assert cache.get_seq_length(1) == 6 and torch.equal(k3, torch.cat([k, k], dim=2))  # the prefix is kept
    none = DynamicCache()
    attn._update_kv_cache(k, v, past_key_values=none)  # the old name still works
    assert none.get_seq_length(1) == 3


def test_a_pass_after_a_cached_prefix_equals_the_full_pass(tiny_llama):
    ids = torch.tensor([tiny_llama.encode("The capital of France is")])
    with torch.no_grad():
        full = tiny_llama.logits(ids)[0, -1]
        pc = tiny_llama.prefix_cache(ids[:, :-1])
        cached = tiny_llama.logits(ids[:, -1:], prefix=pc)[0, -1]
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)


def test_gelu_new_runs_fused_and_equals_the_formula(tiny_gpt2):
    """GPT-2's ``gelu_new`` modules are transformers' fused ``GELUTanh`` once wrapped; both equal the float64
    formula to float rounding, and the model's logits equal a pass with the original activation."""
    import math

    from transformers.activations import GELUTanh, NewGELUActivation

    mlp = tiny_gpt2.hf_model.transformer.h[0].mlp
    mlp = getattr(mlp, "_original_component", mlp)
    assert type(mlp.act) is GELUTanh
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4
    exact = 0.5 * x.double() * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x.double() + 0.044715 * x.double() ** 3)))
    assert float((mlp.act(x).double() - exact).abs().max()) < 2e-6
    ids = torch.tensor([tiny_gpt2.encode("The capital of France is")])
    acts = [getattr(b.mlp, "_original_component", b.mlp) for b in tiny_gpt2.hf_model.transformer.h]
    with torch.no_grad():
        fused = tiny_gpt2.logits(ids)
        for a in acts:
            a.act = NewGELUActivation()
        try:
            plain = tiny_gpt2.logits(ids)
        finally:
            assert hf_compat.fuse_gelu(tiny_gpt2.hf_model) == len(acts)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
