"""``batch_rows="auto"``: budget arithmetic, out-of-memory detection, halve-and-retry, IG identity."""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution import IGConfig, integrated_gradients
from tlcap.attribution.dataset import score_dataset
from tlcap.data.tasks import Sample
from tlcap.errors import InvalidConfigError
from tlcap.runtime.batching import CPU_MAX_ROWS, SAFETY, auto_batch_rows, ig_row_bytes, is_oom, parse_memory, run_auto_batched
from tlcap.runtime.run_control import RunControl

pytestmark = pytest.mark.heavy  # seconds per module: runs after the fast gate (make unit)


def test_parse_memory():
    assert parse_memory("8GiB") == 8 * 2**30
    assert parse_memory("500MB") == 500 * 10**6
    assert parse_memory(" 1.5 kib ") == 1536
    assert parse_memory(4096) == 4096
    for bad in ("lots", "-1GB", 0, "8 GiBs", True):
        with pytest.raises(InvalidConfigError, match="max_memory"):
            parse_memory(bad)


def test_auto_batch_rows_fits_the_budget():
    # 10 000 bytes at SAFETY 0.8 = 8 000 usable; 100 bytes a row -> 80 rows
    assert auto_batch_rows(row_bytes=100, total_rows=1000, max_memory=10_000) == int(10_000 * SAFETY) // 100 == 80
    assert auto_batch_rows(row_bytes=100, total_rows=30, max_memory=10_000) == 30  # no more rows than there are
    assert auto_batch_rows(row_bytes=10**12, total_rows=30, max_memory=10_000) == 1  # at least one row
    assert auto_batch_rows(row_bytes=1, total_rows=7) == 7  # default budget: free memory (>> 7 bytes)


def test_is_oom():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(MemoryError())
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))  # not an error an allocator raises


def test_run_auto_batched_halves_until_it_fits():
    tried: list[int] = []
    retries: list[int] = []

    def fn(rows: int) -> int:
        tried.append(rows)
        if rows > 50:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")
        return rows * 2

    assert run_auto_batched(fn, 200, on_retry=lambda r, msg: retries.append(r)) == 100
    assert tried == [200, 100, 50] and retries == [100, 50]


def test_run_auto_batched_reraises():
    def other(rows: int) -> int:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_auto_batched(other, 8)
    calls: list[int] = []

    def never(rows: int) -> int:
        calls.append(rows)
        raise MemoryError

    with pytest.raises(MemoryError):
        run_auto_batched(never, 5)
    assert calls == [5, 2, 1]


def _oom_over_two_rows(model, monkeypatch, error):
    """Make every staged batch of more than 2 rows raise ``error``; returns the list of refused sizes."""
    real = model.continue_staged
    ooms: list[int] = []

    def fake(prefix, rows, lengths, last, staging, *args, **kwargs):
        n = int(staging.fill.sum())
        if n > 2:
            ooms.append(n)
            raise error
        return real(prefix, rows, lengths, last, staging, *args, **kwargs)

    monkeypatch.setattr(model, "continue_staged", fake)
    return ooms


def test_ig_auto_batch_equals_fixed_batch_under_fake_oom(tiny_gpt2, monkeypatch):
    """An OOM injected for batches over 2 rows: auto halves 10 -> 5 -> 2 and equals batch_rows=2 exactly."""
    prompt, target = "The capital of France is", " Paris"
    fixed = integrated_gradients(tiny_gpt2, prompt, target, steps=4, batch_rows=2)
    ooms = _oom_over_two_rows(tiny_gpt2, monkeypatch, torch.cuda.OutOfMemoryError("CUDA out of memory (injected)"))
    auto = integrated_gradients(tiny_gpt2, prompt, target, steps=4, batch_rows="auto", max_memory="1GiB")
    # 2 layers x (4 steps + 1 baseline row) = 10 rows fit 1 GiB: one staged batch of 10, then 5, OOM
    assert ooms == [10, 5]
    assert torch.equal(auto.scores, fixed.scores)
    assert torch.equal(auto.prob_baseline, fixed.prob_baseline) and torch.equal(auto.layer_sums, fixed.layer_sums)


def test_ig_auto_is_the_default_and_equals_a_fixed_batch(tiny_gpt2):
    assert IGConfig().batch_rows == "auto"
    a = integrated_gradients(tiny_gpt2, "The capital of France is", " Paris", steps=4)
    b = integrated_gradients(tiny_gpt2, "The capital of France is", " Paris", steps=4, batch_rows=3)
    assert torch.allclose(a.scores, b.scores, rtol=1e-5, atol=1e-9)


def test_cpu_batches_stop_at_cpu_max_rows():
    # a CPU budget of 1 TiB would fit 10**6 rows of 1 MB; the CPU cap keeps 256 (CUDA would not)
    assert auto_batch_rows(row_bytes=2**20, total_rows=10**6, max_memory="1TiB", device="cpu") == CPU_MAX_ROWS == 256
    assert auto_batch_rows(row_bytes=2**20, total_rows=100, max_memory="1TiB", device="cpu") == 100


def test_amig_auto_equals_a_fixed_batch_and_halves_on_oom(tiny_llama, monkeypatch):
    # AMIG over the words takes batch_rows="auto" (the default): same scores as a fixed batch,
    # and an injected out-of-memory at more than 2 rows halves the batch until it fits and reruns
    from tlcap.attribution import amig as amig_module  # noqa: PLC0415

    prompt, target = "The capital of France is", " Paris"
    fixed = amig_module.word_attributions(tiny_llama, prompt, target, steps=2, batch_rows=3)
    real, seen = tiny_llama.continue_rows, []

    def fake(last, prefix, counts, *args, **kwargs):
        seen.append(int(torch.as_tensor(counts).sum()))
        if seen[-1] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return real(last, prefix, counts, *args, **kwargs)

    monkeypatch.setattr(tiny_llama, "continue_rows", fake)
    auto = amig_module.word_attributions(tiny_llama, prompt, target, steps=2)
    monkeypatch.undo()
    last_oom = max(i for i, n in enumerate(seen) if n > 2)
    assert seen[last_oom + 1:] and max(seen[last_oom + 1:]) <= 2  # ran out above 2 rows, finished at fewer
    for x, y in zip(auto, fixed):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-9)


def test_row_bytes_grows_with_context_and_config_validation(tiny_gpt2):
    assert ig_row_bytes(tiny_gpt2, 100) > ig_row_bytes(tiny_gpt2, 10) > 0
    with pytest.raises(InvalidConfigError, match="batch_rows"):
        integrated_gradients(tiny_gpt2, "The capital of France is", " Paris", batch_rows="big")
    with pytest.raises(InvalidConfigError, match="max_memory"):
        integrated_gradients(tiny_gpt2, "The capital of France is", " Paris", batch_rows="auto", max_memory="lots")


def test_dataset_scores_auto_batch_equal_fixed_batch_under_fake_oom(tiny_gpt2, monkeypatch):
    """score_dataset with batch_rows="auto": every sample's IG halves past an injected OOM; sums equal batch 2's."""
    samples = [Sample("Item 1 is", " very red", uid="1"), Sample("Item 2 is", " old", uid="2")]
    fixed = score_dataset(tiny_gpt2, samples, max_answer_tokens=2, steps=3, batch_rows=2, run=RunControl(progress=False))
    ooms = _oom_over_two_rows(tiny_gpt2, monkeypatch, MemoryError("injected"))
    auto = score_dataset(tiny_gpt2, samples, max_answer_tokens=2, steps=3, batch_rows="auto", max_memory="1GiB",
                         run=RunControl(progress=False))
    assert len(ooms) >= 2  # at least one retry per sample
    assert torch.equal(auto.scores, fixed.scores)


def test_cuda_free_memory_counts_the_allocators_unused_cache(monkeypatch):
    """A window sized after an earlier one sees the memory PyTorch cached but no longer uses as free."""
    from tlcap.runtime import batching  # noqa: PLC0415

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (10 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev=None: 50 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: 14 * 2**30)
    assert batching.free_memory("cuda:0") == (10 + 50 - 14) * 2**30
