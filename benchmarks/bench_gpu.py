"""GPU benchmark: exact-IG KN and CNL throughput, causal trace and EAP seconds, peak memory, MFU.

One call measures, on ``--device`` (default CUDA when available) and each ``--dtype``:

- ``matmul``: the device's measured dense matmul throughput (bf16 ``N×N @ N×N``, N = 8192 on a
  GPU), TFLOP/s = 2·N³ / seconds — the denominator of the achieved fractions below.
- On the SmolLM2-135M shape with random weights (``smollm2-135m-shape``; fixed-step methods cost
  the same as with the real weights), per dtype:
  ``kn``: exact IG of every MLP neuron for single facts (20 midpoint steps, all layers), samples/s;
  ``cnl``: CNL dataset scoring (:func:`tlcap.attribution.dataset.score_dataset`, exact IG,
  20 steps, ≤ 8 answer tokens) on bundled GSM8K train samples, samples/s, one sample at a time
  and (``cnl_exact_ig_batched``) with the rows of ``--cnl-batch`` samples in shared batches, and
  (``cnl_exact_ig_auto``) the same with ``steps="auto"`` (Gauss–Legendre nodes doubled until the
  completeness error reaches ``--auto-tol``, by default the error the fixed-steps section measured:
  equal completeness, fewer gradient rows); each reports its completeness error and rows per sample;
  ``trace``: causal trace of the canonical subject-first prompt (3 kinds, window 10, 10 noise
  samples), seconds per prompt; ``eap``: EAP (1 step) and EAP-IG (5 steps), seconds per prompt;
  across facts (``--facts-batch`` facts per call, their rows sharing batches): ``kn_facts_batched``
  (KN exact IG, ``integrated_gradients_facts``), ``ql_amig_batched`` (QL's AMIG over every word,
  ``amig_facts``) and ``trace_facts_batched`` (``causal_trace_facts``), facts/s with FLOPs per fact;
  ``accuracy_batched``: Emotion ``task_accuracy`` one forward call per sample against the samples as rows of
  teacher-forced passes (seconds per sample, speed-up, equal scores).
- On the Llama-2-7B shape in bf16 (``llama-7b-shape``, timing only): ``kn`` and ``cnl`` (and the
  three across-facts sections) as above on a handful of samples, with the CNL time extrapolated to GSM8K's 7,473 training samples.

Every measurement records peak GPU memory (``torch.cuda.max_memory_allocated``) and, for the
attribution runs, model FLOPs per sample counted by ``torch.utils.flop_counter.FlopCounterMode``
on one sample (2·m·n·k per matmul, forward and backward as executed — i.e. ≈ 2·params·tokens per
forward and ≈ 3× that with the backward pass, where tokens are the rows actually pushed through
each layer after prefix reuse and late expansion), and the achieved fraction of the measured
matmul throughput = FLOPs/sample × samples/s ÷ matmul FLOP/s.

Every section has a wall-clock cap (``--section-seconds``): it times whole samples until the cap
or ``--samples`` is reached and reports how many it ran. A ``batch_rows="auto"`` plateau probe
that falls into a timed call (5–9 s at 7B, once per context length per process, which a dataset
pays once) is left out of the per-sample time and reported as ``probe_seconds`` (with
``seconds_with_probes``; before 2026-11-27 it was counted in). The JSON is rewritten after every
section, so a run cut short keeps what it measured; a section that fails records its error.

``--quick`` runs the whole GPU verification in one short slot instead (``benchmarks/gpu_quick.py``:
the ``cuda`` tests, both shapes in bf16, the batched-across-facts sections, the ``reproduce``
probe saved as ``<out>.calibration.json``, a predicted-vs-measured ``reproduce`` check), within
``--max-wall`` seconds.

Usage::

    python benchmarks/bench_gpu.py --device cuda --dtype float32,bfloat16 --out gpu.json
    python benchmarks/bench_gpu.py --device cpu --tiny --out /tmp/gpu_tiny.json   # CPU smoke run
    python benchmarks/bench_gpu.py --quick --out gpu_quick.json                    # < 6 min on one H100/H200
    python benchmarks/bench_gpu.py --quick --device cpu --tiny --out /tmp/q.json    # its CPU dry run
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper

_ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def _relative_paths(text: str) -> str:
    """A traceback with the checkout's root removed from its file names (results carry no machine path)."""
    return text.replace(_ROOT, "")


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._util import env_info  # noqa: E402
from tlcap.attribution import integrated_gradients, integrated_gradients_facts  # noqa: E402
from tlcap.attribution.amig import amig_facts  # noqa: E402
from tlcap.attribution.dataset import score_dataset  # noqa: E402
from tlcap.data.tasks import load_task  # noqa: E402
from tlcap.locate.causal_trace import causal_trace, causal_trace_facts  # noqa: E402
from tlcap.locate.circuits.eap import edge_attribution  # noqa: E402
from tlcap.models import Model, load_model, make_llama, transformer_bridge_class  # noqa: E402
from tlcap.reproduce.probe import matmul_peak  # noqa: E402
from tlcap.runtime.device import dtype_name, resolve_device, resolve_dtype  # noqa: E402
from tlcap.runtime.plateau import cached_plateaus  # noqa: E402
from tlcap.runtime.run_control import RunControl  # noqa: E402

GSM8K_TRAIN = 7473
FACTS = [
    ("The capital of France is", " Paris"), ("The Eiffel Tower is located in the city of", " Paris"),
    ("The mother tongue of Danielle Darrieux is", " French"), ("Michael Jordan plays the sport of", " basketball"),
    ("The official language of Italy is", " Italian"), ("Toko Yasuda plays the", " guitar"),
]
TRACE = ("The Eiffel Tower is located in the city of", "The Eiffel Tower")
TRACE_FACTS = [  # (prompt, subject) of the facts above
    ("The capital of France is", "France"), ("The Eiffel Tower is located in the city of", "The Eiffel Tower"),
    ("The mother tongue of Danielle Darrieux is", "Danielle Darrieux"), ("Michael Jordan plays the sport of", "Michael Jordan"),
    ("The official language of Italy is", "Italy"), ("Toko Yasuda plays the", "Toko Yasuda"),
]
EAP = ("The capital of France is", " Paris", "The capital of Italy is")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def matmul_tflops(device: torch.device, n: int, seconds: float = 3.0) -> dict[str, Any]:
    """Measured bf16 ``n×n @ n×n`` throughput (TFLOP/s = 2·n³ / seconds), best of repeated runs
    (:func:`tlcap.reproduce.probe.matmul_peak`, the probe's own measurement)."""
    flops = matmul_peak(device, torch.bfloat16, n, seconds)
    return {"n": n, "dtype": "bfloat16", "seconds": 2 * n**3 / flops, "tflops": flops / 1e12,
            "formula": "2*n^3 / seconds per matmul"}


def _addmm_inplace_flops(self_shape: Any, a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
    return 2 * int(a_shape[0]) * int(a_shape[1]) * int(b_shape[1])


INPLACE_MATMULS = {torch.ops.aten.addmm_: _addmm_inplace_flops}
"""Matrix products FlopCounterMode does not count by itself: ``addmm_`` (the fused float32 read-out's gradient
product, ``tlcap.models.unembedding``; uncounted, an IG row read as 1.2 forward passes instead of 2)."""


class _MatmulFlops(TorchDispatchMode):
    """Counts the FLOPs of every operator torch's FlopCounterMode has a formula for (matrix products, attention
    kernels, convolutions) and of :data:`INPLACE_MATMULS`, as they execute, forward and backward. No module hooks
    (FlopCounterMode's module tracking breaks ``torch.autograd.grad`` with leaf inputs, which EAP uses)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.registry = {**flop_registry, **{op: shape_wrapper(f) for op, f in INPLACE_MATMULS.items()}}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        f = self.registry.get(func._overloadpacket)
        if f is not None:
            self.flops += int(f(*args, **kwargs, out_val=out))
        return out


def count_flops(fn: Callable[[], Any]) -> float:
    """Matmul FLOPs (forward and backward as executed) of one call: FlopCounterMode's formulas, in-place ``addmm_``
    too, without its module tracking (so EAP's gradients of leaf inputs run under it)."""
    with _MatmulFlops() as mode:
        fn()
    return float(mode.flops)


def run_timed(fns: list[Callable[[], Any]], device: torch.device, cap: float, warmup: bool = True) -> dict[str, Any]:
    """Time calls of ``fns`` (one per sample) until ``cap`` seconds; the first is a warm-up when ``warmup``."""
    out: dict[str, Any] = {}
    if warmup and len(fns) > 1:
        t0 = time.perf_counter()
        fns[0]()
        sync(device)
        out["warmup_seconds"] = time.perf_counter() - t0
        fns = fns[1:]
    reset_peak(device)
    times: list[float] = []
    probes_before = cached_plateaus()
    t_start = time.perf_counter()
    for fn in fns:
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - t_start > cap:
            break
    # batch_rows="auto" probes a context length once per process (6-9 s at 7B): a dataset of thousands of
    # samples pays it once, so the per-sample time leaves out the probes that fell into the timed calls
    probe_s = sum(p.seconds for k, p in cached_plateaus().items() if probes_before.get(k) is not p)
    total = max(sum(times) - probe_s, 1e-9)
    out.update(n=len(times), seconds=total, seconds_per_sample=total / len(times), samples_per_s=len(times) / total,
               probe_seconds=probe_s, seconds_with_probes=sum(times), peak_gib=peak_gib(device))
    return out


def with_flops(res: dict[str, Any], fn: Callable[[], Any], peak_tflops: float | None,
               per_call: int = 1) -> dict[str, Any]:
    """Add the counted FLOPs per sample (one call of ``fn`` scores ``per_call`` samples) and the
    achieved fraction of the matmul peak."""
    try:
        flops = count_flops(fn) / per_call
    except Exception as exc:  # noqa: BLE001 - the timing stands without the FLOP count
        res["flops_error"] = f"{type(exc).__name__}: {exc}"
        return res
    res["flops_per_sample"] = flops
    res["achieved_tflops"] = flops * res["samples_per_s"] / 1e12
    res["fraction_of_matmul_peak"] = res["achieved_tflops"] / peak_tflops if peak_tflops else None
    return res


def bench_kn(model: Model, n: int, steps: int, cap: float, peak: float | None) -> dict[str, Any]:
    facts = [FACTS[i % len(FACTS)] for i in range(n + 1)]
    fns = [lambda p=p, t=t: integrated_gradients(model, p, t, steps=steps) for p, t in facts]
    res = run_timed(fns, model.device, cap)
    return with_flops(res, fns[0], peak)


def bench_cnl(model: Model, n: int, steps: int, cap: float, peak: float | None) -> dict[str, Any]:
    samples = load_task("gsm8k", split="train", n=n + 1, seed=0)
    fns = [lambda s=s: score_dataset(model, [s], steps=steps, run=RunControl(progress=False)) for s in samples]
    res = run_timed(fns, model.device, cap)
    res = with_flops(res, fns[0], peak)
    res["gsm8k_train_hours_extrapolated"] = GSM8K_TRAIN * res["seconds_per_sample"] / 3600
    res["prompt_tokens_mean"] = sum(len(model.to_tokens(s.prompt)[0]) for s in samples[1:]) / max(1, len(samples) - 1)
    return res


def bench_cnl_batched(model: Model, n: int, steps: int | str, batch: int, cap: float, peak: float | None,
                      tol: float = 0.01, rule: str = "midpoint", windows: int = 1,
                      stream_depth: int | None = None, count: bool = True) -> dict[str, Any]:
    """``bench_cnl`` with the rows of ``batch`` samples in shared batches (``sample_batch``; staged rows).

    ``steps="auto"``: Gauss–Legendre (or ``rule``) nodes doubled per token and layer until the completeness
    error is at most ``tol``. Records the completeness error and the gradient rows per sample either way.
    ``windows``: windows of ``batch`` samples per call (``steps="auto"`` streams their rounds, ``stream_depth``
    of them in flight; 1 runs each window alone).
    """
    per_call = batch * windows
    samples = load_task("gsm8k", split="train", n=per_call * (n + 1), seed=0)
    groups = [samples[i:i + per_call] for i in range(0, len(samples), per_call)]
    kw: dict[str, Any] = {"steps": steps, "rule": rule} | ({"tol": tol} if steps == "auto" else {})
    if stream_depth is not None:
        kw["stream_depth"] = stream_depth
    done: list[Any] = []
    fns = [lambda g=g: done.append(score_dataset(model, g, sample_batch=batch, **kw,
                                                 run=RunControl(progress=False))) for g in groups]
    res = run_timed(fns, model.device, cap)
    timed = done[1:] if len(done) > 1 else done  # the warm-up's result is left out, as its time is
    res["seconds_per_sample"] /= per_call  # run_timed counts calls: one call is `per_call` samples
    res["samples_per_s"] *= per_call
    one = groups[0][:batch]  # FLOPs counted on one window (the counting pass runs the call again); count=False: not
    if count:
        res = with_flops(res, lambda: score_dataset(model, one, sample_batch=batch, **kw, run=RunControl(progress=False)),
                         peak, per_call=batch)
    err = sum(d.meta.get("completeness_abs_error", 0.0) for d in timed)
    den = sum(d.meta.get("completeness_delta", 0.0) for d in timed)
    res.update(sample_batch=batch, windows_per_call=windows, stream_depth=stream_depth, steps=steps, rule=rule,
               tol=tol if steps == "auto" else None,
               completeness_rel_error=err / den if den else None,
               evaluations_per_sample=sum(d.meta.get("evaluations", 0) for d in timed) / max(1, per_call * len(timed)),
               gsm8k_train_hours_extrapolated=GSM8K_TRAIN * res["seconds_per_sample"] / 3600)
    return res


def _per_fact(res: dict[str, Any], fn: Callable[[], Any], peak: float | None, batch: int) -> dict[str, Any]:
    """``run_timed`` counts calls: one call is ``batch`` facts; FLOPs per fact from one call."""
    res["seconds_per_sample"] /= batch
    res["samples_per_s"] *= batch
    res = with_flops(res, fn, peak, per_call=batch)
    res["facts_per_call"] = batch
    return res


def bench_kn_facts_batched(model: Model, n: int, steps: int, batch: int, cap: float, peak: float | None) -> dict[str, Any]:
    """KN exact IG of ``batch`` facts per call, their rows in shared batches (``integrated_gradients_facts``)."""
    facts = [FACTS[i % len(FACTS)] for i in range(batch * (n + 1))]
    groups = [facts[i:i + batch] for i in range(0, len(facts), batch)]
    fns = [lambda g=g: integrated_gradients_facts(model, g, steps=steps, fact_batch=batch) for g in groups]
    return _per_fact(run_timed(fns, model.device, cap), fns[0], peak, batch) | {"steps": steps, "unit": "fact"}


def bench_ql_amig_batched(model: Model, n: int, steps: int, batch: int, cap: float, peak: float | None) -> dict[str, Any]:
    """QL's AMIG over every word (eq. 18) of ``batch`` queries per call, their rows in shared batches (``amig_facts``)."""
    facts = [FACTS[i % len(FACTS)] for i in range(batch * (n + 1))]
    groups = [facts[i:i + batch] for i in range(0, len(facts), batch)]
    fns = [lambda g=g: amig_facts(model, g, steps=steps, words="all", fact_batch=batch) for g in groups]
    res = _per_fact(run_timed(fns, model.device, cap), fns[0], peak, batch)
    return res | {"steps": steps, "unit": "query", "words": "all",
                  "query_tokens_mean": sum(len(model.encode(p)) for p, _ in facts[:batch]) / batch}


def bench_trace_facts_batched(model: Model, n: int, samples: int, batch: int, cap: float,
                              peak: float | None) -> dict[str, Any]:
    """Causal traces (3 kinds, window 10, every token) of ``batch`` facts per call, cells of several facts per
    pass (``causal_trace_facts``); FLOPs are forward passes only."""
    facts = [(p, s, None) for p, s in (TRACE_FACTS[i % len(TRACE_FACTS)] for i in range(batch * (n + 1)))]
    groups = [facts[i:i + batch] for i in range(0, len(facts), batch)]
    fns = [lambda g=g: causal_trace_facts(model, g, samples=samples, fact_batch=batch, warn=False) for g in groups]
    return _per_fact(run_timed(fns, model.device, cap), fns[0], peak, batch) | {"noise_samples": samples, "unit": "fact"}


def bench_accuracy_batched(model: Model, batch: int, cap: float) -> dict[str, Any]:
    """``task_accuracy`` of ``8 · batch`` Emotion test samples: one forward call per sample (the CPU's path) against the
    samples as rows of teacher-forced passes (the accelerator's, ``erased_scores`` with one empty set); both
    timed after a warm-up, the scores compared."""
    from unittest import mock

    from tlcap.metrics.accuracy import task_accuracy
    from tlcap.runtime import device as runtime_device

    samples = load_task("emotion", split="test", n=8 * max(1, batch))
    out: dict[str, Any] = {"unit": "sample", "samples": len(samples)}
    scores: dict[str, list[float]] = {}
    for path, policy in (("per_sample", False), ("batched", True)):
        def call(path: str = path) -> None:  # the timed call's scores are the ones compared
            scores[path] = list(task_accuracy(model, "emotion", samples).scores)

        with mock.patch.object(runtime_device, "one_pass_default", lambda m, p=policy: p):
            res = run_timed([call, call], model.device, cap)
        out[path] = {"seconds_per_sample": res["seconds"] / len(samples), "peak_gib": res["peak_gib"]}
    out["speedup"] = out["per_sample"]["seconds_per_sample"] / max(out["batched"]["seconds_per_sample"], 1e-12)
    out["scores_equal"] = scores["per_sample"] == scores["batched"]
    return out


def bench_trace(model: Model, n: int, samples: int, cap: float) -> dict[str, Any]:
    prompt, subject = TRACE
    fns = [lambda: causal_trace(model, prompt, subject, samples=samples) for _ in range(n + 1)]
    return run_timed(fns, model.device, cap) | {"prompt": prompt, "noise_samples": samples}


def bench_eap(model: Model, n: int, steps: int, cap: float) -> dict[str, Any]:
    prompt, target, corrupt = EAP
    if len(model.to_tokens(prompt)[0]) != len(model.to_tokens(corrupt)[0]):
        corrupt = None  # zero ablation when the two subjects tokenize to different lengths
    fns = [lambda: edge_attribution(model, prompt, target, corrupt, steps=steps) for _ in range(n + 1)]
    return run_timed(fns, model.device, cap) | {"steps": steps, "corrupt_prompt": corrupt}


def cast_copy(model: Model, dtype: torch.dtype) -> Model:
    """The same weights in another dtype (a cast deep copy of the HF model, booted again)."""
    hf = copy.deepcopy(model.hf_model).to(dtype)
    bridge = transformer_bridge_class().boot_transformers(
        "HuggingFaceTB/SmolLM2-135M-Instruct" if model.architecture == "llama" else "gpt2", hf_model=hf,
        tokenizer=model.tokenizer, device=model.device, dtype=dtype)
    return Model(bridge, model.tokenizer, name=f"{model.name}-{dtype_name(dtype)}")


def bench_agreement(model: Model, n: int, steps: int) -> dict[str, Any]:
    """bf16 vs float32 exact IG on the same weights: IoU of the located sets, max relative score error."""
    low = cast_copy(model, torch.bfloat16)
    rows = []
    for prompt, target in FACTS[:n]:
        a = integrated_gradients(model, prompt, target, steps=steps)
        b = integrated_gradients(low, prompt, target, steps=steps)
        rows.append({"prompt": prompt, "iou_t0.2": float(a.select(threshold=0.2).iou(b.select(threshold=0.2))),
                     "iou_top50": float(a.select(threshold=None, top_k=50).iou(b.select(threshold=None, top_k=50))),
                     "max_rel_score_error": float((a.scores - b.scores).abs().max() / a.scores.abs().max()),
                     "completeness_error_fp32": a.completeness_rel_error,
                     "completeness_error_bf16": b.completeness_rel_error})
    return {"model": model.name, "steps": steps, "facts": rows,
            "min_iou_t0.2": min(r["iou_t0.2"] for r in rows),
            "max_rel_score_error": max(r["max_rel_score_error"] for r in rows)}


class Report:
    """The JSON payload, rewritten after every section."""

    def __init__(self, path: Path, payload: dict[str, Any]) -> None:
        self.path, self.payload = path, payload
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.payload, indent=1, default=str))

    def section(self, key: tuple[str, ...], fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        node = self.payload
        for k in key[:-1]:
            node = node.setdefault(k, {})
        t0 = time.perf_counter()
        print(f"[bench_gpu] {'/'.join(key)} ...", flush=True)
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - a failed section is recorded, the others still run
            res = {"error": f"{type(exc).__name__}: {exc}", "traceback": _relative_paths(traceback.format_exc()[-3000:])}
        res["wall_seconds"] = time.perf_counter() - t0
        node[key[-1]] = res
        self.write()
        print(f"[bench_gpu] {'/'.join(key)}: " + json.dumps({k: v for k, v in res.items() if k != "traceback"}, default=str),
              flush=True)
        return res


def auto_tol(asked: str, fixed: dict[str, Any] | None) -> float | None:
    """The ``tol`` of a ``steps="auto"`` section: a number, the fixed-steps section's measured completeness error
    (``"match"``: the same completeness at fewer rows, if auto needs fewer), or ``None`` (``"off"``, or nothing to match)."""
    if asked == "off":
        return None
    if asked != "match":
        return float(asked)
    err = (fixed or {}).get("completeness_rel_error")
    return min(max(float(err), 1e-4), 0.5) if err else None


def build(name: str, device: torch.device, dtype: torch.dtype, tiny: bool) -> Model:
    if tiny:  # a 2-layer GQA Llama: the same code paths at unit-test cost
        return make_llama(seed=0, device=device, dtype=dtype)
    return load_model(name, device=device, dtype=dtype)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    ap.add_argument("--dtype", default="float32,bfloat16", help="comma list of model dtypes for the SmolLM2-shape runs")
    ap.add_argument("--out", type=Path, required=True, help="JSON output path")
    ap.add_argument("--tiny", action="store_true", help="tiny random Llama instead of the real shapes (CPU smoke run)")
    ap.add_argument("--samples", type=int, default=None,
                    help="most timed samples per KN/CNL section (after one warm-up; default 20, --quick 6)")
    ap.add_argument("--big-samples", type=int, default=4, help="most timed samples per Llama-7B-shape section")
    ap.add_argument("--prompts", type=int, default=3, help="most timed prompts per trace/EAP section")
    ap.add_argument("--steps", type=int, default=20, help="IG steps")
    ap.add_argument("--cnl-batch", type=int, default=8,
                    help="samples whose rows share batches in the cnl_exact_ig_batched sections (1: skip them)")
    ap.add_argument("--auto-tol", default="match",
                    help="completeness target of the cnl_exact_ig_auto sections (steps='auto', Gauss-Legendre): a number, "
                         "'match' (the error the fixed-steps batched section measured in this run) or 'off' (skip them)")
    ap.add_argument("--trace-samples", type=int, default=10, help="noise samples of the causal trace")
    ap.add_argument("--facts-batch", type=int, default=8,
                    help="facts per call of the kn_facts_batched / ql_amig_batched / trace_facts_batched sections "
                         "(1: skip them)")
    ap.add_argument("--section-seconds", type=float, default=None,
                    help="wall-clock cap of each timed section (default 30, --quick 12)")
    ap.add_argument("--quick", action="store_true", help="the whole GPU verification in one short run (gpu_quick.py)")
    ap.add_argument("--max-wall", type=float, default=300.0, help="--quick: total wall-clock budget in seconds")
    ap.add_argument("--test-seconds", type=float, default=120.0, help="--quick: timeout of the cuda-marked tests")
    ap.add_argument("--matmul-n", type=int, default=None, help="matmul size (default 8192 on CUDA, 512 on CPU)")
    ap.add_argument("--skip-7b", action="store_true", help="skip the Llama-2-7B-shape runs")
    ap.add_argument("--agreement", type=int, default=3, help="facts of the bf16-vs-float32 IG agreement (0: skip)")
    ap.add_argument("--agreement-model", default=None,
                    help="model of the agreement check (default: the float32 SmolLM2-shape model; e.g. smollm2-135m)")
    ap.add_argument("--only-agreement", action="store_true", help="run only the agreement check")
    args = ap.parse_args(argv)
    args.samples = args.samples if args.samples is not None else (6 if args.quick else 20)
    args.section_seconds = args.section_seconds if args.section_seconds is not None else (12.0 if args.quick else 30.0)
    if args.quick:
        from benchmarks.gpu_quick import run_quick  # noqa: PLC0415 - the quick run's own module

        return run_quick(args, sys.modules[__name__])

    device = resolve_device(args.device)
    dtypes = [resolve_dtype(d) for d in args.dtype.split(",") if d.strip()]
    cap = args.section_seconds
    payload: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "device_type": device.type, "tiny": args.tiny, "env": env_info(),
        "settings": {k: (v.name if isinstance(v, Path) else v) for k, v in vars(args).items()},  # no machine paths
        "flops_note": "FLOPs counted by torch.utils.flop_counter.FlopCounterMode on one sample (matmuls, forward and "
                      "backward as executed: ~2*params*tokens per forward, ~3x that with backward); "
                      "fraction_of_matmul_peak = flops_per_sample * samples_per_s / matmul.tflops",
    }
    rep = Report(args.out, payload)
    mm = rep.section(("matmul",), lambda: matmul_tflops(device, args.matmul_n or (8192 if device.type == "cuda" else 512)))
    peak = mm.get("tflops") if mm else None
    small = "smollm2-135m-shape"
    models: dict[str, Model] = {}

    def load_small(dt: torch.dtype) -> dict[str, Any]:
        t0 = time.perf_counter()
        m = models[dtype_name(dt)] = build(small, device, dt, args.tiny)
        return {"model": m.name, "params": sum(p.numel() for p in m.backend.parameters()),
                "n_layers": m.n_layers, "d_mlp": m.d_mlp, "load_seconds": time.perf_counter() - t0}

    if args.agreement > 0 and (args.agreement_model or args.only_agreement):
        rep.section(("agreement_bf16_vs_float32",), lambda: bench_agreement(
            load_model(args.agreement_model or small, device=device), args.agreement, args.steps))
    if args.only_agreement:
        return payload
    # the headline numbers first (exact IG on both shapes), then tracing and EAP
    for dt in dtypes:
        key = dtype_name(dt)
        rep.section(("smollm2_shape", key, "model"), lambda dt=dt: load_small(dt))
        if key in models:
            m = models[key]
            rep.section(("smollm2_shape", key, "kn_exact_ig"), lambda m=m: bench_kn(m, args.samples, args.steps, cap, peak))
            rep.section(("smollm2_shape", key, "cnl_exact_ig"), lambda m=m: bench_cnl(m, args.samples, args.steps, cap, peak))
            if args.cnl_batch > 1:
                fixed = rep.section(("smollm2_shape", key, "cnl_exact_ig_batched"), lambda m=m: bench_cnl_batched(
                    m, max(1, args.samples // args.cnl_batch), args.steps, args.cnl_batch, cap, peak))
                tol = auto_tol(args.auto_tol, fixed)
                if tol is not None:
                    rep.section(("smollm2_shape", key, "cnl_exact_ig_auto"), lambda m=m, tol=tol: bench_cnl_batched(
                        m, max(1, args.samples // args.cnl_batch), "auto", args.cnl_batch, cap, peak, tol, "gauss_legendre"))
            if args.facts_batch > 1:
                fb, n_calls = args.facts_batch, max(1, args.samples // args.facts_batch)
                rep.section(("smollm2_shape", key, "kn_facts_batched"),
                            lambda m=m, n=n_calls, fb=fb: bench_kn_facts_batched(m, n, args.steps, fb, cap, peak))
                rep.section(("smollm2_shape", key, "ql_amig_batched"),
                            lambda m=m, n=n_calls, fb=fb: bench_ql_amig_batched(m, n, args.steps, fb, cap, peak))
    if args.agreement > 0 and not args.agreement_model and "float32" in models:
        rep.section(("agreement_bf16_vs_float32",), lambda: bench_agreement(models["float32"], args.agreement, args.steps))
    if not args.skip_7b:
        holder: dict[str, Model] = {}

        def load_big() -> dict[str, Any]:
            reset_peak(device)
            t0 = time.perf_counter()
            holder["m"] = build("llama-7b-shape", device, torch.bfloat16, args.tiny)
            m = holder["m"]
            sync(device)
            return {"model": m.name, "params": sum(p.numel() for p in m.backend.parameters()), "n_layers": m.n_layers,
                    "d_mlp": m.d_mlp, "load_seconds": time.perf_counter() - t0, "weights_gib": peak_gib(device)}

        rep.section(("llama7b_shape", "bfloat16", "model"), load_big)
        if "m" in holder:
            big = holder["m"]
            rep.section(("llama7b_shape", "bfloat16", "kn_exact_ig"),
                        lambda: bench_kn(big, args.big_samples, args.steps, cap, peak))
            rep.section(("llama7b_shape", "bfloat16", "cnl_exact_ig"),
                        lambda: bench_cnl(big, args.big_samples, args.steps, cap, peak))
            if args.cnl_batch > 1:
                fixed = rep.section(("llama7b_shape", "bfloat16", "cnl_exact_ig_batched"),
                                    lambda: bench_cnl_batched(big, 1, args.steps, args.cnl_batch, cap, peak))
                tol = auto_tol(args.auto_tol, fixed)
                if tol is not None:
                    rep.section(("llama7b_shape", "bfloat16", "cnl_exact_ig_auto"), lambda tol=tol: bench_cnl_batched(
                        big, 1, "auto", args.cnl_batch, cap, peak, tol, "gauss_legendre"))
            if args.facts_batch > 1:
                rep.section(("llama7b_shape", "bfloat16", "kn_facts_batched"),
                            lambda: bench_kn_facts_batched(big, 1, args.steps, args.facts_batch, cap, peak))
                rep.section(("llama7b_shape", "bfloat16", "ql_amig_batched"),
                            lambda: bench_ql_amig_batched(big, 1, args.steps, args.facts_batch, cap, peak))
                rep.section(("llama7b_shape", "bfloat16", "trace_facts_batched"),
                            lambda: bench_trace_facts_batched(big, 1, args.trace_samples, args.facts_batch, cap, peak))
            rep.section(("llama7b_shape", "bfloat16", "accuracy_batched"),
                        lambda: bench_accuracy_batched(big, args.cnl_batch, cap))
            del big
        holder.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for key, m in models.items():
        rep.section(("smollm2_shape", key, "causal_trace"), lambda m=m: bench_trace(m, args.prompts, args.trace_samples, cap))
        if args.facts_batch > 1:
            rep.section(("smollm2_shape", key, "trace_facts_batched"), lambda m=m: bench_trace_facts_batched(
                m, max(1, args.prompts // args.facts_batch), args.trace_samples, args.facts_batch, cap, peak))
        rep.section(("smollm2_shape", key, "eap"), lambda m=m: bench_eap(m, args.prompts, 1, cap))
        rep.section(("smollm2_shape", key, "eap_ig5"), lambda m=m: bench_eap(m, args.prompts, 5, cap))
    print(f"[bench_gpu] wrote {args.out}", flush=True)
    return payload


if __name__ == "__main__":
    main()
