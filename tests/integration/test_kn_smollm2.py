"""Knowledge neurons on the real offline model: located neurons matter more than random ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tlcap.experiments.knowledge_neurons import locate_knowledge_neurons

pytestmark = pytest.mark.integration

FACTS = [
    ("The capital of France is", " Paris"),
    ("The capital of Japan is", " Tokyo"),
    ("The Eiffel Tower is located in the city of", " Paris"),
    ("The official language of Germany is", " German"),
]


def test_suppressing_located_beats_random(smollm2):
    located, random = [], []
    for prompt, target in FACTS:
        res = locate_knowledge_neurons(smollm2, prompt, target, n_random=3, progress=False)
        assert res.target_prob > 0.1, (prompt, res.target_prob)
        assert res.completeness_rel_error < 0.1
        assert 0 < len(res.neurons) < 200
        located.append(res.effects["suppress_located"])
        random.append(res.effects["suppress_random"])
    # every fact: located suppression lowers P clearly; on average far more than random
    assert all(l < -0.1 for l in located), located
    assert sum(located) / len(located) < sum(random) / len(random) - 0.2, (located, random)
    assert sum(1 for l, r in zip(located, random) if l < r) >= len(FACTS) - 1


def test_cli_kn_contract(tmp_path, smollm2):  # smollm2 fixture: skip if the model is missing
    out = tmp_path / "kn"
    cmd = [sys.executable, "-m", "tlcap", "kn", "--model", "smollm2-135m", "--prompt", "The capital of France is",
           "--target", " Paris", "--paraphrase", "France's capital city is", "--steps", "10", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    for key in ["neurons", "target_prob", "completeness_rel_error", "suppress_located_rel_change", "suppress_random_rel_change"]:
        assert key in s
    assert s["n_random"] >= 10
    assert all(len(n) == 2 for n in s["neurons"])
    assert s["suppress_located_rel_change"] < s["suppress_random_rel_change"]
    assert list(out.glob("*.html")) and list(out.glob("*.png"))
