"""QL localization's clean runs and baselines over many queries (issue 25, item 1): on an accelerator AMIG's clean
runs and ``<eos>`` baselines and SIG's masked rows of many queries share passes, and the reproduce cost model counts
the passes each path makes."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from tlcap.attribution.amig import amig_facts, eos_baselines, word_attributions_facts
from tlcap.attribution.config import IGConfig
from tlcap.attribution.ig import integrated_gradients_facts
from tlcap.attribution.sig import mask_token_id, masked_baselines, masked_baselines_many, sig_facts
from tlcap.data.pararel import Fact
from tlcap.experiments.ql.facts import localize_facts
from tlcap.models import make_tiny
from tlcap.reproduce.ql_stages import localize_passes, sig_clean_runs
from tlcap.runtime import device

pytestmark = pytest.mark.usefixtures("one_thread")

# unequal lengths (one of a single token), a multi-token target: several teacher-forced contexts per fact
FACTS = [("The capital of France is", " Paris"), ("Hi", " there you go"), ("One two three four five six", " seven")]


def _model(request, name):
    return request.getfixturevalue(f"tiny_{name}") if name in ("gpt2", "llama") else make_tiny(name, seed=0)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def _no_grad_passes(model, run, policy=None):
    """``(run(), the forward passes it made without gradients)``, the batching policy forced when given."""
    n = []
    handle = model.backend.register_forward_pre_hook(lambda mod, args: n.append(torch.is_grad_enabled()))
    try:
        if policy is None:
            return run(), n.count(False)
        with mock.patch.object(device, "one_pass_default", lambda m: policy):
            return run(), n.count(False)
    finally:
        handle.remove()


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "gemma2"])
def test_eos_baseline_is_the_same_at_every_sentence_length(request, name):
    """Position ``i`` of an all-``<eos>`` sentence sees only ``<eos>`` tokens (causal attention, a sliding window
    too), so eq. 16's ``b_i`` read from one long sentence equals the sentence of each length's own."""
    m = _model(request, name)
    long = eos_baselines(m, 9)
    for n in (1, 2, 5, 9):
        torch.testing.assert_close(long[:n], eos_baselines(m, n), rtol=1e-5, atol=1e-6)
    if name == "gpt2":  # learned positions: the positions differ, so the check compares different values (a
        assert _rel(long[0], long[8]) > 1e-3  # rotary model's all-<eos> sentence is the same at every position)


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "gemma2"])
def test_amig_clean_runs_and_baselines_of_many_facts_take_two_passes(request, name):
    """``word_attributions_facts(one_pass=True)`` (an accelerator's path): the facts' clean runs as one right-padded
    pass and every baseline from one sentence; equal to a pass pair per fact (the CPU path) to float rounding."""
    m = _model(request, name)
    cfg = IGConfig(steps=2, batch_rows=16)
    alone, n_alone = _no_grad_passes(m, lambda: word_attributions_facts(m, FACTS, config=cfg, one_pass=False))
    one, n_one = _no_grad_passes(m, lambda: word_attributions_facts(m, FACTS, config=cfg, one_pass=True))
    assert (n_alone, n_one) == (2 * len(FACTS), 2)
    for (a, pb, pc), (b, qb, qc) in zip(alone, one):
        assert a.shape == b.shape and _rel(b, a) < 2e-5
        torch.testing.assert_close(qb, pb, rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(qc, pc, rtol=1e-5, atol=1e-8)
        assert float(a.abs().max()) > 0


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_sig_masked_rows_of_many_prompts_share_passes(request, name):
    """``masked_baselines_many``: every prompt's masked rows in right-padded passes of ``rows`` rows, each read at
    its own last token, equal each prompt's own batch; passes of 4 rows split the prompts' rows."""
    m = _model(request, name)
    ids = [m.encode(p) for p, _ in FACTS]
    mid = mask_token_id(m)
    n_rows = sum(len(p) for p in ids)
    assert n_rows > 8
    many, n = _no_grad_passes(m, lambda: masked_baselines_many(m, ids, mid, rows=4))
    assert n == -(-n_rows // 4) and [b.shape[0] for b in many] == [len(p) for p in ids]
    for p, b in zip(ids, many):
        torch.testing.assert_close(b, masked_baselines(m, p, mid), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b, _masked_reference(m, p, mid), rtol=1e-5, atol=1e-6)
    assert _rel(many[0][0], many[0][-1]) > 1e-3  # masking another word changes the last position


def _masked_reference(m, ids, mid):
    """Eq. 12's baselines the slow way: each masked prompt alone, its last position's MLP neurons."""
    names = [m.hook_name("mlp_post", layer) for layer in range(m.n_layers)]
    out = []
    for i in range(len(ids)):
        row = list(ids)
        row[i] = mid
        out.append(m.last_position_activations(torch.tensor([row]), names)[0][0].float())
    return torch.stack(out)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_sig_and_amig_facts_on_the_accelerator_path_equal_the_cpu_path(request, name):
    """The whole SIG / AMIG (both ``words``) over a fact list, with the accelerator's batching policy forced on the
    CPU, equals the CPU policy's results, in fewer passes."""
    m = _model(request, name)
    for fn, kw in ((sig_facts, {}), (amig_facts, {}), (amig_facts, {"words": "last"})):
        cpu, n_cpu = _no_grad_passes(m, lambda fn=fn, kw=kw: fn(m, FACTS, steps=2, **kw), policy=False)
        acc, n_acc = _no_grad_passes(m, lambda fn=fn, kw=kw: fn(m, FACTS, steps=2, **kw), policy=True)
        assert n_acc < n_cpu, (fn.__name__, kw)
        for a, b in zip(cpu, acc):
            assert _rel(b.scores, a.scores) < 2e-5, (fn.__name__, kw)
            torch.testing.assert_close(b.layer_sums, a.layer_sums, rtol=1e-4, atol=1e-7)
            torch.testing.assert_close(b.prob_baseline, a.prob_baseline, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("method", ["ig", "sig", "amig"])
def test_ql_localize_passes_are_the_counted_ones(tiny_llama, method):
    """``localize_passes`` (the reproduce cost model's forward passes of ``ql.localize.<method>``) equals the no-grad
    passes ``localize_facts`` makes, on the CPU path and on the accelerator's, windows of one fact each."""
    facts = [Fact("P36", "France", "Paris", ("The capital of France is", "France's capital is",
                                             "The capital city of France is")),
             Fact("P30", "Kenya", "Africa", ("Kenya is located in", "Kenya is in the continent of"))]
    windows = [[len(tiny_llama.encode(q)) for q in f.queries] for f in facts]
    for policy in (False, True):
        _, n = _no_grad_passes(tiny_llama, lambda: localize_facts(tiny_llama, facts, method, fact_batch=1,
                                                                  progress=False, ig__steps=2), policy=policy)
        assert n == localize_passes(method, windows, rows=policy), (method, policy)
    assert localize_passes(method, windows, rows=True) < localize_passes(method, windows)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_amig_labels_its_results_from_its_own_runs(request, name):
    """AMIG (words ``"all"``) builds its results from its word runs, without a one-step IG to label them: the clean
    activations and P(target) equal IG's, ``prob_baseline`` is zero outside the scored layers (as IG's), completeness
    is Σ_i over each target token's own words (not the later positions a longer context pads), and the provenance
    records the settings asked for (it once said ``steps=1``)."""
    m = _model(request, name)
    for layers in (None, (1,)):
        attrs = amig_facts(m, FACTS, steps=3, rule="linspace", layers=layers)
        refs = integrated_gradients_facts(m, FACTS, steps=1, rule="midpoint", layers=layers)
        for a, ref in zip(attrs, refs):
            torch.testing.assert_close(a.activations, ref.activations, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(a.prob_full, ref.prob_full, rtol=1e-4, atol=1e-8)
            assert (a.target, a.target_tokens, a.layers, a.site) == (ref.target, ref.target_tokens, ref.layers, ref.site)
            outside = [l for l in range(m.n_layers) if l not in a.layers]
            assert not a.prob_baseline[:, outside].any() and not a.layer_sums[:, outside].any()
            delta = (a.prob_full - a.prob_baseline)[:, list(a.layers)].double()
            assert _rel(a.layer_sums[:, list(a.layers)], delta) < 0.05  # completeness summed over the words
            assert (a.provenance.config["steps"], a.provenance.config["rule"]) == (3, "linspace")
            n_ctx = len(m.encode(a.prompt)) + len(a.target_tokens) - 1  # a multi-token target's words: its contexts'
            assert (a.steps, a.rule, a.meta["n_words"]) == (3, "linspace", n_ctx)


def test_sig_word_pairs_share_their_query_clean_run(tiny_llama):
    """SIG's (query, word) pairs have the same clean run: a call makes it once per query it holds (``make_units``
    runs each distinct sample once), so one 5-word query costs its masked batch and one clean run on a CPU, not
    1 + 5; ``sig_clean_runs`` lists each call's queries (hand-counted)."""
    m = tiny_llama
    prompt = "The capital of France is"
    assert len(m.encode(prompt)) == 5
    _, n = _no_grad_passes(m, lambda: sig_facts(m, [(prompt, " Paris")], steps=2), policy=False)
    assert n == 2
    assert sig_clean_runs([5, 4, 6], batch=4) == [[0], [0, 1], [1, 2], [2]]
    assert sig_clean_runs([5], batch=16) == [[0]]
