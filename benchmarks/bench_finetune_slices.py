"""CNL's masked fine-tuning ("located" mode) with Adam on the trained neurons' slices against the full masked step.

``masked_finetune`` runs Adam on the trained neurons' slices when they are few (``SLICE_SHARE``): the same weights
bit for bit (tested), without reading and writing the frozen neurons' moments, gradients and weights each step.
This script times both in one process (alternating, the minimum of ``--repeats`` each) on GSM8K training samples
with a random set of ``--neurons`` neurons (the paper's located sets are 0.1-0.3 % of the neurons), and checks the
weights agree.

Usage::

    python benchmarks/bench_finetune_slices.py                  # SmolLM2-135M, 16 samples, CPU
    python benchmarks/bench_finetune_slices.py --threads 2 --tag t2

Writes ``benchmarks/results/bench_finetune_slices[_TAG].json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _util import env_info, write_json  # noqa: E402

from tlcap.data.tasks import load_task  # noqa: E402
from tlcap.intervene import finetune as F  # noqa: E402
from tlcap.metrics.sets import NeuronSet  # noqa: E402
from tlcap.models import load_model  # noqa: E402


def time_located(model: Any, n_samples: int, n_neurons: int, repeats: int, sync: Any = lambda: None) -> dict[str, Any]:
    """``masked_finetune`` of ``n_neurons`` random neurons on ``n_samples`` GSM8K samples: slices against full.

    Args:
        model: The model.
        n_samples: Training samples (one epoch, one sample per step).
        n_neurons: Neurons trained (a seeded random set).
        repeats: Alternating runs of each path (the minimum is reported).
        sync: Waits for the device.

    Returns:
        Seconds of each run, the speedup of the minima, and whether the trained weights are equal.
    """
    samples = load_task("gsm8k", split="train", n=n_samples, seed=0)
    shape = (model.n_layers, model.d_mlp)
    g = torch.Generator().manual_seed(0)
    flat = torch.randperm(shape[0] * shape[1], generator=g)[:n_neurons].tolist()
    ns = NeuronSet(tuple(sorted((i // shape[1], i % shape[1]) for i in flat)), shape=shape)
    params = F.trained_params(F.neuron_params(model, ns))[0]
    times: dict[str, list[float]] = {"full": [], "slices": []}
    weights: dict[str, list[torch.Tensor]] = {}
    for _ in range(repeats):
        for name, share in (("full", -1.0), ("slices", F.SLICE_SHARE)):
            real, F.SLICE_SHARE = F.SLICE_SHARE, share
            try:
                sync()
                t0 = time.perf_counter()
                edit = F.masked_finetune(model, samples, ns, epochs=1, progress=False)
                sync()
                times[name].append(time.perf_counter() - t0)
            finally:
                F.SLICE_SHARE = real
            weights[name] = [p.detach().clone() for p in params]
            edit.undo()
    return {"samples": n_samples, "neurons": n_neurons, "share": n_neurons / (shape[0] * shape[1]),
            "seconds": times, "s_per_step_full": min(times["full"]) / n_samples,
            "s_per_step_slices": min(times["slices"]) / n_samples,
            "speedup": min(times["full"]) / min(times["slices"]),
            "same_weights": all(torch.equal(a, b) for a, b in zip(weights["full"], weights["slices"]))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time both and write the JSON (module docstring).

    Args:
        argv: Command-line arguments (``--help``).

    Returns:
        The payload written.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--neurons", type=int, default=69, help="default: 0.15 %% of SmolLM2-135M's 46,080 neurons")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    payload = {"model": model.name, "device": str(model.device), "threads": args.threads,
               **time_located(model, args.samples, args.neurons, args.repeats, sync), "env": env_info()}
    path = write_json("bench_finetune_slices" + (f"_{args.tag}" if args.tag else ""), payload)
    print(f"full masked step {payload['s_per_step_full']:.3f} s/step, slices {payload['s_per_step_slices']:.3f} s/step "
          f"({payload['speedup']:.2f}x), same weights {payload['same_weights']} -> {path}")
    return payload


if __name__ == "__main__":
    main()
