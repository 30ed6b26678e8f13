"""Mechanistic unit tests as a researcher writes them (docs/testing.md walks through this file).

With tlcap installed the fixtures come from its pytest plugin: no conftest.py, no set-up code.

    pytest examples/test_my_mechanism.py -v

1. A method must find a mechanism that is known to be there: a planted fact.
2. The same claim must *fail* on the model with the wiring removed (otherwise the test proves nothing).
3. Housekeeping claims about a method: it leaves no hooks and no changed weights behind.
4. A circuit claim: the edges EAP-IG ranks first carry the fact on their own.
5. The claim on a real model, SmolLM2-135M (skipped, with the reason, where it is not installed).
"""

import pytest

import tlcap
from tlcap.locate.circuits import edge_attribution
from tlcap.testing import (
    MechanismAssertionError,
    assert_causal,
    assert_circuit_faithful,
    assert_hooks_clean,
    assert_localized,
    assert_weights_unchanged,
    planted_fact_model,
)


def test_knowledge_neurons_find_the_planted_fact(tlcap_planted_fact):
    model, truth = tlcap_planted_fact  # "The capital of France is" -> " Paris", wired in 4 neurons of layer 2
    attr = tlcap.integrated_gradients(model, truth.prompt, truth.target)
    located = attr.select(threshold=0.2)
    assert located == truth.neurons  # on failure pytest lists the missing and the extra neurons
    assert_localized(attr, layers=[truth.layer], top_k=len(truth.neurons))
    assert_causal(model, truth.prompt, truth.target, located, min_drop=0.9)


@pytest.mark.xfail(raises=MechanismAssertionError, strict=True, reason="nothing is wired: the claim must fail")
def test_the_same_claim_fails_when_nothing_is_planted():
    model, truth = planted_fact_model(seed=0, wired=False)
    located = tlcap.integrated_gradients(model, truth.prompt, truth.target).select(threshold=0.2)
    assert_causal(model, truth.prompt, truth.target, located, min_drop=0.9)


def test_integrated_gradients_leaves_the_model_as_it_found_it(tlcap_tiny_gpt2):
    with assert_weights_unchanged(tlcap_tiny_gpt2):
        tlcap.integrated_gradients(tlcap_tiny_gpt2, "The Eiffel Tower is in the city of", " Paris", steps=5)
    assert_hooks_clean(tlcap_tiny_gpt2)


def test_the_top_edges_of_eap_ig_are_a_faithful_circuit(tlcap_planted_fact):
    model, truth = tlcap_planted_fact
    scores = edge_attribution(model, truth.prompt, truth.target, corrupt_prompt=truth.corrupt_prompt, steps=5)
    circuit = scores.select(top_n=len(truth.edges))
    assert {(upstream, reader) for upstream, reader, _ in circuit.edges} == set(truth.edges)
    assert_circuit_faithful(model, circuit, min_recovery=0.9)


def test_paris_neurons_of_smollm2_are_causal(tlcap_smollm2):
    prompt, target = "The capital of France is", " Paris"
    located = tlcap.integrated_gradients(tlcap_smollm2, prompt, target).select(threshold=0.2)
    check = assert_causal(tlcap_smollm2, prompt, target, located, min_drop=0.5)
    assert check.drop > max(check.random_drops)
