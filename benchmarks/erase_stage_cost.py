"""Predicted vs measured time of the ``cnl.erase.<ds>`` stage's work on SmolLM2 (issue 24 sizing).

Runs the calibration probe, then, per dataset, what the stage runs — the base ``task_accuracy``
and, per σ, :func:`~tlcap.experiments.cnl.erase_effect` with ``--n-random`` matched random sets
(batched) and the perplexity control — on the located set of a saved ``cnl.locate.<ds>`` result,
and prints the cost model's prediction (:func:`tlcap.reproduce.cnl_stages.erase_sets_work`, the
probe of this process) beside the measured seconds and the load. The work is linear in the sets,
so a smaller ``--n-random`` checks the model in less time.

    python benchmarks/erase_stage_cost.py --location emotion=runs/cache/cnl.locate.emotion-*/location \
        --location mbpp=runs/cache/cnl.locate.mbpp-*/location --n emotion=60 --n mbpp=8 --n-random 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import RESULTS_DIR, env_info, print_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--location", action="append", required=True, help="dataset=path of a saved CNLLocation")
    ap.add_argument("--n", action="append", default=[], help="dataset=held-out samples")
    ap.add_argument("--n-random", type=int, default=50)
    ap.add_argument("--ppl-texts", type=int, default=4)
    ap.add_argument("--ppl-n-random", type=int, default=50)
    ap.add_argument("--sigmas", default="3,6,12")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    import tlcap
    from tlcap.data.tasks import load_task
    from tlcap.experiments.cnl import erase_effect
    from tlcap.metrics.accuracy import task_accuracy
    from tlcap.reproduce.cnl_stages import erase_sets_work, eval_work
    from tlcap.reproduce.cost import predict
    from tlcap.reproduce.probe import calibrate
    from tlcap.results import load_result

    model = tlcap.load_model("smollm2-135m")
    cal = calibrate(model)
    sizes = dict(x.split("=") for x in args.n)
    sigmas = [float(s) for s in args.sigmas.split(",")]
    rows = []
    for spec in args.location:
        ds, path = spec.split("=")
        loc = load_result(path)
        samples = load_task(ds, split="test", n=int(sizes.get(ds, 60)), seed=0)
        work = eval_work(model, ds, samples) + erase_sets_work(
            model, ds, samples, 1 + args.n_random, ppl_texts=args.ppl_texts,
            ppl_sets=2 + min(args.ppl_n_random, args.n_random)).scaled(len(sigmas))
        pred = predict(work, cal).seconds
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        base = task_accuracy(model, ds, samples)
        per = {}
        for s in sigmas:
            ts = time.perf_counter()
            er = erase_effect(model, ds, samples, loc.reselect(s), n_random=args.n_random, base_accuracy=base,
                              ppl_texts=args.ppl_texts, ppl_n_random=args.ppl_n_random)
            per[f"{s:g}"] = {"seconds": time.perf_counter() - ts, "n_neurons": er.n_neurons, "tokens": er.meta["tokens"],
                             "located": er.located_accuracy, "random_mean": er.random_accuracy,
                             "ppl": er.perplexities[:3].tolist()}
        dt = time.perf_counter() - t0
        rows.append({"dataset": ds, "items": len(samples), "n_random": args.n_random, "predicted_s": pred, "measured_s": dt,
                     "measured/predicted": dt / pred, "load": (load0 + os.getloadavg()[0]) / 2,
                     "probe_load": cal.load, "per_sigma": per})
        print(json.dumps(rows[-1]), flush=True)
    print_table([{k: v for k, v in r.items() if k != "per_sigma"} for r in rows])
    out = RESULTS_DIR / f"erase_stage_cost{'-' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps({"env": env_info(), "args": vars(args), "calibration": cal.to_dict(), "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
