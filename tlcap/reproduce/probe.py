"""The calibration probe: time a few units of each kind on the actual model and machine.

It runs, on the loaded model: an IG pass (``(steps+1)·L`` rows), a forward pass over a sequence, a
short greedy generation, masked fine-tuning on two samples (two epochs, weights restored; the second epoch is
timed: the steps without the run's set-up, undo snapshots and first-step state) and a
batched many-sets pass (32 rows, each with its own neuron set; one size everywhere), and
turns each timing into seconds per FLOP of its unit (:class:`tlcap.reproduce.cost.Calibration`).
Each op runs once to warm up, then is timed :data:`PROBE_TRIALS` times; the fastest trial is the unit's time (a
one-off stall of the machine or the process slows one trial, not the probe), and how much slower the slowest was
is kept beside it (``spread``; the largest over the units in ``meta["timing_spread"]``, which the plan prints).

On an accelerator every unit but generation is timed at two sizes with the same number of passes
(IG with 5 and 63 steps, the larger in one pass; forward over 16 and 2,048 tokens; fine-tuning on two short and
two long samples), and the two timings are split into seconds per pass and seconds per FLOP
(:func:`split_pass_flop`): a small model's GPU pass costs its kernel launches whatever its size. The probe also
times a square matrix product (:func:`matmul_peak`): no unit's seconds per FLOP may fall below its inverse
(:func:`tlcap.reproduce.cost.floor_at_peak`).
Memory is CUDA's allocator there: the base is what the loaded model holds, the IG batch's working
memory its peak above that. On a CPU one size is timed (the per-pass part is 0) and memory is the
process's resident set, as before.

Example:
    >>> cal = calibrate(model)
    >>> sorted(cal.seconds_per_flop)                     # the timed kinds of work
    ['fwd_token', 'gen_token', 'ig_row', 'set_token', 'train_token']
    >>> cal.seconds_per_pass.get("ig_row", 0.0), cal.base_bytes > 0      # CPU: no per-pass part
    (0.0, True)
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from tlcap.attribution.ig import integrated_gradients
from tlcap.data.tasks import Sample, encode_sample
from tlcap.errors import InvalidConfigError
from tlcap.intervene.finetune import masked_finetune, trained_fraction
from tlcap.intervene.set_rows import SetFactors
from tlcap.metrics.set_scores import teacher_forced
from tlcap.metrics.sets import NeuronSet
from tlcap.reproduce.calibration import split_pass_flop
from tlcap.reproduce.cost import CPU_MEMORY_ROWS, Calibration, ModelShape
from tlcap.reproduce.memory import PeakMemory, rss_bytes
from tlcap.runtime.device import dtype_name

PROMPT = "The capital of France is"
TARGET = " Paris"
TEXT = ("The history of the city goes back to the Roman period, when a small settlement grew on an island in the river. "
        "Over the following centuries it became the seat of kings, a centre of learning and trade, and one of the")
ACCEL_IG_STEPS = (5, 63)
"""IG steps of the two accelerator sizes; the larger runs its ``64 · L`` rows in one pass (2,048 at 7B, about 80 % of
the measured rows/s plateau on an H200; 5 and 20 steps were both launch-bound there and fitted no per-row cost)."""
ACCEL_FWD_TOKENS = (16, 2048)
"""Tokens of the two accelerator forward sizes (capped by the context window; 16 and 128 took the same 48 ms at 7B)."""
PEAK_N = {"cpu": 1024}
"""Side of the square matrix product timed for the peak (8,192 on an accelerator)."""


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None, seconds: float = 0.2) -> float:
    """The best FLOP/s of an ``n × n`` matrix product in ``dtype`` on ``device``: ten back-to-back products per
    timing (launches amortised), timings repeated for ``seconds`` (at least one), after three warm-up products.

    Args:
        device: The device.
        dtype: The model's dtype.
        n: Side of the matrices (default :data:`PEAK_N`: 1,024 on a CPU, 8,192 on an accelerator).
        seconds: Time budget of the timings.

    Returns:
        FLOP/s (``2 n³`` per product).

    Example:
        >>> matmul_peak(torch.device("cpu"), torch.float32, n=256, seconds=0.05) > 1e8
        True
    """
    n = int(n or PEAK_N.get(device.type, 8192))
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best, t_end = float("inf"), time.perf_counter() + seconds
    while best == float("inf") or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - t0) / 10)
    return 2.0 * n ** 3 / best


PROBE_TRIALS = 3
"""Timed trials of each probe op (after one warm-up run): the fastest is the unit's time. Two H200 probes of the same
7B model, one op timed once each, once gave full plans 29 % apart (157.6 h on 2026-11-27, 203.1 h on 2026-12-04)."""


def _timed(fn: Callable[[], object], repeat: int = 1, sync: Callable[[], None] | None = None,
           trials: int = PROBE_TRIALS, after: Callable[[float], float] | None = None) -> tuple[float, float]:
    """``(fastest, slowest / fastest - 1)`` over ``trials`` timings of ``repeat`` calls of ``fn`` each (seconds per
    call), after one warm-up call; ``after(seconds)`` turns a trial's wall time into the time that counts (the
    fine-tuning probe: its second epoch's)."""
    wait = sync or (lambda: None)
    fn()  # warm-up
    wait()
    times = []
    for _ in range(max(1, trials)):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        wait()
        t = (time.perf_counter() - t0) / repeat
        times.append(after(t) if after is not None else t)
    best = min(times)
    return best, (max(times) / best - 1.0 if best > 0 else 0.0)


def modelled_train_bytes(model: Any, neurons: NeuronSet, longest: int, mode: str = "except") -> tuple[int, int]:
    """The parameters :func:`~tlcap.intervene.finetune.masked_finetune` trains in ``mode`` and the fine-tuning
    working memory the cost model gives them (:meth:`ModelShape.train_bytes`, in the model's dtype).

    Args:
        model: The model.
        neurons: The neuron set of the fine-tuning.
        longest: Tokens of the longest training sequence.
        mode: ``"located"`` or ``"except"``.

    Returns:
        ``(trainable parameters, modelled bytes above the loaded model)``.
    """
    shape = ModelShape.of(model)
    trainable = round(trained_fraction(model, neurons, mode) * shape.n_mlp_params)  # type: ignore[arg-type]
    return trainable, shape.train_bytes(trainable, longest, model.dtype.itemsize)


def calibrate(model: object, *, ig_steps: int = 3, fwd_tokens: int = 64, gen_tokens: int = 8,
              two_sizes: bool | None = None, trials: int = PROBE_TRIALS) -> Calibration:
    """Measure seconds per FLOP (and per pass) of each unit kind (module docstring).

    Args:
        model: A :class:`tlcap.models.Model` with weights (not on the ``meta`` device).
        ig_steps: IG steps of the probe on a CPU (rows = ``(ig_steps + 1) · n_layers``).
        fwd_tokens: Tokens of the forward probe on a CPU.
        gen_tokens: Tokens generated by the generation probe.
        two_sizes: Time each unit at two sizes and split per pass / per FLOP (default: on an accelerator).
        trials: Timed trials of each op; the fastest counts (:data:`PROBE_TRIALS`).

    Returns:
        A :class:`Calibration`.

    Raises:
        InvalidConfigError: the model has no weights (``meta`` device).
    """
    dev = model.device  # type: ignore[attr-defined]
    if dev.type == "meta":
        raise InvalidConfigError("a model on the meta device has shapes but no weights to probe; give a probe saved on "
                                 "the target machine (--calibration FILE)")
    two = dev.type != "cpu" if two_sizes is None else bool(two_sizes)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else None
    t_start = time.perf_counter()
    shape = ModelShape.of(model)
    L = shape.n_layers
    base = torch.cuda.memory_allocated(dev) if cuda else rss_bytes()
    meter = PeakMemory()
    probe: dict[str, dict[str, float]] = {}
    spf: dict[str, float] = {}
    spp: dict[str, float] = {}

    spreads: dict[str, list[float]] = {}

    def record(unit: str, runs: list[tuple[float, float, float]], n_units: list[float]) -> None:
        for k, ((p, f, t), n) in enumerate(zip(runs, n_units)):
            probe[unit if k == len(runs) - 1 else f"{unit}@{k}"] = {
                "units": n, "flops": f, "seconds": t, "passes": p, "spread": round(spreads[unit][k], 4)}
        if len(runs) == 2:
            spp[unit], spf[unit] = split_pass_flop(runs[0], runs[1])
        else:
            spf[unit] = runs[0][2] / runs[0][1]

    # IG rows (one pass: one answer token); the larger size's peak is the working memory of an IG batch
    ig_runs, ig_units = [], []
    ig_peak = 0
    for steps in (ACCEL_IG_STEPS if two else (ig_steps,)):
        rows = (steps + 1) * L
        meter.reset(dev)
        one_pass = {"batch_rows": rows} if two else {}  # the timed run is one pass of its rows
        s, sp = _timed(lambda steps=steps, kw=one_pass: integrated_gradients(model, PROMPT, TARGET, steps=steps, **kw),
                       sync=sync, trials=trials)
        spreads.setdefault("ig_row", []).append(sp)
        ig_peak = meter.peak_bytes() - base
        ig_runs.append((1.0, rows * shape.ig_row_flops(), s))
        ig_units.append(rows)
    record("ig_row", ig_runs, ig_units)

    fwd_runs, fwd_units = [], []
    for n_tok in (ACCEL_FWD_TOKENS if two else (fwd_tokens,)):
        n_tok = min(n_tok, int(model.n_ctx))  # type: ignore[attr-defined]
        ids = model.encode(" ".join([TEXT] * (4 + n_tok // 40)), prepend_bos=False, max_tokens=n_tok, check_length=False)
        toks = torch.tensor([ids], device=dev)
        n = len(ids)
        with torch.no_grad():
            s, sp = _timed(lambda toks=toks: model.logits(toks), repeat=2, sync=sync, trials=trials)
        spreads.setdefault("fwd_token", []).append(sp)
        fwd_runs.append((1.0, n * shape.fwd_token_flops(n / 2), s))
        fwd_units.append(n)
    record("fwd_token", fwd_runs, fwd_units)

    p_ids = model.encode(PROMPT)
    s, sp = _timed(lambda: model.generate(p_ids, max_new_tokens=gen_tokens), sync=sync, trials=trials)
    spreads["gen_token"] = [sp]
    record("gen_token", [(0.0, gen_tokens * shape.fwd_token_flops(len(p_ids) + gen_tokens / 2), s)], [gen_tokens])

    neurons = NeuronSet(tuple((l, 0) for l in range(L)), (L, shape.d_mlp))
    sample_sets = [[Sample(PROMPT, TARGET, uid="probe0"), Sample(TEXT[:120], " trade", uid="probe1")]]
    if two:
        sample_sets = [[Sample(PROMPT, TARGET, uid=f"probe{i}") for i in range(2)],
                       [Sample(TEXT, " city", uid=f"probe{i + 2}") for i in range(2)]]
    tr_runs, tr_units = [], []
    train_peak, longest = 0, 0
    for samples in sample_sets:
        enc = [encode_sample(model, x, 16) for x in samples]
        ntok = sum(len(p) + len(t) for p, t in enc)
        longest = max(len(p) + len(t) for p, t in enc)

        stamps: list[float] = []

        def tune(samples: list[Sample] = samples, stamps: list[float] = stamps) -> None:
            stamps.clear()

            def stamp(_: int) -> None:
                if sync is not None:
                    sync()
                stamps.append(time.perf_counter())

            masked_finetune(model, samples, neurons, mode="except", epochs=2, on_epoch=stamp, progress=False).undo()

        meter.reset(dev)
        trial_times: list[tuple[float, float]] = []  # (second epoch, whole run) of each trial

        def second_epoch(total: float, stamps: list[float] = stamps, out: list = trial_times) -> float:
            out.append((stamps[1] - stamps[0], total))  # the steps alone (the stage runs thousands per set-up)
            return out[-1][0]

        s, sp = _timed(tune, sync=sync, trials=trials, after=second_epoch)
        spreads.setdefault("train_token", []).append(sp)
        train_setup = max(0.0, min(trial_times)[1] - 2 * s)  # the fastest trial's set-up
        train_peak = meter.peak_bytes() - base  # the larger (last) run's
        # every MLP matrix's gradient ("except" mode); a sample's last answer token is not fed
        fed = ntok - len(samples)
        tr_runs.append((float(len(samples)), fed * shape.train_token_flops(ntok / (2 * len(samples)), shape.n_mlp_params), s))
        tr_units.append(fed)
    record("train_token", tr_runs, tr_units)

    # a batched many-sets pass (CNL erase, reliability): 4 sets x 8 sequences of the text, each row its own set
    sets = [NeuronSet(tuple((l, (37 * k + j) % shape.d_mlp) for l in range(shape.n_layers) for j in range(8)),
                      (shape.n_layers, shape.d_mlp))
            for k in range(4)]
    plan = SetFactors.of(model, sets, 0.0)
    seqs = [ids[i:] + ids[:i] for i in range(1, 9)]  # no shared prefix: every row runs every token
    state: dict[str, int] = {}

    def many_sets() -> None:
        _, state["tokens"] = teacher_forced(model, plan, seqs, [[len(q) - 1] for q in seqs], lambda lg, i: lg[:, 0, 0])

    s, sp = _timed(many_sets, sync=sync, trials=trials)
    spreads["set_token"] = [sp]
    st = state["tokens"]
    record("set_token", [(1.0, st * shape.set_token_flops(n / 2) + len(sets) * len(seqs) * shape.unembed_flops(), s)], [st])


    modelled = (ig_units[-1] if two else min(ig_units[-1], CPU_MEMORY_ROWS)) * shape.ig_row_bytes()  # two sizes: one pass of all
    scale = max(ig_peak, 0) / modelled if modelled and ig_peak > 0 else 1.0
    t_modelled = modelled_train_bytes(model, neurons, longest)[1]
    train_scale = train_peak / t_modelled if cuda and t_modelled and train_peak > 0 else None  # a CPU's RSS: too coarse
    if cuda:
        where = f"cuda ({torch.cuda.get_device_name(dev)})"
    elif dev.type == "cpu":
        where = f"cpu ({torch.get_num_threads()} threads)"
    else:
        where = dev.type
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "torch": torch.__version__,
            "ig_peak_bytes": int(ig_peak), "train_peak_bytes": int(train_peak), "two_sizes": two,
            "train_setup_seconds": round(train_setup, 4), "trials": max(1, trials),
            "timing_spread": round(max(max(v) for v in spreads.values()), 4)}
    if cuda:  # what a pass may hold: the rows that fit the card (tlcap.reproduce.cost.memory_rows)
        meta["device_bytes"] = int(torch.cuda.get_device_properties(dev).total_memory)
    peak = matmul_peak(dev, model.dtype)  # type: ignore[attr-defined]
    return Calibration(spf, int(base), scale, probe, where, load, time.perf_counter() - t_start, spp,
                       str(getattr(model, "name", "")), shape.dims(), dtype_name(model.dtype), meta,  # type: ignore[attr-defined]
                       train_scale, peak)


__all__ = ["PROBE_TRIALS", "calibrate", "matmul_peak", "modelled_train_bytes", "split_pass_flop"]
