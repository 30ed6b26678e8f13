"""The README's knowledge-circuit table on SmolLM2.

Circuit size (block-parameter share and the older all-parameter share), rank and NLL with the
circuit alone, and the random control of the same size.

Run: ``python benchmarks/circuit_table.py`` (a few minutes on CPU).
"""
import torch

from tlcap.locate.circuits import edge_attribution, evaluate_circuits
from tlcap.models import load_model

torch.manual_seed(0)
m = load_model("smollm2-135m")
P, T, C = "The capital of France is", " Paris", "The capital of Italy is"
for steps, sizes in ((1, (100, 300, 1000)), (5, (30, 100, 300, 1000))):
    sc = edge_attribution(m, P, T, C, steps=steps)
    cs = [sc.select(top_n=n) for n in sizes]
    rnd = [c.random_like(0) for c in cs]
    evs = evaluate_circuits(m, cs + rnd)
    g = sc.graph
    print(f"graph edges {int(g.valid_mask().sum())} block params {g.block_params} total {g.total_params}")
    for n, c, ev, er in zip(sizes, cs, evs[: len(cs)], evs[len(cs):]):
        mlps = sum(1 for x in c.block_nodes if x.startswith("m"))
        heads = len(c.block_nodes) - mlps
        print(f"| {'EAP' if steps == 1 else f'EAP-IG ({steps})'} | {n} | {c.n_edges} | {c.n_nodes} | "
              f"{100 * c.param_fraction:.1f} % | {100 * c.param_fraction_with_embeddings:.1f} % | "
              f"{ev.circuit_target_rank} | {ev.circuit_nll:.2f} | {er.circuit_target_rank} |  heads={heads} mlps={mlps} "
              f"full={ev.full_nll:.2f} abl={ev.ablated_nll:.2f}", flush=True)
