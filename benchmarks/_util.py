"""Small helpers shared by the benchmark scripts: timing, tables, JSON output."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[float, Any]:
    """Run ``fn`` ``repeats`` times; return (best wall-clock seconds, last result).

    The minimum is the least noisy estimate on a shared machine.
    """
    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def cpu_model() -> str:
    """The CPU's model name and its widest vector extension (``"AMD EPYC (avx2)"``; ``"?"`` where unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "?"
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    vec = next((f for f in ("avx512f", "avx2", "avx") if f in flags), "")
    return f"{name} ({vec})" if vec else name


def env_info() -> dict[str, Any]:
    """Versions and machine facts recorded next to the numbers."""
    import torch
    import transformers

    try:
        from importlib.metadata import version

        tl = version("transformer-lens")
    except Exception:  # noqa: BLE001
        tl = "?"
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "transformer_lens": tl,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg": load,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def print_table(rows: list[dict[str, Any]], columns: list[str] | None = None, floatfmt: str = "{:.3g}") -> None:
    """Print ``rows`` as an aligned plain-text table."""
    if not rows:
        return
    cols = columns or list(rows[0].keys())

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return floatfmt.format(v)
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` and return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path
