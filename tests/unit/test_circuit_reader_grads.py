"""Grouped q/k/v reader gradients (no split per-head inputs) equal the split-input gradients."""

from __future__ import annotations

import pytest
import torch

from tlcap.locate.circuits import EdgeGraph, edge_attribution
from tlcap.locate.circuits.passes import run_pass
from tlcap.locate.circuits.reader_grads import norm_vjp
from tlcap.locate.circuits.task import make_task
from tlcap.models import make_tiny

PROMPT, TARGET, CORRUPT = "The capital of France is", " Paris", "The capital of Italy is"


@pytest.mark.parametrize("kind", ["LN", "RMS"])
def test_norm_vjp_is_the_autograd_vjp(kind):
    torch.manual_seed(0)
    x, gamma, w = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64), torch.randn(2, 3, 4, 8,
                                                                                                            dtype=torch.float64)
    eps = 1e-5

    def norm(v):
        v = v - v.mean(-1, keepdim=True) if kind == "LN" else v
        return gamma * v / (v.pow(2).mean(-1, keepdim=True) + eps).sqrt()

    xc = x - x.mean(-1, keepdim=True) if kind == "LN" else x
    scale = (xc.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    want = torch.stack([torch.autograd.functional.vjp(norm, x, w[:, :, h])[1] for h in range(4)], 2)
    torch.testing.assert_close(norm_vjp(x, scale, gamma, w, kind), want)


# GPT-2 (LN, MHA), Llama (RMS, GQA), NeoX (parallel blocks), Qwen2 (q/k/v biases, GQA)
@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama", "neox", "qwen2"])
def test_grouped_reader_grads_equal_split_inputs(request, name):
    model = request.getfixturevalue(name) if name.startswith("tiny") else make_tiny(name, seed=1)
    assert model.grouped_reader_grads
    g = EdgeGraph.from_model(model)
    task = make_task(model, PROMPT, TARGET, CORRUPT, "nll", None)
    split = run_pass(model, g, task, task.clean, record_upstream=True, grads=True, split_inputs=True)
    grouped = run_pass(model, g, task, task.clean, record_upstream=True, grads=True)  # the default where allowed
    scale = float(split.reader_grads.abs().max())
    torch.testing.assert_close(grouped.reader_grads, split.reader_grads, atol=1e-5 * scale, rtol=1e-4)
    torch.testing.assert_close(grouped.upstream, split.upstream)
    # EAP-IG's rows: interpolated inputs, mean over each item's 3 rows taken in the backward hook
    emb = split.upstream[:, 0]
    x = torch.cat([emb * a for a in (0.25, 0.5, 1.0)])
    kw = dict(items=torch.zeros(3, dtype=torch.long), input_value=x, grads=True, mean_grads=3)
    rows = task.clean.expand(3, -1)
    a, b = (run_pass(model, g, task, rows, split_inputs=s, **kw) for s in (True, False))
    torch.testing.assert_close(b.reader_grads, a.reader_grads, atol=1e-5 * float(a.reader_grads.abs().max()), rtol=1e-4)


def test_edge_scores_do_not_change(tiny_llama):
    # EAP-IG scores with grouped readers (the default) equal those with split inputs
    import tlcap.locate.circuits.passes as passes_mod  # noqa: PLC0415

    sc = edge_attribution(tiny_llama, PROMPT, TARGET, CORRUPT, steps=3)
    real = passes_mod.run_pass
    try:
        passes_mod.run_pass = lambda *a, **k: real(*a, **{**k, "split_inputs": True})
        import tlcap.locate.circuits.scoring as scoring_mod  # noqa: PLC0415

        orig = scoring_mod.run_pass
        scoring_mod.run_pass = passes_mod.run_pass
        ref = edge_attribution(tiny_llama, PROMPT, TARGET, CORRUPT, steps=3)
    finally:
        passes_mod.run_pass = real
        scoring_mod.run_pass = orig
    torch.testing.assert_close(sc.scores, ref.scores, atol=1e-5 * float(ref.scores.abs().max()), rtol=1e-4)


def test_not_offered_where_the_math_does_not_hold():
    assert not make_tiny("gemma2").grouped_reader_grads  # post-norms (circuits refuse it anyway)


def test_score_accumulation_in_position_blocks(monkeypatch):
    # the float64 product is taken over blocks of positions (bounded memory); any block size gives the sum
    import tlcap.locate.circuits.scoring as scoring  # noqa: PLC0415

    torch.manual_seed(0)
    diff, grad = torch.randn(2, 5, 7, 3), torch.randn(2, 6, 7, 3)
    want = sum(diff[i].flatten(1).double() @ grad[i].flatten(1).double().T for i in range(2))
    for budget in (1, (5 + 6) * 3 * 8 * 3, 2**30):  # 1, 3 and all 7 positions per block
        monkeypatch.setattr(scoring, "_ACCUMULATE_BYTES", budget)
        torch.testing.assert_close(scoring._accumulate(diff, grad), want)
