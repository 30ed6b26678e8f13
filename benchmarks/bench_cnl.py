"""Benchmark: streamed CNL scoring on SmolLM2 — samples/s and peak memory vs dataset size.

Time should grow linearly with n (constant samples/s) and peak memory stay flat (running sums
only). Each n runs in a fresh subprocess so that its peak RSS (``ru_maxrss``) is its own; the
baseline is the smallest n measured in the same run (ratios are relative to it).

Full mode: n = 50, 100, 200 Emotion samples (answer = 1 token), exact IG (S = 20, all 30
layers) — tens of minutes on a laptop CPU. ``--quick``: n = 10, 20, 40 with ``method="joint"``
(labelled: the cheaper estimator) so the whole ladder runs in a few minutes.

    python benchmarks/bench_cnl.py --quick
    python benchmarks/bench_cnl.py --ns 50,100,200 --method ig
    python benchmarks/bench_cnl.py --ns 2,4 --method ig --tag ig-small   # exact IG cost per sample

``--compare``: exact IG on the same n samples in ONE process, today's path (midpoint, S = 20, one
sample at a time) first, then each ``rule:steps:sample_batch[:rows]`` setting (``steps`` a number or
``auto`` with ``--tol``; ``:rows`` runs the rows as batch rows, each with its own copy of the
prefix's keys/values, instead of packed as query positions, :mod:`tlcap.models.packed_rows`);
reports samples/s, the ratio to the first setting (a ratio survives machine load), the
completeness error and the gradient rows per sample:

    python benchmarks/bench_cnl.py --compare midpoint:20:1,gauss_legendre:auto:8 --n 12 --tol 0.02
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from tlcap.runtime.run_control import RunControl

ROOT = Path(__file__).resolve().parents[1]


def worker(n: int, method: str, dataset: str, steps: int, max_answer_tokens: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    import tlcap
    from tlcap.attribution.dataset import score_dataset
    from tlcap.data.tasks import load_task

    torch.manual_seed(0)
    model = tlcap.load_model("smollm2-135m")
    samples = load_task(dataset, split="train", n=n, seed=0)  # $TLCAP_DATA or the bundled copy
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    res = score_dataset(model, samples, method=method, steps=steps, max_answer_tokens=max_answer_tokens,
                        task=dataset, run=RunControl(progress=False))
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"n": n, "seconds": dt, "samples_per_s": res.n_samples / dt, "tokens": res.n_tokens,
                      "peak_rss_mb": rss, "rss_after_load_mb": rss0, "n_neurons_sigma3": len(res.select(3.0))}))


def compare(settings: str, n: int, dataset: str, tol: float, threads: int, tag: str) -> None:
    """Exact-IG settings against today's path, same samples, same process (module docstring)."""
    import torch

    torch.set_num_threads(threads)
    import tlcap
    from tlcap.attribution.dataset import score_dataset
    from tlcap.data.tasks import load_task

    model = tlcap.load_model("smollm2-135m")
    samples = load_task(dataset, split="train", n=n, seed=0)
    rows = []
    for spec in settings.split(","):
        rule, steps, sb, *layout = spec.split(":")
        st: int | str = steps if steps == "auto" else int(steps)
        model.packed_rows = layout != ["rows"]  # ":rows": the batch-row layout (each row its own prefix copy)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        res = score_dataset(model, samples, method="ig", rule=rule, steps=st, tol=tol, sample_batch=int(sb),
                            max_answer_tokens=8, task=dataset, run=RunControl(progress=False))
        dt = time.perf_counter() - t0
        rows.append({"setting": spec, "rule": rule, "steps": steps, "sample_batch": int(sb),
                     "layout": "packed" if model.packed_rows else "batch rows",
                     "tol": tol if steps == "auto" else None,
                     "n": res.n_samples, "seconds": dt, "samples_per_s": res.n_samples / dt,
                     "completeness_rel_error": res.completeness_rel_error,
                     "rows_per_sample": res.meta["evaluations"] / max(res.n_samples, 1),
                     "load_1min_before": load0, "load_1min_after": os.getloadavg()[0]})
        rows[-1]["scores"] = res.scores
        print(f"{spec}: {dt:.1f} s, {res.n_samples / dt:.3f} samples/s, "
              f"completeness {res.completeness_rel_error:.2%}", flush=True)
    base = rows[0]
    print(f"\nexact-IG CNL scoring, SmolLM2-135M, {dataset}, n={n}, {threads} thread(s), all 30 layers")
    print(f"{'setting':>28} {'seconds':>8} {'samples/s':>10} {'ratio':>6} {'completeness':>13} "
          f"{'rows/sample':>12} {'corr(scores)':>12}")
    for r in rows:
        r["ratio"] = r["samples_per_s"] / base["samples_per_s"]
        a, b = base["scores"].flatten(), r["scores"].flatten()
        r["score_corr_vs_first"] = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        print(f"{r['setting']:>28} {r['seconds']:>8.1f} {r['samples_per_s']:>10.3f} {r['ratio']:>6.2f} "
              f"{r['completeness_rel_error']:>12.2%} {r['rows_per_sample']:>12.0f} {r['score_corr_vs_first']:>12.4f}")
    for r in rows:
        del r["scores"]
    path = ROOT / "benchmarks" / "results" / (f"bench_cnl_compare-{tag}.json" if tag else "bench_cnl_compare.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"dataset": dataset, "n": n, "threads": threads, "cpu_count": os.cpu_count()}
    path.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="n = 10, 20, 40 with method=joint (cheaper estimator)")
    ap.add_argument("--ns", default=None, help="comma-separated sample counts (default 50,100,200; quick 10,20,40)")
    ap.add_argument("--method", default=None, help="ig (default), joint or grad_x_act (quick: joint)")
    ap.add_argument("--dataset", default="emotion")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-answer-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: best on a shared 2-core box)")
    ap.add_argument("--tag", default="", help="suffix of the results file (bench_cnl-TAG.json)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compare", default=None, help="rule:steps:sample_batch settings, comma-separated (first = baseline)")
    ap.add_argument("--n", type=int, default=12, help="samples of --compare")
    ap.add_argument("--tol", type=float, default=0.02, help="completeness target of steps=auto in --compare")
    a = ap.parse_args()
    if a.compare:
        compare(a.compare, a.n, a.dataset, a.tol, a.threads, a.tag)
        return
    method = a.method or ("joint" if a.quick else "ig")
    if a.worker is not None:
        worker(a.worker, method, a.dataset, a.steps, a.max_answer_tokens, a.threads)
        return
    ns = [int(x) for x in (a.ns or ("10,20,40" if a.quick else "50,100,200")).split(",")]
    rows = []
    for n in ns:
        cmd = [sys.executable, __file__, "--worker", str(n), "--method", method, "--dataset", a.dataset, "--steps", str(a.steps),
               "--max-answer-tokens", str(a.max_answer_tokens), "--threads", str(a.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"n={n} done: {rows[-1]['seconds']:.1f} s", flush=True)
    base = rows[0]
    label = " (cheaper estimator)" if method != "ig" else ""
    print(f"\nCNL streamed scoring, SmolLM2-135M, {a.dataset}, method={method}{label}, "
          f"S={a.steps}, all 30 layers, {a.threads} thread(s){'  [QUICK n ladder]' if a.quick else ''}")
    print(f"{'n':>6} {'seconds':>9} {'samples/s':>10} {'time ratio':>11} {'n ratio':>8} {'peak RSS MB':>12} {'RSS ratio':>10}")
    for r in rows:
        r["time_ratio"] = r["seconds"] / base["seconds"]
        r["n_ratio"] = r["n"] / base["n"]
        r["rss_ratio"] = r["peak_rss_mb"] / base["peak_rss_mb"]
        print(f"{r['n']:>6} {r['seconds']:>9.1f} {r['samples_per_s']:>10.3f} {r['time_ratio']:>11.2f} {r['n_ratio']:>8.1f} "
              f"{r['peak_rss_mb']:>12.0f} {r['rss_ratio']:>10.3f}")
    res_dir = ROOT / "benchmarks" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    path = res_dir / (f"bench_cnl-{a.tag}.json" if a.tag else "bench_cnl.json")
    path.write_text(json.dumps(
        {"dataset": a.dataset, "method": method, "steps": a.steps, "quick": a.quick, "threads": a.threads,
         "cpu_count": os.cpu_count(),
         "load_average_at_end": os.getloadavg(), "rows": rows},
        indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
