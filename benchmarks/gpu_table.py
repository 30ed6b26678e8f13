"""README's GPU table from a ``bench_gpu.py`` JSON (``--quick`` or the full run): device, dtype, date, per method.

One row per measured section and model shape: throughput, seconds per sample, the fraction of the
bf16 matmul peak measured in the same run, peak GPU memory, and the batch it ran at. A section that
failed or was skipped gets a row saying so (no number is invented). ``--write README.md`` replaces
the block between ``<!-- gpu-table:start -->`` and ``<!-- gpu-table:end -->``; without it the
Markdown is printed.

Usage::

    python benchmarks/gpu_table.py benchmarks/results/gpu_quick_h100.json
    python benchmarks/gpu_table.py benchmarks/results/gpu_quick_h100.json --write README.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

START, END = "<!-- gpu-table:start -->", "<!-- gpu-table:end -->"
SHAPES = {"smollm2_shape": "SmolLM2-135M shape", "llama7b_shape": "Llama-2-7B shape"}
METHODS = {
    "kn_exact_ig": "KN exact IG, 20 steps, one fact",
    "kn_facts_batched": "KN exact IG, facts batched",
    "cnl_exact_ig": "CNL exact IG, one GSM8K sample at a time",
    "cnl_exact_ig_batched": "CNL exact IG, {sample_batch} GSM8K samples batched",
    "ql_amig_batched": "QL AMIG, facts batched",
    "trace_facts_batched": "causal trace, facts batched",
    "causal_trace": "causal trace, {noise_samples} noise samples, one prompt",
    "eap": "EAP, one prompt pair",
    "eap_ig5": "EAP-IG (5 steps), one prompt pair",
}


def _num(v: Any, fmt: str) -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def _pct(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return "–"
    return f"{100 * v:.2f} %" if v < 0.1 else f"{100 * v:.1f} %"


def rows(d: dict[str, Any]) -> list[list[str]]:
    """Table rows ``[method, shape, dtype, samples/s, s/sample, fraction of peak, peak GiB, batch]``."""
    out = []
    settings = d.get("settings") or {}  # a section that did not run records no settings of its own: the run's
    default = {"sample_batch": settings.get("cnl_batch", "?"), "noise_samples": settings.get("trace_samples", "?")}
    for shape_key, shape in SHAPES.items():
        for dtype, sections in (d.get(shape_key) or {}).items():
            for key, label in METHODS.items():
                r = sections.get(key)
                if not isinstance(r, dict):
                    continue
                name = label.format(**{k: r.get(k, v) for k, v in default.items()})
                if "error" in r or "skipped" in r:
                    why = str(r.get("error") or r.get("skipped")).splitlines()[0][:80]
                    out.append([name, shape, dtype, f"not measured: {why}", "", "", "", ""])
                    continue
                batch = r.get("batch_rows") or r.get("sample_batch") or r.get("batch") or ""
                out.append([name, shape, dtype, _num(r.get("samples_per_s"), "{:.3g}"),
                            _num(r.get("seconds_per_sample"), "{:.3g}"), _pct(r.get("fraction_of_matmul_peak")),
                            _num(r.get("peak_gib"), "{:.1f}"), str(batch)])
    return out


def markdown(d: dict[str, Any], source: str = "") -> str:
    """The README block: the measurement's header line, the table, the cuda tests' summary."""
    mm = d.get("matmul") or {}
    env = d.get("env") or {}
    date = d.get("date") or str(env.get("time", "?"))[:10]
    how = "`python benchmarks/bench_gpu.py --quick`" if d.get("quick") else "`python benchmarks/bench_gpu.py`"
    head = (f"Measured on **{d.get('device', '?')}** ({date}, torch {env.get('torch', '?')}, "
            f"transformer-lens {env.get('transformer_lens', '?')}; {how}{', JSON: `' + source + '`' if source else ''}); "
            f"measured bf16 matmul peak {_num(mm.get('tflops'), '{:.0f}')} TFLOP/s (n = {mm.get('n', '?')}). "
            "Random weights of the real shapes; fixed-step methods cost the same as with real weights.")
    lines = [head, "",
             "| method | model | dtype | samples/s | s / sample | fraction of bf16 matmul peak | peak GPU memory (GiB) | batch |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(d)]
    tests = d.get("cuda_tests")
    if isinstance(tests, dict) and "counts" in tests:
        lines += ["", f"`cuda`-marked tests there: {tests.get('summary') or tests['counts']}."]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between the markers replaced by ``block`` (markers kept).

    Raises:
        ValueError: the markers are not both in ``text``, in order.
    """
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no {START} ... {END} block to replace")
    return text[: i + len(START)] + "\n" + block + "\n" + text[j:]


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", type=Path, help="a bench_gpu.py JSON")
    ap.add_argument("--write", type=Path, default=None, help="replace the gpu-table block of this file (README.md)")
    args = ap.parse_args(argv)
    block = markdown(json.loads(args.json.read_text()), args.json.name)
    if args.write is not None:
        args.write.write_text(replace_block(args.write.read_text(), block))
        print(f"[gpu_table] wrote the table into {args.write}")
    else:
        print(block)
    return block


if __name__ == "__main__":
    main()
