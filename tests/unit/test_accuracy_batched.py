"""``task_accuracy`` of choice and code tasks on an accelerator: the samples as rows of a few teacher-forced passes.

On an accelerator (the ``one_pass_default`` policy, patched here to run that path on the CPU) the samples of a
choice or code task are scored by :func:`~tlcap.metrics.set_scores.erased_scores` with one empty set instead of
one forward call each. Compared with the one-sample-at-a-time path on tiny random GPT-2 and Llama models:
scores, predictions, golds and skipped samples; the forward calls are counted and equal what the cost model
(``eval_work``) prices.
"""

from __future__ import annotations

from unittest import mock

import pytest

from tlcap.data.tasks import Sample, encode_sample, load_task, register_task
from tlcap.metrics.accuracy import task_accuracy
from tlcap.reproduce.cnl_stages import eval_work
from tlcap.runtime import device

WORDS = ["red", "table", "blue", "chair", "green", "lamp", "old", "river"]
PREFIX = "Decide whether the word names a colour.\nWord:"


@pytest.fixture(params=["gpt2", "llama"])
def model(request, tiny_gpt2, tiny_llama):
    return tiny_gpt2 if request.param == "gpt2" else tiny_llama


def _counted(m, *args, **kw):
    """``task_accuracy(m, *args, **kw)`` and the number of forward calls of the backend it made."""
    calls: list[int] = []
    handle = m.backend.register_forward_pre_hook(lambda mod, a, k: calls.append(1), with_kwargs=True)
    try:
        out = task_accuracy(m, *args, **kw)
    finally:
        handle.remove()
    return out, len(calls)


def _planted(m) -> list[Sample]:
    """Samples of the ``_pick_multi`` task (multi-token labels) whose gold is the model's own pick for the even ones
    and another label for the odd ones (accuracy 1/2), and one prompt beyond the context window (skipped)."""
    prompts = [f"{PREFIX} {w}" + " and more" * (i % 3) + "\nAnswer:" for i, w in enumerate(WORDS)]
    plain = [Sample(p, " no", " no", str(i)) for i, p in enumerate(prompts)]
    register_task("_pick_multi", lambda d, split: plain, kind="choice", choices=(" yes indeed", " no", " not at all"),
                  overwrite=True)
    picks = task_accuracy(m, "_pick_multi", plain).predictions
    too_long = Sample("word " * (m.n_ctx + 10), " no", " no", "long")
    labels = ["yes indeed", "no", "not at all"]
    golds = [k if i % 2 == 0 else labels[(labels.index(k) + 1) % 3] for i, k in enumerate(picks)]
    return [Sample(p, " " + g, " " + g, str(i)) for i, (p, g) in enumerate(zip(prompts, golds))] + [too_long]


def test_choice_and_code_accuracy_batched_equals_one_sample_at_a_time(model):
    cases = [("emotion", load_task("emotion", split="test", n=8), {}),
             ("mbpp", load_task("mbpp", split="test", n=3), {"code_tokens": 8}),
             ("_pick_multi", _planted(model), {})]
    assert any(len(encode_sample(model, Sample(PREFIX, c))[1]) > 1 for c in (" yes indeed", " not at all"))
    for task, samples, kw in cases:
        alone, calls_alone = _counted(model, task, samples, **kw)
        with mock.patch.object(device, "one_pass_default", lambda m: True):
            batched, calls_batched = _counted(model, task, samples, **kw)
        assert batched.scores == alone.scores, task
        assert batched.predictions == alone.predictions and batched.golds == alone.golds, task
        assert batched.n_skipped == alone.n_skipped and batched.accuracy == alone.accuracy, task
        assert batched.metric == alone.metric and batched.task == alone.task, task
        assert calls_batched < calls_alone, (task, calls_batched, calls_alone)
        if task != "mbpp":  # the cost model counts the accelerator's calls exactly (mbpp's code_tokens differ)
            w = eval_work(model, task, samples)
            assert w.passes["fwd_token"] + w.accelerator_passes["fwd_token"] == calls_batched, task
    planted = cases[-1][1]
    res = task_accuracy(model, "_pick_multi", planted)
    assert res.n_skipped == 1 and res.accuracy == 0.5  # the planted golds


def test_the_cost_model_counts_the_passes_of_code_tasks(model):
    """``eval_work`` prices MBPP's 64 reference tokens: the accelerator's calls counted at that size."""
    samples = load_task("mbpp", split="test", n=4)
    with mock.patch.object(device, "one_pass_default", lambda m: True):
        _, calls = _counted(model, "mbpp", samples)
    w = eval_work(model, "mbpp", samples)
    assert w.passes["fwd_token"] == 4 and w.passes["fwd_token"] + w.accelerator_passes["fwd_token"] == calls
