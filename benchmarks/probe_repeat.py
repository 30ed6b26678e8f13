"""Repeatability of ``tlcap reproduce``'s probe (:func:`tlcap.reproduce.probe.calibrate`) on this machine.

``python benchmarks/probe_repeat.py benchmarks/results/probe_repeat_smollm2_cpu.json`` probes SmolLM2-135M three
times with one timed trial per op and three times with three (:data:`tlcap.reproduce.probe.PROBE_TRIALS`, the
fastest counts) and reports, per unit, how far apart the three probes' seconds per FLOP are (max / min - 1), each
probe's wall time and its own within-probe spread (``meta["timing_spread"]``).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlcap import load_model  # noqa: E402
from tlcap.reproduce.probe import calibrate  # noqa: E402

if __name__ == "__main__":
    m = load_model("smollm2-135m", device="cpu")
    out = {}
    for trials in (1, 3):
        cals = [calibrate(m, trials=trials) for _ in range(3)]
        out[trials] = {"probe_seconds": [round(c.seconds, 1) for c in cals],
                       "spread_across_probes": {u: max(c.seconds_per_flop[u] for c in cals)
                                                / min(c.seconds_per_flop[u] for c in cals) - 1
                                                for u in cals[0].seconds_per_flop},
                       "timing_spread_within": [c.meta["timing_spread"] for c in cals]}
        print(trials, json.dumps(out[trials]), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
