"""Masked fine-tuning of a bfloat16 model: Adam in bfloat16 against the compensated step, float32 as reference.

At the paper's learning rate (1e-5) an Adam step is below half a bfloat16 ulp of most weights, so Adam on the
bfloat16 parameters (``precision="param"``) rounds most steps away; ``precision="compensated"`` (the default for
a half-precision model) keeps float32 moments and a rounding residual per trained entry. This script fine-tunes
the same random neuron set on GSM8K samples three ways — the float32 model, the bfloat16 model with each precision
— and reports, over the trained entries, how far each bfloat16 run's update (the weights the model uses, and the
weight plus residual) is from the float32 run's (relative L2 error), the share of trained entries whose bfloat16
weight moved, and the seconds per step of both bfloat16 steps (alternating, the minimum of ``--repeats``), in
``"located"`` mode (the trained neurons' slices) and ``"except"`` mode (every other neuron, fewer samples).

Usage::

    python benchmarks/bench_finetune_precision.py --threads 2

Writes ``benchmarks/results/bench_finetune_precision[_TAG].json``.
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


def _run(model: Any, samples: list, ns: NeuronSet, mode: str, lr: float, precision: str) -> dict[str, Any]:
    """One fine-tuning: seconds, the trained entries' update (bfloat16 weights, weight + residual), undone."""
    params, masks, _ = F.trained_params(F.neuron_params(model, ns, mode))
    before = [p.detach().float().clone() for p in params]
    steppers: list[Any] = []
    init = F._CompensatedAdam.__init__

    def keep(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        steppers.append(self)

    F._CompensatedAdam.__init__ = keep  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        edit = F.masked_finetune(model, samples, ns, mode=mode, epochs=1, lr=lr, precision=precision,  # type: ignore[arg-type]
                                 progress=False)
        seconds = time.perf_counter() - t0
    finally:
        F._CompensatedAdam.__init__ = init  # type: ignore[method-assign]
    used, exact = [], []
    for k, p in enumerate(params):
        sel = masks[id(p)].expand_as(p)
        w = p.detach().float()
        used.append((w - before[k])[sel])
        if steppers:
            st = steppers[k]
            pair = st._read().float() + st.residual.float()
            full = pair if st.idx is None else w.index_copy(st.dim, st.idx, pair)
            exact.append((full - before[k])[sel])
    edit.undo()
    return {"seconds": seconds, "used": torch.cat(used), "exact": torch.cat(exact) if exact else None}


def compare(model32: Any, model16: Any, mode: str, n_samples: int, n_neurons: int, lr: float,
            repeats: int) -> dict[str, Any]:
    """Float32 reference, then the two bfloat16 precisions alternating (module docstring)."""
    samples = load_task("gsm8k", split="train", n=n_samples, seed=0)
    shape = (model32.n_layers, model32.d_mlp)
    g = torch.Generator().manual_seed(0)
    flat = torch.randperm(shape[0] * shape[1], generator=g)[:n_neurons].tolist()
    ns = NeuronSet(tuple(sorted((i // shape[1], i % shape[1]) for i in flat)), shape=shape)
    ref = _run(model32, samples, ns, mode, lr, "param")["used"]
    out: dict[str, Any] = {"mode": mode, "samples": n_samples, "neurons": n_neurons, "lr": lr,
                           "trained_entries": int(ref.numel())}
    runs: dict[str, list[dict[str, Any]]] = {"param": [], "compensated": []}
    for _ in range(repeats):
        for precision in runs:
            runs[precision].append(_run(model16, samples, ns, mode, lr, precision))

    def rel(x: torch.Tensor) -> float:
        return float((x - ref).norm() / ref.norm())

    for precision, rs in runs.items():
        r = rs[-1]
        out[precision] = {"s_per_step": min(x["seconds"] for x in rs) / n_samples,
                          "update_rel_error_weights": rel(r["used"]),
                          "update_rel_error_weight_plus_residual": None if r["exact"] is None else rel(r["exact"]),
                          "moved_share": float((r["used"] != 0).float().mean())}
    out["float32_moved_share"] = float((ref != 0).float().mean())
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both modes and write the JSON (module docstring).

    Args:
        argv: Command-line arguments (``--help``).

    Returns:
        The payload written.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=16, help="located mode (except: a quarter)")
    ap.add_argument("--neurons", type=int, default=69, help="default: 0.15 %% of SmolLM2-135M's 46,080 neurons")
    ap.add_argument("--lr", type=float, default=1e-5, help="the paper's")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    m32 = load_model(args.model, device="cpu")
    m16 = load_model(args.model, device="cpu", dtype="bfloat16")
    payload = {"model": m32.name, "threads": args.threads,
               "located": compare(m32, m16, "located", args.samples, args.neurons, args.lr, args.repeats),
               "except": compare(m32, m16, "except", max(1, args.samples // 4), args.neurons, args.lr, args.repeats),
               "env": env_info()}
    path = write_json("bench_finetune_precision" + (f"_{args.tag}" if args.tag else ""), payload)
    for mode in ("located", "except"):
        r = payload[mode]
        print(f"{mode}: update error vs float32 — bf16 Adam {r['param']['update_rel_error_weights']:.3f} "
              f"(moved {r['param']['moved_share']:.1%}), compensated {r['compensated']['update_rel_error_weights']:.3f} "
              f"(weight + residual {r['compensated']['update_rel_error_weight_plus_residual']:.4f}, moved "
              f"{r['compensated']['moved_share']:.1%}); s/step {r['param']['s_per_step']:.3f} vs "
              f"{r['compensated']['s_per_step']:.3f}")
    print(path)
    return payload


if __name__ == "__main__":
    main()
