"""Benchmark: batched causal tracing vs the per-cell loop, and time per ROME edit (SmolLM2).

The batched trace (all three kinds, every layer, every token) is timed in full. The per-cell
loop (one forward of ``samples`` rows over the full prompt per (kind, token, layer) cell, as
ROME's reference code does) is timed on a spread subset of cells and extrapolated as
``mean time per cell × number of cells`` — labelled "extrapolated" in the table. Both run in
the same process on the same prompt, noise and samples, and the subset's scores are checked
against the batched trace.

Usage:
    python benchmarks/bench_trace.py --quick          # 3 noise samples, 12 loop cells
    python benchmarks/bench_trace.py                  # 10 noise samples, 30 loop cells

``--shapes``: for the subject-first prompt ("The Eiffel Tower is located in the city of" /
"The Eiffel Tower") and the mid-prompt one ("The capital of France is" / "France"), times in one
process the batched trace with late expansion (each batch reuses the corrupted run below its
lowest restored layer, the default), without it (the previous engine), and the per-cell loop
(extrapolated from a spread subset); then the dataset mode's seconds per fact with and without
late expansion on ``--facts`` known facts. Writes ``bench_trace_shapes.json``::

    python benchmarks/bench_trace.py --shapes --samples 10 --loop-cells 30 --facts 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from _util import write_json  # noqa: E402

import tlcap  # noqa: E402
from tlcap.intervene.covariance import covariance_path, key_covariance  # noqa: E402
from tlcap.intervene.rome import RomeConfig, rome_edit  # noqa: E402
from tlcap.locate.causal_trace import KINDS, causal_trace, prepare_trace, trace_cell  # noqa: E402

SHAPES = [("subject-first", "The Eiffel Tower is located in the city of", "The Eiffel Tower", " Paris"),
          ("mid-prompt", "The capital of France is", "France", " Paris")]


def flop_floor(model: tlcap.Model, setup) -> dict:  # noqa: ANN001
    """Counted FLOPs of the per-cell loop vs the compute floor of any exact trace of ``setup``'s cells.

    A restored cell (kind, token t, layer l) differs from the corrupted run only at positions ``>= t``
    and layers ``>= low`` (its lowest restored layer: ``l`` for ``resid``, the window's first layer for
    ``mlp``/``attn``); cells before the subject equal the corrupted run. The floor counts, per noise
    row, only that work — ``(T − t) · (L − low) / L`` of the block stack's per-token cost — plus one
    unembedding at the last position; the shared corrupted prefix and lower layers are free. The
    per-cell loop (ROME's scheme) runs every block and the unembedding at every position of every
    row. Per token: block stack ``2 · (block parameters)``, unembedding ``2 · d_model · d_vocab``
    (attention-score FLOPs, ``O(T)`` per token, are left out of both).

    Returns:
        ``{"loop_flops", "floor_flops", "loop_over_floor"}``: ``loop_over_floor`` is the largest
        speed-up over the loop that an exact engine can reach on this prompt (in FLOPs).
    """
    from tlcap.reproduce.cost import ModelShape

    shape = ModelShape.of(model)
    L, T, n = model.n_layers, setup.n_tokens, setup.samples
    blk = 2.0 * shape.n_block_params
    head = 2.0 * shape.d_model * shape.d_vocab
    s0 = setup.subject_range[0]
    loop = floor = 0.0
    for kind in setup.kinds:
        for t in range(T):
            for l in setup.layers:
                loop += n * T * (blk + head)
                if t >= s0:
                    low = min(setup.site_layers(kind, l))
                    floor += n * ((T - t) * blk * (L - low) / L + head)
    return {"loop_flops": loop, "floor_flops": floor, "loop_over_floor": loop / floor}


def shapes(model: tlcap.Model, samples: int, n_loop: int, n_facts: int) -> None:
    """Late expansion vs the previous batched engine vs the per-cell loop, both prompt shapes + dataset mode."""
    from tlcap.data.knowns import load_known_facts
    from tlcap.locate.causal_trace import trace_batched, trace_dataset

    L = model.n_layers
    out: dict = {"model": model.name, "samples": samples, "threads": torch.get_num_threads(), "shapes": []}
    for name, prompt, subject, target in SHAPES:
        setup = prepare_trace(model, prompt, subject, target, samples=samples, warn=False)
        T = setup.n_tokens
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        late = trace_batched(setup, late_expand=True)
        t_late = time.perf_counter() - t0
        t0 = time.perf_counter()
        full = trace_batched(setup, late_expand=False)
        t_full = time.perf_counter() - t0
        cells = [(k, t, l) for k in KINDS for t in range(T) for l in range(L)]
        subset = cells[:: max(1, len(cells) // n_loop)][:n_loop]
        t0 = time.perf_counter()
        for kind, t, l in subset:
            trace_cell(setup, kind, t, l)
        t_loop = (time.perf_counter() - t0) / len(subset) * len(cells)
        row = {"shape": name, "prompt": prompt, "subject": subject, "tokens": T, "cells": len(cells),
               "late_s": t_late, "previous_batched_s": t_full, "loop_extrapolated_s": t_loop,
               "loop_cells_measured": len(subset), "speedup_vs_loop": t_loop / t_late,
               "speedup_vs_previous": t_full / t_late, "previous_speedup_vs_loop": t_loop / t_full,
               "max_abs_diff_late_vs_previous": float((late - full).abs().max()), **flop_floor(model, setup),
               "load_1min_before": load0, "load_1min_after": os.getloadavg()[0]}
        row["share_of_floor_speedup"] = row["speedup_vs_loop"] / row["loop_over_floor"]
        out["shapes"].append(row)
        print(json.dumps(row), flush=True)
    facts = load_known_facts(n=n_facts)
    ds = {}
    for late_on in (True, False):
        t0 = time.perf_counter()
        trace_dataset(model, facts, samples=samples, late_expand=late_on)
        ds["late" if late_on else "previous"] = (time.perf_counter() - t0) / len(facts)
    out["dataset"] = {"facts": len(facts), "late_s_per_fact": ds["late"], "previous_s_per_fact": ds["previous"],
                      "speedup": ds["previous"] / ds["late"], "load_1min_after": os.getloadavg()[0]}
    print(json.dumps(out["dataset"]), flush=True)
    print(f"\n{'shape':<14} {'tokens':>6} {'late s':>8} {'previous s':>11} {'loop s (extrap.)':>17} "
          f"{'late vs loop':>13} {'previous vs loop':>17} {'floor vs loop':>14}")
    for r in out["shapes"]:
        print(f"{r['shape']:<14} {r['tokens']:>6} {r['late_s']:>8.1f} {r['previous_batched_s']:>11.1f} "
              f"{r['loop_extrapolated_s']:>17.1f} {r['speedup_vs_loop']:>12.1f}x {r['previous_speedup_vs_loop']:>16.1f}x "
              f"{r['loop_over_floor']:>13.2f}x")
    d = out["dataset"]
    print(f"dataset mode ({d['facts']} known facts): {d['late_s_per_fact']:.1f} s/fact late, "
          f"{d['previous_s_per_fact']:.1f} s/fact previous ({d['speedup']:.2f}x)")
    print(f"wrote {write_json('bench_trace_shapes', out)}")


def floors(model: tlcap.Model, samples: int) -> None:
    """The compute floor of both prompt shapes (counted FLOPs, no timing): ``bench_trace_floor.json``."""
    out: dict = {"model": model.name, "samples": samples, "shapes": []}
    for name, prompt, subject, target in SHAPES:
        setup = prepare_trace(model, prompt, subject, target, samples=samples, warn=False)
        row = {"shape": name, "prompt": prompt, "subject": subject, "tokens": setup.n_tokens,
               **flop_floor(model, setup)}
        out["shapes"].append(row)
        print(f"{name:<14} {setup.n_tokens:>3} tokens: loop {row['loop_flops']:.3g} FLOPs, floor "
              f"{row['floor_flops']:.3g}, loop/floor {row['loop_over_floor']:.2f}x")
    print(f"wrote {write_json('bench_trace_floor', out)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--subject", default="France")
    ap.add_argument("--target", default=" Paris")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--loop-cells", type=int, default=None)
    ap.add_argument("--edits", type=int, default=None)
    ap.add_argument("--shapes", action="store_true", help="late expansion vs previous vs loop, both prompt shapes")
    ap.add_argument("--facts", type=int, default=4, help="known facts of the --shapes dataset-mode timing")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--floor", action="store_true", help="only the compute floor of both prompt shapes (FLOPs, no timing)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    samples = args.samples or (3 if args.quick else 10)
    n_loop = args.loop_cells or (12 if args.quick else 30)
    n_edits = args.edits or (1 if args.quick else 3)

    model = tlcap.load_model(args.model)
    if args.floor:
        floors(model, samples)
        return
    if args.shapes:
        shapes(model, samples, n_loop, args.facts)
        return
    L = model.n_layers
    rows = []

    # ---- batched trace, all kinds / tokens / layers
    t0 = time.perf_counter()
    tr = causal_trace(model, args.prompt, args.subject, args.target, samples=samples, progress=True)
    t_batched = time.perf_counter() - t0
    T = len(tr.tokens)
    n_cells = len(KINDS) * T * L

    # ---- per-cell loop on a spread subset of cells (same setup, same noise)
    setup = prepare_trace(model, args.prompt, args.subject, args.target, samples=samples)
    all_cells = [(k, t, l) for k in KINDS for t in range(T) for l in range(L)]
    step = max(1, len(all_cells) // n_loop)
    subset = all_cells[::step][:n_loop]
    t0 = time.perf_counter()
    max_err = 0.0
    for kind, t, l in subset:
        p = trace_cell(setup, kind, t, l)
        max_err = max(max_err, abs(p - float(tr.score(kind)[t, l])))
    t_loop_subset = time.perf_counter() - t0
    per_cell = t_loop_subset / len(subset)
    t_loop = per_cell * n_cells
    rows.append(("causal trace, batched (measured)", t_batched, n_cells))
    rows.append((f"causal trace, per-cell loop (extrapolated: {len(subset)} cells measured)", t_loop, n_cells))

    # ---- ROME edit time (covariance cached first, timed separately)
    cfg = RomeConfig()
    layer = L // 6  # an early-middle layer (4 on SmolLM2)
    cached = covariance_path(model, layer, cfg.cov_tokens, cfg.cov_seq_len).exists()
    t0 = time.perf_counter()
    key_covariance(model, [layer], n_tokens=cfg.cov_tokens, seq_len=cfg.cov_seq_len)
    t_cov = time.perf_counter() - t0
    edit_times, steps = [], []
    for _ in range(n_edits):
        W0 = model.mlp_down_matrix(layer).clone()
        t0 = time.perf_counter()
        e = rome_edit(model, "The Eiffel Tower is located in the city of", "The Eiffel Tower", " Rome", layer, config=cfg)
        edit_times.append(time.perf_counter() - t0)
        steps.append(len(e.losses))
        e.undo()
        assert torch.equal(model.mlp_down_matrix(layer), W0)

    res = {
        "model": args.model, "quick": args.quick, "prompt": args.prompt, "tokens": T, "layers": L,
        "samples": samples, "cells": n_cells,
        "trace_batched_s": t_batched, "trace_loop_extrapolated_s": t_loop, "loop_cells_measured": len(subset),
        "loop_subset_s": t_loop_subset, "loop_s_per_cell": per_cell, "speedup": t_loop / t_batched,
        "max_abs_diff_subset": max_err,
        "covariance_s": t_cov, "covariance_was_cached": cached, "cov_tokens": cfg.cov_tokens,
        "rome_edit_s": edit_times, "rome_edit_mean_s": sum(edit_times) / len(edit_times), "rome_steps": steps,
        "clean_prob": tr.clean_prob, "corrupted_prob": tr.corrupted_prob,
        "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
        "load_avg_1m": os.getloadavg()[0],
    }
    print()
    print(f"{'what':<62} {'seconds':>9}")
    print(f"{'-' * 62} {'-' * 9}")
    for name, s, _ in rows:
        print(f"{name:<62} {s:9.1f}")
    print(f"{'speedup (loop / batched)':<62} {res['speedup']:9.1f}x")
    print(f"{'max |batched − loop| on measured cells':<62} {max_err:9.2e}")
    print(f"{'key covariance, ' + str(cfg.cov_tokens) + ' tokens' + (' (cached)' if cached else ''):<62} {t_cov:9.1f}")
    edit_label = f"ROME edit (layer {layer}, {steps} Adam steps), mean of {n_edits}"
    print(f"{edit_label:<62} {res['rome_edit_mean_s']:9.1f}")
    print(f"(cells = 3 kinds × {T} tokens × {L} layers = {n_cells}; {samples} noise samples; "
          f"1-min load avg {res['load_avg_1m']:.1f})")
    print(f"wrote {write_json('bench_trace', res)}")


if __name__ == "__main__":
    main()
