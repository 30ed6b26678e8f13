"""Benchmark: one compensated Adam step of masked fine-tuning (CNL enhance, ``"except"`` mode) against the step as
written before 2026-12-04, and against the machine's memory bandwidth.

``python benchmarks/bench_compensated_adam.py --out benchmarks/results/bench_compensated_adam.json`` steps a
bfloat16 matrix of the Llama-2-7B MLP shape (11,008 × 4,096, 45 M entries, the whole matrix trained with a 0/1
neuron mask) with :class:`tlcap.intervene.finetune._CompensatedAdam` and with :func:`reference_step` (the old
arithmetic), alternating, best of ``--repeats`` each, in one process, and times a large float32 copy for the
bandwidth. The step is elementwise: its time is the bytes it moves over the bandwidth. Counted per entry
(bytes read + written, the 0/1 mask broadcast): the old step 132, the new one 112, a fused kernel 26 (read the
weight, residual, gradient and both moments, write all but the gradient). At 7B the step covers 4.33 B entries,
so its bytes, not its FLOPs, set the fine-tuning floor (``cnl.enhance`` is 81.5x its FLOP floor in the plan).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlcap.intervene.finetune import _CompensatedAdam, _Scratch  # noqa: E402

COUNTED_BYTES = {"reference": 132, "tlcap": 112, "fused": 26}
"""Bytes read + written per entry (module docstring; bfloat16 weight, residual and gradient, float32 moments)."""


def reference_step(st: _CompensatedAdam, grad: torch.Tensor) -> None:
    """The compensated step as written before 2026-12-04 (each operation its own copy), the reference the
    rewritten step is tested bit-equal to (``tests/unit/test_finetune.py``).

    Args:
        st: The stepper (its moments, residual and parameter are updated in place).
        grad: The parameter's full gradient.
    """
    with torch.no_grad():
        g = (grad if st.idx is None else grad.index_select(st.dim, st.idx)).to(torch.float32, copy=True)
        if st.mask is not None:
            g.mul_(st.mask)
        st.steps += 1
        b1, b2 = st.BETAS
        st.exp_avg.lerp_(g, 1 - b1)
        st.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1**st.steps, 1 - b2**st.steps
        denom = (st.exp_avg_sq.sqrt() / bc2**0.5).add_(st.EPS)
        exact = st._read().to(torch.float32, copy=True).add_(st.residual)
        exact.addcdiv_(st.exp_avg, denom, value=-st.lr / bc1)
        new = exact.to(st.param.dtype, copy=True)
        st.residual.copy_(exact.sub_(new))
        if st.idx is None:
            st.param.data.copy_(new)
        else:
            st.param.data.index_copy_(st.dim, st.idx, new)


def main(argv: list[str] | None = None) -> dict:
    """Time both steps and the copy (module docstring) and write the JSON.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        Seconds of each step, the copy bandwidth and the bytes per entry each step's time implies at it.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=11008)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(args.rows, 1, dtype=torch.bool)
    mask[:16] = False  # a located set frozen: the whole matrix trained, its gradient masked ("except")
    grad = (torch.randn(args.rows, args.cols, generator=gen) * 1e-3).to(torch.bfloat16)
    steppers = {}
    for name in ("tlcap", "reference"):
        p = torch.nn.Parameter((torch.randn(args.rows, args.cols, generator=gen) * 0.02).to(torch.bfloat16),
                               requires_grad=False)
        steppers[name] = _CompensatedAdam(p, 0, mask, 1e-5, _Scratch())
    run = {"tlcap": lambda: steppers["tlcap"].step(grad), "reference": lambda: reference_step(steppers["reference"], grad)}
    for fn in run.values():
        fn()  # warm-up
    best = {k: float("inf") for k in run}
    for _ in range(args.repeats):
        for k, fn in run.items():  # alternating: a slower stretch of the machine hits both
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    a = torch.ones(args.rows * args.cols * 2, dtype=torch.float32)
    b = torch.empty_like(a)
    b.copy_(a)
    cp = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        cp = min(cp, time.perf_counter() - t0)
    bw = 2 * a.numel() * 4 / cp
    n = args.rows * args.cols
    out = {"entries": n, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "seconds": best, "speedup": best["reference"] / best["tlcap"], "copy_bandwidth_GBps": bw / 1e9,
           "implied_bytes_per_entry": {k: s * bw / n for k, s in best.items()}, "counted_bytes_per_entry": COUNTED_BYTES}
    print(json.dumps(out, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
