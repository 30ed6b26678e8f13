"""Logit lens and direct logit attribution: exact against the model's own forward pass and hooks."""

from __future__ import annotations

import warnings

import pytest
import torch

import tlcap
from tlcap.explore.dla import direct_logit_attribution
from tlcap.explore.logit_lens import LogitLens, logit_lens
from tlcap.models import make_llama, make_tiny
from tlcap.models.introspect import named_weights
from tlcap.testing import planted_fact_model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def planted():
    return planted_fact_model(seed=0)


@pytest.fixture(scope="module", params=["llama", "gemma2"])
def rms_model(request):
    return make_llama(seed=0) if request.param == "llama" else make_tiny("gemma2", seed=0)


def _direct_effect_by_patching(model, prompt, tid, write):
    """Target logit minus the target logit with ``write`` removed from the final residual at the last
    position and the final norm's scale held at its clean value (the model's own norm, via its hooks)."""
    toks = model.to_tokens(prompt)
    scale = model.record(toks, ["ln_final.hook_scale"])["ln_final.hook_scale"]

    def remove(x, hook):
        x = x.clone()
        x[:, -1] -= write.to(x.dtype)
        return x

    hooks = [("ln_final.hook_in", remove), ("ln_final.hook_scale", lambda s, hook: scale)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bridge notes that it rebuilds the norm from the hooked scale
        patched = model.logits(toks, hooks=hooks)[0, -1, tid]
    return float(model.logits(toks)[0, -1, tid] - patched)


def test_last_layer_of_the_lens_is_the_model_output(planted, rms_model):
    for model in (planted[0], rms_model):
        lens = logit_lens(model, PROMPT)
        logits = model.logits(model.to_tokens(PROMPT))[0].float()
        assert lens.target_id == int(logits[-1].argmax())  # no target: the model's prediction
        assert torch.allclose(lens.logits[-1], logits[:, lens.target_id], atol=1e-4)
        assert torch.equal(lens.top_ids[-1], logits.argmax(-1))
        assert torch.allclose(lens.probs[-1], logits.softmax(-1)[:, lens.target_id], atol=1e-5)


def test_lens_rows_are_the_final_layernorm_of_each_residual_state(planted):
    model, truth = planted
    lens = logit_lens(model, truth.prompt, truth.target)
    toks = model.to_tokens(truth.prompt)
    w = named_weights(model)
    resid = model.record(toks, ["blocks.1.hook_resid_post"])["blocks.1.hook_resid_post"][0]
    normed = torch.nn.functional.layer_norm(resid, (model.d_model,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"])
    logits = normed @ w["transformer.wte.weight"].T  # GPT-2 ties the unembedding to the embedding
    assert torch.allclose(lens.logits[2], logits[:, lens.target_id], atol=1e-4)  # row 2: after layer 1
    ranks = (logits > logits[:, lens.target_id, None]).sum(-1) + 1
    assert torch.equal(lens.ranks[2], ranks)


def test_lens_shows_the_planted_fact_appear_at_the_planted_layer(planted, tmp_path):
    model, truth = planted
    lens = logit_lens(model, truth.prompt, truth.target)
    assert lens.first_layer(top=1) == truth.layer
    last = lens.probs[:, -1]  # rows: embed, layer 0, 1, 2, 3
    assert (last[: truth.layer + 1] < 1e-3).all() and (last[truth.layer + 1:] > 0.7).all()
    again = LogitLens.load(lens.save(tmp_path / "lens"))
    assert torch.equal(again.probs, lens.probs) and again.top_tokens == lens.top_tokens
    fig = lens.figure("rank")
    assert fig.data[0].z.shape == (model.n_layers + 1, len(lens.tokens))


def test_dla_of_each_neuron_and_of_the_set_equal_the_patched_direct_effect(planted):
    model, truth = planted
    dla = direct_logit_attribution(model, truth.prompt, truth.target, truth.neurons)
    toks = model.to_tokens(truth.prompt)
    acts = {l: model.record(toks, [model.hook_name("mlp_post", l)])[model.hook_name("mlp_post", l)][0, -1]
            for l in truth.neurons.layers()}
    total = torch.zeros(model.d_model)
    for (l, j), c in zip(dla.neurons, dla.contributions):
        write = acts[l][j] * model.mlp_down_matrix(l)[:, j]
        total += write
        assert float(c) == pytest.approx(_direct_effect_by_patching(model, truth.prompt, dla.target_id, write), abs=2e-4)
    assert dla.direct_effect == pytest.approx(float(dla.contributions.sum()), abs=1e-6)
    assert dla.direct_effect == pytest.approx(_direct_effect_by_patching(model, truth.prompt, dla.target_id, total),
                                              abs=5e-4)
    assert dla.direct_effect > 0.9 * dla.target_logit  # the planted neurons write the answer directly
    assert dla.promoted[0][0] == truth.target


def test_dla_sums_to_the_direct_effect_under_rmsnorm(rms_model):
    model = rms_model
    attr = tlcap.integrated_gradients(model, PROMPT, " Paris", steps=2, progress=False)
    neurons = attr.select(threshold=0.3)
    dla = direct_logit_attribution(model, PROMPT, " Paris", neurons)
    acts = {l: model.record(model.to_tokens(PROMPT), [model.hook_name("mlp_post", l)])[model.hook_name("mlp_post", l)][0, -1]
            for l in neurons.layers()}
    total = sum(acts[l][j] * model.mlp_down_matrix(l)[:, j] for l, j in dla.neurons)
    ref = _direct_effect_by_patching(model, PROMPT, dla.target_id, total)
    assert dla.direct_effect == pytest.approx(ref, rel=1e-3, abs=1e-5)


def test_html_reprs_name_what_they_show(planted):
    model, truth = planted
    lens_html = logit_lens(model, truth.prompt, truth.target)._repr_html_()
    assert "LogitLens of &#x27;The capital of France is&#x27;" in lens_html and "first layer ranked 1st" in lens_html
    dla_html = direct_logit_attribution(model, truth.prompt, truth.target, truth.neurons)._repr_html_()
    assert "direct effect of the set" in dla_html and "L2/N" in dla_html
