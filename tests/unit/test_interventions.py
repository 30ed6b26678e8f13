"""Activation interventions act at every position that predicts a target token (issue 10, item 1)."""

from __future__ import annotations

import pytest
import torch

from tlcap.experiments.knowledge_neurons import locate_knowledge_neurons
from tlcap.intervene import enhance, scale_neurons, suppress
from tlcap.metrics import NeuronSet, target_prob, token_probs
from tlcap.runtime import hooks as H
from tlcap.runtime.positions import predicting, prediction_positions, resolve_positions
from tlcap.runtime.sites import get_site

PROMPT, TARGET = "The largest city of the United States is", " New York"


def _explicit(model, neurons, factor, positions):
    """The intervention written out by hand: scale the neurons at the given positions."""
    s = get_site("mlp_post")
    return [(s.hook_name(l), H.scale(factor, pos=list(positions), index=idx)) for l, idx in neurons.by_layer().items()]


def test_suppressing_every_neuron_changes_the_first_target_token(tiny_gpt2):
    m = tiny_gpt2
    n_prompt = len(m.encode(PROMPT))
    assert m.to_str_tokens(m.target_ids(PROMPT, TARGET)) == [" New", " York"]
    every = NeuronSet.from_mask(torch.ones(m.n_layers, m.d_mlp, dtype=torch.bool))
    clean = token_probs(m, PROMPT, TARGET)
    sup = token_probs(m, PROMPT, TARGET, hooks=suppress(m, every))
    # before the fix the first token's probability stayed bit-identical (only the last position was hit)
    assert sup[0] != clean[0] and sup[1] != clean[1]
    by_hand = token_probs(m, PROMPT, TARGET, hooks=_explicit(m, every, 0.0, [n_prompt - 1, n_prompt]))
    assert torch.equal(sup, by_hand)
    with m.hooks(suppress(m, every)):  # hooks applied around the metric: the same positions
        assert torch.equal(token_probs(m, PROMPT, TARGET), sup)
    # the literal last-position intervention stays available and misses the first token
    last = token_probs(m, PROMPT, TARGET, hooks=suppress(m, every, pos="last"))
    assert last[0] == clean[0] and last[1] != clean[1]
    # factor 1 changes nothing
    assert torch.equal(token_probs(m, PROMPT, TARGET, hooks=scale_neurons(m, every, 1.0)), clean)


def test_single_token_target_and_plain_runs_use_the_last_position(tiny_gpt2):
    m = tiny_gpt2
    ns = NeuronSet.from_list([(0, 3), (1, 7), (1, 100)], (m.n_layers, m.d_mlp))
    a = target_prob(m, "The capital of France is", " Paris", hooks=enhance(m, ns))
    b = target_prob(m, "The capital of France is", " Paris", hooks=enhance(m, ns, pos="last"))
    assert a == b
    assert resolve_positions("target") == -1  # nothing declared: a next-token prediction
    with predicting(prediction_positions(6, 3)):
        assert resolve_positions("target") == slice(5, 8)
        with predicting([2, 4]):
            assert resolve_positions("target") == [2, 4]
        assert resolve_positions("target") == slice(5, 8)
    assert resolve_positions("target") == -1


def test_kn_effects_and_random_controls_act_at_every_predicting_position(tiny_gpt2):
    m = tiny_gpt2
    n_prompt = len(m.encode(PROMPT))
    res = locate_knowledge_neurons(m, PROMPT, TARGET, steps=2, n_random=2, seed=5, progress=False)
    assert len(res.neurons) > 0
    base = target_prob(m, PROMPT, TARGET)
    where = [n_prompt - 1, n_prompt]

    def rel(hooks):
        return (target_prob(m, PROMPT, TARGET, hooks=hooks) - base) / base

    assert res.effects["suppress_located"] == pytest.approx(rel(_explicit(m, res.neurons, 0.0, where)), rel=1e-6)
    assert res.effects["enhance_located"] == pytest.approx(rel(_explicit(m, res.neurons, 2.0, where)), rel=1e-6)
    for k, draw in enumerate(res.effects["suppress_random_draws"]):
        assert draw == pytest.approx(rel(_explicit(m, res.neurons.random_like(seed=5 + k), 0.0, where)), rel=1e-6)
    assert res.effects["suppress_located"] != pytest.approx(rel(_explicit(m, res.neurons, 0.0, [-1])), rel=1e-6)
