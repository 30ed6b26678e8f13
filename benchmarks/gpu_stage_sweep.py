"""Every ``reproduce`` stage at ``smoke`` scale on a tiny random Llama on an accelerator: which stages break there.

``python benchmarks/gpu_stage_sweep.py --out sweep.json`` (``--device cpu`` runs the same sweep on a CPU, where the
batched paths an accelerator takes by default are off). Each stage's status and note come from the report, so a
device mismatch in a path only an accelerator takes (``runtime.device.one_pass_default``) shows as a failed stage
with its error instead of stopping the sweep. ``--erase`` also decodes CNL erase's GSM8K items one item's sets per
step against every item's rows per step (``gpu_goals.erase_rows``) in float32 and bfloat16: the predictions of the
two paths agree where the arithmetic is the same to the last bit, and bfloat16's batch-shape rounding is what
separates them otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_gpu as bg  # noqa: E402
from tlcap.models import make_llama  # noqa: E402
from tlcap.reproduce.run import reproduce  # noqa: E402
from tlcap.rows import row_dict  # noqa: E402


def sweep(device: torch.device, dtype: torch.dtype, only: list[str] | None) -> dict[str, Any]:
    """The ``smoke`` reproduce of both papers on a tiny Llama (GPT-2 BPE, so no SmolLM2 tokenizer is needed).

    Args:
        device: Where it runs.
        dtype: The model's dtype.
        only: Stages (names or prefixes) to run; ``None``: all.

    Returns:
        ``stages``: name, status, seconds and note per stage; ``failed``: the names of the failed ones.
    """
    model = make_llama(seed=0, vocab=50257, device=device, dtype=dtype)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = reproduce(model, Path(tmp) / "repro", papers=("cnl", "ql"), scale="smoke", only=only)
        stages = [{k: v for k, v in row_dict(s).items() if k in ("name", "status", "measured_s", "note")}
                  for s in run.report.stages]
    return {"dtype": str(dtype).removeprefix("torch."), "seconds": time.perf_counter() - t0, "stages": stages,
            "failed": [s["name"] for s in stages if s["status"] == "failed"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the sweep (module docstring) and write its JSON.

    Args:
        argv: Command-line arguments (``--help``).

    Returns:
        The JSON payload.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--only", default="", help="comma list of stages or prefixes (default: every stage)")
    ap.add_argument("--erase", action="store_true", help="also CNL erase's decode paths in float32 and bfloat16")
    args = ap.parse_args(argv)
    device = bg.resolve_device(args.device)
    only = [x.strip() for x in args.only.split(",") if x.strip()] or None
    payload: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "env": bg.env_info(), "date": time.strftime("%Y-%m-%d"), "only": only}
    write = lambda: args.out.write_text(json.dumps(payload, indent=1, default=str))  # noqa: E731
    try:
        payload["sweep"] = sweep(device, torch.float32, only)
    except Exception as e:  # noqa: BLE001 - recorded, the other parts still run
        payload["sweep"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    write()
    print("[sweep]", json.dumps({k: v for k, v in payload["sweep"].items() if k != "stages"}), flush=True)
    if args.erase:
        from benchmarks.gpu_goals import erase_rows  # noqa: PLC0415 - only with --erase

        for dt in (torch.float32, torch.bfloat16):
            m = make_llama(seed=1, vocab=50257, device=device, dtype=dt)
            try:
                r = erase_rows(m, device, 4, 25)
            except Exception as e:  # noqa: BLE001
                r = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            payload[f"erase_{str(dt).removeprefix('torch.')}"] = r
            write()
            print(f"[erase {dt}]", json.dumps({k: v for k, v in r.items() if "predictions" not in k}), flush=True)
    return payload


if __name__ == "__main__":
    main()
