"""Benchmark: peak CPU memory of EAP / EAP-IG on SmolLM2 and on a random-weight ~1B Llama shape.

Method: each measurement runs in a fresh subprocess started with ``MALLOC_MMAP_THRESHOLD_=65536``
(glibc then serves every tensor-sized allocation with its own ``mmap`` and gives it back to the
OS on free, so the resident set follows the live tensors instead of keeping freed heap). A
sampler thread reads the process's current resident set (``/proc/self/statm``) every 2 ms.
The subprocess loads the model, runs one no-grad forward of the same rows (the checkpoint is
memory-mapped: its pages count once touched), reads the resident set, then runs one
:func:`tlcap.locate.circuits.edge_attribution`; ``extra_mb`` is the sampled peak minus the
resident set just before (the memory EAP adds on top of the weights). The baseline is the same
measurement of one plain forward + backward of the same metric to the input embedding, without
the edge hooks (what any gradient method costs), so ``ratio_to_grad = eap_extra / grad_extra`` says
what the per-head reader inputs and the stored reader gradients add. The script also prints the
analytic sizes of the split q/k/v inputs of one forward (``rows * pos * (n_heads + 2 n_kv_heads) *
d_model`` floats per layer) and of the stacked reader gradients (``rows * n_readers * pos * d_model``).

Mode ``eap_split`` is ``eap`` with the q/k/v readers' gradients taken at split per-head inputs
(``run_pass(split_inputs=True)``, the path before grouped readers), to compare in the same run.

Usage: ``python benchmarks/bench_eap_memory.py [--models smollm2-135m llama-1b-shape] [--steps 1 5]
[--modes grad eap eap_split]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import RESULTS_DIR, env_info  # noqa: E402

PROMPT = "Q: What is the capital of France? A: The capital of France is"
CORRUPT = "Q: What is the capital of Italy? A: The capital of Italy is"
TARGET = " Paris"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _Sampler(threading.Thread):
    """Reads the current resident set every 2 ms; ``peak`` is the largest seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = _rss_mb(), threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, _rss_mb())
            time.sleep(0.002)


def _child(model_name: str, mode: str, steps: int) -> dict:
    import torch

    from tlcap import load_model
    from tlcap.locate.circuits import EdgeGraph, edge_attribution, make_task

    torch.manual_seed(0)
    m = load_model(model_name, device="cpu")
    task = make_task(m, PROMPT, TARGET, CORRUPT)
    with torch.no_grad():  # touch every weight (safetensors are memory-mapped) and warm the kernels up
        m.forward(task.clean.expand(steps, -1))
    before = _rss_mb()
    sampler = _Sampler()
    sampler.start()
    t0 = time.perf_counter()
    if mode == "eap_split":  # the q/k/v readers' gradients at split per-head inputs (before grouped readers)
        import functools  # noqa: PLC0415

        import tlcap.locate.circuits.scoring as scoring  # noqa: PLC0415

        scoring.run_pass = functools.partial(scoring.run_pass, split_inputs=True)
    if mode.startswith("eap"):
        sc = edge_attribution(m, PROMPT, TARGET, CORRUPT, task=task, steps=steps)
        assert torch.isfinite(sc.scores).all()
    else:  # the baseline: forward + backward of the metric to the input embedding, `steps` rows
        store = {}

        def leaf(act, hook):  # noqa: ANN001, ANN202
            act = act.detach().requires_grad_(True)
            store["x"] = act
            return act

        with torch.enable_grad(), m.hooks(fwd=[(m.hook_name("resid_pre", 0), leaf)]):
            rows = task.clean.expand(steps, -1)
            metric = task.metric_rows(m.forward(rows), task.rows(steps))
            torch.autograd.grad(metric.sum(), [store["x"]])
    seconds = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    g = EdgeGraph.from_model(m)
    pos = int(task.clean.shape[1])
    split_floats = m.n_layers * steps * pos * (m.n_heads + 2 * m.n_kv_heads) * m.d_model
    grad_floats = steps * g.n_readers * pos * m.d_model
    return {"model": model_name, "mode": mode, "steps": steps, "tokens": pos, "n_params": m.parameter_count(),
            "rss_before_mb": before, "peak_rss_mb": sampler.peak, "extra_mb": sampler.peak - before,
            "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "seconds": seconds, "split_inputs_mb": split_floats * 4 / 2**20, "reader_grads_mb": grad_floats * 4 / 2**20,
            "n_layers": m.n_layers, "d_model": m.d_model, "n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads,
            "n_readers": g.n_readers, "n_upstream": g.n_upstream}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "llama-1b-shape"])
    ap.add_argument("--steps", nargs="+", type=int, default=[1, 5])
    ap.add_argument("--modes", nargs="+", default=["grad", "eap"], choices=["grad", "eap", "eap_split"])
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "MODE", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_eap_memory.json"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], args.child[1], int(args.child[2]))))
        return
    rows = []
    for name in args.models:
        for steps in args.steps:
            for mode in args.modes:
                env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
                out = subprocess.run([sys.executable, __file__, "--child", name, mode, str(steps)], capture_output=True,
                                     text=True, check=True, env=env)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["load_avg"] = os.getloadavg()
                rows.append(row)
                print(f"{name:>16} {mode:>4} steps={steps}  extra {row['extra_mb']:8.0f} MB  "
                      f"(before {row['rss_before_mb']:6.0f} MB)  {row['seconds']:6.1f} s  "
                      f"split inputs {row['split_inputs_mb']:6.0f} MB/forward, reader grads {row['reader_grads_mb']:5.0f} MB",
                      flush=True)
            if args.modes[0] == "grad" and len(args.modes) > 1:
                base = rows[-len(args.modes)]
                for eap in rows[-len(args.modes) + 1:]:
                    eap["ratio_to_grad"] = eap["extra_mb"] / max(base["extra_mb"], 1.0)
    Path(args.out).write_text(json.dumps({"method": "sampled current RSS (2 ms, /proc/self/statm) per "
                                                    "fresh subprocess with MALLOC_MMAP_THRESHOLD_=65536: peak during the "
                                                    "call minus the RSS just before", "rows": rows, "env": env_info()}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
