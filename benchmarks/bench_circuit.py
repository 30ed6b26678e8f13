"""Benchmark: all-edge attribution scores, tlcap vs TransformerLens 4.x ``attribution_patch``.

Both sides compute the same quantity on the same inputs: EAP in the *denoising* convention of
TransformerLens (gradient on the corrupted run, difference clean - corrupted), MatchNLL of the
target, summed over positions (TL scores each (writer, reader) pair per position; its matrix
is summed over positions to compare). Reported: seconds per all-edge scoring, the ratio, and the
max relative difference of the two score matrices.

* GPT-2-small shapes (random weights): baseline = ``attribution_patch(..., EdgeAttributionConfig(
  granularity="edge"))`` itself.
* SmolLM2-135M: TL 4.3's edge mode refuses grouped-query attention (``_check_kv_heads_match_
  query_heads`` raises "n_key_value_heads=3 for n_heads=9 (GQA/MQA) ... edge granularity and
  faithfulness are unsupported here"). The baseline there is TL's own building blocks of that
  mode: ``cache_activation_and_gradient`` (clean forward; corrupted forward + backward) and
  ``_edge_effects`` over a GQA edge list whose k/v readers are kv heads (``Node(kind="k_input",
  head=g)``) -- exactly what ``attribution_patch`` would do with a GQA-aware ``enumerate_edges``.

Dataset mode (``--dataset-mode``, issue 14): 100 ParaRel P36 prompts with same-length corrupted
partners on SmolLM2; seconds per prompt and peak memory of ``edge_attribution(model, dataset,
batch_size=8)`` for EAP and EAP-IG(5), against the per-prompt loop (``edge_attribution`` per
item), each in its own process so that its peak RSS (``ru_maxrss``) is its own; the peak above
the loaded model is measured at 25 and at 100 prompts (it must not grow with the prompts).
Results: ``benchmarks/results/bench_circuit_dataset.json``.

Usage: ``python benchmarks/bench_circuit.py [--quick] [--skip-smollm2] [--dataset-mode [--loop-n N]]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402

import torch  # noqa: E402
from transformer_lens.tools.analysis import attribution_patching as ap  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tl_compat import gqa_edges, tl_edge_matrix  # noqa: E402

from tlcap import load_model  # noqa: E402
from tlcap.locate.circuits import edge_attribution, make_task  # noqa: E402
from tlcap.models import make_gpt2  # noqa: E402

PROMPT, TARGET, CORRUPT = "The capital of France is", " Paris", "The capital of Italy is"
# A longer pair (17 tokens): TL's per-position edge loop grows with length, the passes barely do.
LONG = ("Q: What is the capital of France? A: The capital of France is", " Paris",
        "Q: What is the capital of Italy? A: The capital of Italy is")


def _timed(fn, reps: int):  # noqa: ANN001, ANN202
    """Best wall-clock and best process-CPU seconds over ``reps`` runs (the CPU may be shared)."""
    best, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    return (best, best_cpu), out


def tl_scores(model, task, gqa: bool):  # noqa: ANN001, ANN202
    metric = lambda lg: task.metric_rows(lg)[0]  # noqa: E731
    model.W_E.requires_grad_(True)  # TL differentiates through the graph; tlcap freezes parameters
    try:
        if not gqa:
            res = ap.attribution_patch(model.backend, task.clean, task.corrupt, metric,
                                       ap.EdgeAttributionConfig(granularity="edge"))
            return res.edge_scores
        names = ap._edge_hook_names(model.n_layers)
        with ap._edge_hook_flags(model.backend):
            clean = ap.cache_activation_and_gradient(model.backend, task.clean, metric, names_filter=names,
                                                     compute_gradient=False)
            cor = ap.cache_activation_and_gradient(model.backend, task.corrupt, metric, names_filter=names)
            edges = gqa_edges(model.n_layers, model.n_heads, model.n_kv_heads, task.clean.shape[1])
            return ap._edge_effects(clean, cor, edges)
    finally:
        model.W_E.requires_grad_(False)


def bench(model, label: str, reps: int, gqa: bool, pair: tuple[str, str, str] = (PROMPT, TARGET, CORRUPT)) -> dict:  # noqa: ANN001
    PROMPT, TARGET, CORRUPT = pair  # noqa: N806

    task = make_task(model, PROMPT, TARGET, CORRUPT)
    ours_fn = lambda: edge_attribution(model, PROMPT, TARGET, CORRUPT, direction="denoising", task=task)  # noqa: E731
    ours_fn()  # warm-up (first bridge calls set up hook wiring)
    row: dict = {"model": label, "n_layers": model.n_layers, "heads": f"{model.n_heads}/{model.n_kv_heads}kv",
                 "seq_len": int(task.clean.shape[1])}
    if gqa:
        try:
            ap.attribution_patch(model.backend, task.clean, task.corrupt, lambda lg: task.metric_rows(lg)[0],
                                 ap.EdgeAttributionConfig(granularity="edge"))
            row["tl_edge_mode_on_gqa"] = "ran"
        except Exception as exc:  # noqa: BLE001 - we report the refusal verbatim
            row["tl_edge_mode_on_gqa"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    t_tl, tl_raw = _timed(lambda: tl_scores(model, task, gqa), reps)
    t_ours, ours = _timed(ours_fn, reps)
    t_tl2, _ = _timed(lambda: tl_scores(model, task, gqa), reps)  # interleaved: load drifts
    t_ours2, _ = _timed(ours_fn, reps)
    t_tl = tuple(min(a, b) for a, b in zip(t_tl, t_tl2))
    t_ours = tuple(min(a, b) for a, b in zip(t_ours, t_ours2))
    t_noise, _ = _timed(lambda: edge_attribution(model, PROMPT, TARGET, CORRUPT, task=task), reps)
    t_ig, _ = _timed(lambda: edge_attribution(model, PROMPT, TARGET, CORRUPT, steps=5, task=task), 1)
    ref = tl_edge_matrix(ours.graph, tl_raw)
    diff = (ours.scores.double() - ref * ours.valid).abs().max().item()
    row.update({
        "n_edges": ours.n_edges, "tl_edges_per_position_total": len(tl_raw),
        "baseline": "TL attribution_patch(edge)" if not gqa else "TL edge-mode utilities, GQA edge list",
        "tl_s": t_tl[0], "tlcap_s": t_ours[0], "speedup": t_tl[0] / t_ours[0],
        "tl_cpu_s": t_tl[1], "tlcap_cpu_s": t_ours[1], "speedup_cpu": t_tl[1] / t_ours[1],
        "tlcap_noising_eap_s": t_noise[0], "tlcap_eap_ig5_s": t_ig[0],
        "max_abs_diff": diff, "max_rel_diff": diff / max(ref.abs().max().item(), 1e-30),
    })
    return row


def _rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def dataset_worker(mode: str, n: int, steps: int) -> dict:
    """One measurement in this process: ``mode`` = ``dataset`` (batched, streamed) or ``loop`` (per prompt)."""
    from tlcap.locate.circuits import load_circuit_dataset

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    sm = load_model("smollm2-135m")
    ds = load_circuit_dataset("pararel", relation="P36", n=100, model=sm)
    items = ds.items[:n]
    edge_attribution(sm, items[0].prompt, items[0].target, items[0].corrupt_prompt, steps=steps)  # warm-up
    base = _rss_mib()
    t, c = time.perf_counter(), time.process_time()
    if mode == "dataset":
        sc = edge_attribution(sm, type(ds)(items, ds.name), steps=steps, batch_size=8)
    else:
        for it in items:
            sc = edge_attribution(sm, it.prompt, it.target, it.corrupt_prompt, steps=steps)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return {"mode": mode, "n_prompts": n, "steps": steps, "s_per_prompt": wall / n, "cpu_s_per_prompt": cpu / n,
            "peak_rss_mib": _rss_mib(), "rss_after_load_mib": base, "peak_above_load_mib": _rss_mib() - base,
            "score_abs_max": float(sc.scores.abs().max())}


def dataset_mode(loop_n: int) -> None:
    import subprocess

    runs = [("dataset", 25, 1), ("dataset", 100, 1), ("loop", loop_n, 1),
            ("dataset", 25, 5), ("loop", loop_n, 5), ("dataset", 100, 5)]
    rows: list[dict] = []
    out = Path(__file__).parent / "results" / "bench_circuit_dataset.json"

    def write() -> None:  # after every run: a long benchmark stopped early keeps what it measured
        out.write_text(json.dumps({"torch_threads": int(os.environ.get("BENCH_THREADS", "2")), "batch_size": 8,
                                   "dataset": "pararel:P36 (same-length corrupted partners)",
                                   "loadavg_at_end": os.getloadavg(), "rows": rows}, indent=1))

    for mode, n, steps in runs:
        res = subprocess.run([sys.executable, __file__, "--worker", mode, str(n), str(steps)], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{mode:<8}{n:>5} prompts  {'EAP' if steps == 1 else f'EAP-IG({steps})':<10}{r['s_per_prompt']:>8.3f} s/prompt"
              f"{r['peak_rss_mib']:>9.0f} MiB peak{r['peak_above_load_mib']:>8.0f} MiB above load "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
        write()
    for steps in (1, 5):
        d = next(r for r in rows if r["mode"] == "dataset" and r["n_prompts"] == 100 and r["steps"] == steps)
        lp = next(r for r in rows if r["mode"] == "loop" and r["steps"] == steps)
        print(f"steps={steps}: per-prompt loop / dataset = {lp['s_per_prompt'] / d['s_per_prompt']:.2f}x per prompt")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one repetition per timing")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--dataset-mode", action="store_true", help="issue 14: dataset vs per-prompt loop on SmolLM2")
    parser.add_argument("--loop-n", type=int, default=100, help="prompts of the per-prompt loop (dataset mode)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(dataset_worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))))
        return
    if args.dataset_mode:
        dataset_mode(args.loop_n)
        return
    reps = 1 if args.quick else 3
    g2 = make_gpt2("small", seed=0)
    rows = [bench(g2, "gpt2-small-random", reps, gqa=False), bench(g2, "gpt2-small-random", reps, gqa=False, pair=LONG)]
    if not args.skip_smollm2:
        sm = load_model("smollm2-135m")
        rows += [bench(sm, "smollm2-135m", reps, gqa=True), bench(sm, "smollm2-135m", reps, gqa=True, pair=LONG)]
    print(f"\n{'model':<20}{'pos':>4}{'edges':>8}{'TL s':>9}{'tlcap s':>9}{'ratio':>8}{'TL cpu':>9}{'tlcap cpu':>10}{'ratio':>8}"
          f"{'max rel diff':>14}{'noising s':>11}{'EAP-IG5 s':>11}")
    for r in rows:
        print(f"{r['model']:<20}{r['seq_len']:>4}{r['n_edges']:>8}{r['tl_s']:>9.2f}{r['tlcap_s']:>9.2f}{r['speedup']:>7.1f}x"
              f"{r['tl_cpu_s']:>9.2f}{r['tlcap_cpu_s']:>10.2f}{r['speedup_cpu']:>7.1f}x"
              f"{r['max_rel_diff']:>14.2e}{r['tlcap_noising_eap_s']:>11.2f}{r['tlcap_eap_ig5_s']:>11.2f}")
        if "tl_edge_mode_on_gqa" in r and r["seq_len"] < 10:
            print(f"  TL attribution_patch(edge) on {r['model']}: {r['tl_edge_mode_on_gqa']}")
    out = Path(__file__).parent / "results" / "bench_circuit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"quick": args.quick, "torch_threads": torch.get_num_threads(), "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
