"""CNL erase's two GSM8K decoding paths on a real model, per dtype: do they give the same predictions and scores?

``python benchmarks/erase_paths.py --out benchmarks/results/erase_paths_smollm2_cpu.json`` runs
:func:`benchmarks.gpu_goals.erase_rows` (one item's sets per decoding step, a CPU's path, against several items'
rows in shared steps, an accelerator's) on SmolLM2-135M's real weights in float32 and bfloat16: ``--items`` GSM8K
test items × ``--sets`` neuron sets (the empty set and random sets of 0.1 % of the neurons), 96 new tokens at most.
It separates the rounding of a batch's composition from the random-weight shapes of ``gpu_goals`` (near-flat
logits): the counts of differing predictions and of differing 0/1 scores, and each set's accuracy on either path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_goals import erase_rows  # noqa: E402
from tlcap.models import load_model  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison (module docstring) and write the JSON.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        ``{dtype: erase_rows(...) without the per-row lists}``.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--items", type=int, default=20)
    ap.add_argument("--sets", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    out: dict = {"model": args.model, "device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads()}
    for name in args.dtypes.split(","):
        t0 = time.perf_counter()
        m = load_model(args.model, device=args.device, dtype=getattr(torch, name))
        r = erase_rows(m, dev, args.items, args.sets)
        out[name] = {k: v for k, v in r.items() if not k.endswith(("_predictions", "_scores"))}
        out[name]["wall_seconds"] = time.perf_counter() - t0
        print(name, json.dumps(out[name]), flush=True)
        del m
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
