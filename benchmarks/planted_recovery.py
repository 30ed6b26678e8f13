"""Recovery of planted ground truth by every localization method (the table of docs/testing.md).

For each seed, :func:`tlcap.testing.planted_fact_model` and :func:`planted_capability_model`
are built wired and unwired; each method locates on both, and its answer is compared with the
planted set: precision = |found ∩ planted| / |found|, recall = |found ∩ planted| / |planted|
(neurons for the neuron methods, edges for EAP, the layer for causal tracing). On the unwired
model the planted set is absent, so what matters there is whether the method *claims* to have
found something: the located-vs-random test (suppressing the located set against 20 matched
random sets; p-value) or the size of the effect.

    python benchmarks/planted_recovery.py --seeds 0 1 2 3 4 --threads 1

Prints a markdown table and writes ``benchmarks/results/planted_recovery.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from statistics import mean
from typing import Any

import torch

import tlcap
from benchmarks._util import RESULTS_DIR, env_info
from tlcap.attribution.methods import localize
from tlcap.experiments.cnl import cnl_locate
from tlcap.intervene import suppress
from tlcap.locate.causal_trace import causal_trace
from tlcap.locate.circuits import edge_attribution
from tlcap.locate.circuits.dataset import CircuitDataset
from tlcap.locate.circuits.neurons import neuron_attribution
from tlcap.locate.circuits.task import CircuitItem
from tlcap.locate.selection import method_select
from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.permutation import located_vs_random
from tlcap.runtime.run_control import RunControl
from tlcap.testing import planted_capability_model, planted_fact_model

N_RANDOM = 20


def pr(found: set, planted: set) -> tuple[float, float]:
    """(precision, recall); precision of an empty answer is NaN."""
    hit = len(found & planted)
    return (hit / len(found) if found else float("nan")), hit / len(planted)


def drop_p(model: Any, prompts: Any, target: str, neurons: Any) -> tuple[float, float]:
    """(relative drop of P(target), its p-value against matched random sets), averaged over ``prompts``."""
    if not len(neurons):
        return float("nan"), float("nan")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    p0 = [tlcap.target_prob(model, p, target) for p in prompts]

    def drop(ns: Any) -> float:
        hooks = suppress(model, ns)
        return mean((b - tlcap.target_prob(model, p, target, hooks=hooks)) / b for p, b in zip(prompts, p0))

    null = [drop(neurons.random_like(seed=i)) for i in range(N_RANDOM)]
    d = drop(neurons)
    return d, located_vs_random(d, null).p_value


def neuron_row(method: str, seed: int, wired: bool, model: Any, truth: Any, found: Any) -> dict[str, Any]:
    """Precision/recall and the suppression test on the located prompt and on held-out paraphrases."""
    same = drop_p(model, truth.prompt, truth.target, found)
    held = drop_p(model, truth.paraphrases, truth.target, found)
    return dict(method=method, seed=seed, wired=wired, n_found=len(found), pr=pr(set(found), set(truth.neurons)),
                base=tlcap.target_prob(model, truth.prompt, truth.target), drop=same[0], p=same[1], drop_held=held[0],
                p_held=held[1])


def fact_methods(seed: int) -> list[dict[str, Any]]:
    rows = []
    for wired in (True, False):
        model, truth = planted_fact_model(seed=seed, wired=wired)
        for method in ("ig", "sig", "amig"):
            attr = localize(model, truth.prompt, truth.target, method=method)
            found = method_select(attr.scores, method)
            rows.append(neuron_row(f"KN {method.upper()} (own rule)", seed, wired, model, truth, found))
        for method in ("joint", "grad_x_act"):
            attr = tlcap.integrated_gradients(model, truth.prompt, truth.target, method=method, progress=False)
            found = attr.select(threshold=0.2)
            rows.append(neuron_row(f"KN {method} (t=0.2)", seed, wired, model, truth, found))
        tr = causal_trace(model, truth.prompt, truth.subject, truth.target, window=1, samples=5, noise_std=1.0)
        eff = tr.effect("mlp")[-1]
        top = tr.top_layers(1, kind="mlp", token=-1)
        rows.append(dict(method="causal trace (MLP, last token, top-1 layer)", seed=seed, wired=wired, n_found=1,
                         pr=pr(set(top), {truth.layer}), effect=float(eff.max())))
        ds = CircuitDataset((CircuitItem(truth.prompt, truth.target, truth.corrupt_prompt),), name="planted")
        for steps, name in ((1, "EAP"), (5, "EAP-IG (5)")):
            sc = edge_attribution(model, truth.prompt, truth.target, corrupt_prompt=truth.corrupt_prompt, steps=steps)
            top_e = {(u, r) for u, r, _ in sc.top_edges(len(truth.edges))}
            rows.append(dict(method=f"{name} edges (top {len(truth.edges)})", seed=seed, wired=wired,
                             n_found=len(top_e), pr=pr(top_e, set(truth.edges)),
                             effect=max(abs(s) for _, _, s in sc.top_edges(1))))
            ns = neuron_attribution(model, ds, steps=steps)
            rows.append(neuron_row(f"{name} neuron nodes (top {len(truth.neurons)})", seed, wired, model, truth,
                                   ns.top(len(truth.neurons))))
    return rows


def accuracy_drop_p(model: Any, task: str, samples: Any, neurons: Any) -> tuple[float, float]:
    """(accuracy drop when suppressing ``neurons``, its p-value against matched random sets)."""
    if not len(neurons):
        return float("nan"), float("nan")

    def acc(ns: Any = None) -> float:
        hooks = () if ns is None else suppress(model, ns)
        return task_accuracy(model, task, samples, hooks=hooks, progress=False).accuracy

    base = acc()
    d = base - acc(neurons)
    return d, located_vs_random(d, [base - acc(neurons.random_like(seed=i)) for i in range(N_RANDOM)]).p_value


def capability_methods(seed: int, n_samples: int) -> list[dict[str, Any]]:
    rows = []
    for wired in (True, False):
        model, truth = planted_capability_model(seed=seed, wired=wired)
        samples = truth.samples[:: max(1, len(truth.samples) // n_samples)][:n_samples]
        loc = cnl_locate(model, truth.task, samples, run=RunControl(progress=False))
        found = loc.neuron_set()
        held = [s for s in truth.samples if s not in samples]
        row = dict(method="CNL (σ = 3, std; accuracy drop)", seed=seed, wired=wired, n_found=len(found),
                   pr=pr(set(found), set(truth.neurons)))
        for key, evaluated in (("", samples), ("_held", held)):
            row[f"drop{key}"], row[f"p{key}"] = accuracy_drop_p(model, truth.task, evaluated, found)
        rows.append(row)
    return rows


def _cell(vals: list[float], fmt: str = "{:.2f}") -> str:
    vals = [v for v in vals if v == v]
    return fmt.format(mean(vals)) if vals else "n/a"


def table(rows: list[dict[str, Any]]) -> str:
    """Neuron methods: recovery, then the suppression test (drop, p) on the located prompt and held out."""
    nan = float("nan")
    out = ["| method | precision | recall | drop | p | drop, held out | p, held out | unwired: found | unwired: P(target) "
           "| unwired: drop | unwired: p | unwired: drop, held out | unwired: p, held out |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for method in dict.fromkeys(r["method"] for r in rows if "drop" in r):
        w = [r for r in rows if r["method"] == method and r["wired"]]
        u = [r for r in rows if r["method"] == method and not r["wired"]]
        cells = [_cell([r["pr"][0] for r in w]), _cell([r["pr"][1] for r in w])]
        for group in (w, u):
            if group is u:
                cells.append(_cell([r["n_found"] for r in u], "{:.1f}"))
                cells.append(_cell([r.get("base", nan) for r in u], "{:.1e}"))
            for key, fmt in (("drop", "{:.1%}"), ("p", "{:.3f}"), ("drop_held", "{:.1%}"), ("p_held", "{:.3f}")):
                cells.append(_cell([r.get(key, nan) for r in group], fmt))
        out.append(f"| {method} | " + " | ".join(cells) + " |")
    out += ["", "| method | precision | recall | largest score, planted | largest score, unwired |", "|---|---:|---:|---:|---:|"]
    for method in dict.fromkeys(r["method"] for r in rows if "effect" in r):
        w = [r for r in rows if r["method"] == method and r["wired"]]
        u = [r for r in rows if r["method"] == method and not r["wired"]]
        out.append(f"| {method} | {_cell([r['pr'][0] for r in w])} | {_cell([r['pr'][1] for r in w])} | "
                   f"{_cell([r['effect'] for r in w], '{:.3g}')} | {_cell([r['effect'] for r in u], '{:.2g}')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--cnl-samples", type=int, default=24, help="prompts of the planted task CNL scores")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        rows += fact_methods(seed) + capability_methods(seed, args.cnl_samples)
        print(f"seed {seed} done ({time.time() - t0:.0f} s)", flush=True)
    md = table(rows)
    print(md)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "planted_recovery.json").write_text(json.dumps(
        {"env": env_info(), "seeds": args.seeds, "seconds": time.time() - t0, "rows": rows, "table": md}, indent=1,
        default=str))


if __name__ == "__main__":
    main()
