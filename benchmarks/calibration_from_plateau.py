"""Derive a replayable calibration from a GPU run's own measurements (no new device time).

The H200 probe of ``gpu_goals3`` timed IG at 192 and 672 rows, both launch-bound (0.229 s and 0.176 s), so its
fit gave IG rows no per-row cost and a pass of 672 rows. The same run also measured (a) the bf16 matrix-product
peak (``matmul``: 799.5 TFLOP/s) and (b) IG rows per second from 8 to 8,175 rows (``plateaus``). This script
writes the probe with ``peak_flops`` from (a) (every unit's seconds per FLOP floored at it,
:func:`tlcap.reproduce.cost.floor_at_peak`) and the IG two sizes from (b): 8 rows and the batch
``batch_rows="auto"`` chose there (4,096 rows at context 128). Its ``memory_scale`` was measured against 128
modelled rows (the probe of that day); the probe now measures it against all the rows of the larger run's one pass
(a batched pass of ``B`` rows is predicted at ``memory_scale · B`` rows, :func:`tlcap.reproduce.cost.held_bytes`),
so it is rescaled to the 672 rows that run held in its one pass (``ig_peak_bytes / (672 · ig_row_bytes)``).
That probe did not record the card's memory (``meta["device_bytes"]``, which caps the rows a pass may hold,
:func:`tlcap.reproduce.cost.memory_rows`); it is taken from the same run's plateau record: at context 128
``batch_rows="auto"`` capped the batch at 8,175 rows, ``0.8 · free / row bytes`` with the runtime's row estimate
(:func:`tlcap.runtime.batching.ig_row_bytes`: 4 bytes per value, 32 heads), so ``free = 8,175 · row bytes / 0.8``
and ``device_bytes = base_bytes + free``.

Usage::

    PYTHONPATH=. python benchmarks/calibration_from_plateau.py \
        benchmarks/results/gpu_goals3_h200.calibration.json benchmarks/results/gpu_goals3_h200.json \
        benchmarks/results/gpu_goals3_h200.calibration_v3.json
"""

import json
import sys
from types import SimpleNamespace

import torch

from tlcap.reproduce.cost import Calibration, ModelShape
from tlcap.reproduce.probe import split_pass_flop
from tlcap.runtime.batching import SAFETY, ig_row_bytes


def main(cal_path: str, run_path: str, out: str) -> None:
    d = json.load(open(cal_path))
    g = json.load(open(run_path))
    peak = g["matmul"]["tflops"] * 1e12
    pl = [p for p in g["plateaus"]["probes"] if p["kind"] == "ig" and p["context_bucket"] == 128][0]
    rates = {int(r): v for r, v in pl["rates_rows_per_s"]}
    c = d["calibrations"][0]
    c["peak_flops"] = peak
    c.setdefault("meta", {})["peak_flops_from"] = f"{run_path} 'matmul' (same run: 8192^3 bf16, {peak / 1e12:.1f} TFLOP/s)"
    # the file's own count (its ig_row_passes): the runs below go back into this dict, which Calibration.from_dict
    # rescales once at the end (a per-row count read from an already loaded Calibration would be rescaled twice)
    per_row = c["probe"]["ig_row"]["flops"] / c["probe"]["ig_row"]["units"]  # ig_row_flops of the shape
    held = int(c["probe"]["ig_row"]["units"])  # the rows of the probe's larger IG run (one pass)
    if c["meta"].get("memory_rows") is None:  # per row of that pass, not of 128 modelled rows
        row_bytes = ModelShape.from_config(**c["shape"]).ig_row_bytes()
        c["memory_scale"] = c["meta"]["ig_peak_bytes"] / (held * row_bytes)
        c["meta"]["memory_rows"] = (f"memory_scale = ig_peak_bytes / ({held} rows x {row_bytes} modelled bytes): the "
                                    "probe's larger IG run held its rows in one pass")
    small, big = 8, int(pl["rows"])  # the plateau's choice: what batch_rows="auto" runs per pass there
    runs = [(1.0, n * per_row, n / rates[n]) for n in (small, big)]
    c["probe"]["ig_row@0"] = {"units": small, "flops": runs[0][1], "seconds": runs[0][2], "passes": 1.0}
    c["probe"]["ig_row"] = {"units": big, "flops": runs[1][1], "seconds": runs[1][2], "passes": 1.0}
    c["seconds_per_pass"]["ig_row"], c["seconds_per_flop"]["ig_row"] = split_pass_flop(*runs)
    c["meta"]["ig_row_from"] = (f"{run_path} 'plateaus' (same run, IG rows at context 128: {small} rows {runs[0][2]:.4f} s, "
                                f"{big} rows {runs[1][2]:.4f} s, the batch batch_rows='auto' chose); the probe's own IG "
                                "sizes (192 and 672 rows) were both launch-bound")
    if "device_bytes" not in c["meta"]:
        # pl's cap (8,175) is the memory fit (the call had more rows); the probed model: Llama-2-7B's 32 heads
        shaped = SimpleNamespace(**c["shape"], n_heads=32, dtype=torch.bfloat16)
        ctx = pl["context_bucket"]
        rt_row = ig_row_bytes(shaped, ctx)
        c["meta"]["device_bytes"] = int(c["base_bytes"] + pl["cap"] * rt_row / SAFETY)
        c["meta"]["device_bytes_from"] = (f"{run_path} 'plateaus': batch_rows='auto' capped IG at {pl['cap']} rows "
                                          f"at context {ctx} ({SAFETY} x free / {rt_row} bytes per row): base + free")
    d["calibrations"][0] = Calibration.from_dict(c).to_dict()
    with open(out, "w") as f:
        json.dump(d, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
