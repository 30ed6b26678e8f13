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

Dataset mode (``--dataset-mode``, issue 14): ParaRel P36 prompts with same-length corrupted
partners on SmolLM2. Seconds per prompt and peak memory of ``edge_attribution(model, dataset,
batch_size=8)`` for EAP and EAP-IG(5) at 25 and 100 prompts, against the per-prompt loop
(``edge_attribution`` per item, ``--loop-n`` prompts, default 25), each run in its own process
started with ``MALLOC_MMAP_THRESHOLD_=65536`` (the resident set follows the live tensors).
``peak_above_load_mib`` = the kernel's high-water mark during the run (``VmHWM``, reset after a
one-prompt warm-up) minus the resident set just before it. Torch threads: ``BENCH_THREADS``
(default 1): on a shared 2-core machine two threads that wait for each other at every parallel
region were 8x slower per prompt at load 4 (EAP-IG(5) loop: 15.9 vs 2.0 s/prompt).

Padding rule, and why the prompts are reordered: a batch is right-padded to its longest row, and
only one batch's activations are alive at a time (running sums cross batches), so the peak is
the peak of the *widest* batch (``batch_size`` x its longest row), whatever the number of prompts.
In dataset order the first 25 P36 prompts' widest batch is 8 x 9 tokens and the 100 prompts'
is 8 x 11, which alone made the 100-prompt peak higher. The benchmark therefore moves the widest
batch of the 100 prompts to the front (the other batches keep their order and composition), so
both sizes contain the same widest batch; every row records its ``widest_batch`` and its total
``padded_tokens``. The loop's batches are single prompts (its widest is the longest prompt).

``--only eap25,ig100,...`` runs a subset (keys: eap25, eap100, loop-eap, ig25, loop-ig, ig100);
rows of other runs already in the results file are kept. Printed: seconds per prompt, peak above
load, the loop / dataset ratio of seconds per prompt, and the 100 - 25 prompt peak difference.
Results: ``benchmarks/results/bench_circuit_dataset.json``.

Usage: ``python benchmarks/bench_circuit.py [--quick] [--skip-smollm2] [--dataset-mode [--loop-n N] [--only KEYS]]``
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


RUNS: dict[str, tuple[str, int | None, int]] = {  # key -> (mode, prompts (None: --loop-n), IG steps)
    "eap25": ("dataset", 25, 1), "eap100": ("dataset", 100, 1), "loop-eap": ("loop", None, 1),
    "ig25": ("dataset", 25, 5), "loop-ig": ("loop", None, 5), "ig100": ("dataset", 100, 5),
}
BATCH = 8


def _proc_mib(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process in MiB (Linux ``/proc``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def widest_first(items: list, batch: int) -> list:
    """The items with the batch of the most padded tokens moved to the front (the other batches unchanged).

    The peak of a dataset run is the peak of its widest batch (``batch`` items right-padded to the
    longest row), so the 25- and 100-prompt runs both start with this batch: like with like.
    """
    chunks = [items[i : i + batch] for i in range(0, len(items), batch)]
    w = max(range(len(chunks)), key=lambda i: len(chunks[i]) * max(it.width for it in chunks[i]))
    return [it.item for it in chunks[w] + [x for i, c in enumerate(chunks) if i != w for x in c]]


def dataset_worker(mode: str, n: int, steps: int) -> dict:
    """One measurement in this process: ``mode`` = ``dataset`` (batched, streamed) or ``loop`` (per prompt).

    Peak memory: the kernel's high-water mark (``VmHWM``) is reset after the warm-up
    (``/proc/self/clear_refs``), so ``peak_above_load_mib`` = peak during the run minus the resident
    set just before it.
    """
    from types import SimpleNamespace

    from tlcap.locate.circuits import load_circuit_dataset
    from tlcap.locate.circuits.task import make_items_task

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    sm = load_model("smollm2-135m")
    ds = load_circuit_dataset("pararel", relation="P36", n=100, model=sm)
    tagged = [SimpleNamespace(item=it, width=int(make_items_task(sm, [it]).clean.shape[1])) for it in ds.items]
    items = widest_first(tagged, BATCH)[:n]
    sub = type(ds)(tuple(items), ds.name)
    widths = [(t.n_items, int(t.clean.shape[1])) for t in sub.tasks(sm, BATCH if mode == "dataset" else 1)]
    edge_attribution(sm, items[0].prompt, items[0].target, items[0].corrupt_prompt, steps=steps)  # warm-up
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    base = _proc_mib("VmRSS")
    t, c = time.perf_counter(), time.process_time()
    if mode == "dataset":
        sc = edge_attribution(sm, sub, steps=steps, batch_size=BATCH)
    else:
        for it in items:
            sc = edge_attribution(sm, it.prompt, it.target, it.corrupt_prompt, steps=steps)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    peak = _proc_mib("VmHWM")
    wb = max(widths, key=lambda w: w[0] * w[1])
    return {"mode": mode, "n_prompts": n, "steps": steps, "batch_size": BATCH if mode == "dataset" else 1,
            "s_per_prompt": wall / n, "cpu_s_per_prompt": cpu / n, "peak_rss_mib": peak, "rss_before_mib": base,
            "peak_above_load_mib": peak - base, "widest_batch": list(wb), "padded_tokens": sum(a * b for a, b in widths),
            "score_abs_max": float(sc.scores.abs().max()), "loadavg": os.getloadavg(),
            "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def dataset_mode(loop_n: int, only: list[str]) -> None:
    import subprocess

    out = Path(__file__).parent / "results" / "bench_circuit_dataset.json"
    old = json.loads(out.read_text()).get("rows", []) if out.exists() else []
    rows: dict[str, dict] = {r["key"]: r for r in old if "key" in r}  # --only keeps the other runs' rows

    def write() -> None:  # after every run: a long benchmark stopped early keeps what it measured
        out.write_text(json.dumps({"torch_threads": int(os.environ.get("BENCH_THREADS", "1")), "batch_size": BATCH,
                                   "dataset": "pararel:P36 (same-length corrupted partners), widest batch first",
                                   "malloc_mmap_threshold": 65536, "rows": list(rows.values())}, indent=1))

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # the resident set follows the live tensors
    for key in only:
        mode, n, steps = RUNS[key]
        n = loop_n if n is None else n
        res = subprocess.run([sys.executable, __file__, "--worker", mode, str(n), str(steps)], capture_output=True,
                             text=True, check=True, env=env)
        r = rows[key] = {"key": key, **json.loads(res.stdout.strip().splitlines()[-1])}
        print(f"{key:<9}{mode:<8}{n:>5} prompts  {'EAP' if steps == 1 else f'EAP-IG({steps})':<10}"
              f"{r['s_per_prompt']:>8.3f} s/prompt{r['peak_above_load_mib']:>8.0f} MiB above load  widest batch "
              f"{r['widest_batch'][0]}x{r['widest_batch'][1]}  (load {r['loadavg'][0]:.1f})", flush=True)
        write()
    for steps, loop_key, keys in ((1, "loop-eap", ("eap100", "eap25")), (5, "loop-ig", ("ig100", "ig25"))):
        d = next((rows[k] for k in keys if k in rows), None)
        if d is not None and loop_key in rows:
            ratio = rows[loop_key]["s_per_prompt"] / d["s_per_prompt"]
            print(f"steps={steps}: per-prompt loop / dataset ({d['n_prompts']} prompts) = {ratio:.2f}x seconds per prompt")
    for a, b in (("eap25", "eap100"), ("ig25", "ig100")):
        if a in rows and b in rows:
            print(f"{b} - {a}: peak above load {rows[b]['peak_above_load_mib'] - rows[a]['peak_above_load_mib']:+.0f} MiB "
                  f"(widest batch {rows[a]['widest_batch']} vs {rows[b]['widest_batch']})")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one repetition per timing")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--dataset-mode", action="store_true", help="issue 14: dataset vs per-prompt loop on SmolLM2")
    parser.add_argument("--loop-n", type=int, default=25, help="prompts of the per-prompt loop (dataset mode)")
    parser.add_argument("--only", default=",".join(RUNS),
                        help=f"dataset mode: comma-separated runs among {','.join(RUNS)} (default: all, in this order)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(dataset_worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))))
        return
    if args.dataset_mode:
        only = [k.strip() for k in args.only.split(",") if k.strip()]
        if bad := [k for k in only if k not in RUNS]:
            parser.error(f"--only: unknown run(s) {bad}; choose among {','.join(RUNS)}")
        dataset_mode(args.loop_n, only)
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
