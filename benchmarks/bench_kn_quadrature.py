"""Completeness error of integrated gradients vs steps, for every quadrature rule, on SmolLM2.

For each rule of :data:`tlcap.attribution.quadrature.RULES` and each size m, runs exact
all-layer IG (``method="ig"``) on known facts SmolLM2 answers (ROME's ``known_1000.json``,
first ``--facts``) and reports ``completeness_rel_error`` — Σ_l |Σ_j Attr − (P(w̄) − P(0))| /
Σ_l |P(w̄) − P(0)| — averaged over the facts. ``evals`` is the number of gradient evaluations
per layer (m; m + 1 for ``cnl``). The table in ``docs/kn.md`` comes from this script.

Usage::

    python benchmarks/bench_kn_quadrature.py               # 3 facts, m = 1, 2, 4, 8, 16, 32
    python benchmarks/bench_kn_quadrature.py --facts 2 --steps 1 2 4 8 16 --layers 0 7 14 21 29

Writes ``benchmarks/results/bench_kn_quadrature.json``.

``--auto TOL``: instead of the m grid, ``steps="auto"`` per rule (sizes doubled from 4 per layer
until the completeness error is at most TOL, up to ``--max-steps``) and reports per fact the
gradient rows needed (``evaluations``: every round's nodes plus one baseline row per layer), the
rows per layer, the largest size used and the error reached; writes
``bench_kn_quadrature_auto.json``::

    python benchmarks/bench_kn_quadrature.py --auto 0.01 --facts 3 --rules midpoint gauss_legendre trapezoid
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import env_info, print_table, write_json  # noqa: E402
from bench_kn import known_facts  # noqa: E402

from tlcap.attribution import integrated_gradients  # noqa: E402
from tlcap.attribution.quadrature import RULES  # noqa: E402
from tlcap.models import load_model  # noqa: E402


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure, print the table (rule × m), write the JSON; return the payload."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--facts", type=int, default=3)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--rules", nargs="+", default=list(RULES))
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="Layers to attribute (default all).")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--auto", type=float, default=None, help="steps='auto' at this completeness target instead")
    ap.add_argument("--max-steps", type=int, default=256)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model("smollm2-135m")
    facts = known_facts(model, args.facts)
    print(f"facts: {facts}", flush=True)
    if args.auto is not None:
        return auto(model, facts, args)
    rows = []
    for rule in args.rules:
        row: dict[str, Any] = {"rule": rule}
        for m in args.steps:
            errs = [integrated_gradients(model, p, t, steps=m, rule=rule, layers=args.layers).completeness_rel_error
                    for p, t in facts]
            row[f"m={m}"] = sum(errs) / len(errs)
            print(rule, m, [f"{e:.4f}" for e in errs], flush=True)
        rows.append(row)
    print_table(rows, floatfmt="{:.2%}")
    payload = {"env": env_info(), "facts": facts, "steps": args.steps, "layers": args.layers, "rows": rows}
    print(write_json("bench_kn_quadrature", payload))
    return payload


def auto(model: Any, facts: list, args: argparse.Namespace) -> dict[str, Any]:
    """``steps="auto"`` per rule: gradient rows needed for completeness error <= ``args.auto``."""
    rows = []
    for rule in args.rules:
        for p, t in facts:
            a = integrated_gradients(model, p, t, steps="auto", tol=args.auto, max_steps=args.max_steps, rule=rule,
                                     layers=args.layers)
            n_l = len(a.layers)
            rows.append({"rule": rule, "fact": p, "evaluations": a.meta["evaluations"],
                         "rows_per_layer": a.meta["evaluations"] / n_l / len(a.target_tokens),
                         "max_steps_used": a.steps, "completeness_rel_error": a.completeness_rel_error})
            print(rows[-1], flush=True)
    summary = []
    for rule in args.rules:
        mine = [r for r in rows if r["rule"] == rule]
        summary.append({"rule": rule, "mean evaluations": sum(r["evaluations"] for r in mine) / len(mine),
                        "mean rows/layer": sum(r["rows_per_layer"] for r in mine) / len(mine),
                        "max size": max(r["max_steps_used"] for r in mine),
                        "mean error": sum(r["completeness_rel_error"] for r in mine) / len(mine),
                        "worst error": max(r["completeness_rel_error"] for r in mine)})
    print_table(summary)
    payload = {"env": env_info(), "facts": facts, "tol": args.auto, "max_steps": args.max_steps, "layers": args.layers,
               "rows": rows, "summary": summary}
    print(write_json("bench_kn_quadrature_auto", payload))
    return payload


if __name__ == "__main__":
    main()
