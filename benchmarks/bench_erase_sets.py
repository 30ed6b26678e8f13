"""Benchmark: many neuron sets per forward pass vs one set at a time (CNL erase, perplexity, reliability).

For each workload, in ONE process on SmolLM2 (default one thread, as a ``--jobs 2`` worker runs):

- ``emotion`` / ``mbpp`` erase: :func:`tlcap.metrics.set_scores.erased_scores` on ``S`` sets
  (located + random) vs ``task_accuracy`` inside ``erase_neurons`` for a few sets (today's path);
- ``ppl``: :func:`tlcap.metrics.set_probs.erased_text_nll` vs ``text_nll`` inside ``erase_neurons``;
- ``reliability``: :func:`tlcap.metrics.set_probs.scaled_target_probs` (double + zero, ``R`` sets)
  vs one ``target_prob`` per (set, factor).

Reported per workload: seconds per (set × item) of each path, their ratio (survives machine load),
the batched path's tokens/s (its own count: each row's tokens, each set's cached prefix once), the
largest difference of the scores on the sets both paths ran, and the 1-minute load average.

    python benchmarks/bench_erase_sets.py --location runs/repro/cache/cnl.locate.emotion-*/location
    python benchmarks/bench_erase_sets.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import RESULTS_DIR, env_info, print_table  # noqa: E402


def _sets(model, location: str | None, sigma: float, n: int):
    from tlcap.metrics.sets import NeuronSet
    from tlcap.results import load_result

    if location:
        loc = load_result(location).reselect(sigma)
    else:  # a located-like set: 60 neurons in layer 0, 29, and spread over the top third
        g = __import__("torch").Generator().manual_seed(0)
        pick = [(0, j) for j in range(0, 1500, 75)] + [(l, int(j)) for l in range(20, 30)
                                                        for j in __import__("torch").randperm(model.d_mlp, generator=g)[:4]]
        loc = NeuronSet(tuple(pick), (model.n_layers, model.d_mlp))
    return loc, [loc] + [loc.random_like(seed=k) for k in range(n - 1)]


def _task(model, task: str, n_items: int, sets, n_slow: int) -> dict:
    import torch

    from tlcap.data.tasks import load_task
    from tlcap.intervene.weights import erase_neurons
    from tlcap.metrics.accuracy import task_accuracy
    from tlcap.metrics.set_scores import erased_scores

    samples = load_task(task, split="test", n=n_items, seed=0)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    sc = erased_scores(model, task, samples, sets)
    fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow_rows = []
    for s in sets[:n_slow]:
        with erase_neurons(model, s):
            slow_rows.append(task_accuracy(model, task, samples).scores)
    slow = time.perf_counter() - t0
    diff = float((sc.scores[:n_slow] - torch.tensor(slow_rows, dtype=torch.float64)).abs().max())
    per_fast, per_slow = fast / (len(sets) * len(sc.items)), slow / (n_slow * len(sc.items))
    return {"workload": f"{task} erase", "items": len(sc.items), "sets_batched": len(sets), "sets_slow": n_slow,
            "s_per_set_item_batched": per_fast, "s_per_set_item_slow": per_slow, "speedup": per_slow / per_fast,
            "tokens_per_s_batched": sc.tokens / fast, "max_score_diff": diff, "load": (load0 + os.getloadavg()[0]) / 2}


def _ppl(model, n_texts: int, sets, n_slow: int) -> dict:
    import torch

    from tlcap.data.wikitext import load_wikitext
    from tlcap.intervene.weights import erase_neurons
    from tlcap.metrics.perplexity import text_nll
    from tlcap.metrics.set_probs import erased_text_nll

    texts = load_wikitext(n_texts=n_texts)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    nll, cnt = erased_text_nll(model, texts, sets, 128)
    fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = []
    for s in sets[:n_slow]:
        with erase_neurons(model, s):
            ref.append(text_nll(model, texts, 128)[0])
    slow = time.perf_counter() - t0
    diff = float(((nll[:n_slow] - torch.stack(ref)).abs() / torch.stack(ref).abs()).max())
    per_fast, per_slow = fast / (len(sets) * len(texts)), slow / (n_slow * len(texts))
    return {"workload": "wikitext-2 ppl", "items": len(texts), "sets_batched": len(sets), "sets_slow": n_slow,
            "s_per_set_item_batched": per_fast, "s_per_set_item_slow": per_slow, "speedup": per_slow / per_fast,
            "tokens_per_s_batched": float(cnt.sum() + len(texts)) * len(sets) / fast, "max_score_diff": diff,
            "load": (load0 + os.getloadavg()[0]) / 2}


def _reliability(model, sets, n_slow: int) -> dict:
    from tlcap.intervene.activations import scale_neurons
    from tlcap.metrics.probs import target_prob
    from tlcap.metrics.set_probs import scaled_target_probs

    prompt, target = "The capital of France is", " Paris"
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    _, p = scaled_target_probs(model, prompt, target, sets, (2.0, 0.0))
    fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = [[target_prob(model, prompt, target, hooks=scale_neurons(model, s, f)) for s in sets[:n_slow]] for f in (2.0, 0.0)]
    slow = time.perf_counter() - t0
    import torch

    diff = float(((p[:, :n_slow] - torch.tensor(ref, dtype=torch.float64)).abs() / p[:, :n_slow]).max())
    per_fast, per_slow = fast / (2 * len(sets)), slow / (2 * n_slow)
    return {"workload": "reliability double+zero", "items": 1, "sets_batched": len(sets), "sets_slow": n_slow,
            "s_per_set_item_batched": per_fast, "s_per_set_item_slow": per_slow, "speedup": per_slow / per_fast,
            "tokens_per_s_batched": float("nan"), "max_score_diff": diff, "load": (load0 + os.getloadavg()[0]) / 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--location", help="A saved CNLLocation (cnl.locate.<ds>/location) whose σ-set is erased")
    ap.add_argument("--sigma", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="Fewer items and sets (a smoke run)")
    ap.add_argument("--only", default="emotion,mbpp,ppl,reliability")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    import tlcap

    model = tlcap.load_model("smollm2-135m")
    q = args.quick
    rows = []
    only = args.only.split(",")
    if "emotion" in only:
        _, sets = _sets(model, args.location, args.sigma, 9 if q else 33)
        rows.append(_task(model, "emotion", 16 if q else 64, sets, 2))
    if "mbpp" in only:
        _, sets = _sets(model, args.location, args.sigma, 5 if q else 17)
        rows.append(_task(model, "mbpp", 4 if q else 12, sets, 2))
    if "ppl" in only:
        _, sets = _sets(model, args.location, args.sigma, 5 if q else 17)
        rows.append(_ppl(model, 4 if q else 16, sets, 2))
    if "reliability" in only:
        _, sets = _sets(model, args.location, args.sigma, 41 if q else 201)
        rows.append(_reliability(model, sets, 5 if q else 20))
    print_table(rows)
    out = RESULTS_DIR / f"bench_erase_sets{'-' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps({"env": env_info(), "args": vars(args), "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
