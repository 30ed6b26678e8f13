"""Completeness error of CNL's exact-IG dataset scoring vs quadrature rule and size, on SmolLM2 (real weights).

Issue 25 asks whether Gauss–Legendre reaches the completeness error of the paper's S = 20 (midpoint)
with fewer gradient rows on GSM8K. The GPU run (``benchmarks/gpu_goals.py``) times the rules on a
random-weight 7B shape, where the path integrand is nearly linear and every rule looks exact; the
accuracy question needs trained weights, so it is answered here, on CPU, in float32:
``completeness_rel_error`` = Σ |Σ_j Attr − ΔP| / Σ |ΔP| over the samples' answer tokens and layers
(``score_dataset(...).meta``), and ``evaluations`` = gradient rows per sample.

Usage::

    python benchmarks/bench_cnl_quadrature.py --n 4      # writes benchmarks/results/bench_cnl_quadrature.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._util import env_info  # noqa: E402
from tlcap.attribution.dataset import score_dataset  # noqa: E402
from tlcap.data.tasks import load_task  # noqa: E402
from tlcap.models import load_model  # noqa: E402
from tlcap.runtime.run_control import RunControl  # noqa: E402

GRID = (("midpoint", 20), ("midpoint", 10), ("gauss_legendre", 2), ("gauss_legendre", 4), ("gauss_legendre", 6),
        ("gauss_legendre", 8), ("gauss_legendre", 12))


def main(argv: list[str] | None = None) -> dict:
    """Score ``--n`` GSM8K training samples with each (rule, steps) of the grid; write the JSON.

    Args:
        argv: Command-line arguments (``--help``).

    Returns:
        The JSON payload (``rows``: rule, steps, completeness_rel_error, evaluations per sample, seconds).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=4, help="GSM8K training samples")
    ap.add_argument("--max-answer-tokens", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_cnl_quadrature.json")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = load_model(args.model)
    samples = load_task("gsm8k", split="train", n=args.n, seed=0)
    rows = []
    for rule, steps in GRID:
        t0 = time.perf_counter()
        res = score_dataset(model, samples, steps=steps, rule=rule, max_answer_tokens=args.max_answer_tokens,
                            run=RunControl(progress=False))
        meta = res.meta
        den = meta.get("completeness_delta") or 0.0
        row = {"rule": rule, "steps": steps, "seconds": time.perf_counter() - t0,
               "completeness_rel_error": meta.get("completeness_abs_error", 0.0) / den if den else None,
               "evaluations_per_sample": meta.get("evaluations", 0) / args.n}
        rows.append(row)
        print(json.dumps(row), flush=True)
    payload = {"model": model.name, "dtype": "float32", "n": args.n, "max_answer_tokens": args.max_answer_tokens,
               "env": env_info(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1))
    return payload


if __name__ == "__main__":
    main()
