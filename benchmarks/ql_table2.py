"""QL Table 2 on SmolLM2: erasure and both Update rules on the same localized facts.

Localizes the facts once (IG), then runs :func:`tlcap.experiments.ql.modification_experiment`
with erasure + the default Update rule (``activation``) and with the literal rule (``paper``),
and prints the Table 2 layout of each plus the share of edited queries whose P(o') went up and
whose top-1 became o'. Only queries the model answers top-1 before the edit are edited.

Usage:
    python benchmarks/ql_table2.py --relations P36 --n-facts 6 --max-queries 2 --steps 3 --edit-queries 1
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--relations", default="P36,P103,P30")
    ap.add_argument("--n-facts", type=int, default=12)
    ap.add_argument("--max-queries", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--edit-queries", type=int, default=None, help="Edit only the first n queries of each fact")
    ap.add_argument("--max-scan", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("runs/ql_table2"))
    args = ap.parse_args()

    import torch

    import tlcap
    from tlcap.data.pararel import load_pararel, relation_objects
    from tlcap.experiments import ql

    torch.manual_seed(0)
    model = tlcap.load_model(args.model)
    rels = args.relations.split(",")
    facts = load_pararel(None, rels, n_facts=args.n_facts, model=model, known_top_k=10, max_queries=args.max_queries,
                          max_scan=args.max_scan)
    locs = ql.localize_facts(model, facts, "ig", steps=args.steps)
    groups, _ = ql.groups_for(locs)
    objs = {r: relation_objects(None, r) for r in rels}
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    for rule, ops in (("activation", ("erasure", "update")), ("paper", ("update",))):
        res = ql.modification_experiment(model, locs, groups, operations=ops, update_rule=rule, new_objects=objs,
                                           edit_queries=args.edit_queries)
        df = res.to_frame()
        up = df[df.operation == "update"]
        report[rule] = {
            "table": res.table().to_dict("records"),
            "n_update_edits": len(up),
            "share_p_new_up": float((up.p_new_after > up.p_new_before).mean()) if len(up) else None,
            "share_new_top1": float(up.rel.mean()) if len(up) else None,
            "median_dppl_update": float(up.dppl.median()) if len(up) else None,
            "median_dppl_erasure": (float(df[df.operation == "erasure"].dppl.median())
                                    if (df.operation == "erasure").any() else None),
            "skipped": res.summary()["skipped_reasons"],
        }
        df.to_csv(args.out / f"edits_{rule}.csv", index=False)
        print(f"== rule {rule}\n{res.table().to_string()}\n{json.dumps({k: v for k, v in report[rule].items() if k != 'table'})}",
              flush=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
