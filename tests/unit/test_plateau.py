"""``batch_rows="auto"`` on an accelerator: the plateau probe (fake clock), its cache, and the real path on a tiny model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import tlcap.runtime.batching as batching
from tlcap.attribution import integrated_gradients
from tlcap.attribution.batched import scaled_batch
from tlcap.runtime import plateau as P


class FakeClock:
    """A clock that only moves when the fake work below says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def launch_bound(clock: FakeClock, floor_s: float = 0.01, per_row_s: float = 1e-4):
    """A batch costs max(floor, rows · per_row): launch-bound below 100 rows, compute-bound above."""
    calls: list[int] = []

    def run(b: int) -> None:
        calls.append(b)
        clock.now += max(floor_s, b * per_row_s)

    return run, calls


def test_candidates_double_up_to_the_cap():
    assert P.candidates(600) == [8, 16, 32, 64, 128, 256, 512, 600]
    assert P.candidates(64) == [8, 16, 32, 64]
    assert P.candidates(5) == [5]


def test_timed_rate_warms_up_then_times_with_the_clock():
    clock = FakeClock()
    run, calls = launch_bound(clock)
    # 50 rows cost the 0.01 s floor: 2 timed calls of 50 rows in 0.02 s = 5000 rows/s; the warm-up is not timed
    assert P.timed_rate(run, 50, clock=clock) == pytest.approx(5000.0)
    assert calls == [50, 50, 50]
    assert P.timed_rate(run, 400, clock=clock) == pytest.approx(10_000.0)  # 400 rows in 0.04 s


def test_plateau_of_a_launch_bound_device_with_a_fake_clock():
    clock = FakeClock()
    run, _ = launch_bound(clock)
    found = P.find_plateau(lambda b: P.timed_rate(run, b, clock=clock), cap=600, clock=clock)
    # rates 800, 1600, 3200, 6400, then 10 000 at 128, 256 and 512: two doublings without a 10 % gain stop it
    assert [b for b, _ in found.rates] == [8, 16, 32, 64, 128, 256, 512]
    assert [round(r) for _, r in found.rates] == [800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
    assert found.rows == 128 and not found.limited
    # 3 calls per size: 0.01 s each up to 64 rows (12 calls), then 3 x 0.0128 + 3 x 0.0256 + 3 x 0.0512
    assert found.seconds == pytest.approx(12 * 0.01 + 3 * (0.0128 + 0.0256 + 0.0512))


def test_plateau_keeps_the_smaller_batch_when_a_larger_one_is_slower():
    # CNL scoring at 7B ran slower per sample with 16 samples' rows than with 8: take the smaller one
    rates = {8: 100.0, 16: 80.0, 32: 70.0, 64: 200.0}
    found = P.find_plateau(lambda b: rates[b], cap=64)
    assert [b for b, _ in found.rates] == [8, 16, 32] and found.rows == 8


def test_plateau_within_tol_takes_the_smallest_and_stops_on_budget():
    rates = {8: 10.0, 16: 95.0, 32: 100.0, 64: 104.0, 128: 105.0}
    assert P.find_plateau(lambda b: rates[b], cap=128).rows == 16  # 95 · 1.1 >= 105
    clock = FakeClock()

    def slow(b: int) -> float:
        clock.now += 7.0
        return float(b)

    found = P.find_plateau(slow, cap=1024, budget_s=20.0, clock=clock)
    assert [b for b, _ in found.rates] == [8, 16, 32]  # 21 s after the third size


def test_plateau_limited_by_the_cap_and_by_out_of_memory():
    found = P.find_plateau(lambda b: float(b), cap=100)
    assert found.rows == 100 and found.limited and [b for b, _ in found.rates] == [8, 16, 32, 64, 100]

    def oom_above_128(b: int) -> float:
        if b > 128:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return float(b)

    found = P.find_plateau(oom_above_128, cap=4096)
    assert found.rows == 128 and [b for b, _ in found.rates][-1] == 128 and not found.limited
    assert P.find_plateau(lambda b: 1.0, cap=8).rates == ()  # nothing to choose: no measurement

    def broken(b: int) -> float:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        P.find_plateau(broken, cap=64)


def test_plateau_rows_caches_per_key_and_continues_a_limited_one(tiny_llama):
    P.clear_plateaus()
    calls: list[int] = []

    def rate(b: int) -> float:
        calls.append(b)
        return float(min(b, 40))

    try:
        assert P.plateau_rows(tiny_llama, "ig", 12, 600, rate_of=rate) == 64  # 40 · 1.1 >= 40 first at 64
        n = len(calls)
        assert P.plateau_rows(tiny_llama, "ig", 13, 600, rate_of=rate) == 64 and len(calls) == n  # same bucket (16)
        assert P.plateau_rows(tiny_llama, "ig", 12, 20, rate_of=rate) == 20  # a smaller cap is respected
        assert P.plateau_rows(tiny_llama, "trace", 12, 600, rate_of=rate) == 64 and len(calls) > n  # another kind
        key = P.plateau_key(tiny_llama, "ig", 12)
        assert key[-2:] == ("ig", 16) and P.cached_plateaus()[key].rows == 64
        # still rising at a cap of 30: cached as limited, probed again when the cap grows
        calls.clear()
        assert P.plateau_rows(tiny_llama, "ig", 100, 30, rate_of=lambda b: calls.append(b) or float(b)) == 30
        assert P.plateau_rows(tiny_llama, "ig", 100, 300, rate_of=lambda b: calls.append(b) or float(b)) == 300
        assert calls == [8, 16, 30, 32, 64, 128, 256, 300]  # continued above 30, the smaller sizes not redone
        assert P.cached_plateaus()[P.plateau_key(tiny_llama, "ig", 100)].rates[:3] == ((8, 8.0), (16, 16.0), (30, 30.0))
    finally:
        P.clear_plateaus()


def test_probe_rows_are_scaled_batch_rows(tiny_llama):
    """The probe runs IG's own rows: row r zeroes layer r·L//b's neurons after the cached prefix."""
    run = P.rows_probe(tiny_llama, "ig", 10, seed=3)
    b = 5
    got = run(b)
    ids = torch.randint(0, tiny_llama.d_vocab, (1, 16), generator=torch.Generator().manual_seed(3)).tolist()[0]
    names = [tiny_llama.hook_name("mlp_post", l) for l in range(tiny_llama.n_layers)]
    row_layer = torch.arange(b) * tiny_llama.n_layers // b
    probs, grad = scaled_batch(tiny_llama, ids, tiny_llama.prefix_cache(torch.tensor([ids[:-1]])), names, row_layer,
                               torch.zeros(b, tiny_llama.d_mlp), 0, layer_ids=list(range(tiny_llama.n_layers)))
    torch.testing.assert_close(got, probs, rtol=1e-5, atol=1e-7)
    assert grad is not None and grad.shape == (b, tiny_llama.d_mlp)
    torch.testing.assert_close(P.rows_probe(tiny_llama, "trace", 10, seed=3)(b), probs, rtol=1e-5, atol=1e-7)


def test_auto_probes_on_an_accelerator_and_equals_a_fixed_batch(tiny_llama, monkeypatch):
    """The real path (a timed probe) with the CPU counted as an accelerator: the chosen batch is a
    measured size within the fit, cached, and the result equals a fixed batch's."""
    monkeypatch.setattr(batching, "PROBE_DEVICE_TYPES", ("cpu",))
    P.clear_plateaus()
    prompt, target = "The capital of France is", " Paris"
    try:
        auto = integrated_gradients(tiny_llama, prompt, target, steps=20)
        probes = P.cached_plateaus()
        assert len(probes) == 1
        (key, found), = probes.items()
        assert key[-2] == "ig" and found.rows in [b for b, _ in found.rates]
        assert found.cap == tiny_llama.n_layers * 21  # the fit: every row of the fact (42 < the CPU cap)
        again = integrated_gradients(tiny_llama, prompt, target, steps=20)
        assert P.cached_plateaus() == probes  # no second probe
        fixed = integrated_gradients(tiny_llama, prompt, target, steps=20, batch_rows=7)
        torch.testing.assert_close(auto.scores, fixed.scores, rtol=1e-5, atol=1e-9)
        assert torch.equal(auto.scores, again.scores)
    finally:
        P.clear_plateaus()


def test_fit_is_taken_on_every_device_of_the_model():
    # 3 of 4 layers on cuda:0 hold 3/4 of each row: 10 000 B · 0.8 / 0.75 / 100 B = 106 rows; cuda:1 would take 320
    two = SimpleNamespace(device=torch.device("cuda:0"), layer_devices=[torch.device("cuda:0")] * 3 + [torch.device("cuda:1")])
    assert batching.device_shares(two) == {torch.device("cuda:0"): 0.75, torch.device("cuda:1"): 0.25}
    assert batching.auto_batch_rows(100, 10**6, max_memory=10_000, model=two) == 106
    one = SimpleNamespace(device=torch.device("cpu"), layer_devices=[torch.device("cpu")] * 2)
    assert batching.auto_batch_rows(100, 10**6, max_memory=10_000, model=one) == 80  # the CPU cap 256 is above


def test_find_plateau_continues_a_prior_probe():
    """Sizes at or below the prior's largest are not measured; the choice sees all rates."""
    seen: list[int] = []
    rates = {8: 10.0, 16: 20.0, 32: 40.0, 64: 80.0, 128: 85.0, 256: 86.0, 512: 86.0}
    found = P.find_plateau(lambda b: seen.append(b) or rates[b], cap=512, prior=((8, 10.0), (16, 20.0), (32, 40.0)))
    assert seen == [64, 128, 256]  # 128 and 256 gain < 10 % over 80: stop after two flat doublings
    assert found.rows == 64 and found.rates[:3] == ((8, 10.0), (16, 20.0), (32, 40.0))
    # a smaller cap than the prior's sizes: the choice stays within the cap
    assert P.find_plateau(lambda b: rates[b], cap=16, prior=((8, 10.0), (16, 20.0), (32, 40.0))).rows == 16
