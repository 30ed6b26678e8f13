"""Causal traces and edge scores over fact lists: several facts share batches, each result equals its own run.

Causal tracing of several facts (cells of facts whose continuations have one length in one batch,
per-row subject noise, each row restoring its own fact's clean state) equals :func:`causal_trace` fact by
fact on every family; the random tiny models' output embeddings are scaled up (x8) so that a fact's
prediction is peaked and restorations move it. Edge scores of several prompts in one pass equal
:func:`edge_attribution` of each prompt. The CNL fidelity experiment gives the same rows whether its
facts are located together or one by one; a ROME sweep, which measures the unedited model once, equals
each layer's edit evaluated alone.
"""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution import IGConfig
from tlcap.data.rewrites import RewriteFact
from tlcap.experiments.cnl_eval import fidelity
from tlcap.intervene.covariance import key_covariance
from tlcap.intervene.rome import RomeConfig, evaluate_rome, rome_sweep
from tlcap.locate.causal_trace import causal_trace, causal_trace_facts, trace_dataset
from tlcap.locate.circuits import edge_attribution
from tlcap.locate.circuits.items import edge_attribution_items
from tlcap.models import make_gpt2, make_llama, make_tiny
from tlcap.runtime.run_control import RunControl

FAMILIES = ["gpt2", "llama", "neox", "gptj", "qwen2", "gemma2"]
# unequal lengths, a subject at the start, a target the model does not predict (None: its top token)
FACTS = [("The capital of France is", "France", None), ("The Eiffel Tower is located in the city of", "The Eiffel Tower", None),
         ("Paris is the capital of", "Paris", None), ("Rome is the capital of", "Rome", " Italy")]


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.heavy]  # one torch thread; after the fast gate


def _peaked(name: str):
    m = make_gpt2("tiny", seed=0) if name == "gpt2" else make_llama(seed=0) if name == "llama" else make_tiny(name, seed=0)
    with torch.no_grad():
        m.hf_model.get_output_embeddings().weight.mul_(8)
    return m


@pytest.fixture(scope="module", params=FAMILIES)
def peaked(request):
    return _peaked(request.param)


@pytest.mark.parametrize("kw", [
    dict(samples=2, window=1, seed=1, kinds=("mlp", "attn", "resid")),  # every token, pairs of equal length batched
    dict(samples=3, tokens="last_subject", kinds=("mlp", "resid"), batch_rows=25),  # 4 cells x 3 samples x 2 facts
], ids=["all_tokens", "last_subject"])
def test_trace_facts_equal_one_fact_at_a_time(peaked, kw):
    many = causal_trace_facts(peaked, FACTS, warn=False, **kw)
    moved = 0.0
    for (p, s, t), b in zip(FACTS, many):
        one = causal_trace(peaked, p, s, t, warn=False, **kw)
        torch.testing.assert_close(b.scores, one.scores, rtol=1e-5, atol=1e-6, equal_nan=True)
        assert (b.clean_prob, b.corrupted_prob, b.tokens, b.subject_range) == (
            one.clean_prob, one.corrupted_prob, one.tokens, one.subject_range)
        moved = max(moved, float((one.scores - one.corrupted_prob).nan_to_num(0).abs().max()))
    assert moved > 5e-5  # restorations move P(target) 50x the tolerance: a wrong restoration would show


def test_trace_setups_from_padded_passes_equal_each_fact_alone(peaked):
    """What an accelerator runs (prepare_traces: the facts' clean runs in one right-padded pass, their corrupted runs
    in another) equals prepare_trace of each fact; the traces built on them too."""
    from unittest import mock

    from tlcap.locate.causal_trace.setup import prepare_trace, prepare_traces
    from tlcap.runtime import device

    kw = dict(samples=3, kinds=("mlp", "resid"), seed=2)
    with mock.patch.object(device, "one_pass_default", lambda m: True):
        many = prepare_traces(peaked, FACTS, warn=False, **kw)
        traces = causal_trace_facts(peaked, FACTS, warn=False, **kw)
    for (p, s, t), b, tr in zip(FACTS, many, traces):
        one = prepare_trace(peaked, p, s, t, warn=False, **kw)
        assert (b.target, b.target_id, b.subject_range, b.noise_std) == (one.target, one.target_id, one.subject_range,
                                                                         one.noise_std)
        assert torch.equal(b.tokens, one.tokens) and torch.equal(b.noise, one.noise)
        assert b.clean_prob == pytest.approx(one.clean_prob, rel=1e-5, abs=1e-9)
        assert b.corrupted_prob == pytest.approx(one.corrupted_prob, rel=1e-5, abs=1e-9)
        assert b.clean.keys() == one.clean.keys()
        for name, a in one.clean.items():
            torch.testing.assert_close(b.clean[name], a, rtol=1e-5, atol=1e-5)
        alone = causal_trace(peaked, p, s, t, warn=False, **kw)
        torch.testing.assert_close(tr.scores, alone.scores, rtol=1e-4, atol=1e-6, equal_nan=True)
    assert len({round(b.corrupted_prob, 6) for b in many}) == len(FACTS)  # each fact its own noise rows and target


def test_trace_dataset_from_padded_set_ups_equals_each_fact_set_up_alone():
    """trace_dataset on the accelerator's path (each window's facts set up in two padded passes, each fact with its
    own noise seed) equals the per-fact set-up."""
    from unittest import mock

    from tlcap.data import load_known_facts
    from tlcap.runtime import device

    m = _peaked("llama")
    facts = load_known_facts(n=5)
    kw = dict(samples=2, fact_batch=3, seed=4, kinds=("mlp", "resid"))
    alone = trace_dataset(m, facts, **kw)
    with mock.patch.object(device, "one_pass_default", lambda model: True):
        padded = trace_dataset(m, facts, **kw)
    torch.testing.assert_close(padded.effects, alone.effects, rtol=1e-4, atol=1e-6, equal_nan=True)
    assert padded.clean_prob == pytest.approx(alone.clean_prob, rel=1e-5)
    assert padded.corrupted_prob == pytest.approx(alone.corrupted_prob, rel=1e-5)
    assert padded.top_layers == alone.top_layers and padded.noise_std == alone.noise_std


def test_trace_dataset_windows_equal_one_fact_windows():
    model = _peaked("llama")
    facts = [{"prompt": p, "subject": s} for p, s, _ in FACTS]
    kw = dict(samples=2, window=1, kinds=("mlp", "resid"), noise_std=0.5)
    many, one = trace_dataset(model, facts, fact_batch=4, **kw), trace_dataset(model, facts, fact_batch=1, **kw)
    torch.testing.assert_close(many.effects, one.effects, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.equal(many.counts, one.counts) and many.top_layers == one.top_layers


@pytest.mark.parametrize("name", ["gpt2", "llama", "gptj", "gemma2"])
def test_edge_scores_of_several_prompts_equal_each_prompt(name):
    model = _peaked(name)
    items = [("The capital of France is", " Paris"), ("Hi", " there you go"), ("France's capital city is", " Paris")]
    for steps in (1, 3):
        many = edge_attribution_items(model, items, steps=steps, items_per_pass=2)
        for (p, t), b in zip(items, many):
            one = edge_attribution(model, p, t, None, steps=steps)
            assert float((b.scores - one.scores).abs().max() / one.scores.abs().max()) < 3e-5
            assert b.clean_metric == pytest.approx(one.clean_metric, rel=1e-5)
            assert b.corrupt_metric == pytest.approx(one.corrupt_metric, rel=1e-5)
            assert (b.prompt, b.target, b.method, b.ablation) == (p, t, one.method, one.ablation)


def test_fidelity_locates_a_window_of_facts_as_one_fact_at_a_time():
    model = _peaked("gpt2")
    facts = [RewriteFact("France", " Paris", ("The capital of France is", "France's capital city is"), "P1", "a"),
             RewriteFact("Italy", " Rome", ("The capital of Italy is", "Italy's capital city is"), "P1", "b")]
    kw = dict(methods=("kn", "trace", "kc"), ig=IGConfig(steps=2), trace__samples=2, trace__top_k=1, kc__top_n=20,
              kc__steps=2, run=RunControl(progress=False))
    together = fidelity(model, facts, fact_batch=2, **kw)
    alone = fidelity(model, facts, fact_batch=1, **kw)
    assert together.sets == alone.sets and all(len(s) for m in ("kn", "trace") for f in together.sets[m] for s in f)
    for a, b, n in ((together.to_frame(), alone.to_frame(), 6), (together.rewrite_frame(), alone.rewrite_frame(), 12)):
        assert list(a.columns) == list(b.columns) and len(a) == len(b) == n
        for col in a.columns:
            if a[col].dtype.kind == "f":
                assert a[col].fillna(-1).to_numpy() == pytest.approx(b[col].fillna(-1).to_numpy(), rel=1e-6, abs=1e-9)
            else:
                assert a[col].tolist() == b[col].tolist()


def test_rome_sweep_measures_once_and_equals_each_layer_edited_alone(tiny_gpt2):
    """The sweep's unedited measurements (taken once) and passed covariances give each layer's evaluate_rome."""
    cfg = RomeConfig(steps=2, cov_tokens=128, cov_seq_len=32, prefixes=("",))
    args = (tiny_gpt2, "The capital of France is", "France", " Rome")
    covs = key_covariance(tiny_gpt2, [0, 1], n_tokens=128, seq_len=32)
    sweep = rome_sweep(*args, [0, 1], config=cfg, covs=covs)
    for layer, r in zip((0, 1), sweep.results):
        one = evaluate_rome(*args, layer, config=cfg, cov=covs[layer])
        assert (r.efficacy, r.paraphrase, r.specificity, r.target_old) == (one.efficacy, one.paraphrase, one.specificity,
                                                                           one.target_old)
        assert (r.new_prob_before, r.old_prob_before) == (one.new_prob_before, one.old_prob_before)
        assert r.new_prob_after == pytest.approx(one.new_prob_after, rel=1e-5)


def test_trace_setups_corrupted_pass_is_split_by_batch_rows(peaked):
    """prepare_traces' corrupted pass holds at most batch_rows rows (whole facts of ``samples`` rows each): 4 facts of
    2 samples at batch_rows 6 are two passes (3 facts + 1), at 4 two, at 2 or 3 four, at 8 or "auto" one; every
    split gives the probabilities of one pass."""
    from unittest import mock

    from tlcap.locate.causal_trace.setup import prepare_traces
    from tlcap.models.adapter import Model
    from tlcap.runtime import device

    calls: list[int] = []
    real = Model.logits_at

    def counted(self, tokens, *a, **k):
        calls.append(int(tokens.shape[0]))
        return real(self, tokens, *a, **k)

    got = {}
    with mock.patch.object(device, "one_pass_default", lambda m: True), mock.patch.object(Model, "logits_at", counted):
        for rows in (8, 6, 4, 3, 2, "auto"):
            calls.clear()
            got[rows] = [s.corrupted_prob for s in prepare_traces(peaked, FACTS, warn=False, samples=2, seed=3,
                                                                  kinds=("mlp",), batch_rows=rows)]
            assert calls[0] == len(FACTS)  # the clean pass: one row per fact
            assert calls[1:] == {8: [8], 6: [6, 2], 4: [4, 4], 3: [2] * 4, 2: [2] * 4, "auto": [8]}[rows]
    for rows in (6, 4, 3, 2, "auto"):
        assert got[rows] == pytest.approx(got[8], rel=1e-5, abs=1e-9)  # float rounding of other batch shapes
