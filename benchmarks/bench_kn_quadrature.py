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
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model("smollm2-135m")
    facts = known_facts(model, args.facts)
    print(f"facts: {facts}", flush=True)
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


if __name__ == "__main__":
    main()
