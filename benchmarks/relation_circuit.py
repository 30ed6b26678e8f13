"""A relation-level circuit on SmolLM2 for the README (issue 14): ParaRel relation, faithfulness curve, KN overlap.

1. ``dataset_circuit`` over ``--n`` facts of ``--relation`` (same-length corrupted partners,
   EAP-IG(``--steps``)), written like ``tlcap circuit --dataset`` (summary.json, faithfulness.html/png,
   circuit.dot/json) into ``--out``;
2. MLP-neuron scores over the same facts (``neuron_attribution``);
3. knowledge neurons (Dai et al., ``locate_knowledge_neurons``) of the first ``--kn-facts`` facts,
   their union = the relation's KN set; its overlap with the circuit's top neurons (all layers,
   and only the circuit's MLPs) -> ``kn_overlap.json``.

Usage: ``python benchmarks/relation_circuit.py --relation P36 --n 32 --out figures/circuit_relation``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tlcap import load_model  # noqa: E402
from tlcap.cli._common import write_outputs  # noqa: E402
from tlcap.experiments.knowledge_neurons import locate_knowledge_neurons  # noqa: E402
from tlcap.experiments.ql.facts import union_of  # noqa: E402
from tlcap.locate.circuits import load_circuit_dataset  # noqa: E402
from tlcap.locate.circuits.dataset_circuit import dataset_circuit  # noqa: E402
from tlcap.locate.circuits.export import export_circuit  # noqa: E402
from tlcap.locate.circuits.neurons import neuron_attribution, neuron_overlap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--relation", default="P36")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top-n", type=int, default=300)
    ap.add_argument("--neuron-steps", type=int, default=1, help="EAP-IG steps of the neuron scores (1 = EAP)")
    ap.add_argument("--kn-facts", type=int, default=4)
    ap.add_argument("--kn-steps", type=int, default=10)
    ap.add_argument("--known-top-k", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("figures/circuit_relation"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    m = load_model("smollm2-135m")
    ds = load_circuit_dataset("pararel", relation=args.relation, n=args.n, model=m, known_top_k=args.known_top_k)
    print(f"{ds.name}: {len(ds)} items ({ds.dropped} dropped without a same-length partner)", flush=True)
    res = dataset_circuit(m, ds, steps=args.steps, top_n=args.top_n, batch_size=8, log=print)
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs(args.out, res, figures=res.figures(), tables={"circuit_edges": res.to_frame()})
    for suffix in (".dot", ".json"):
        export_circuit(res.circuit, args.out / f"circuit{suffix}")
    print(f"circuit {res.circuit.n_edges} edges, faithfulness {res.circuit_faithfulness:.3f}, "
          f"CPR {res.curve.cpr:.3f}, CMD {res.curve.cmd:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    ns = neuron_attribution(m, ds, steps=args.neuron_steps, batch_size=8)
    kn_sets = []
    for it in ds.items[: args.kn_facts]:
        kn = locate_knowledge_neurons(m, it.prompt, it.target, steps=args.kn_steps, n_random=0, progress=False)
        kn_sets.append(kn.neurons)
        print(f"KN {it.prompt!r} -> {it.target!r}: {len(kn.neurons.neurons)} neurons", flush=True)
    rel_kn = union_of(kn_sets, (m.n_layers, m.d_mlp))
    mlp_layers = sorted({int(n[1:]) for n in res.circuit.block_nodes if n.startswith("m")})
    report = {
        "relation": args.relation, "n_items": len(ds), "edge_ig_steps": args.steps, "neuron_ig_steps": args.neuron_steps,
        "kn_facts": args.kn_facts, "kn_ig_steps": args.kn_steps,
        "kn_union_size": len(rel_kn.neurons), "circuit_mlp_layers": mlp_layers,
        "overlap_all_layers": neuron_overlap(ns, rel_kn),
        "overlap_circuit_mlps": neuron_overlap(ns, rel_kn, layers=mlp_layers) if mlp_layers else None,
        "top_neurons": ns.to_frame().head(20).values.tolist(), "seconds": time.perf_counter() - t0,
        "loadavg": os.getloadavg(),
    }
    (args.out / "kn_overlap.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "top_neurons"}, indent=1))


if __name__ == "__main__":
    main()
