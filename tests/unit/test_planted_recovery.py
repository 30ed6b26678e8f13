"""Every localization method of tlcap against planted ground truth (tlcap.testing.planted).

On the wired model each method must find what was planted (neurons, the layer, the edges, the
capability neurons) and the statistics must call it significant and large; on the same model with
the wiring removed it must find no effect of that size. The recovery table over five seeds is in
docs/testing.md (benchmarks/planted_recovery.py).
"""

from __future__ import annotations

import pytest

import tlcap
from tlcap.attribution.methods import localize
from tlcap.experiments.cnl import cnl_locate
from tlcap.experiments.cnl.erase import erase_effect
from tlcap.experiments.knowledge_neurons import locate_knowledge_neurons
from tlcap.locate.causal_trace import causal_trace
from tlcap.locate.circuits import edge_attribution
from tlcap.locate.circuits.dataset import CircuitDataset
from tlcap.locate.circuits.neurons import neuron_attribution
from tlcap.locate.circuits.task import CircuitItem
from tlcap.locate.selection import method_select
from tlcap.locate.synapses import locate_synapses
from tlcap.metrics.permutation import located_vs_random
from tlcap.runtime.run_control import RunControl
from tlcap.testing import (
    MechanismAssertionError,
    assert_causal,
    assert_circuit_faithful,
    assert_hooks_clean,
    assert_localized,
    assert_weights_unchanged,
    planted_capability_model,
    planted_fact_model,
)


@pytest.fixture(scope="module")
def wired():
    return planted_fact_model(seed=1)


@pytest.fixture(scope="module")
def unwired():
    return planted_fact_model(seed=1, wired=False)


@pytest.fixture(scope="module")
def capability():
    model, truth = planted_capability_model(seed=1)
    return model, truth, truth.samples[::7]  # 11 prompts: 11 words, both labels, every template


def test_kn_ig_recovers_the_planted_neurons_and_they_pass_assert_causal(wired):
    model, truth = wired
    with assert_weights_unchanged(model):
        attr = tlcap.integrated_gradients(model, truth.prompt, truth.target, progress=False)
    assert_hooks_clean(model)
    assert attr.select(threshold=0.2) == truth.neurons
    assert_localized(attr, layers=[truth.layer], top_k=4, neurons=truth.neurons)
    check = assert_causal(model, truth.prompt, truth.target, truth.neurons, min_drop=0.9)
    assert check.p_value == pytest.approx(1 / 201)  # 200 random sets by default, one-sided and max(check.random_drops) < 0.01


@pytest.mark.parametrize("method", ["sig", "amig"])
def test_sig_and_amig_recover_the_planted_neurons_with_their_own_rules(wired, method):
    model, truth = wired
    attr = localize(model, truth.prompt, truth.target, method=method, steps=10)
    assert method_select(attr.scores, method) == truth.neurons


@pytest.mark.parametrize("method", ["joint", "grad_x_act"])
def test_cheap_kn_estimators_recover_the_planted_neurons(wired, method):
    model, truth = wired
    attr = tlcap.integrated_gradients(model, truth.prompt, truth.target, method=method, progress=False)
    assert attr.select(threshold=0.2) == truth.neurons


def test_kn_refined_over_paraphrases_keeps_exactly_the_planted_neurons(wired):
    model, truth = wired
    res = locate_knowledge_neurons(model, truth.prompt, truth.target, truth.paraphrases, n_random=3, progress=False)
    assert res.neurons == truth.neurons


def test_unwired_model_gives_kn_no_causal_effect(unwired):
    model, truth = unwired
    attr = tlcap.integrated_gradients(model, truth.prompt, truth.target, progress=False)
    located = attr.select(threshold=0.2)
    assert not set(located) & set(truth.neurons) or len(located) > 40  # a relative threshold on noise: many or other
    with pytest.raises(MechanismAssertionError, match=r"expected a drop of at least 50%"):
        assert_causal(model, truth.prompt, truth.target, located, min_drop=0.5)
    with pytest.raises(MechanismAssertionError, match=r"top 4 neurons hold 0 of the 4 expected"):
        assert_localized(attr, top_k=4, neurons=truth.neurons)


def test_causal_trace_peaks_at_the_planted_layer_and_finds_nothing_unwired(wired, unwired):
    model, truth = wired
    tr = causal_trace(model, truth.prompt, truth.subject, truth.target, window=1, samples=5, noise_std=1.0)
    assert tr.corrupted_prob < 1e-3 < 0.5 < tr.clean_prob
    assert tr.top_layers(1, kind="mlp", token=-1) == [truth.layer]
    mlp_last = tr.effect("mlp")[-1]
    assert mlp_last[truth.layer] > 0.9 * (tr.clean_prob - tr.corrupted_prob)
    assert mlp_last.abs().sum() - mlp_last[truth.layer].abs() < 1e-3
    resid = tr.effect("resid")
    subj = model.subject_span(truth.prompt, truth.subject).start
    assert (resid[-1, truth.head[0]:] > 0.9 * (tr.clean_prob - tr.corrupted_prob)).all()  # after the head moved it
    assert resid[subj, truth.head[0]:].abs().max() < 1e-3  # the head has already read the subject
    model_u, truth_u = unwired
    tr_u = causal_trace(model_u, truth_u.prompt, truth_u.subject, truth_u.target, window=1, samples=5, noise_std=1.0)
    assert tr_u.effect("mlp").nan_to_num().abs().max() < 1e-6


def test_eap_ig_ranks_the_planted_edges_first_and_the_circuit_is_faithful(wired):
    model, truth = wired
    scores = edge_attribution(model, truth.prompt, truth.target, corrupt_prompt=truth.corrupt_prompt, steps=5)
    assert {(u, r) for u, r, _ in scores.top_edges(4)} == set(truth.edges)
    ev = assert_circuit_faithful(model, scores.select(top_n=4), min_recovery=0.9)
    assert ev.circuit_target_rank == 1 and ev.n_edges == 4
    plain = edge_attribution(model, truth.prompt, truth.target, corrupt_prompt=truth.corrupt_prompt, steps=1)
    top5 = [(u, r) for u, r, _ in plain.top_edges(5)]
    assert set(truth.edges) <= set(top5)  # plain EAP: the planted edges within its top 5 (see docs/testing.md)


def test_eap_scores_on_the_unwired_model_are_tiny_and_its_circuit_is_not_faithful(unwired):
    model, truth = unwired
    scores = edge_attribution(model, truth.prompt, truth.target, corrupt_prompt=truth.corrupt_prompt, steps=5)
    assert abs(scores.top_edges(1)[0][2]) < 1e-2
    with pytest.raises(MechanismAssertionError, match=r"barely better than the run with every edge ablated .*"
                                                      r"nothing for a circuit to recover"):
        assert_circuit_faithful(model, scores.select(top_n=4), min_recovery=0.9)


def test_eap_neuron_nodes_rank_the_planted_neurons_first(wired):
    model, truth = wired
    ds = CircuitDataset((CircuitItem(truth.prompt, truth.target, truth.corrupt_prompt),), name="planted")
    ns = neuron_attribution(model, ds, steps=5)
    assert ns.top(4) == truth.neurons


def test_knowledge_synapses_include_the_mover_heads_subject_column(wired):
    model, truth = wired
    syn = locate_synapses(model, truth.prompt)
    layer, head = truth.head
    subj = model.subject_span(truth.prompt, truth.subject).start
    assert syn.mask[layer, head, subj]
    assert syn.col_mass[layer, head, subj] == syn.col_mass[layer, :, 1:].max()  # its largest column in that layer


def test_cnl_finds_the_capability_neurons_and_erasing_them_is_significant(capability):
    model, truth, samples = capability
    loc = cnl_locate(model, truth.task, samples, run=RunControl(progress=False))
    assert loc.neuron_set() == truth.neurons
    assert loc.split_overlap > 0.9  # halves of 6 and 5 prompts
    er = erase_effect(model, truth.task, samples, loc.neuron_set(), n_random=20)
    assert er.base_accuracy == 1.0 and er.located_accuracy <= er.majority_share and min(er.random_accuracies) == 1.0
    test = located_vs_random(er.located_accuracy, er.random_accuracies, alternative="less")
    assert test.p_value == pytest.approx(1 / 21)


def test_cnl_on_the_unwired_capability_model_erases_nothing():
    model, truth = planted_capability_model(seed=1, wired=False)
    samples = truth.samples[::7]
    loc = cnl_locate(model, truth.task, samples, run=RunControl(progress=False))
    assert not set(loc.neuron_set()) & set(truth.neurons)
    er = erase_effect(model, truth.task, samples, loc.neuron_set(), n_random=20)
    assert er.base_accuracy <= er.majority_share  # no skill: at most the majority label's share
    assert er.located_accuracy >= er.base_accuracy  # and erasing the located set costs nothing
    assert located_vs_random(er.located_accuracy, er.random_accuracies, alternative="less").p_value > 0.5
