"""Runtime: sites, hook factories, the hook context manager, prefix reuse, weight edits."""

from __future__ import annotations

import pytest
import torch

from tlcap.errors import PromptTooLongError, TargetTokenizationError, UnknownModelError, UnknownNameError
from tlcap.intervene import erase_neurons, suppress
from tlcap.metrics import NeuronSet, target_prob
from tlcap.models import load_model, make_tiny
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import SITES, get_site

PROMPT = "The capital of France is"


def test_hooks_removed_after_exception(tiny_gpt2):
    toks = tiny_gpt2.to_tokens(PROMPT)
    clean = tiny_gpt2.logits(toks)
    name = tiny_gpt2.hook_name("mlp_post", 0)
    with pytest.raises(RuntimeError, match="boom"):
        with tiny_gpt2.hooks(fwd=[(name, H.scale(0.0))]):
            hooked = tiny_gpt2.logits(toks)
            assert not torch.allclose(hooked, clean)
            raise RuntimeError("boom")
    assert torch.equal(tiny_gpt2.logits(toks), clean)


def test_nested_hook_contexts_keep_outer_hooks(tiny_gpt2):
    toks = tiny_gpt2.to_tokens(PROMPT)
    clean = tiny_gpt2.logits(toks)
    outer = [(tiny_gpt2.hook_name("resid_post", 1), H.scale(0.0))]
    inner = [(tiny_gpt2.hook_name("resid_post", 0), H.scale(0.5))]
    only_outer = tiny_gpt2.logits(toks, hooks=outer)
    both = tiny_gpt2.logits(toks, hooks=outer + inner)
    with tiny_gpt2.hooks(fwd=outer):
        # every call in the body sees the outer hooks, also after other calls closed their contexts
        for _ in range(3):
            assert torch.equal(tiny_gpt2.logits(toks), only_outer)
        assert torch.equal(tiny_gpt2.logits(toks, hooks=inner), both)
        with pytest.raises(RuntimeError):
            with tiny_gpt2.hooks(fwd=inner):
                raise RuntimeError("inner fails")
        assert torch.equal(tiny_gpt2.logits(toks), only_outer)
    assert torch.equal(tiny_gpt2.logits(toks), clean)


def test_hook_inside_logits_does_not_leak(tiny_gpt2):
    toks = tiny_gpt2.to_tokens(PROMPT)
    clean = tiny_gpt2.logits(toks)
    ablated = tiny_gpt2.logits(toks, hooks=[(tiny_gpt2.hook_name("resid_post", 1), H.scale(0.0))])
    assert not torch.allclose(ablated, clean)
    assert torch.equal(tiny_gpt2.logits(toks), clean)


def test_every_site_resolves_on_both_architectures(tiny_gpt2, tiny_llama):
    gemma2 = make_tiny("gemma2", seed=0)
    for model in (tiny_gpt2, tiny_llama, gemma2):
        names = set(model.backend.hook_dict)
        for site in SITES.values():
            if site.name in {"head_result", "q_input", "k_input", "v_input"}:
                continue  # need split-input / result hooks switched on
            if site.name == "attn_post_norm_scale" and not model.post_norm_blocks:
                continue  # post-norm blocks only (Gemma-2)
            assert site.hook_name(0) in names, (model.name, site.name)


def test_unknown_site_message():
    with pytest.raises(UnknownNameError) as info:
        get_site("mlp_neurons_typo")
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working
    assert str(info.value) == (
        "unknown site 'mlp_neurons_typo' (--site); choose one of: " + ", ".join(SITES)
    )


def test_record_patch_roundtrip(tiny_gpt2):
    toks = tiny_gpt2.to_tokens(PROMPT)
    name = tiny_gpt2.hook_name("resid_post", 0)
    _, cache = tiny_gpt2.run_with_cache(toks, [name])
    corrupted = [(name, H.add_noise(torch.ones(1) * 3.0, pos=[0, 1]))]
    noisy = tiny_gpt2.logits(toks, hooks=corrupted)
    # patching the clean state back after the noise restores the clean logits exactly
    restored = tiny_gpt2.logits(toks, hooks=corrupted + [(name, H.patch(cache[name]))])
    assert not torch.allclose(noisy, tiny_gpt2.logits(toks))
    assert torch.allclose(restored, tiny_gpt2.logits(toks), atol=1e-6)


def test_selector_outer_product(tiny_gpt2):
    act = torch.arange(2 * 5 * 8, dtype=torch.float).reshape(2, 5, 8)
    out = H.set_to(-1.0, pos=[1, 3], index=[0, 2, 4])(act)
    assert (out == -1).sum() == 2 * 2 * 3
    assert torch.equal(out[:, [0, 2, 4]], act[:, [0, 2, 4]])


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_prefix_cache_matches_full_forward(fixture, request):
    model = request.getfixturevalue(fixture)
    ids = torch.randint(0, 1000, (1, 9))
    full = model.logits(ids)[:, -1]
    pc = model.prefix_cache(ids[:, :-1])
    again = model.logits(ids[:, -1:].expand(3, -1), prefix=pc)[:, -1]
    assert torch.allclose(again, full.expand(3, -1), atol=1e-5)
    # the cache is reusable (not consumed by the first call)
    assert torch.allclose(model.logits(ids[:, -1:], prefix=pc)[:, -1], full, atol=1e-5)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_erase_is_reversible_and_effective(fixture, request):
    model = request.getfixturevalue(fixture)
    before = {k: v.clone() for k, v in model.backend.state_dict().items()}
    ids = torch.randint(0, 1000, (1, 6))
    clean = model.logits(ids)
    neurons = NeuronSet.from_list([(0, 1), (0, 5), (1, 7)], (model.n_layers, model.d_mlp))
    mlp_name = model.hook_name("mlp_post", 0)
    with erase_neurons(model, neurons):
        erased = model.logits(ids)
        # erasing the write weights == zeroing the activations of those neurons at all positions
        hooked = [(model.hook_name("mlp_post", l), H.scale(0.0, index=idx)) for l, idx in neurons.by_layer().items()]
    assert not torch.allclose(erased, clean)
    assert torch.allclose(erased, model.logits(ids, hooks=hooked), atol=1e-5)
    after = model.backend.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(model.logits(ids), clean)
    assert mlp_name  # site resolved


def test_weight_slices_shapes(tiny_gpt2, tiny_llama):
    for m in (tiny_gpt2, tiny_llama):
        assert m.mlp_down_matrix(0).shape == (m.d_model, m.d_mlp)
        for ws in m.mlp_in_weights(0):
            assert ws.param.shape[ws.neuron_dim] == m.d_mlp


def test_target_errors(tiny_gpt2):
    with pytest.raises(TargetTokenizationError, match="single-token"):
        tiny_gpt2.target_ids(PROMPT, " Parisian", single_token=True)
    with pytest.raises(TargetTokenizationError, match="empty"):
        tiny_gpt2.target_ids(PROMPT, "")
    with pytest.warns(UserWarning, match="leading space"):
        tiny_gpt2.target_ids(PROMPT, "Paris")
    assert len(tiny_gpt2.target_ids(PROMPT, " Parisian")) == 2


def test_prompt_too_long(tiny_gpt2):
    with pytest.raises(PromptTooLongError, match="context"):
        tiny_gpt2.to_tokens("word " * 500)


def test_unknown_model_message():
    with pytest.raises(UnknownModelError, match="registered name"):
        load_model("definitely-not-a-model")


def test_suppress_hooks_change_probability(tiny_gpt2):
    ns = NeuronSet.from_list([(1, j) for j in range(0, 256, 2)], (2, 256))
    p0 = target_prob(tiny_gpt2, PROMPT, " Paris")
    p1 = target_prob(tiny_gpt2, PROMPT, " Paris", hooks=suppress(tiny_gpt2, ns))
    assert p0 != p1
    assert target_prob(tiny_gpt2, PROMPT, " Paris") == p0
