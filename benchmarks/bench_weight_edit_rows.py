"""Weight edits one at a time against the same edits as rows of shared passes (``SetFactors(writes=)``).

On an accelerator (``tlcap.runtime.device.one_pass_default``) QL Table 2 measures every edit of an edited query as
rows of two passes, and ``rome_sweep`` optimises and measures its layers' ROME edits as rows; a CPU keeps one weight
edit at a time. This script times both paths in one process on any device (alternating, the minimum of
``--repeats`` each) and reports how far their results differ:

- ``table2``: ``modification_experiment`` (erasure and Update of N_i and N_g) over ``--facts`` facts of three
  queries each with planted neuron sets (the timing does not depend on how the sets were found);
- ``rome``: ``rome_sweep`` of one fact over ``--layers`` layers, ``--steps`` value steps.

Usage::

    python benchmarks/bench_weight_edit_rows.py                  # SmolLM2-135M, CPU
    python benchmarks/bench_weight_edit_rows.py --threads 2 --tag t2

Writes ``benchmarks/results/bench_weight_edit_rows[_TAG].json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _util import env_info, write_json  # noqa: E402

from tlcap.data.pararel import Fact  # noqa: E402
from tlcap.experiments.ql import FactKNs, modification_experiment  # noqa: E402
from tlcap.experiments.ql.modification import wikitext_sample  # noqa: E402
from tlcap.intervene.covariance import key_covariance  # noqa: E402
from tlcap.intervene.rome import rome_sweep  # noqa: E402
from tlcap.models import load_model  # noqa: E402
from tlcap.runtime import device as runtime_device  # noqa: E402

FACTS = [
    ("P36", "France", "Paris", ["The capital of France is", "France's capital is", "The capital city of France is"]),
    ("P36", "Italy", "Rome", ["The capital of Italy is", "Italy's capital is", "The capital city of Italy is"]),
    ("P36", "Japan", "Tokyo", ["The capital of Japan is", "Japan's capital is", "The capital city of Japan is"]),
    ("P30", "Kenya", "Africa", ["Kenya is located in", "Kenya is in the continent of", "Kenya belongs to the continent of"]),
    ("P30", "Peru", "South America", ["Peru is located in", "Peru is in the continent of", "Peru belongs to"]),
    ("P30", "Norway", "Europe", ["Norway is located in", "Norway is in the continent of", "Norway belongs to"]),
]


def planted_locs(model: Any, n_facts: int, per_layer: int = 2) -> list[FactKNs]:
    """``n_facts`` facts of :data:`FACTS` with random (seeded) knowledge-neuron scores: sets of about
    ``per_layer`` neurons per layer per query, overlapping between a fact's queries."""
    g = torch.Generator().manual_seed(0)
    out = []
    for rel, subj, obj, queries in FACTS[:n_facts]:
        scores = torch.zeros(len(queries), model.n_layers, model.d_mlp)
        shared = torch.randint(0, model.d_mlp, (model.n_layers, per_layer), generator=g)
        for q in range(len(queries)):
            own = torch.randint(0, model.d_mlp, (model.n_layers, per_layer), generator=g)
            scores[q, torch.arange(model.n_layers)[:, None], shared] = 1.0
            scores[q, torch.arange(model.n_layers)[:, None], own] = 1.0
        out.append(FactKNs(scores, (0.5,) * len(queries), Fact(rel, subj, obj, tuple(queries))))
    return out


def _alternate(repeats: int, run: Any, sync: Any) -> tuple[dict[str, list[float]], dict[str, Any]]:
    times: dict[str, list[float]] = {"alone": [], "rows": []}
    out: dict[str, Any] = {}
    for _ in range(repeats):
        for name, rows in (("alone", False), ("rows", True)):
            sync()
            t0 = time.perf_counter()
            out[name] = run(rows)
            sync()
            times[name].append(time.perf_counter() - t0)
    return times, out


def time_table2(model: Any, n_facts: int, repeats: int, sync: Any = lambda: None) -> dict[str, Any]:
    """Table 2 over ``n_facts`` planted facts, one weight edit at a time against every edit of a query as rows.

    Args:
        model: The model.
        n_facts: Facts of :data:`FACTS` (at most 6).
        repeats: Alternating runs of each path (the minimum is reported).
        sync: Waits for the device (e.g. ``torch.cuda.synchronize``).

    Returns:
        Seconds of each run, the speedup of the minima, and how far the two tables differ.
    """
    locs = planted_locs(model, n_facts)
    texts = wikitext_sample(20)

    def table2(rows: bool) -> Any:
        with mock.patch.object(runtime_device, "one_pass_default", lambda m, r=rows: r):
            return modification_experiment(model, locs, ["K_I"] * len(locs), ppl_texts=texts, n_ppl_texts=3,
                                           only_known=False, edit_queries=2, progress=False)

    times, out = _alternate(repeats, table2, sync)
    pairs = list(zip(out["alone"].rows, out["rows"].rows))
    return {"facts": len(locs), "edits": len(out["alone"].rows), "seconds": times,
            "speedup": min(times["alone"]) / min(times["rows"]),
            "same_rel_gen_loc": all((a.rel, a.gen, a.loc) == (b.rel, b.gen, b.loc) for a, b in pairs),
            "max_rel_diff_p_ppl": max(max(abs(b.p_after / a.p_after - 1), abs(b.ppl_after / a.ppl_after - 1))
                                      for a, b in pairs)}


def time_rome(model: Any, n_layers: int, steps: int, repeats: int, sync: Any = lambda: None) -> dict[str, Any]:
    """``rome_sweep`` of one fact over the first ``n_layers`` layers, one edit at a time against the layers as rows.

    Args:
        model: The model.
        n_layers: Layers swept.
        steps: Value-optimisation steps.
        repeats: Alternating runs of each path (the minimum is reported).
        sync: Waits for the device.

    Returns:
        Seconds of each run, the speedup of the minima, and how far the two sweeps differ.
    """
    layers = list(range(min(n_layers, model.n_layers)))
    covs = key_covariance(model, layers, n_tokens=2048, seq_len=128, cache=False)

    def rome(rows: bool) -> Any:
        return rome_sweep(model, "The Eiffel Tower is located in the city of", "The Eiffel Tower", " Rome", layers,
                          covs=covs, steps=steps, bos=True, layers_per_pass=len(layers) if rows else 1)

    times, out = _alternate(repeats, rome, sync)
    rp = list(zip(out["alone"].results, out["rows"].results))
    return {"layers": len(layers), "steps": steps, "seconds": times,
            "speedup": min(times["alone"]) / min(times["rows"]),
            "same_metrics": all((a.efficacy, a.paraphrase, a.specificity, len(a.losses))
                                == (b.efficacy, b.paraphrase, b.specificity, len(b.losses)) for a, b in rp),
            "max_rel_diff_new_prob": max(abs(b.new_prob_after / a.new_prob_after - 1) for a, b in rp),
            "efficacy": [r.efficacy for r in out["rows"].results]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time both paths of both experiments and write the JSON (module docstring).

    Args:
        argv: Command-line arguments (``--help``).

    Returns:
        The payload written.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--facts", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8, help="ROME: the first N layers are swept")
    ap.add_argument("--steps", type=int, default=10, help="ROME value steps")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    payload = {"model": model.name, "device": str(model.device), "threads": args.threads,
               "table2": time_table2(model, args.facts, args.repeats, sync),
               "rome": time_rome(model, args.layers, args.steps, args.repeats, sync), "env": env_info()}
    path = write_json("bench_weight_edit_rows" + (f"_{args.tag}" if args.tag else ""), payload)
    for k in ("table2", "rome"):
        t = payload[k]["seconds"]
        print(f"{k}: one at a time {min(t['alone']):.1f} s, rows {min(t['rows']):.1f} s ({payload[k]['speedup']:.2f}x)")
    print(f"same Rel/Gen/Loc {payload['table2']['same_rel_gen_loc']} (max rel diff "
          f"{payload['table2']['max_rel_diff_p_ppl']:.1e}); ROME same metrics {payload['rome']['same_metrics']} "
          f"(max rel diff {payload['rome']['max_rel_diff_new_prob']:.1e}) -> {path}")
    return payload


if __name__ == "__main__":
    main()
