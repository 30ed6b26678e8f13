"""Causal tracing and ROME on the real SmolLM2-135M (kept short: few samples, few layers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tlcap.intervene.rome import RomeConfig, evaluate_rome, rome_sweep
from tlcap.locate.causal_trace import causal_trace, load_known_facts, prepare_trace

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"
EDIT_PROMPT = "The Eiffel Tower is located in the city of"
EDIT_SUBJECT = "The Eiffel Tower"


def test_trace_known_fact(smollm2):
    setup = prepare_trace(smollm2, PROMPT, "France", " Paris", samples=5)
    assert setup.clean_prob > 0.5
    # Noise on the subject clearly lowers the answer's probability ...
    assert setup.corrupted_prob < 0.5 * setup.clean_prob
    # ... and restoring the last token's residual at the final layer recovers it.
    L, T = smollm2.n_layers, setup.n_tokens
    assert abs(setup.restored_prob([("resid", T - 1, L - 1)]) - setup.clean_prob) < 1e-3
    tr = causal_trace(smollm2, PROMPT, "France", " Paris", kinds=("resid",), layers=[0, L // 2, L - 1], samples=5)
    assert tr.score("resid")[-1, -1] == pytest.approx(tr.clean_prob, abs=1e-3)
    # Early-layer restoration at the subject token also recovers most of the effect.
    s = tr.subject_range[1] - 1
    assert tr.score("resid")[s, 0] > tr.corrupted_prob + 0.5 * (tr.clean_prob - tr.corrupted_prob)


def test_known_facts_file():
    facts = load_known_facts(n=5)
    assert len(facts) == 5 and all(f["subject"] in f["prompt"] for f in facts)


def test_rome_edit_flips_answer_and_undo_is_exact(smollm2):
    layer = 4
    W0 = smollm2.mlp_down_matrix(layer).clone()
    neigh = [f["prompt"] for f in load_known_facts(n=40)[20:30]]
    res = evaluate_rome(smollm2, EDIT_PROMPT, EDIT_SUBJECT, " Rome", layer, target_old=" Paris",
                        paraphrases=["Where is the Eiffel Tower? It is in the city of"], neighbourhood=neigh)
    assert res.efficacy and res.new_prob_after > res.old_prob_after
    assert res.new_prob_after > 10 * res.new_prob_before
    assert res.specificity >= 0.7  # most unrelated prompts keep their answers
    assert torch.equal(smollm2.mlp_down_matrix(layer), W0)


def test_edit_all_layers_subset(smollm2):
    before = {n: p.detach().clone() for n, p in smollm2.backend.named_parameters() if "mlp" in n}
    sweep = rome_sweep(smollm2, EDIT_PROMPT, EDIT_SUBJECT, " Rome", layers=[2, 28], target_old=" Paris",
                       neighbourhood=["The capital of Germany is"], config=RomeConfig(steps=10))
    assert sweep.layers == [2, 28]
    assert sweep.results[0].new_prob_after > sweep.results[0].new_prob_before
    for n, p in smollm2.backend.named_parameters():
        if n in before:
            assert torch.equal(p, before[n]), n


def test_cli_trace_contract(tmp_path):
    out = tmp_path / "trace"
    cmd = [str(Path(sys.executable).parent / "tlcap"), "trace", "--model", "smollm2-135m", "--prompt", PROMPT,
           "--subject", "France", "--target", " Paris", "--samples", "2", "--layers", "0,15,29", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    s = json.loads((out / "summary.json").read_text())
    for key in ("clean_prob", "corrupted_prob", "scores", "top_layers"):
        assert key in s
    assert len(s["scores"]["mlp"]) == 5 and len(s["scores"]["mlp"][0]) == 3
    assert s["clean_prob"] > s["corrupted_prob"]
    assert (out / "causal_trace.html").exists() and (out / "causal_trace.png").exists()
