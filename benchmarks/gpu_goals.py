"""Issue 25's open goals on one GPU in a short slot: ``python benchmarks/gpu_goals.py --out goals.json``.

What ``bench_gpu.py --quick`` measured on an H200 (2026-11-26) left these unmeasured or unmet; this run
measures them, most important first, each section with a time budget (``gpu_quick.Budget``):

1. ``matmul``: the measured bf16 matmul peak (the denominator of every fraction of peak);
2. Llama-2-7B shape, bf16: ``cnl_fixed_b8`` (exact IG, S = 20 midpoint, 8 GSM8K samples per call: the
   55-GPU-minute baseline), ``cnl_auto_b8`` (``steps="auto"``, Gauss–Legendre, to the completeness error
   the fixed run measured: the 20-GPU-minute goal; also with 16 and 32 samples per call), ``cnl_gl8_b8`` /
   ``cnl_gl4_b8`` (fixed Gauss–Legendre nodes at fewer rows), ``cnl_fixed_b16`` (why batch 16 was slower per sample);
   ``cnl_auto_stream_w4`` / ``cnl_auto_alone_w4``: ``steps="auto"`` on 4 windows of 8 samples per call, their
   rounds streamed (a window's refinements in the next windows' batches) against each window alone;
   ``enhance_memory``: the peak of CNL's masked fine-tuning ("w/o located") against the cost model;
3. ``gen_gsm8k_b16``: GSM8K generation one sample at a time against 16 per batch (``Model.generate_many``);
   ``erase_gsm8k_rows``: CNL erase's GSM8K generation with 25 sets on 8 items, one item's sets per decoding step
   against every item's rows in shared steps (``decode_batches``: the ``full`` plan's ``cnl.erase.gsm8k``);
   ``table2_rows`` / ``rome_rows``: QL Table 2 (2 planted facts) and a ROME sweep (8 layers, 5 steps) one weight
   edit at a time against the edits as rows of shared passes (``benchmarks/bench_weight_edit_rows.py``);
   ``finetune_slices``: CNL's "located" fine-tuning (0.15 % of the neurons, 8 GSM8K samples) with Adam on the
   trained neurons' slices against the full masked step (``benchmarks/bench_finetune_slices.py``);
   ``kn_facts_b8`` / ``kn_facts_b32``: KN exact IG over facts batched (the 30 %-of-peak goal);
   ``ql_amig_b8``: QL's AMIG over every word of 8 queries per call (eq. 18; the same goal for QL, and the
   dominant stage of the ``full`` plan);
4. ``profile_kn_facts`` / ``profile_cnl_b8``: one call under ``torch.profiler``: kernel launches, CUDA time
   against wall time, the top CUDA and CPU operators (launch-bound or kernel-bound?);
5. ``calibration`` + ``reproduce_check``: the ``reproduce`` probe at 7B and four small stages (AMIG, the dominant
   stage of the ``full`` plan, among them) predicted vs measured;
6. ``cuda_tests``: the ``cuda``-marked tests;
7. ``plateaus``: the batches ``batch_rows="auto"`` chose;
8. ``llama3_8b_shape``: every method once on a Llama-3-8B shape on an emulated 80 GB card, its peak memory
   (``benchmarks/memory_8b.py``; item 3: no OOM at 8B on an 80 GB card, bf16). ``--only llama3_8b_shape``
   runs only these (the 7B model is not loaded).

``--only cnl_fixed_b8,cnl_auto_b16`` runs those sections (after the matmul peak and the model).
Timed calls leave out the ``batch_rows="auto"`` probes that fall into them (``probe_seconds``; a
dataset pays one per context length). ``--device cpu --tiny`` runs every code path on tiny models in
a minute or two.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tlcap.attribution.staged as staged  # noqa: E402
import tlcap.runtime.batching as batching  # noqa: E402
from benchmarks import bench_finetune_slices as BF  # noqa: E402
from benchmarks import bench_gpu as bg  # noqa: E402
from benchmarks import bench_weight_edit_rows as BW  # noqa: E402
from benchmarks import memory_8b as M8  # noqa: E402
from benchmarks.gpu_quick import Budget, cuda_tests, keeps_probe_types, plateau_record, probe, repro_check  # noqa: E402
from tlcap.attribution import integrated_gradients_facts  # noqa: E402
from tlcap.attribution.dataset import score_dataset  # noqa: E402
from tlcap.data.tasks import encode_sample, load_task  # noqa: E402
from tlcap.intervene.finetune import masked_finetune  # noqa: E402
from tlcap.metrics.sets import NeuronSet  # noqa: E402
from tlcap.reproduce.probe import modelled_train_bytes  # noqa: E402
from tlcap.runtime.run_control import RunControl  # noqa: E402


def profiled(fn: Any, device: torch.device, top: int = 12) -> dict[str, Any]:
    """One call of ``fn`` under ``torch.profiler``: wall time, summed device-kernel time, launches, top operators.

    Args:
        fn: The call to profile (run once before, so caches and plateaus are warm).
        device: Where it runs.
        top: Operators listed per table.

    Returns:
        ``wall_s``, ``kernel_s`` (device time of the kernels), ``kernel_over_wall``, ``launches``
        (cudaLaunchKernel calls), and the ``top_device`` / ``top_cpu`` operators with self times in seconds.
    """
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    bg.sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        fn()
        bg.sync(device)
        wall = time.perf_counter() - t0
    ka = prof.key_averages()
    dev_attr = "self_device_time_total" if hasattr(ka[0], "self_device_time_total") else "self_cuda_time_total"
    # kernels only: an operator's row carries its kernels' device time too (summing every row counts them twice,
    # as the 2026-11-27 H200 JSON's kernel_s did)
    kern = sum(getattr(e, dev_attr, 0) for e in ka if getattr(e, "device_type", None) == DeviceType.CUDA) / 1e6
    launches = sum(e.count for e in ka if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel"))
    by_dev = sorted(ka, key=lambda e: getattr(e, dev_attr, 0), reverse=True)[:top]
    by_cpu = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {"wall_s": wall, "kernel_s": kern, "kernel_over_wall": kern / wall if wall else None, "launches": launches,
            "top_device": [[e.key, e.count, getattr(e, dev_attr, 0) / 1e6] for e in by_dev],
            "top_cpu": [[e.key, e.count, e.self_cpu_time_total / 1e6] for e in by_cpu]}


def auto_phases(model: Any, device: torch.device, tol: float) -> dict[str, Any]:
    """Where one ``steps="auto"`` call's wall time goes (16 GSM8K samples, 8 per window, streamed): the units'
    clean runs (``make_units``), the rounds' ``run_rows`` calls and, inside them, the staged batches' forward
    and backward passes (each timed between device synchronizations; the rest is host-side work).

    Args:
        model: The model.
        device: Where it runs.
        tol: The completeness target.

    Returns:
        Seconds and counts per phase.
    """
    import tlcap.attribution.dataset as ds
    import tlcap.attribution.grouped as grouped

    samples = load_task("gsm8k", split="train", n=16, seed=3)
    t = {"make_units": [0.0, 0], "run_rows": [0.0, 0], "batch": [0.0, 0]}

    def timed(name: str, fn: Any) -> Any:
        def wrap(*a: Any, **k: Any) -> Any:
            bg.sync(device)
            t0 = time.perf_counter()
            out = fn(*a, **k)
            bg.sync(device)
            t[name][0] += time.perf_counter() - t0
            t[name][1] += 1
            return out
        return wrap

    real = ds.make_units, grouped.run_rows, staged._Plan.batch
    ds.make_units, grouped.run_rows = timed("make_units", real[0]), timed("run_rows", real[1])
    staged._Plan.batch = timed("batch", real[2])  # type: ignore[method-assign]
    try:
        bg.sync(device)
        t0 = time.perf_counter()
        d = score_dataset(model, samples, steps="auto", rule="gauss_legendre", tol=tol, sample_batch=8,
                          run=RunControl(progress=False))
        bg.sync(device)
        wall = time.perf_counter() - t0
    finally:
        ds.make_units, grouped.run_rows, staged._Plan.batch = real  # type: ignore[method-assign]
    return {"wall_s": wall, "rows": d.meta["evaluations"], **{f"{k}_s": v[0] for k, v in t.items()},
            **{f"{k}_calls": v[1] for k, v in t.items()},
            "host_other_s": wall - t["make_units"][0] - t["run_rows"][0],
            "in_run_rows_outside_batches_s": t["run_rows"][0] - t["batch"][0]}


def enhance_memory(model: Any, device: torch.device) -> dict[str, Any]:
    """Peak memory of CNL's masked fine-tuning in its largest mode ("w/o located": every MLP neuron but one per
    layer trains) on two GSM8K samples, against the cost model's prediction of it.

    Args:
        model: The model.
        device: Where it runs.

    Returns:
        Peak and base memory (GiB), the modelled working memory, the seconds and the steps.
    """
    samples = load_task("gsm8k", split="train", n=2, seed=0)
    ns = NeuronSet(tuple((l, 0) for l in range(model.n_layers)), (model.n_layers, model.d_mlp))
    longest = max(len(p) + len(t) for p, t in (encode_sample(model, s, 16) for s in samples))
    trainable, modelled = modelled_train_bytes(model, ns, longest)
    bg.sync(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    bg.reset_peak(device)
    t0 = time.perf_counter()
    edit = masked_finetune(model, samples, ns, mode="except", epochs=1, max_answer_tokens=16, progress=False)
    bg.sync(device)
    seconds = time.perf_counter() - t0
    peak = bg.peak_gib(device)
    edit.undo()
    return {"mode": "except", "trainable": trainable, "longest_tokens": longest, "seconds": seconds,
            "steps": edit.meta["steps"], "base_gib": base / 2**30, "peak_gib": peak,
            "extra_gib": None if peak is None else peak - base / 2**30, "modelled_extra_gib": modelled / 2**30,
            "fits_80gb_card": None if peak is None else peak < 79.0}


def smoke_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on an accelerator; float32 on a CPU, where the ``--tiny`` smoke run checks the code paths (a CPU
    without bfloat16 instructions emulates them about 50x slower: 1.3 GFLOP/s on a 2-core AMD EPYC)."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def gen_batched(model: Any, device: torch.device, n: int) -> dict[str, Any]:
    """GSM8K accuracy of ``n`` samples (96 new tokens at most) generated one at a time against ``GEN_ROWS`` per batch.

    Args:
        model: The model.
        device: Where it runs.
        n: Samples.

    Returns:
        Seconds per sample of each, their ratio, and whether the predictions agree.
    """
    from unittest import mock

    from tlcap.metrics.accuracy import GEN_ROWS, task_accuracy
    from tlcap.runtime import device as runtime_device

    samples = load_task("gsm8k", split="test", n=n, seed=0)
    out: dict[str, Any] = {"samples": n, "gen_rows": GEN_ROWS}
    for name, batched in (("alone", False), ("batched", True)):
        with mock.patch.object(runtime_device, "one_pass_default", lambda m, b=batched: b):
            bg.sync(device)
            t0 = time.perf_counter()
            acc = task_accuracy(model, "gsm8k", samples)
            bg.sync(device)
            out[f"{name}_s_per_sample"] = (time.perf_counter() - t0) / n
            out[f"{name}_predictions"] = list(acc.predictions)
    out["speedup"] = out["alone_s_per_sample"] / out["batched_s_per_sample"]
    out["same_predictions"] = out["alone_predictions"] == out["batched_predictions"]
    return out


def erase_rows(model: Any, device: torch.device, n_items: int, n_sets: int) -> dict[str, Any]:
    """CNL erase's GSM8K generation (``erased_scores``, 96 new tokens at most) with ``n_sets`` random sets on
    ``n_items`` items: one item's sets per decoding step (a CPU's path) against several items' rows per step
    (``decode_batches``, the accelerator's), and the passes the cost model counts for each.

    Args:
        model: The model.
        device: Where it runs.
        n_items: GSM8K test items.
        n_sets: Neuron sets (one empty, the rest random 0.1 % of the neurons).

    Returns:
        Seconds of each path, their ratio, the counted passes, whether the predictions agree and how many differ
        (``n_differ`` of ``n_predictions``), how many 0/1 scores differ (``n_score_differ``) and each set's accuracy
        on either path.
    """
    from unittest import mock

    import tlcap.metrics.set_scores as ss
    from tlcap.data.tasks import get_task
    from tlcap.reproduce.cnl_stages import number_set_passes

    samples = load_task("gsm8k", split="test", n=n_items, seed=0)
    shape = (model.n_layers, model.d_mlp)
    base = NeuronSet.from_list([(l, i) for l in range(model.n_layers) for i in range(max(1, model.d_mlp // 1000))],
                               shape=shape)
    sets = [NeuronSet((), shape)] + [base.random_like(seed=k) for k in range(1, n_sets)]
    lens = [len(p) for _, _, p in ss.scored_items(model, get_task("gsm8k"), samples)]
    out: dict[str, Any] = {"items": n_items, "sets": n_sets, "budget_tokens": ss.decode_budget(model),
                           "passes_items_alone": number_set_passes(lens, n_sets, 96, every=n_sets),
                           "passes_items_rows": number_set_passes(lens, n_sets, 96, every=n_sets,
                                                                  budget=ss.decode_budget(model))}
    for name, rows in (("items_alone", False), ("items_rows", True)):
        with mock.patch.object(ss, "one_pass_default", lambda m, b=rows: b):
            bg.sync(device)
            t0 = time.perf_counter()
            sc = ss.erased_scores(model, "gsm8k", samples, sets)
            bg.sync(device)
            out[f"{name}_seconds"] = time.perf_counter() - t0
            out[f"{name}_tokens"] = sc.tokens
            out[f"{name}_predictions"] = [list(p) for p in sc.predictions]
            out[f"{name}_scores"] = sc.scores.tolist()
    out["speedup"] = out["items_alone_seconds"] / out["items_rows_seconds"]
    a, b = out["items_alone_predictions"], out["items_rows_predictions"]
    out["same_predictions"] = a == b
    out["n_differ"] = sum(u != v for x, y in zip(a, b) for u, v in zip(x, y))
    out["n_predictions"] = sum(len(x) for x in a)
    sa, sb = out["items_alone_scores"], out["items_rows_scores"]
    out["n_score_differ"] = sum(u != v for x, y in zip(sa, sb) for u, v in zip(x, y))  # what the accuracies see
    out["accuracy_alone"], out["accuracy_rows"] = ([sum(r) / len(r) for r in sc_] for sc_ in (sa, sb))
    return out


def eight_b(q: Budget, device: torch.device, tiny: bool) -> None:
    """Section 8 (module docstring): the 8B model, then every method and path of :func:`memory_8b.calls` and the
    masked fine-tuning, each its own section, on an emulated 80 GB card (:func:`memory_8b.card_of`).

    Args:
        q: The run's budget.
        device: Where it runs.
        tiny: A tiny random Llama instead (the CPU smoke run).
    """
    held: dict[str, Any] = {}

    def load() -> dict[str, Any]:
        bg.reset_peak(device)
        t0 = time.perf_counter()
        m = held["m"] = (bg.make_llama(seed=2, n_layers=3, device=device, dtype=smoke_dtype(device)) if tiny
                         else bg.load_model("llama3-8b-shape", device=device, dtype=torch.bfloat16))
        bg.sync(device)
        return {"model": m.name, "params": sum(p.numel() for p in m.backend.parameters()), "n_layers": m.n_layers,
                "d_vocab": m.d_vocab, "n_kv_heads": m.n_kv_heads, "load_seconds": time.perf_counter() - t0,
                "weights_gib": bg.peak_gib(device)}

    q.run((M8.KEY, "model"), load, 90, 30)
    if "m" not in held:
        return
    m = held["m"]
    with M8.card_of(device) as cap:
        q.rep.payload.setdefault(M8.KEY, {})["card_gib"] = cap
        for name, fn in M8.calls(m).items():
            q.run((M8.KEY, name), lambda fn=fn: M8.peak_of(fn, device), 90, 20)
        q.run((M8.KEY, "enhance_memory"), lambda: enhance_memory(m, device), 90, 20)


@keeps_probe_types
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the goal sections (module docstring) and write the JSON after each.

    Args:
        argv: Command-line arguments (``--help``).

    Returns:
        The JSON payload.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tiny", action="store_true", help="tiny random Llama (CPU smoke run)")
    ap.add_argument("--max-wall", type=float, default=330.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cap", type=float, default=12.0, help="seconds of timed calls per section")
    ap.add_argument("--only", default="", help="comma list of sections to run (matmul and the model always run); "
                    "default: all")
    ap.add_argument("--tol", type=float, default=None,
                    help="completeness target of the cnl_auto sections (default: the error cnl_fixed_b8 measured)")
    args = ap.parse_args(argv)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    device = bg.resolve_device(args.device)
    if device.type == "cpu":
        batching.PROBE_DEVICE_TYPES = (*batching.PROBE_DEVICE_TYPES, "cpu")
    dt = smoke_dtype(device)
    payload: dict[str, Any] = {"goals": True, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                               else "cpu", "tiny": args.tiny, "dtype": str(dt).removeprefix("torch."), "env": bg.env_info(),
                               "date": time.strftime("%Y-%m-%d"),
                               "settings": {k: (v.name if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    rep = bg.Report(args.out, payload)
    q = Budget(rep, args.max_wall)
    cal_path = args.out.with_name(args.out.stem + ".calibration.json")
    cal_path.unlink(missing_ok=True)
    peak: dict[str, float | None] = {"t": None}
    holder: dict[str, Any] = {}
    key, S, cap = "llama7b_shape", args.steps, args.cap

    def matmul() -> dict[str, Any]:
        res = bg.matmul_tflops(device, 8192 if device.type == "cuda" else 256, seconds=2.0)
        peak["t"] = res["tflops"]
        return res

    def load() -> dict[str, Any]:
        bg.reset_peak(device)
        t0 = time.perf_counter()
        m = holder["m"] = (bg.make_llama(seed=1, n_layers=3, device=device, dtype=dt) if args.tiny
                           else bg.load_model("llama-7b-shape", device=device, dtype=dt))
        bg.sync(device)
        return {"model": m.name, "params": sum(p.numel() for p in m.backend.parameters()), "n_layers": m.n_layers,
                "load_seconds": time.perf_counter() - t0, "weights_gib": bg.peak_gib(device)}

    def need_model(fn: Any) -> Any:
        return lambda: fn(holder["m"]) if "m" in holder else {"skipped": "no model"}

    def section(k: tuple[str, ...], fn: Any, budget: float, need: float) -> Any:
        """``q.run`` for the sections ``--only`` names (all of them without it)."""
        return q.run(k, fn, budget, need) if not only or k[-1] in only or k[0] in only else None

    q.run(("matmul",), matmul, 15, 5)
    if not only or not only <= {M8.KEY}:  # --only llama3_8b_shape: the 8B sections alone
        q.run((key, "model"), load, 60, 10)
    fixed = section((key, "cnl_fixed_b8"), need_model(lambda m: bg.bench_cnl_batched(m, 2, S, 8, cap, peak["t"])), 70, 30)
    for k in (8, 4):  # fixed Gauss-Legendre nodes: the completeness error beside midpoint S = 20's, at fewer rows
        section((key, f"cnl_gl{k}_b8"), need_model(lambda m, k=k: bg.bench_cnl_batched(
            m, 1, k, 8, cap, peak["t"], rule="gauss_legendre")), 50, 20)
    tol = args.tol if args.tol is not None else bg.auto_tol("match", fixed)
    if tol is not None:  # the completeness S = 20 reached, at the rows auto needs; more samples per call fill the rounds
        for b, n, budget in ((8, 2, 70), (16, 1, 70), (32, 1, 90)):
            section((key, f"cnl_auto_b{b}"), need_model(lambda m, b=b, n=n: bg.bench_cnl_batched(
                m, n, "auto", b, cap, peak["t"], tol, "gauss_legendre")), budget, 30)
    if tol is not None:  # several windows per call: their rounds streamed (depth 4) against each window alone
        for name, depth, budget in (("cnl_auto_stream_w4", 4, 80), ("cnl_auto_alone_w4", 1, 90)):
            section((key, name), need_model(lambda m, depth=depth: bg.bench_cnl_batched(
                m, 1, "auto", 8, cap, peak["t"], tol, "gauss_legendre", windows=4, stream_depth=depth)), budget, 40)
    if tol is not None:  # the piece cost choose_width weighs, raised: wider pieces, fewer prefix copies
        for w in (4.0, 16.0):
            def wide(m: Any, w: float = w) -> dict[str, Any]:
                staged.PIECE_WEIGHT = w
                try:
                    return bg.bench_cnl_batched(m, 1, "auto", 8, cap, None, tol, "gauss_legendre", windows=4,
                                                stream_depth=4, count=False) | {"piece_weight": w}
                finally:
                    staged.PIECE_WEIGHT = 1.0
            section((key, f"cnl_auto_stream_w4_pw{int(w)}"), need_model(wide), 60, 30)
    if tol is not None:  # attr moved to the host after every round, as before this stop's change (the A/B)
        def host_attr(m: Any) -> dict[str, Any]:
            import tlcap.attribution.grouped as grouped
            real = grouped.run_rows
            grouped.run_rows = lambda *a, **k: (lambda r: (r[0].cpu(), r[1]))(real(*a, **k))
            try:
                return bg.bench_cnl_batched(m, 1, "auto", 8, cap, None, tol, "gauss_legendre", windows=4,
                                            stream_depth=4, count=False) | {"attr": "host after every round"}
            finally:
                grouped.run_rows = real
        section((key, "cnl_auto_stream_w4_hostattr"), need_model(host_attr), 70, 30)
        section((key, "auto_phases"), need_model(lambda m: auto_phases(m, device, tol)), 40, 15)
    section((key, "enhance_memory"), need_model(lambda m: enhance_memory(m, device)), 40, 15)
    section((key, "gen_gsm8k_b16"), need_model(lambda m: gen_batched(m, device, 16)), 90, 30)
    section((key, "erase_gsm8k_rows"), need_model(lambda m: erase_rows(m, device, 8 if not args.tiny else 3, 25)), 90, 40)
    section((key, "table2_rows"), need_model(lambda m: BW.time_table2(m, 2, 1, lambda: bg.sync(device))), 60, 20)
    section((key, "rome_rows"), need_model(lambda m: BW.time_rome(m, 8, 5, 1, lambda: bg.sync(device))), 90, 30)
    section((key, "finetune_slices"), need_model(lambda m: BF.time_located(
        m, 8, max(1, m.n_layers * m.d_mlp * 15 // 10000), 1, lambda: bg.sync(device))), 60, 20)
    section((key, "kn_facts_b8"), need_model(lambda m: bg.bench_kn_facts_batched(m, 2, S, 8, cap, peak["t"])), 40, 15)
    section((key, "kn_facts_b32"), need_model(lambda m: bg.bench_kn_facts_batched(m, 1, S, 32, cap, peak["t"])), 50, 20)
    # QL's AMIG over every word of 8 queries per call (the dominant stage of the full plan; the quick run's 52 s did
    # not reach it at 7B): seconds per query and, from one counted call, its fraction of the peak
    section((key, "ql_amig_b8"), need_model(lambda m: bg.bench_ql_amig_batched(m, 1, S, 8, cap, peak["t"])), 150, 60)

    def prof_kn(m: Any) -> dict[str, Any]:
        facts = [bg.FACTS[i % len(bg.FACTS)] for i in range(8)]
        return profiled(lambda: integrated_gradients_facts(m, facts, steps=S, fact_batch=8), device)

    def prof_cnl(m: Any) -> dict[str, Any]:
        samples = load_task("gsm8k", split="train", n=8, seed=5)
        return profiled(lambda: score_dataset(m, samples, steps=S, sample_batch=8, run=RunControl(progress=False)),
                        device)

    section((key, "profile_kn_facts"), need_model(prof_kn), 30, 10)
    section((key, "profile_cnl_b8"), need_model(prof_cnl), 40, 15)
    section((key, "cnl_fixed_b16"), need_model(lambda m: bg.bench_cnl_batched(m, 1, S, 16, cap, peak["t"])), 60, 30)
    cals: dict[str, Any] = {}
    section(("calibration", key), need_model(lambda m: probe(m, cal_path, cals)), 60, 20)
    if cal_path.exists():
        section(("reproduce_check",), need_model(lambda m: repro_check(m, cal_path, args.tiny)), 100, 45)
    section(("plateaus",), plateau_record, 5, 0)
    holder.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not only or M8.KEY in only:
        eight_b(q, device, args.tiny)
        holder.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    section(("cuda_tests",), lambda: cuda_tests(args.tiny, max(q.left() - 5, 20)), 90, 30)
    payload["wall_seconds_total"] = time.perf_counter() - q.t0
    rep.write()
    print(f"[gpu_goals] wrote {args.out} ({payload['wall_seconds_total']:.0f} s)", flush=True)
    return payload


if __name__ == "__main__":
    main()
