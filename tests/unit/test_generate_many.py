"""``Model.generate_many``: several prompts' greedy continuations as rows of one batch equal ``generate`` of each
prompt token for token (issue 25: generation was one sample at a time, launch-bound on a GPU), and task accuracy on a
number task batched on an accelerator equals it one sample at a time."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from tlcap.data.tasks import load_task
from tlcap.metrics.accuracy import task_accuracy
from tlcap.models import make_gpt2, make_llama, make_tiny
from tlcap.runtime import device

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["Question: 2 + 2 =", "The capital of France is", "Hi", "A", "Natalia sold clips to 48 of her friends in April"]


def _peaked(name):
    m = make_gpt2("tiny", seed=0) if name == "gpt2" else make_llama(seed=0) if name == "llama" else make_tiny(name, seed=0)
    with torch.no_grad():  # a sharper read-out: greedy choices far from ties
        m.hf_model.get_output_embeddings().weight.mul_(8)
    return m


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "neox", "gemma2"])
def test_rows_of_one_batch_equal_each_prompt_generated_alone(name):
    m = _peaked(name)
    ids = [m.encode(p) for p in PROMPTS]
    assert len({len(i) for i in ids}) > 2
    alone = [m.generate(i, 12) for i in ids]
    assert m.generate_many(ids, 12) == alone
    # stops: each row ends at its own stop token (included) or stop text, as generate ends
    stop = [alone[0][3], alone[2][1]]
    want = [m.generate(i, 12, stop_ids=stop) for i in ids]
    assert m.generate_many(ids, 12, stop_ids=stop) == want and len({len(w) for w in want}) > 1
    text = m.decode(alone[1][2:4])
    want = [m.generate(i, 12, stop_text=[text]) for i in ids]
    assert m.generate_many(ids, 12, stop_text=[text]) == want
    assert m.generate_many([], 4) == []


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "neox"])
def test_every_step_of_a_row_has_the_logits_of_its_own_sequence(name):
    """Sharper than the tokens: each row's logits at every step equal a plain forward pass of its own prompt and
    continuation so far (its positions, its prompt only: the padding of shorter prompts masked)."""
    m = make_gpt2("tiny", seed=0) if name == "gpt2" else make_llama(seed=0) if name == "llama" else make_tiny(name, seed=0)
    ids = [m.encode(p) for p in PROMPTS]
    d = m.decode_rows(ids, 6, keep_logits=True)
    out, logits = d.tokens, d.logits
    assert len(logits) == 6
    for r, (p, o) in enumerate(zip(ids, out)):
        for t in range(6):
            want = m.logits(torch.tensor([p + o[:t]]))[0, -1].float()
            torch.testing.assert_close(logits[t][r], want, rtol=1e-4, atol=1e-4)


def test_task_accuracy_of_a_number_task_batched_equals_one_sample_at_a_time():
    """On an accelerator (the ``one_pass_default`` policy) a number task's samples generate as rows of one batch."""
    m = _peaked("llama")
    test = load_task("gsm8k", split="test", n=6, seed=1)
    alone = task_accuracy(m, "gsm8k", test, max_new_tokens=10)
    calls = []
    real = type(m).generate_many

    def counted(self, prompts, *a, **k):
        calls.append(len(prompts))
        return real(self, prompts, *a, **k)

    with mock.patch.object(device, "one_pass_default", lambda model: True), \
            mock.patch.object(type(m), "generate_many", counted):
        batched = task_accuracy(m, "gsm8k", test, max_new_tokens=10)
    assert sum(calls) == 6 and calls[0] > 1
    assert batched.predictions == alone.predictions and batched.scores == alone.scores
    assert batched.accuracy == alone.accuracy


def test_batched_generation_makes_the_passes_the_cost_model_prices():
    """``eval_work`` on an accelerator prices a number task's prompts at one padded pass per ``GEN_ROWS`` samples:
    counted, ``task_accuracy`` of 20 samples in rows of 8 runs 3 multi-token (prefix) passes and every other pass
    one token per row; on a CPU each sample's prompt is its own pass."""
    from tlcap.metrics import accuracy
    from tlcap.reproduce.cnl_stages import eval_work

    m = _peaked("llama")
    test = load_task("gsm8k", split="test", n=20, seed=1)
    widths: list[int] = []
    handle = m.backend.register_forward_pre_hook(lambda mod, args, kwargs: widths.append(int(
        (args[0] if args else kwargs["input"]).shape[-1])), with_kwargs=True)
    try:
        with mock.patch.object(device, "one_pass_default", lambda model: True), \
                mock.patch.object(accuracy, "GEN_ROWS", 8):
            task_accuracy(m, "gsm8k", test, max_new_tokens=4)
        prefill_gpu = sum(w > 1 for w in widths)
        widths.clear()
        task_accuracy(m, "gsm8k", test, max_new_tokens=4)
        prefill_cpu = sum(w > 1 for w in widths)
    finally:
        handle.remove()
    assert prefill_gpu == 3 and prefill_cpu == 20
    import tlcap.reproduce.cnl_stages as stages

    with mock.patch.object(stages, "GEN_ROWS", 8):
        w = eval_work(m, "gsm8k", test)
    assert w.passes["fwd_token"] == prefill_cpu and w.passes["fwd_token"] + w.accelerator_passes["fwd_token"] == 3
