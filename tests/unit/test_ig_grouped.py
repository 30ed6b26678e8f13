"""Exact IG with rows batched across samples (``sample_batch``) and ``steps="auto"``, on tiny GPT-2 and Llama.

What is asserted: several contexts of different lengths in one batch give each context's own
logits; dataset scores batched across samples equal the one-sample-at-a-time path (unequal prompt
and answer lengths, padding, small batches that split a sample's rows); ``steps="auto"`` reaches its
completeness target and each layer equals the fixed-steps result at the size it chose.
"""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution.config import IGConfig
from tlcap.attribution.dataset import score_dataset
from tlcap.attribution.ig import integrated_gradients
from tlcap.data.tasks import Sample
from tlcap.errors import InvalidConfigError, TlcapError
from tlcap.runtime.run_control import RunControl

# unequal prompt and answer lengths (1 to 3 answer tokens): prefixes are padded to the longest
SAMPLES = [
    Sample("The capital of France is", " Paris", uid="0"),
    Sample("Hi", " there you go", uid="1"),
    Sample("One two three four five six seven", " eight nine", uid="2"),
]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one torch thread per module


@pytest.fixture(params=["tiny_gpt2", "tiny_llama"])
def model(request):
    return request.getfixturevalue(request.param)


def test_continue_rows_equals_each_context_alone(model):
    ctxs = [[5, 7, 9, 11, 3], [4, 8], [6, 1, 2, 3, 4, 5, 7], [9]]
    prefix = model.padded_prefix([c[:-1] for c in ctxs])
    counts = torch.tensor([2, 0, 3, 1])  # the second context is left out of this batch
    ref = torch.cat([model.logits(torch.tensor([c]))[:, -1].expand(int(k), -1) for c, k in zip(ctxs, counts) if k])
    for expand_at in (None, 1):
        out = model.continue_rows([c[-1] for c in ctxs], prefix, counts, expand_at=expand_at)
        assert out.shape == (6, model.d_vocab)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(TlcapError, match="one count"):
        model.continue_rows([1, 2], prefix, counts)


@pytest.mark.parametrize("batch_rows", [256, 7])  # 7: a sample's rows are split over batches
def test_samples_batched_equal_one_at_a_time(model, batch_rows):
    kw = dict(max_answer_tokens=3, steps=3, run=RunControl(progress=False))
    one = score_dataset(model, SAMPLES, **kw)
    many = score_dataset(model, SAMPLES, sample_batch=3, batch_rows=batch_rows, **kw)
    assert (many.n_samples, many.n_tokens) == (one.n_samples, one.n_tokens) == (3, 6)
    scale = float(one.scores.abs().max())
    assert scale > 0
    torch.testing.assert_close(many.scores, one.scores, rtol=1e-4, atol=1e-5 * scale)
    assert many.prob_sum == pytest.approx(one.prob_sum, rel=1e-6)
    assert many.meta["evaluations"] == one.meta["evaluations"] == 6 * model.n_layers * 4
    # both report the same completeness (the errors are ~1e-4 here, so float32 summation order shows at ~1e-6)
    assert many.completeness_rel_error == pytest.approx(one.completeness_rel_error, rel=1e-2, abs=1e-5)


def test_steps_auto_reaches_tol_and_equals_fixed_steps(model):
    # `left` converges at first order, so a 1e-4 target needs more than the 4 starting nodes
    attr = integrated_gradients(model, "The capital of France is", " Paris", steps="auto", tol=1e-4, rule="left")
    used = torch.tensor(attr.meta["steps_used"])[0]
    assert attr.completeness_rel_error <= 1e-4 or bool((used * 2 > 64).any())
    assert int(used.max()) > 4  # it had to refine
    for m in used.unique().tolist():
        fixed = integrated_gradients(model, "The capital of France is", " Paris", steps=int(m), rule="left")
        for l in (used == m).nonzero().flatten().tolist():
            scale = float(fixed.scores[l].abs().max())
            torch.testing.assert_close(attr.scores[l], fixed.scores[l], rtol=1e-4, atol=1e-5 * scale)
            assert float(attr.prob_baseline[0, l]) == pytest.approx(float(fixed.prob_baseline[0, l]), rel=1e-5)
    tries = [sum(2 ** k for k in range(2, 2 + (int(u) // 4).bit_length())) for u in used]  # 4 + 8 + ... + u
    assert attr.meta["evaluations"] == sum(tries)  # `left`'s α = 0 node is each layer's baseline row


def test_steps_auto_trapezoid_adds_midpoints_and_equals_fixed_steps(model):
    # trapezoid refines 5 → 9 → 17 points by adding the midpoints: a layer costs exactly its points
    attr = integrated_gradients(model, "The capital of France is", " Paris", steps="auto", tol=1e-5, rule="trapezoid")
    used = torch.tensor(attr.meta["steps_used"])[0]
    assert set(used.tolist()) <= {5, 9, 17, 33, 65} and int(used.max()) > 5
    assert attr.meta["evaluations"] == int(used.sum())  # no node computed twice, α = 0 is the baseline row
    for m in used.unique().tolist():
        fixed = integrated_gradients(model, "The capital of France is", " Paris", steps=int(m), rule="trapezoid")
        for l in (used == m).nonzero().flatten().tolist():
            scale = float(fixed.scores[l].abs().max())
            torch.testing.assert_close(attr.scores[l], fixed.scores[l], rtol=1e-4, atol=1e-5 * scale)
            assert float(attr.prob_baseline[0, l]) == pytest.approx(float(fixed.prob_baseline[0, l]), rel=1e-5)


def test_steps_auto_dataset_records_completeness(tiny_gpt2):
    res = score_dataset(tiny_gpt2, SAMPLES[:2], max_answer_tokens=1, steps="auto", tol=1e-3, rule="gauss_legendre",
                        run=RunControl(progress=False))
    assert res.completeness_rel_error <= 1e-3
    assert res.steps == "auto" and res.n_samples == 2


def test_steps_auto_is_for_exact_ig():
    with pytest.raises(InvalidConfigError, match="steps='auto'"):
        IGConfig(steps="auto", method="joint")
    with pytest.raises(InvalidConfigError, match="tol"):
        IGConfig(steps="auto", tol=0)
    with pytest.raises(InvalidConfigError, match="sample_batch"):
        IGConfig(sample_batch=0)


@pytest.mark.parametrize("rule", ["left", "trapezoid"])  # trapezoid: its refinements run another rule (midpoint)
def test_auto_stream_equals_each_window_alone(model, rule, monkeypatch):
    import tlcap.attribution.grouped as grouped

    # a sample with an empty answer between the others: its window scores nothing and keeps its place
    samples = [*SAMPLES, Sample("Nothing", "", uid="e"), Sample("Red green blue", " yellow", uid="4")]
    kw = dict(max_answer_tokens=2, steps="auto", tol=1e-4, rule=rule, batch_rows=9, run=RunControl(progress=False))
    calls = []
    real = grouped.run_rows
    monkeypatch.setattr(grouped, "run_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    alone = score_dataset(model, samples, sample_batch=1, stream_depth=1, **kw)
    n_alone, calls[:] = len(calls), []
    streamed = score_dataset(model, samples, sample_batch=1, stream_depth=3, **kw)
    # refinement rounds shared the next windows' calls (trapezoid's midpoint rounds share only with each other)
    assert len(calls) < n_alone if rule == "left" else len(calls) <= n_alone
    assert (streamed.n_samples, streamed.n_skipped, streamed.sample_ids) == (alone.n_samples, 1, alone.sample_ids)
    assert streamed.meta["evaluations"] == alone.meta["evaluations"] > 4 * 4 * model.n_layers  # same refinements
    scale = float(alone.scores.abs().max())
    torch.testing.assert_close(streamed.scores, alone.scores, rtol=1e-4, atol=1e-5 * scale)
    # |Σ attr − ΔP| / |ΔP| with Σ attr ≈ ΔP: float32 sums that agree to 1e-5 of ΔP (the batches differ, so does
    # the rounding) move it by up to 1e-5; a round more or less would move it by about the tolerance (1e-4)
    assert streamed.completeness_rel_error == pytest.approx(alone.completeness_rel_error, abs=1e-5)
    pair = score_dataset(model, samples, sample_batch=2, stream_depth=2, **kw)  # windows of two samples
    torch.testing.assert_close(pair.scores, alone.scores, rtol=1e-4, atol=1e-5 * scale)
    with pytest.raises(InvalidConfigError, match="stream_depth"):
        IGConfig(stream_depth=0)


def test_ig_units_stream_returns_every_window_in_order(tiny_llama):
    from tlcap.attribution.batched import fact_tokens
    from tlcap.attribution.grouped import ig_units, ig_units_stream, make_units
    from tlcap.data.tasks import encode_sample
    from tlcap.runtime.sites import get_site

    m = tiny_llama
    li = list(range(m.n_layers))
    hooks = [get_site("mlp_post").hook_name(l) for l in li]
    cfg = IGConfig(steps="auto", tol=1e-4, rule="left", batch_rows=9)
    items = [fact_tokens(m, s.prompt, encode_sample(m, s, 2)[1]) for s in [*SAMPLES, Sample("Red green", " blue", uid="4")]]
    windows = [make_units(m, w, hooks, li) for w in (items[0:2], items[2:3], items[3:4])]
    ref = [ig_units(m, u, p, hooks, li, cfg, 9) for u, p in windows]
    for depth in (1, 2, 5):  # 2: a window waits while the stream is full, then the next is admitted
        got = list(ig_units_stream(m, iter(windows), hooks, li, cfg, 9, depth=depth))
        assert len(got) == 3
        for r, g in zip(ref, got):
            assert torch.equal(r.steps_used, g.steps_used) and torch.equal(r.evaluations, g.evaluations)
            torch.testing.assert_close(g.attr, r.attr, rtol=1e-5, atol=1e-12)
    assert int(max(r.steps_used.max() for r in ref)) > 4  # it refined


def test_units_from_one_padded_pass_equal_each_sample_alone(model):
    from tlcap.attribution.batched import fact_tokens
    from tlcap.attribution.grouped import ig_units, make_units
    from tlcap.data.tasks import encode_sample
    from tlcap.runtime.sites import get_site

    li = list(range(model.n_layers))
    hooks = [get_site("mlp_post").hook_name(l) for l in li]
    items = [fact_tokens(model, s.prompt, encode_sample(model, s, 3)[1]) for s in SAMPLES]  # lengths 6 to 10
    alone, p_alone = make_units(model, items, hooks, li, one_pass=False)
    one, p_one = make_units(model, items, hooks, li, one_pass=True)  # what an accelerator runs
    assert [u.context for u in one] == [u.context for u in alone] and p_one.lengths == p_alone.lengths
    for a, b in zip(alone, one):
        torch.testing.assert_close(b.w_bar, a.w_bar, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.states, a.states, rtol=1e-5, atol=1e-6)
        assert b.p_clean == pytest.approx(a.p_clean, rel=1e-5)
    for la, lb in zip(p_alone.cache.layers, p_one.cache.layers):  # every real position's keys and values
        for r, n in enumerate(p_alone.lengths):
            torch.testing.assert_close(lb.keys[r, :, :n], la.keys[r, :, :n], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(lb.values[r, :, :n], la.values[r, :, :n], rtol=1e-5, atol=1e-6)
    cfg = IGConfig(steps=3, batch_rows=16)
    ra, rb = ig_units(model, alone, p_alone, hooks, li, cfg, 16), ig_units(model, one, p_one, hooks, li, cfg, 16)
    torch.testing.assert_close(rb.attr, ra.attr, rtol=1e-4, atol=1e-6 * float(ra.attr.abs().max()))


def test_streamed_auto_run_resumes_to_the_same_sums(tiny_llama, tmp_path):
    words = ["red", "green", "blue", "up", "down", "left", "right", "north", "south", "east", "west"]
    samples = [*SAMPLES, *(Sample(f"The {w} one is", f" {words[(k + 3) % 11]}", uid=f"w{k}") for k, w in enumerate(words))]
    kw = dict(max_answer_tokens=2, steps="auto", tol=1e-5, rule="left", sample_batch=2, batch_rows=16)
    full = score_dataset(tiny_llama, samples, run=RunControl(progress=False), **kw)

    def boom(i, s):  # windows are prepared ahead of their results: stop while later windows are in flight
        if i == 12:
            raise KeyboardInterrupt

    rc = RunControl(progress=False, checkpoint_dir=tmp_path, checkpoint_every=1)
    with pytest.raises(KeyboardInterrupt):
        score_dataset(tiny_llama, samples, run=rc, on_sample=boom, **kw)
    from tlcap.attribution.checkpoint import load_checkpoint

    assert 0 < load_checkpoint(tmp_path)[1]["n_seen"] < len(samples)  # stopped part-way, with windows saved
    again = score_dataset(tiny_llama, samples, run=rc, **kw)
    assert again.meta["evaluations"] == full.meta["evaluations"] > 14 * 4 * tiny_llama.n_layers
    assert torch.equal(again.sums, full.sums) and again.sample_ids == full.sample_ids
