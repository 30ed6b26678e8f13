"""Activation index (against brute force), neuron cards on a planted model, and Jupyter HTML views."""

from __future__ import annotations

import sys

import pytest
import torch

import tlcap
from tlcap.explore.activation_index import BEFORE, activation_index, build_activation_index, corpus_tokens
from tlcap.explore.card import NeuronCard, inspect_neuron
from tlcap.testing import planted_fact_model

CTX = 64


@pytest.fixture(scope="module")
def planted():
    return planted_fact_model(seed=0)


@pytest.fixture(scope="module")
def index_and_acts(planted):
    model, _ = planted
    ids = corpus_tokens(model, max_tokens=1500)
    idx = build_activation_index(model, ids, k=5, context=CTX, batch_contexts=3, progress=False)
    x = torch.tensor(ids[: len(ids) // CTX * CTX]).view(-1, CTX)
    names = [model.hook_name("mlp_post", l) for l in range(model.n_layers)]
    rec = model.record(x, names)
    return idx, torch.stack([rec[n] for n in names])  # [layer, ctx, pos, d_mlp]


def test_index_equals_a_brute_force_top_k(index_and_acts):
    idx, acts = index_and_acts
    L, C, T, D = acts.shape
    counted = acts[:, :, 1:].reshape(L, -1, D)  # position 0 of each context is context only
    v, i = counted.topk(5, dim=1)
    assert torch.allclose(idx.values, v.permute(0, 2, 1), atol=1e-5)
    flat = acts.reshape(L, C * T, D)  # the recorded position holds the recorded value (ties may order either way)
    at = flat.gather(1, idx.positions.permute(0, 2, 1)).permute(0, 2, 1)
    assert torch.equal(at, idx.values) and (idx.positions % T >= 1).all()
    assert torch.allclose(idx.mean, counted.mean(1), atol=1e-5)
    assert torch.allclose(idx.std, counted.std(1, unbiased=False), atol=1e-4)
    assert torch.allclose(idx.frac_active, (counted > 0).float().mean(1))
    assert idx.n_counted == C * (T - 1) and idx.tokens.numel() == C * T


def test_snippet_windows_are_the_neurons_activations_on_the_snippet_tokens(index_and_acts):
    idx, acts = index_and_acts
    T = idx.context
    for layer, neuron in ((0, 3), (3, 100)):
        for value, toks, win, mark in idx.snippets(layer, neuron):
            assert win[mark] == pytest.approx(value, abs=2e-3)  # windows are stored as float16
            p = int(idx.positions[layer, neuron, 0]) if value == idx.values[layer, neuron, 0] else None
            if p is not None:
                c, t = divmod(p, T)
                start = max(0, t - BEFORE)
                ref = acts[layer, c, start:start + len(win), neuron]
                assert torch.allclose(torch.tensor(win), ref, atol=2e-3)
                assert toks == idx.tokens[c * T + start:c * T + start + len(win)].tolist()


def _no_rebuild(*args, **kwargs):
    raise AssertionError("the activation index was rebuilt instead of read from the cache")


def test_activation_index_is_cached_and_reloaded(planted, tmp_path, monkeypatch):
    model, _ = planted
    assert activation_index(model, max_tokens=700, context=CTX, cache=tmp_path, build=False) is None
    built = activation_index(model, max_tokens=700, context=CTX, cache=tmp_path, progress=False)
    monkeypatch.setattr(sys.modules["tlcap.explore.activation_index"], "build_activation_index", _no_rebuild)
    again = activation_index(model, max_tokens=700, context=CTX, cache=tmp_path)
    assert again is not None and torch.equal(again.values, built.values)
    other = activation_index(model, max_tokens=650, context=CTX, cache=tmp_path, build=False)
    assert other is None  # other settings, another key


def test_card_of_a_planted_neuron(planted, tmp_path, monkeypatch):
    model, truth = planted
    layer, neuron = truth.neurons.neurons[0]
    activation_index(model, max_tokens=700, context=CTX, cache=tmp_path, progress=False)
    # a card reads the cached index
    monkeypatch.setattr(sys.modules["tlcap.explore.activation_index"], "build_activation_index", _no_rebuild)
    card = inspect_neuron(model, layer, neuron, truth.prompt, max_tokens=700, context=CTX, cache=tmp_path)
    assert card.out_top[0][0] == truth.target  # the planted neuron writes " Paris" directly
    assert card.prompt_acts[-1] > 1.0 and card.prompt_acts[:-2].abs().max() < 0.05  # fires where the subject was moved
    changed = {t: (a, b) for t, a, b in card.zero_changes}
    assert changed[truth.target][1] < changed[truth.target][0]  # zeroing it lowers P(" Paris")
    assert card.zero_kl > 0 and card.corpus == "wikitext2-test" and len(card.snippet_tokens) == card.snippet_values.numel()
    html = card._repr_html_()
    assert f"Neuron L{layer}/N{neuron}" in html and "&#x27; Paris&#x27;" in html and "Top activations over" in html
    again = tlcap.load_result(card.save(tmp_path / "card"))
    assert isinstance(again, NeuronCard) and again.summary() == card.summary()
    assert len(card.figure().data) == 3 and card.to_dict()["layer"] == layer


def test_card_without_an_index_says_how_to_build_one(planted, tmp_path):
    model, _ = planted
    card = inspect_neuron(model, 1, 7, cache=tmp_path)
    assert card.corpus == "" and card.snippet_values.numel() == 0
    assert "tlcap.activation_index(model)" in card._repr_html_()
    with pytest.raises(tlcap.errors.UnknownNameError, match="activations"):
        inspect_neuron(model, 1, 7, activations="sometimes")
    with pytest.raises(tlcap.errors.InvalidConfigError, match=r"layer \(--layer\) must be between 0 and 3"):
        inspect_neuron(model, 4, 7)


def test_html_views_of_sets_attributions_and_experiment_results(planted):
    model, truth = planted
    assert "NeuronSet: 4 neurons (0.391% of 4 × 256)" in truth.neurons._repr_html_()
    attr = tlcap.integrated_gradients(model, truth.prompt, truth.target, steps=4, progress=False)
    html = attr._repr_html_()
    assert "NeuronAttribution of &#x27;The capital of France is&#x27;" in html
    assert f"L{truth.layer}/N{attr.to_frame(top=1).neuron.iloc[0]}" in html
    from tlcap.experiments.knowledge_neurons import locate_knowledge_neurons

    kn = locate_knowledge_neurons(model, truth.prompt, truth.target, steps=4, n_random=1, progress=False)
    assert "KnowledgeNeurons" in kn._repr_html_() and "suppress_located_rel_change" in kn._repr_html_()


def test_merge_sparse_and_dense_paths_equal_a_brute_force_top_k():
    ai = sys.modules["tlcap.explore.activation_index"]  # the package's name is taken by the function
    torch.manual_seed(0)
    B, T, D, k = 3, 20, 7, 4
    batches = [torch.randn(B, T, D).bfloat16().float() for _ in range(6)]  # bfloat16 values: many ties
    valid = (torch.arange(T) >= 1).expand(B, -1)
    W = ai.BEFORE + ai.AFTER + 1
    best = torch.full((D, 0), float("-inf")), torch.zeros((D, 0), dtype=torch.long), torch.zeros((D, 0, W))
    sparse = []
    real = ai._merge_sparse
    ai._merge_sparse = lambda *a: sparse.append(1) or real(*a)
    try:
        for n, acts in enumerate(batches):
            best = ai._merge(*best, acts, torch.arange(n * B, (n + 1) * B) * T, k, valid)
    finally:
        ai._merge_sparse = real
    assert sparse  # later batches took the sparse path
    allv = torch.cat([a[:, 1:].reshape(-1, D) for a in batches])
    torch.testing.assert_close(best[0], allv.topk(k, dim=0).values.T)
    flat = torch.cat(batches).reshape(-1, D)  # each kept position holds its value, and its window is the tokens around it
    assert torch.equal(flat.gather(0, best[1].T).T, best[0])
    for d in range(D):
        for j in range(k):
            c, t = divmod(int(best[1][d, j]), T)
            win = best[2][d, j]
            assert win[ai.BEFORE] == best[0][d, j]
            lo = max(0, t - ai.BEFORE)
            torch.testing.assert_close(win[lo - t + ai.BEFORE:min(T, t + ai.AFTER + 1) - t + ai.BEFORE],
                                       torch.cat(batches)[c, lo:t + ai.AFTER + 1, d])
