"""Planted ground-truth models (tlcap.testing.planted): the wiring carries what it claims, nothing else.

Each property is measured on the model, against the same model with the wiring removed
(``wired=False``: same seed, same random weights), or against matched random neuron sets.
"""

from __future__ import annotations

import time

import pytest
import torch

import tlcap
from tlcap.errors import InvalidConfigError
from tlcap.intervene import suppress
from tlcap.metrics.accuracy import task_accuracy
from tlcap.models.hand_weights import hand_weights
from tlcap.testing import planted_capability_model, planted_fact_model
from tlcap.testing.planted import CAPABILITY_TASK, FACTS, LABELS


@pytest.fixture(scope="module")
def facts():
    return planted_fact_model(seed=0, n_facts=3)


@pytest.fixture(scope="module")
def unwired():
    return planted_fact_model(seed=0, n_facts=3, wired=False)


@pytest.fixture(scope="module")
def capability():
    return planted_capability_model(seed=0)


def _p(model, fact, hooks=()):
    return tlcap.target_prob(model, fact.prompt, fact.target, hooks=hooks)


def test_truth_describes_the_wiring(facts):
    model, truth = facts
    assert [(f.subject, f.target) for f in truth.facts] == list(FACTS[:3])
    assert truth.prompt == "The capital of France is" and truth.target == " Paris"
    assert truth.corrupt_prompt == "The capital of Canada is"
    assert all(len(f.neurons) == 4 and f.neurons.layers() == [truth.layer] for f in truth.facts)
    assert len(truth.all_neurons) == 12  # distinct neurons per fact
    hl, h = truth.head
    assert truth.edges == (("input", f"a{hl}.h{h}<k>"), ("input", f"a{hl}.h{h}<v>"), (f"a{hl}.h{h}", "m2"),
                           ("m2", "logits"))
    assert (model.n_layers, model.d_mlp, model.d_model) == (4, 256, 64)


def test_suppressing_the_planted_neurons_removes_the_fact_and_random_sets_do_not(facts):
    model, truth = facts
    for fact in truth.facts:
        base = _p(model, fact)
        assert base > 0.6
        assert _p(model, fact, suppress(model, fact.neurons)) < 1e-3 * base
        rnd = [_p(model, fact, suppress(model, fact.neurons.random_like(seed=i))) for i in range(20)]
        assert max(abs(r - base) for r in rnd) < 0.01 * base


def test_each_fact_has_its_own_neurons(facts):
    model, truth = facts
    first, second = truth.facts[0], truth.facts[1]
    base = _p(model, second)
    assert _p(model, second, suppress(model, first.neurons)) == pytest.approx(base, rel=1e-3)


def test_the_mover_head_carries_the_subject_to_the_last_position(facts):
    model, truth = facts
    hl, h = truth.head
    toks = model.to_tokens(truth.prompt)
    name = model.hook_name("attn_pattern", hl)
    pattern = model.record(toks, [name])[name][0, h, -1]  # attention of the last position
    subject_pos = model.subject_span(truth.prompt, truth.subject).start
    assert pattern[subject_pos] > 0.95
    assert tlcap.target_prob(model, truth.corrupt_prompt, truth.target) < 1e-3  # an unmarked subject: no fact
    with torch.no_grad():
        saved = {k: v.clone() for k, v in vars(hand_weights(model).head(hl, h)).items()}
        hand_weights(model).head(hl, h).W_O.zero_()
        try:
            assert _p(model, truth.facts[0]) < 1e-3
        finally:
            for k, v in vars(hand_weights(model).head(hl, h)).items():
                v.copy_(saved[k])
    assert _p(model, truth.facts[0]) > 0.6


def test_planted_neurons_fire_only_for_their_subject(facts):
    model, truth = facts
    name = model.hook_name("mlp_post", truth.layer)
    for fact in truth.facts:
        acts = model.record(model.to_tokens(fact.prompt), [name])[name][0, -1]
        for other in truth.facts:
            idx = [j for _, j in other.neurons]
            if other is fact:
                assert acts[idx].min() > 1.0
            else:
                assert acts[idx].abs().max() < 0.05


def test_unwired_model_has_the_same_random_weights_and_no_fact(facts, unwired):
    model, truth = facts
    model_u, truth_u = unwired
    assert truth_u.facts == truth.facts and not truth_u.wired and truth.wired
    for fact in truth_u.facts:
        base = _p(model_u, fact)
        assert base < 1e-3
        assert _p(model_u, fact, suppress(model_u, fact.neurons)) == pytest.approx(base, rel=0.05)
    # Differences are confined to what the wiring writes: the head, the planted neurons, the marked
    # and read-out tokens' embeddings.
    hw, hw_u = hand_weights(model), hand_weights(model_u)
    rows = (hw.W_E != hw_u.W_E).any(1).nonzero().flatten().tolist()
    marked = sorted({model.encode(" " + f.subject)[0] for f in truth.facts}
                    | {model.encode(f.target)[0] for f in truth.facts})
    assert rows == marked
    mlp, mlp_u = hw.mlp(truth.layer), hw_u.mlp(truth.layer)
    changed = ((mlp.W_in != mlp_u.W_in).any(0) | (mlp.W_out != mlp_u.W_out).any(1)).nonzero().flatten().tolist()
    assert changed == sorted(j for _, j in truth.all_neurons)
    for layer in range(model.n_layers):
        if layer != truth.layer:
            assert torch.equal(hw.mlp(layer).W_in, hw_u.mlp(layer).W_in)
        for h in range(model.n_heads):
            if (layer, h) != truth.head:
                assert torch.equal(hw.head(layer, h).W_V, hw_u.head(layer, h).W_V)
    assert torch.equal(hw.W_pos, hw_u.W_pos)  # the scaffold is in both


def test_builds_are_deterministic_fast_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    t0 = time.perf_counter()
    a, ta = planted_fact_model(seed=5)
    elapsed = time.perf_counter() - t0
    assert torch.equal(torch.rand(3), expected)
    b, tb = planted_fact_model(seed=5)
    c, tc = planted_fact_model(seed=6)
    assert ta == tb and ta.neurons != tc.neurons
    sa, sb = a.backend.state_dict(), b.backend.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert elapsed < 3.0, f"a planted model took {elapsed:.2f} s to build (about 0.5 s expected)"
    assert a.name == "gpt2-planted-fact-4l-seed5" and "seed 5" in tlcap.provenance.model_identity(a)


def test_bad_layouts_and_multi_token_pieces_are_refused():
    with pytest.raises(InvalidConfigError, match="head_layer"):
        planted_fact_model(layer=1, head_layer=1)
    with pytest.raises(InvalidConfigError, match="layer"):
        planted_fact_model(n_layers=4, layer=4)
    with pytest.raises(InvalidConfigError, match="single GPT-2 tokens"):
        planted_fact_model(facts=[("Nairobiland", " Paris")])
    with pytest.raises(InvalidConfigError, match="one-token target"):
        planted_fact_model(facts=[("France", " Parisville")])


def test_capability_neurons_carry_the_whole_task(capability):
    model, truth = capability
    assert truth.task == CAPABILITY_TASK and truth.choices == LABELS and len(truth.samples) == 72
    assert len(truth.neurons) == 12 and truth.neurons.layers() == [truth.layer]
    assert task_accuracy(model, truth.task, truth.samples, progress=False).accuracy == 1.0
    erased = task_accuracy(model, truth.task, truth.samples, hooks=suppress(model, truth.neurons), progress=False)
    assert erased.accuracy <= 0.5
    some = truth.samples[::4]
    for seed in range(3):
        rnd = truth.neurons.random_like(seed=seed)
        assert task_accuracy(model, truth.task, some, hooks=suppress(model, rnd), progress=False).accuracy == 1.0


def test_every_prompt_uses_the_capability_neurons_half_of_them_per_label(capability):
    model, truth = capability
    name = model.hook_name("mlp_post", truth.layer)
    idx = [j for _, j in truth.neurons]
    firing = {}
    for s in truth.samples[:: 5]:
        acts = model.record(model.to_tokens(s.prompt), [name])[name][0, -1, idx]
        on = frozenset(i for i, a in zip(idx, acts.tolist()) if a > 0.5)
        assert len(on) >= 2
        firing.setdefault(s.answer, set()).update(on)
    assert firing[LABELS[0]].isdisjoint(firing[LABELS[1]])
    assert firing[LABELS[0]] | firing[LABELS[1]] == set(idx)


def test_unwired_capability_model_is_at_chance(capability):
    model_u, truth_u = planted_capability_model(seed=0, wired=False)
    assert truth_u.samples == capability[1].samples and truth_u.neurons == capability[1].neurons
    acc = task_accuracy(model_u, truth_u.task, truth_u.samples, progress=False)
    assert acc.accuracy == 0.5  # one label for everything: half the prompts
    assert max(tlcap.target_prob(model_u, s.prompt, s.answer) for s in truth_u.samples[:10]) < 1e-3
