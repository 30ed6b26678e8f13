"""Benchmark: per-fact cost of the CNL evaluation experiments and the share spent in each method.

Runs :func:`~tlcap.experiments.cnl_eval.fidelity` (KN / causal tracing / knowledge circuits on
every rewrite), :func:`~tlcap.experiments.cnl_eval.reliability` (KN interventions, ROME at every
layer, KC alone vs random circuits) and :func:`~tlcap.experiments.cnl_eval.decoupling` (KN on both
framings of a pair) on ``--n`` items of SmolLM2-135M with the commands' default settings, and
reports seconds per item and each method's share (the experiments' own stopwatches), so the next
speed-up is chosen by measurement.

Baseline (in the same process, so the ratio survives a loaded machine): one forward pass of the
model on the first fact's prompt (:func:`tlcap.metrics.probs.target_prob`, best of 5), timed
before and after each experiment; ``x_forward`` is an item's cost in such forward passes.

Usage::

    python benchmarks/bench_cnl_eval.py --n 2                 # all three experiments
    python benchmarks/bench_cnl_eval.py --n 1 --only fidelity --rome-layers 0,15,29
    python benchmarks/bench_cnl_eval.py --n 1 --facts runs/fidelity/facts.json   # skip the ParaRel draw
    python benchmarks/bench_cnl_eval.py --n 2 --checkpoints /tmp/bench_ckpt --out /tmp/bench.json  # resumable

Each experiment shows its progress bar. With ``--checkpoints DIR`` each one checkpoints in
``DIR/<experiment>`` and a rerun resumes there; the per-item costs are the experiments' own
per-item wall times (summed over resumed runs), so a resumed run reports the same costs.

Writes ``benchmarks/results/bench_cnl_eval.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._util import env_info, print_table, timed, write_json  # noqa: E402
from tlcap import load_model  # noqa: E402
from tlcap.data.comparative import comparative_pairs  # noqa: E402
from tlcap.data.rewrites import load_rewrites, rewrite_facts  # noqa: E402
from tlcap.experiments.cnl_eval import decoupling, fidelity, reliability  # noqa: E402
from tlcap.metrics.probs import target_prob  # noqa: E402
from tlcap.runtime.run_control import RunControl


def _rows(name: str, res, n: int, forward_s: float) -> list[dict]:  # noqa: ANN001
    wall = res.wall_seconds  # per-item wall times summed (resumed items included)
    total = sum(res.method_seconds.values()) or 1.0
    rows = [{"experiment": name, "method": m, "s_per_item": s / n, "share": s / total, "items": n, "wall_s": wall}
            for m, s in sorted(res.method_seconds.items(), key=lambda kv: -kv[1])]
    rows.append({"experiment": name, "method": "(all, wall)", "s_per_item": wall / n, "share": 1.0, "items": n,
                 "wall_s": wall})
    for r in rows:
        r["forward_s"], r["x_forward"] = forward_s, r["s_per_item"] / forward_s
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=2, help="facts (fidelity, reliability) and pairs (decoupling)")
    ap.add_argument("--only", default="fidelity,reliability,decoupling")
    ap.add_argument("--rome-layers", default=None, help="ROME layers to edit (default: every layer)")
    ap.add_argument("--facts", default=None, help="a facts JSON (tlcap cnl fidelity's facts.json) instead of the ParaRel draw")
    ap.add_argument("--rome-facts", type=int, default=None, help="ROME: edit only the first N facts")
    ap.add_argument("--bos", action="store_true", help="causal tracing with the BOS prepended")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--checkpoints", default=None, help="folder: checkpoint each experiment there and resume on rerun")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/bench_cnl_eval.json)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    only = args.only.split(",")
    m = load_model(args.model)
    t0 = time.perf_counter()
    facts = load_rewrites(args.facts)[:args.n] if args.facts else rewrite_facts(m, args.n, seed=0)
    t_facts = time.perf_counter() - t0
    fact = facts[0]

    def forward_s() -> float:
        return timed(lambda: target_prob(m, fact.rewrites[0], fact.target), repeats=5)[0]

    f0 = forward_s()
    rows: list[dict] = [{"experiment": "rewrite_facts", "method": "filter", "s_per_item": t_facts / args.n, "share": 1.0,
                         "items": args.n, "wall_s": t_facts, "forward_s": f0, "x_forward": t_facts / args.n / f0}]
    for name in only:
        before = forward_s()
        ck = Path(args.checkpoints) / name if args.checkpoints else None
        if name == "fidelity":
            res = fidelity(m, facts, bos=args.bos, run=RunControl(checkpoint_dir=ck))
        elif name == "reliability":
            layers = tuple(int(x) for x in args.rome_layers.split(",")) if args.rome_layers else None
            res = reliability(m, facts, rome_layers=layers, rome_facts=args.rome_facts, bos=args.bos,
                              run=RunControl(checkpoint_dir=ck))
        else:
            res = decoupling(m, comparative_pairs(args.n, seed=0), run=RunControl(checkpoint_dir=ck))
        rows += _rows(name, res, args.n, (before + forward_s()) / 2)
        print_table(rows)
        print(flush=True)
    payload = {"model": args.model, "n": args.n, "facts": args.facts, "rome_layers": args.rome_layers,
               "rome_facts": args.rome_facts, "bos": args.bos, "rows": rows, "env": env_info()}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(payload, indent=2, default=str))
        print(f"wrote {args.out}")
    else:
        write_json("bench_cnl_eval", payload)


if __name__ == "__main__":
    main()
