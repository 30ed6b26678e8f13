"""GSM8K generation one sample at a time against ``GEN_ROWS`` samples per batch (``Model.generate_many``).

``task_accuracy`` of a number task generates its samples as rows of one batch on an accelerator
(``tlcap.runtime.device.one_pass_default``); this script times both paths in one process on any device
(alternating, the minimum of ``--repeats`` each) and checks that they predict the same numbers.

Usage::

    python benchmarks/bench_generate.py                          # SmolLM2-135M, 16 GSM8K test samples, CPU
    python benchmarks/bench_generate.py --samples 32 --threads 2 --tag t2

Writes ``benchmarks/results/bench_generate[_TAG].json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _util import env_info, write_json  # noqa: E402

from tlcap.data.tasks import load_task  # noqa: E402
from tlcap.metrics.accuracy import GEN_ROWS, task_accuracy  # noqa: E402
from tlcap.models import load_model  # noqa: E402
from tlcap.runtime import device as runtime_device  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time both paths and write the JSON (module docstring).

    Args:
        argv: Command-line arguments (``--help``).

    Returns:
        The payload written.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device)
    samples = load_task("gsm8k", split="test", n=args.samples, seed=0)
    times: dict[str, list[float]] = {"alone": [], "batched": []}
    preds: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, batched in (("alone", False), ("batched", True)):
            with mock.patch.object(runtime_device, "one_pass_default", lambda m, b=batched: b):
                t0 = time.perf_counter()
                acc = task_accuracy(model, "gsm8k", samples, max_new_tokens=args.max_new)
                times[name].append(time.perf_counter() - t0)
                preds[name] = list(acc.predictions)
    best = {k: min(v) for k, v in times.items()}
    payload = {"model": model.name, "device": str(model.device), "samples": args.samples, "max_new_tokens": args.max_new,
               "gen_rows": GEN_ROWS, "threads": args.threads, "seconds": times,
               "alone_s_per_sample": best["alone"] / args.samples, "batched_s_per_sample": best["batched"] / args.samples,
               "speedup": best["alone"] / best["batched"], "same_predictions": preds["alone"] == preds["batched"],
               "predictions": preds, "env": env_info()}
    name = "bench_generate" + (f"_{args.tag}" if args.tag else "")
    path = write_json(name, payload)
    print(f"alone {best['alone']:.1f} s, batched {best['batched']:.1f} s ({payload['speedup']:.2f}x), "
          f"same predictions: {payload['same_predictions']} -> {path}")
    return payload


if __name__ == "__main__":
    main()
