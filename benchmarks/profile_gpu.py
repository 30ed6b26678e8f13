"""Where GPU time goes: exact-IG KN batch_rows sweep and torch.profiler tables (KN, CNL) on the SmolLM2 shape.

Run on a CUDA machine: ``python benchmarks/profile_gpu.py`` (random weights of the real shape; timings equal
the real model for fixed-step IG). Found on an H100 (2026-11-22): exact IG is launch-bound: one KN fact
= 687 ms CPU-side vs 48 ms of CUDA kernels; one GSM8K CNL sample = 110,304 kernel launches, 5.3 s CPU vs
0.44 s CUDA, plus 0.48 s in CPU scatter_add_ (float64 accumulation on the CPU).
"""

import time

import torch
from torch.profiler import ProfilerActivity, profile

from tlcap.attribution.dataset import score_dataset
from tlcap.attribution.ig import integrated_gradients
from tlcap.data.tasks import load_task
from tlcap.models import load_model
from tlcap.runtime.run_control import RunControl


def _sync() -> None:
    torch.cuda.synchronize()


def main() -> None:
    dev = torch.device("cuda")
    for dt in (torch.float32, torch.bfloat16):
        m = load_model("smollm2-135m-shape", device=dev, dtype=dt)
        p, t = "The Eiffel Tower is located in the city of", " Paris"
        for br in (None, 64, 256, 1024):
            kw = {} if br is None else {"batch_rows": br}
            integrated_gradients(m, p, t, steps=20, **kw)
            _sync()
            t0 = time.perf_counter()
            for _ in range(3):
                integrated_gradients(m, p, t, steps=20, **kw)
            _sync()
            print(dt, "kn batch_rows", br, (time.perf_counter() - t0) / 3, flush=True)
        if dt != torch.float32:
            continue
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            integrated_gradients(m, p, t, steps=20)
            _sync()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), flush=True)
        s = load_task("gsm8k", split="train", n=2, seed=0)
        for sm in s:
            print("gsm8k prompt tokens", len(m.to_tokens(sm.prompt)[0]), "answer", repr(sm.answer)[:80])
        score_dataset(m, [s[0]], steps=20, run=RunControl(progress=False))
        _sync()
        t0 = time.perf_counter()
        score_dataset(m, [s[1]], steps=20, run=RunControl(progress=False))
        _sync()
        print("cnl one sample", time.perf_counter() - t0, flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            score_dataset(m, [s[1]], steps=20, run=RunControl(progress=False))
            _sync()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), flush=True)


if __name__ == "__main__":
    main()
