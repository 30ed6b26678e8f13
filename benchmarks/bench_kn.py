"""Benchmark: all-layer knowledge-neuron attribution (integrated gradients, 20 steps).

Compares ``tlcap.attribution.integrated_gradients`` (prefix KV reuse + every (layer, step)
row in one batch) against, in the same run and on the same model:

(a) ``reference_ig``: a per-layer, per-step loop over the full sequence (one forward/backward
    per step and layer; what a straightforward implementation does);
(b) EleutherAI's ``knowledge-neurons`` package (``KnowledgeNeurons.get_scores_for_layer``),
    pointed at the very HF ``GPT2LMHeadModel`` that backs our TransformerBridge, with its
    site ``mlp.c_fc`` output = our ``mlp_pre`` (``blocks.{l}.mlp.hook_pre``). It computes
    ``act * mean_k grad(P(y) | act * linspace(0,1,steps)[k])`` per layer, ``batch_size``
    steps per forward pass, so ours runs with ``rule="linspace"`` and the attributions must
    agree to float precision (checked and reported).

on the GPT-2-small shape (random weights; hub weights are not available offline) and on
SmolLM2-135M, for a short (~6 token) and a long (~40 token) prompt. Then, on SmolLM2, the
exact IG is compared with the cheaper estimators ``method="joint"`` and ``"grad_x_act"``:
time, and agreement of the located neuron sets (threshold 0.2·max and top-20) over known
facts from ROME's ``known_1000.json`` that SmolLM2 answers.

Baselines whose full cost would take minutes are timed on a subset of layers and
extrapolated (``extrapolated: true`` in the JSON, marked ``*`` in the table): both
baselines run an independent full-sequence forward/backward per layer, so their time is
a sum over layers; the subset includes the first and last layer (backward depth varies
linearly with the layer) and the mean per-layer time is multiplied by ``n_layers``.

Usage::

    python benchmarks/bench_kn.py --quick     # ~7-10 min on the shared 2-core CPU
    python benchmarks/bench_kn.py             # more layers timed, 3 repeats
    python benchmarks/bench_kn.py --pair      # single-fact latency vs knowledge-neurons only: every layer,
                                              # alternating in one process, min of 2 (bench_kn_pair.json);
                                              # knowledge-neurons runs on a plain transformers GPT2LMHeadModel
                                              # with the same weights (stock_gpt2), as its users run it

Writes ``benchmarks/results/bench_kn.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import env_info, print_table, timed, write_json  # noqa: E402
from bench_gpu import count_flops  # noqa: E402

from tlcap.attribution import integrated_gradients, reference_ig  # noqa: E402
from tlcap.data import load_known_facts  # noqa: E402
from tlcap.models import Model, load_model, make_gpt2  # noqa: E402

STEPS = 20
SHORT = ("The capital city of France is", " Paris")
LONG = (
    "The Eiffel Tower is a lattice tower designed by the company of Gustave "
    "Eiffel and completed in 1889 for the World's Fair. Today it is the best-known "
    "landmark of the city of",
    " Paris",
)


# --------------------------------------------------------------------------- baselines
def kn_available() -> tuple[bool, str]:
    try:
        from importlib.metadata import version

        import knowledge_neurons  # noqa: F401

        return True, version("knowledge-neurons")
    except Exception as exc:  # noqa: BLE001
        return False, repr(exc)


def stock_gpt2(model: Model) -> Any:
    """A plain transformers ``GPT2LMHeadModel`` with ``model``'s weights: what a knowledge-neurons user runs (no
    TransformerLens bridge around its modules, transformers' own ``gelu_new``); its logits are checked against
    ``model``'s (float rounding: tlcap runs the same GELU fused)."""
    from transformers import GPT2LMHeadModel

    state = {k.replace("._original_component", ""): v for k, v in model.hf_model.state_dict().items()}
    stock = GPT2LMHeadModel(model.hf_model.config)
    missing, _ = stock.load_state_dict(state, strict=False)  # the bridge's own extra entries are left out
    if missing:
        raise RuntimeError(f"stock GPT-2 lacks weights {missing[:4]}")
    stock.eval()
    ids = torch.tensor([model.encode("The capital city of France is")])
    with torch.no_grad():
        diff = float((stock(ids).logits - model.logits(ids)).abs().max())
    if diff > 1e-3:
        raise RuntimeError(f"stock GPT-2 logits differ from the model's by {diff}")
    return stock


def kn_scores(model: Model, prompt: str, target: str, layers: Sequence[int], batch_size: int,
              hf_model: Any = None) -> torch.Tensor:
    """EleutherAI knowledge-neurons' per-layer IG on ``hf_model`` (default ``model.hf_model``; GPT-2: ``mlp.c_fc``)."""
    from knowledge_neurons import KnowledgeNeurons

    hf = model.hf_model if hf_model is None else hf_model
    kn = KnowledgeNeurons(hf, model.tokenizer, model_type="gpt2", device=str(model.device))
    enc = kn.tokenizer(prompt, return_tensors="pt").to(kn.device)
    out = torch.zeros(model.n_layers, model.d_mlp)
    for l in layers:
        out[l] = kn.get_scores_for_layer(
            prompt, target, layer_idx=l, batch_size=batch_size, steps=STEPS, encoded_input=enc
        ).detach().float()
    return out


def layer_subset(n_layers: int, k: int) -> list[int]:
    """``k`` evenly spaced layers including the first and the last."""
    if k >= n_layers:
        return list(range(n_layers))
    if k <= 1:
        return [n_layers - 1]
    return sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)})


def diff_stats(ours: torch.Tensor, ref: torch.Tensor, layers: Sequence[int]) -> dict[str, float]:
    a, b = ours[list(layers)].double(), ref[list(layers)].double()
    d = (a - b).abs()
    return {
        "max_abs_diff": float(d.max()),
        "max_rel_diff": float(d.max() / b.abs().max().clamp_min(1e-30)),
        "argmax_same": bool(int(a.flatten().argmax()) == int(b.flatten().argmax())),
    }


# --------------------------------------------------------------------------- timing section
def bench_model(model: Model, label: str, args: argparse.Namespace, with_kn: bool) -> list[dict[str, Any]]:
    rows = []
    L = model.n_layers
    # warm up (allocator, kernels, lazy imports)
    integrated_gradients(model, "Hello there", " world", steps=2, layers=[0])
    for kind, (prompt, target) in (("short", SHORT), ("long", LONG)):
        n_tok = len(model.encode(prompt))
        print(f"\n[{label}] {kind} prompt: {n_tok} tokens, target {target!r}", flush=True)
        site = "mlp_pre" if with_kn else "mlp_post"
        rule = "linspace" if with_kn else "midpoint"
        ig = partial(integrated_gradients, model, prompt, target, steps=STEPS, rule=rule, site=site)
        t_ours, attr = timed(ig, args.repeats)
        ours = attr.scores
        print(f"  ours (integrated_gradients, all {L} layers): {t_ours:.2f}s", flush=True)
        row: dict[str, Any] = {
            "model": label, "prompt": kind, "n_tokens": n_tok, "n_layers": L, "site": site, "rule": rule,
            "steps": STEPS, "ours_s": t_ours, "target_prob": attr.target_prob,
        }
        # Same method with batches split along layers (each batch only runs the layers from its
        # lowest scaled layer on as a full batch when the adapter supports late expansion).
        n_rows = L * (STEPS + 1)
        chunk = -(-n_rows // args.chunks)
        t_chunk, attr_c = timed(partial(ig, batch_rows=chunk), args.repeats)
        print(f"  ours with batch_rows={chunk} ({args.chunks} batches): {t_chunk:.2f}s", flush=True)
        row.update(ours_chunked_s=t_chunk, chunked_batch_rows=chunk,
                   chunked_max_rel_diff=diff_stats(attr_c.scores, ours, range(L))["max_rel_diff"])
        # (a) per-layer, per-step reference loop
        ref_layers = layer_subset(L, args.ref_layers)
        t_ref, ref = timed(partial(reference_ig, model, prompt, target, steps=STEPS, rule=rule, site=site,
                                   layers=ref_layers, batched_steps=False), 1)
        t_ref_all = t_ref / len(ref_layers) * L
        print(f"  reference_ig per-step loop on layers {ref_layers}: {t_ref:.2f}s -> all layers {t_ref_all:.2f}s", flush=True)
        row.update(
            ref_layers_timed=ref_layers, ref_extrapolated=len(ref_layers) < L, ref_s=t_ref_all,
            ratio_vs_ref=t_ref_all / t_ours, **{f"ref_{k}": v for k, v in diff_stats(ours, ref, ref_layers).items()},
        )
        # (b) EleutherAI knowledge-neurons
        if with_kn:
            kn_layers = layer_subset(L, args.kn_layers if kind == "long" else max(args.kn_layers, args.kn_layers_short))
            t_kn, kn = timed(partial(kn_scores, model, prompt, target, kn_layers, args.kn_batch_size), 1)
            t_kn_all = t_kn / len(kn_layers) * L
            print(f"  knowledge-neurons (batch_size={args.kn_batch_size}) on layers {kn_layers}: {t_kn:.2f}s "
                  f"-> all layers {t_kn_all:.2f}s", flush=True)
            row.update(
                kn_layers_timed=kn_layers, kn_extrapolated=len(kn_layers) < L, kn_batch_size=args.kn_batch_size,
                kn_s=t_kn_all, ratio_vs_kn=t_kn_all / t_ours,
                **{f"kn_{k}": v for k, v in diff_stats(ours, kn, kn_layers).items()},
            )
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- paired latency
def bench_pair(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Single-fact latency, tlcap vs knowledge-neurons, all layers of the GPT-2-small shape, alternating in one
    process: ``--pair-repeats`` rounds of (ours, knowledge-neurons), the minimum of each kept; and the matrix-product
    FLOPs of one call of each (``bench_gpu.count_flops``: FlopCounterMode with the in-place ``addmm_`` of tlcap's
    fused read-out, which the counter alone misses)."""
    model = make_gpt2("small", seed=0)
    stock = stock_gpt2(model)  # knowledge-neurons runs on a plain transformers GPT-2 with the same weights
    integrated_gradients(model, "Hello there", " world", steps=2, layers=[0])  # warm-up
    kn_scores(model, "Hello there", " world", [0], args.kn_batch_size, stock)
    rows = []
    for kind, (prompt, target) in (("short", SHORT), ("long", LONG)):
        ig = partial(integrated_gradients, model, prompt, target, steps=STEPS, rule="linspace", site="mlp_pre")
        kn = partial(kn_scores, model, prompt, target, range(model.n_layers), args.kn_batch_size, stock)
        t_ours, t_kn, load = [], [], [os.getloadavg()[0]]
        for _ in range(args.pair_repeats):
            t, ours = timed(ig, 1)
            t_ours.append(t)
            t, ref = timed(kn, 1)
            t_kn.append(t)
            load.append(os.getloadavg()[0])
        flops = {"ours_gflop": count_flops(ig) / 1e9, "kn_gflop": count_flops(kn) / 1e9}  # one more call of each
        flops["flop_ratio_vs_kn"] = flops["kn_gflop"] / flops["ours_gflop"]
        row = {"model": "gpt2-small-random", "kn_model": "transformers GPT2LMHeadModel, same weights", **flops,
               "prompt": kind, "n_tokens": len(model.encode(prompt)), "steps": STEPS,
               "rule": "linspace", "site": "mlp_pre", "ours_s": min(t_ours), "kn_s": min(t_kn),
               "ratio_vs_kn": min(t_kn) / min(t_ours), "ours_runs_s": t_ours, "kn_runs_s": t_kn,
               "loadavg_1min": load, **{f"kn_{k}": v for k, v in diff_stats(ours.scores, ref, range(model.n_layers)).items()}}
        print(f"  {kind} ({row['n_tokens']} tokens): ours {row['ours_s']:.3f}s, knowledge-neurons {row['kn_s']:.3f}s, "
              f"{row['ratio_vs_kn']:.2f}x (runs {[round(x, 3) for x in t_ours]} / {[round(x, 3) for x in t_kn]}; "
              f"load {[round(x, 2) for x in load]})", flush=True)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- estimators
def known_facts(model: Model, n: int) -> list[tuple[str, str]]:
    """First ``n`` ROME known facts (``$TLCAP_DATA`` or bundled) the model answers (argmax = single-token answer)."""
    facts = load_known_facts()
    out = []
    for f in facts:
        prompt, target = f["prompt"], " " + f["attribute"]
        try:
            ids = model.target_ids(prompt, target, single_token=True)
        except Exception:  # noqa: BLE001 - multi-token or tokenization mismatch: skip
            continue
        with torch.no_grad():
            logits = model.logits(model.to_tokens(prompt))[0, -1]
        if int(logits.argmax()) == ids[0]:
            out.append((prompt, target))
            if len(out) >= n:
                break
    return out


def bench_estimators(model: Model, facts: list[tuple[str, str]], top_k: int = 20) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = []
    for prompt, target in facts:
        t_ig, exact = timed(partial(integrated_gradients, model, prompt, target, steps=STEPS), 1)
        sel = {"thr0.2": exact.select(threshold=0.2), f"top{top_k}": exact.select(top_k=top_k)}
        for method in ("joint", "grad_x_act"):
            t_m, approx = timed(partial(integrated_gradients, model, prompt, target, steps=STEPS, method=method), 1)
            row: dict[str, Any] = {"prompt": prompt, "target": target, "method": method, "ig_s": t_ig, "method_s": t_m,
                                   "speedup": t_ig / t_m}
            for name, exact_set in sel.items():
                a = approx.select(threshold=0.2) if name == "thr0.2" else approx.select(top_k=top_k)
                row[f"{name}_n_exact"] = len(exact_set)
                row[f"{name}_n_method"] = len(a)
                row[f"{name}_overlap"] = exact_set.overlap(a)
                row[f"{name}_iou"] = exact_set.iou(a)
            rows.append(row)
        print(f"  {prompt!r} -> {target!r}: ig {t_ig:.2f}s, |thr0.2|={len(sel['thr0.2'])}", flush=True)
    summary = {}
    for method in ("joint", "grad_x_act"):
        rs = [r for r in rows if r["method"] == method]
        if not rs:
            continue
        summary[method] = {
            k: sum(r[k] for r in rs) / len(rs)
            for k in ("ig_s", "method_s", "speedup", "thr0.2_overlap", "thr0.2_iou", f"top{top_k}_overlap", f"top{top_k}_iou")
        }
    return rows, summary


# --------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer layers timed for the slow baselines, fewer facts")
    ap.add_argument("--repeats", type=int, default=None, help="repeats of our method (min is kept)")
    ap.add_argument("--ref-layers", type=int, default=None, help="layers timed for reference_ig (rest extrapolated)")
    ap.add_argument("--kn-layers", type=int, default=None, help="layers timed for knowledge-neurons on the long prompt")
    ap.add_argument("--kn-layers-short", type=int, default=None, help="layers timed for knowledge-neurons on the short prompt")
    ap.add_argument("--kn-batch-size", type=int, default=10, help="knowledge-neurons batch_size (its default: 10)")
    ap.add_argument("--chunks", type=int, default=4, help="batches for the 'ours, chunked by layer' variant")
    ap.add_argument("--facts", type=int, default=None, help="SmolLM2 facts for the estimator comparison")
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--pair", action="store_true",
                    help="only the single-fact latency pair: tlcap vs knowledge-neurons on the GPT-2-small shape, every "
                         "layer, alternating in one process (min of --pair-repeats); writes bench_kn_pair.json")
    ap.add_argument("--pair-repeats", type=int, default=2, help="alternating rounds of --pair")
    ap.add_argument("--tag", default="", help="--pair writes bench_kn_pair_<tag>.json (another machine's record)")
    ap.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads for every method (default 1: on a shared, oversubscribed CPU, 2 threads "
        "made our method ~5x slower because every small op waits for both threads to be scheduled)",
    )
    args = ap.parse_args(argv)
    q = args.quick
    args.repeats = args.repeats or (1 if q else 3)
    args.ref_layers = args.ref_layers or (2 if q else 3)
    args.kn_layers = args.kn_layers or (2 if q else 12)
    args.kn_layers_short = args.kn_layers_short or (4 if q else 12)
    args.facts = args.facts or (3 if q else 5)
    if args.threads and args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    ok, kn_version = kn_available()
    print(f"knowledge-neurons: {'installed ' + kn_version if ok else 'NOT available: ' + kn_version}")
    if args.pair:
        if not ok:
            raise SystemExit("--pair needs knowledge-neurons (pip install --no-deps knowledge-neurons)")
        t0 = time.time()
        pair = bench_pair(args)
        name = "bench_kn_pair" + (f"_{args.tag}" if args.tag else "")
        path = write_json(name, {"benchmark": "bench_kn --pair", "env": env_info(), "args": vars(args),
                                 "knowledge_neurons": kn_version, "prompts": {"short": SHORT, "long": LONG},
                                 "pair": pair, "total_s": time.time() - t0})
        print(f"wrote {path}")
        return {"pair": pair}
    payload: dict[str, Any] = {
        "benchmark": "bench_kn", "quick": q, "steps": STEPS, "env": env_info(), "knowledge_neurons": kn_version if ok else None,
        "args": vars(args), "prompts": {"short": SHORT, "long": LONG},
    }
    t0 = time.time()
    rows = []
    gpt2 = make_gpt2("small", seed=0)
    rows += bench_model(gpt2, "gpt2-small-random", args, with_kn=ok)
    del gpt2
    facts_rows, est_summary = [], {}
    if not args.skip_smollm2:
        try:
            smol = load_model("smollm2-135m")
        except Exception as exc:  # noqa: BLE001
            print(f"SmolLM2 unavailable ({exc!r}); skipping its rows")
            smol = None
        if smol is not None:
            rows += bench_model(smol, "smollm2-135m", args, with_kn=False)
            print(f"\n[smollm2-135m] estimators vs exact IG on {args.facts} known facts", flush=True)
            facts = known_facts(smol, args.facts)
            facts_rows, est_summary = bench_estimators(smol, facts)
    payload.update(timing=rows, estimators=facts_rows, estimator_summary=est_summary, total_s=time.time() - t0)

    print("\n== all-layer IG time per prompt (steps=20); * = baseline timed on a layer subset, scaled to all layers ==")
    table = []
    for r in rows:
        table.append({
            "model": r["model"], "prompt": f"{r['prompt']} ({r['n_tokens']} tok)", "ours_s": r["ours_s"],
            "ours_chunked_s": r["ours_chunked_s"],
            "ref_loop_s": f"{r['ref_s']:.3g}{'*' if r['ref_extrapolated'] else ''}", "x_vs_ref": r["ratio_vs_ref"],
            "ref_max_rel": r["ref_max_rel_diff"],
            "kn_s": f"{r['kn_s']:.3g}{'*' if r.get('kn_extrapolated') else ''}" if "kn_s" in r else "n/a",
            "x_vs_kn": r.get("ratio_vs_kn"), "kn_max_rel": r.get("kn_max_rel_diff"), "kn_max_abs": r.get("kn_max_abs_diff"),
        })
    print_table(table)
    if est_summary:
        print("\n== SmolLM2: cheaper estimators vs exact IG (mean over facts) ==")
        print_table([{"method": m, **v} for m, v in est_summary.items()])
    path = write_json("bench_kn", payload)
    print(f"\nwrote {path} ({payload['total_s']:.0f}s total)")
    return payload


if __name__ == "__main__":
    main()
