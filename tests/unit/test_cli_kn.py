"""The ``tlcap kn`` command on a tiny random model (contract checked from outside)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_cli_kn_tiny(tmp_path):
    out = tmp_path / "kn"
    cmd = [sys.executable, "-m", "tlcap", "kn", "--model", "gpt2-tiny", "--prompt", "The capital of France is",
           "--target", " Paris", "--steps", "4", "--n-random", "10", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert {"neurons", "target_prob", "completeness_rel_error", "suppress_located_rel_change",
            "suppress_random_rel_change"} <= set(s)
    assert len(s["suppress_random_draws"]) == 10
    assert (out / "kn_heatmap.html").exists() and (out / "kn_heatmap.png").exists()


def test_cli_clear_error_for_unknown_model(tmp_path):
    cmd = [sys.executable, "-m", "tlcap", "kn", "--model", "no-such-model", "--prompt", "a", "--target", " b",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 2
    assert "Unknown model" in proc.stderr and "registered name" in proc.stderr
