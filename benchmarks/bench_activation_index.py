"""Time the activation index (tlcap.activation_index) on SmolLM2-135M over WikiText-2 test, and the card it serves.

Builds the index of the first ``--tokens`` tokens of the bundled WikiText-2 test split (all of
it with ``--tokens 0``) in each ``--dtype``, reports tokens per second and the projected time of
the whole split (about 300k SmolLM2 tokens), then times opening a card from the saved index (a
fresh load from disk, then from memory) with a prompt. The index is written to a temporary cache.

    python benchmarks/bench_activation_index.py --tokens 8192 --threads 2 --dtype float32 bfloat16

Writes ``benchmarks/results/bench_activation_index.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

import tlcap
from benchmarks._util import RESULTS_DIR, env_info
from tlcap.explore.activation_index import _LOADED, activation_index, corpus_tokens

PROMPT = "The capital of France is"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192, help="tokens indexed (0: the whole split)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch-contexts", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = {"env": env_info(), "args": vars(args), "runs": []}
    total = None
    for dtype in args.dtype:
        model = tlcap.load_model("smollm2-135m", dtype=dtype)
        if total is None:
            total = len(corpus_tokens(model))
        cache = tempfile.mkdtemp()
        max_tokens = args.tokens or None
        t0 = time.perf_counter()
        idx = activation_index(model, max_tokens=max_tokens, context=args.context, cache=cache, progress=False,
                               batch_contexts=args.batch_contexts)
        wall = time.perf_counter() - t0
        n = int(idx.tokens.numel())
        _LOADED.clear()
        model32 = model if dtype == "float32" else tlcap.load_model("smollm2-135m")
        t1 = time.perf_counter()
        tlcap.inspect_neuron(model32, 20, 100, PROMPT, max_tokens=max_tokens, context=args.context, cache=cache)
        cold = time.perf_counter() - t1
        t2 = time.perf_counter()
        tlcap.inspect_neuron(model32, 21, 7, PROMPT, max_tokens=max_tokens, context=args.context, cache=cache)
        warm = time.perf_counter() - t2
        run = {"dtype": dtype, "tokens": n, "seconds": wall, "tokens_per_s": n / wall,
               "projected_full_split_s": total / (n / wall), "full_split_tokens": total,
               "card_cold_s": cold, "card_warm_s": warm, "loadavg_after": list(os.getloadavg())}
        out["runs"].append(run)
        print(json.dumps(run), flush=True)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "bench_activation_index.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
