"""QL Update efficacy per ParaRel relation on SmolLM2, and why it fails where it fails (issue 24 item 11).

For each relation: facts the model answers top-1 (``--known-top-k 1``, unknown queries dropped),
their IG knowledge neurons (the ``cpu`` scale's 4 Gauss–Legendre steps), then the QL Update edit
(N_i and N_g, the first query the model answers, o' a seeded other object of the relation) with
the default rule (``activation``, size 1). Printed per relation: Update Rel and Gen with Wilson
95 % intervals (Gen pools the edited facts' neighbor queries; Wilson treats them as independent),
median ΔPPL, and the diagnosis:

- ``gap`` = top logit − logit of o' at the edited query before the edit (o is the top token:
  the query is answered), ``moved`` = gap − gap after (how far the edit brought o' towards the
  top); Rel = 1 exactly when ``moved ≥ gap``;
- the same as the write grows: ``--sizes`` of the activation rule (the added write in units of
  the KNs' own output at the query) and ``--lambdas`` (λ1 = λ2) of both rules — under the
  activation rule λ only sets δ's direction, so equal λs give the same edit whatever their size;
- the KN sets' size and layers.

The known-fact scan and each fact's localization are cached under ``--out`` (a rerun with other
edit settings reuses them); every edit's row is written to ``--out``/edits_<run>.csv.

Usage:
    python benchmarks/ql_update_relations.py --relations P178,P407,P20,P159,P740,P47,P1376,P36,P37,P30 \\
        --per-relation 6 --out runs/ql_update
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def wilson(k: int, n: int) -> str:
    from tlcap.metrics.shares import wilson_interval

    if n == 0:
        return "–"
    lo, hi = wilson_interval(k, n)
    return f"{k}/{n} = {k / n:.2f} [{lo:.2f}, {hi:.2f}]"


def gen_counts(df, fks) -> tuple[int, int]:
    """Pooled (successes, trials) of Gen over the neighbor queries the model answered (Gen · count per edit)."""
    k = n = 0
    for _, r in df.iterrows():
        if isinstance(r.gen, float) and math.isnan(r.gen):
            continue
        nb = r.n_gen
        k += round(r.gen * nb)
        n += nb
    return k, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--relations", default="P178,P407,P20,P159,P740,P47,P1376,P36,P37,P30")
    ap.add_argument("--per-relation", type=int, default=6, help="Facts per relation")
    ap.add_argument("--max-queries", type=int, default=3)
    ap.add_argument("--known-top-k", type=int, default=1)
    ap.add_argument("--max-scan", type=int, default=150, help="Facts tested per relation (known filter)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rule", default="gauss_legendre", help="IG quadrature rule")
    ap.add_argument("--sizes", default="0.5,1,2,4,8", help="Activation-rule write sizes of the diagnosis")
    ap.add_argument("--lambdas", default="2,8", help="λ1 = λ2 values of the diagnosis (both rules)")
    ap.add_argument("--ppl-max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("runs/ql_update"))
    args = ap.parse_args()

    import pandas as pd
    import torch

    import tlcap
    from tlcap.data.pararel import Fact, load_pararel, relation_objects
    from tlcap.errors import EmptyDatasetError
    from tlcap.experiments import ql
    from tlcap.intervene.update import kn_write
    from tlcap.runtime.sites import get_site

    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = tlcap.load_model(args.model)
    rels = args.relations.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    key = {k: getattr(args, k) for k in ("model", "per_relation", "max_queries", "known_top_k", "max_scan")}
    facts = []
    for r in rels:  # per relation (each gets its share), cached per relation
        fpath = args.out / f"facts_{r}.json"
        if fpath.exists() and json.loads(fpath.read_text())["key"] == key:
            got = [Fact(d["relation"], d["subject"], d["object"], tuple(d["queries"]), d["uuid"])
                   for d in json.loads(fpath.read_text())["facts"]]
        else:
            try:
                got = load_pararel(None, [r], n_facts=args.per_relation, model=model, known_top_k=args.known_top_k,
                                   known_policy="any", max_queries=args.max_queries, min_queries=2,
                                   max_scan=args.max_scan, progress=False)
            except EmptyDatasetError:
                got = []
            fpath.write_text(json.dumps({"key": key, "facts": [f.to_dict() for f in got]}))
        facts += got
    print(f"{len(facts)} facts ({time.perf_counter() - t0:.0f} s): "
          + json.dumps({r: sum(f.relation == r for f in facts) for r in rels}), flush=True)
    locs = []
    for i, f in enumerate(facts):
        cache = args.out / f"locs_{args.steps}_{args.rule}" / f"{f.relation}_{f.uuid or i}"
        if (cache / "result.json").exists():
            fk = tlcap.load_result(cache)
            if fk.fact.uuid == f.uuid and fk.queries == list(f.queries):
                locs.append(fk)
                continue
        fk = ql.localize_facts(model, [f], "ig", steps=args.steps, rule=args.rule, progress=False)[0]
        fk.save(cache)
        locs.append(fk)
    print(f"localized ({time.perf_counter() - t0:.0f} s)", flush=True)
    groups = ["all"] * len(locs)  # the edit does not depend on K_I / K_II; 2-query facts are edited too
    objs = {r: relation_objects(None, r) for r in rels}
    texts = ql.wikitext_sample(200, seed=0)
    post = [get_site("mlp_post").hook_name(l) for l in range(model.n_layers)]

    def run(name: str, **kw) -> pd.DataFrame:
        path = args.out / f"edits_{name}.csv"
        if path.exists():
            return pd.read_csv(path)
        res = ql.modification_experiment(model, locs, groups, operations=("update",), sets=("local", "global"),
                                         edit_queries=1, new_objects=objs, ppl_texts=texts,
                                         ppl_max_tokens=kw.pop("ppl_max_tokens", args.ppl_max_tokens), progress=False, **kw)
        df = res.to_frame()
        known = {fi: [int(model.last_logits(model.to_tokens(q))[0].argmax()) == model.target_ids(q, fk.target)[0]
                      for q in fk.queries] for fi, fk in enumerate(locs)}
        df["n_gen"] = [sum(k for j, k in enumerate(known[f]) if j != q) for f, q in zip(df.fact, df["query"])]
        # the KN sets: their layers and what they write at the query (‖Σ a_p W_p‖) vs the residual stream there
        info = []
        for f, q, s in zip(df.fact, df["query"], df["set"]):
            fk = locs[f]
            ns = fk.sets()[q] if s == "local" else fk.global_set()
            acts, _ = model.last_position_activations(model.to_tokens(fk.queries[q]), post)
            layers = [l for l, _ in ns.neurons]
            info.append({"mean_layer": sum(layers) / max(len(layers), 1), "max_layer": max(layers, default=-1),
                         "kn_write_norm": float(kn_write(model, ns, acts[0].float()).norm())})
        df = pd.concat([df, pd.DataFrame(info)], axis=1)
        df.to_csv(path, index=False)
        return df

    base = run("activation_1")
    print(f"default edits done ({time.perf_counter() - t0:.0f} s)", flush=True)
    print("\n== Update (activation rule, size 1: the default), per relation; N_i and N_g pooled")
    lines = []
    for r in rels + ["all"]:
        sub = base if r == "all" else base[base.relation == r]
        if not len(sub):
            lines.append(f"{r:6s} no edits ({sum(f.relation == r for f in facts)} facts answered top-1 on >= 2 queries)")
            continue
        kr, nr = int(sub.rel.sum()), len(sub)
        kg, ng = gen_counts(sub, locs)
        moved = sub.gap_new_before - sub.gap_new_after
        lines.append(f"{r:6s} facts {sub.fact.nunique():2d} edits {nr:3d}  Rel {wilson(kr, nr):28s} Gen {wilson(kg, ng):28s} "
                     f"median ΔPPL {sub.dppl.median():.3f}  gap {sub.gap_new_before.median():5.2f}  "
                     f"moved {moved.median():5.2f}  moved/gap {(moved / sub.gap_new_before).median():5.2f}  "
                     f"|N| {sub.n_neurons.median():4.0f}  layer {sub.mean_layer.median():4.1f}  "
                     f"write {sub.kn_write_norm.median():6.2f}")
    print("\n".join(lines), flush=True)

    print("\n== the write size (activation rule): share of edits that flip (Rel), median moved/gap, median ΔPPL")
    sizes = [float(x) for x in args.sizes.split(",")]
    lams = [float(x) for x in args.lambdas.split(",")]
    grid = {}
    light = dict(n_ppl_texts=2, ppl_max_tokens=64)  # the grid's ΔPPL: 2 texts × 64 tokens (indicative)
    for sz in sizes:
        grid[f"activation_size{sz:g}"] = base if sz == 1 else run(f"activation_{sz:g}", update_size=sz, **light)
    for lam in lams:
        if lam != 2:  # λ1 = λ2 = 2 is the default run
            grid[f"activation_lambda{lam:g}"] = run(f"activation_l{lam:g}", lambda1=lam, lambda2=lam, **light)
        grid[f"paper_lambda{lam:g}"] = run(f"paper_l{lam:g}", update_rule="paper", lambda1=lam, lambda2=lam, **light)
    for name, df in grid.items():
        moved = df.gap_new_before - df.gap_new_after
        per = "  ".join(f"{r} {df[df.relation == r].rel.mean():.2f}" for r in rels if (df.relation == r).any())
        print(f"{name:24s} Rel {wilson(int(df.rel.sum()), len(df)):28s} moved/gap {(moved / df.gap_new_before).median():6.2f}"
              f"  median ΔPPL {df.dppl.median():9.3f}  | {per}", flush=True)
    summary = {"n_facts": len(facts), "relations": rels, "seconds": time.perf_counter() - t0, "load": os.getloadavg()}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\ntotal {summary['seconds']:.0f} s, load {summary['load']}")


if __name__ == "__main__":
    main()
