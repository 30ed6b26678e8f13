"""Count the host round trips (GPU synchronisations) of the batched methods, on a CPU.

Each method runs on a random tiny Llama (``--layers`` layers) with the accelerator's code path (the samples'
clean forwards as one padded pass, :func:`tlcap.runtime.device.one_pass_default`) under
:func:`tlcap.runtime.host_syncs.count_host_syncs`, at two sizes (``--facts`` and twice as many facts or
samples), so the per-call and per-fact round trips can be told apart. On a GPU each round trip drains the
launch queue (the H200 profile of KN over 8 facts counted 74 ``cudaStreamSynchronize`` per call,
``gpu_goals_h200.json``). Writes ``benchmarks/results/host_syncs[_TAG].json``::

    PYTHONPATH=. python benchmarks/count_host_syncs.py --layers 32 --facts 4 --batch-rows 128
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._util import env_info, write_json  # noqa: E402
from tlcap.attribution import integrated_gradients_facts  # noqa: E402
from tlcap.attribution.amig import amig_facts  # noqa: E402
from tlcap.attribution.dataset import score_dataset  # noqa: E402
from tlcap.data.tasks import load_task  # noqa: E402
from tlcap.locate.causal_trace import causal_trace_facts  # noqa: E402
from tlcap.models import make_llama  # noqa: E402
from tlcap.runtime import device  # noqa: E402
from tlcap.runtime.host_syncs import count_host_syncs  # noqa: E402
from tlcap.runtime.run_control import RunControl  # noqa: E402

FACTS = [
    ("The capital of France is", " Paris", "France"),
    ("The Eiffel Tower is located in the city of", " Paris", "The Eiffel Tower"),
    ("The mother tongue of Danielle Darrieux is", " French", "Danielle Darrieux"),
    ("Michael Jordan plays the sport of", " basketball", "Michael Jordan"),
    ("The official language of Italy is", " Italian", "Italy"),
    ("Toko Yasuda plays the", " guitar", "Toko Yasuda"),
]


def methods(model: Any, steps: int, batch_rows: int) -> dict[str, Callable[[int], Any]]:
    """Per method, a call on ``k`` facts (or GSM8K samples)."""
    def facts(k: int) -> list[tuple[str, str, str]]:
        return [FACTS[i % len(FACTS)] for i in range(k)]
    quiet = RunControl(progress=False)
    return {
        "kn_facts": lambda k: integrated_gradients_facts(model, [(p, t) for p, t, _ in facts(k)], steps=steps,
                                                         fact_batch=k, batch_rows=batch_rows),
        "kn_facts_auto": lambda k: integrated_gradients_facts(model, [(p, t) for p, t, _ in facts(k)], steps="auto",
                                                              fact_batch=k, batch_rows=batch_rows),
        "ql_amig": lambda k: amig_facts(model, [(p, t) for p, t, _ in facts(k)], steps=max(2, steps // 4),
                                        words="all", fact_batch=k, batch_rows=batch_rows),
        "trace_facts": lambda k: causal_trace_facts(model, [(p, s, t) for p, t, s in facts(k)], samples=3, fact_batch=k,
                                                    batch_rows=batch_rows, warn=False),
        "cnl_score": lambda k: score_dataset(model, load_task("gsm8k", split="train", n=k, seed=0), steps=steps,
                                             sample_batch=k, batch_rows=batch_rows, run=quiet),
        "cnl_score_auto": lambda k: score_dataset(model, load_task("gsm8k", split="train", n=k, seed=0), steps="auto",
                                                  sample_batch=k, batch_rows=batch_rows, run=quiet),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32, help="layers of the random tiny Llama")
    ap.add_argument("--facts", type=int, default=4, help="facts (samples) of the first size; the second is twice")
    ap.add_argument("--steps", type=int, default=20, help="IG steps (QL's AMIG: a quarter)")
    ap.add_argument("--batch-rows", type=int, default=128, help="rows per batch (more batches: more per-batch trips)")
    ap.add_argument("--only", nargs="*", help="methods to run (default: all)")
    ap.add_argument("--tag", default="", help="write host_syncs_TAG.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = make_llama(seed=0, n_layers=args.layers)
    out: dict[str, Any] = {"env": env_info(), "settings": vars(args), "methods": {}}
    with mock.patch.object(device, "one_pass_default", lambda m: True):  # what an accelerator runs
        for name, fn in methods(model, args.steps, args.batch_rows).items():
            if args.only and name not in args.only:
                continue
            rec: dict[str, Any] = {}
            for k in (args.facts, 2 * args.facts):
                t0 = time.perf_counter()
                with count_host_syncs(model) as syncs:
                    fn(k)
                rec[str(k)] = {"total": syncs.total, "by_kind": dict(syncs.by_kind), "by_site": dict(syncs.by_site),
                               "seconds": round(time.perf_counter() - t0, 2)}
                print(f"{name}, {k} facts: {syncs.summary(8)}", flush=True)
            a, b = rec[str(args.facts)]["total"], rec[str(2 * args.facts)]["total"]
            rec["per_fact"] = (b - a) / args.facts
            rec["per_call"] = a - rec["per_fact"] * args.facts
            out["methods"][name] = rec
    path = write_json("host_syncs" + (f"_{args.tag}" if args.tag else ""), out)
    print("\n".join(f"{n:16s} per call {r['per_call']:6.1f}   per fact {r['per_fact']:5.1f}"
                    for n, r in out["methods"].items()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
