"""Benchmark: facts per minute of the QL consistency analysis on SmolLM2 for IG, SIG and AMIG.

Each method localizes every neighbor query of the same facts (the expensive step; CS1/CS2 and
the split cost nothing). The baseline is Dai's IG measured in the same run; the table gives each
method's seconds per fact, facts per minute and its cost relative to IG.

Usage:
    python benchmarks/bench_ql.py --quick          # 2 facts × 2 queries, 5 steps
    python benchmarks/bench_ql.py --n-facts 6 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--relations", default="P36,P103")
    ap.add_argument("--n-facts", type=int, default=4)
    ap.add_argument("--max-queries", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--methods", default="ig,sig,amig")
    ap.add_argument("--quick", action="store_true", help="2 facts, 2 queries, 5 steps")
    args = ap.parse_args()
    if args.quick:
        args.n_facts, args.max_queries, args.steps = 2, 2, 5

    import torch

    import tlcap
    from tlcap.data.pararel import load_pararel
    from tlcap.experiments import ql

    torch.manual_seed(0)
    model = tlcap.load_model(args.model)
    facts = load_pararel(None, args.relations.split(","), args.n_facts, model, known_top_k=10, max_queries=args.max_queries)
    n_q = sum(len(f.queries) for f in facts)
    prompt_tokens = sum(len(model.encode(q)) for f in facts for q in f.queries) / n_q
    rows = []
    locs = {}
    for method in args.methods.split(","):
        t0 = time.perf_counter()
        locs[method] = ql.localize_facts(model, facts, method, steps=args.steps, progress=False)
        dt = time.perf_counter() - t0
        rows.append({"method": method, "seconds": dt, "sec_per_fact": dt / len(facts), "sec_per_query": dt / n_q,
                     "facts_per_min": 60 * len(facts) / dt})
    t0 = time.perf_counter()
    cons = ql.consistency_analysis(locs)
    t_cons = time.perf_counter() - t0
    base = next((r for r in rows if r["method"] == "ig"), rows[0])
    for r in rows:
        r["cost_vs_ig"] = r["seconds"] / base["seconds"]
    print(f"\nQL consistency on {args.model}: {len(facts)} facts, {n_q} queries (mean {prompt_tokens:.1f} tokens), "
          f"{args.steps} steps, {model.n_layers} layers, torch threads {torch.get_num_threads()}")
    print(f"{'method':8s} {'s/fact':>8s} {'s/query':>8s} {'facts/min':>10s} {'× IG':>6s}")
    for r in rows:
        print(f"{r['method']:8s} {r['sec_per_fact']:8.2f} {r['sec_per_query']:8.2f} {r['facts_per_min']:10.2f} "
              f"{r['cost_vs_ig']:6.2f}")
    print(f"CS1/CS2 + split + t-test for all methods: {t_cons * 1000:.1f} ms")
    out = Path(__file__).parent / "results" / "bench_ql.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "n_facts": len(facts), "n_queries": n_q, "steps": args.steps,
                               "mean_prompt_tokens": prompt_tokens, "quick": args.quick, "rows": rows,
                               "consistency_ms": t_cons * 1000,
                               "k2_ratio": {m: cons.stats(m)["k2_ratio"] for m in locs}}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
