"""The fused read-out of P(target): values and gradients equal autograd's unembedding, softmax and gather.

:func:`tlcap.models.unembedding.target_probs` walks the vocabulary in chunks (online softmax) and computes
``d P_y / d h`` inside the forward; checked against the plain ``softmax(h W_U + b)[y]`` differentiated by
autograd in float64, on targets spread over several chunks, with a non-zero bias, and for confident
predictions (``P_y`` within 1e-5 of 1, where ``W_y − E_p[W]`` or ``P_y − P_y²`` computed as differences lose
their digits to cancellation; the logits path, :func:`~tlcap.models.unembedding.target_prob`, is checked there too).
"""

from __future__ import annotations

import pytest
import torch

from tlcap.models import make_tiny
from tlcap.models import unembedding as U


def _reference(model, normed: torch.Tensor, tids: torch.Tensor, bias: torch.Tensor | None):
    """``softmax(normed W_U^T + b)[tids]`` and its gradient, autograd in float64."""
    head = model.hf_model.get_output_embeddings()
    w = getattr(head, "original_component", head).weight.detach().double()
    h = normed.detach().double().requires_grad_(True)
    z = h @ w.T + (0 if bias is None else bias.double())
    p = z.softmax(-1)[torch.arange(len(tids)), tids]
    (g,) = torch.autograd.grad(p.sum(), h)
    return p.detach(), g


def _fused(model, normed: torch.Tensor, tids: torch.Tensor):
    h = normed.detach().clone().requires_grad_(True)
    p = U.target_probs(model, h, tids)
    (g,) = torch.autograd.grad((p * torch.arange(1.0, len(tids) + 1)).sum(), h)  # a weighted sum: g reaches each row
    return p.detach(), g / torch.arange(1.0, len(tids) + 1)[:, None]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("chunk", [4096, 7, 1000])
def test_fused_readout_equals_autograd(tiny_gpt2, monkeypatch, chunk):
    model = tiny_gpt2
    monkeypatch.setattr(U, "READOUT_CHUNK", chunk)
    assert U._readout_linear(model) is not None  # the fused path is the one under test
    g = torch.Generator().manual_seed(0)
    normed = U.final_norm(model, torch.randn(6, model.d_model, generator=g))
    tids = torch.tensor([0, 6, 7, 13999, model.d_vocab - 1, 6])  # first, chunk edges, last, a repeated target
    p, grad = _fused(model, normed, tids)
    p_ref, g_ref = _reference(model, normed, tids, None)
    assert _rel(p, p_ref) < 1e-5
    assert _rel(grad, g_ref) < 1e-5


def test_fused_readout_confident_and_biased(tiny_gpt2, monkeypatch):
    model = tiny_gpt2
    monkeypatch.setattr(U, "READOUT_CHUNK", 1000)
    head = model.hf_model.get_output_embeddings()
    lin = getattr(head, "original_component", head)
    w = lin.weight.detach()
    tids = torch.tensor([11, 2500, 40000])
    bias = torch.randn(model.d_vocab, generator=torch.Generator().manual_seed(1))
    # states along their target's unembedding row, lengthened until P_y is within 1e-5 of 1
    normed = w[tids] / w[tids].norm(dim=-1, keepdim=True)
    while float(_reference(model, normed, tids, bias)[0].min()) < 1 - 1e-5:
        normed = normed * 1.1
    old = lin.bias
    lin.bias = bias
    try:
        assert U._readout_linear(model)[1] is bias  # a non-zero bias is read
        p, grad = _fused(model, normed, tids)
    finally:
        lin.bias = old
    p_ref, g_ref = _reference(model, normed, tids, bias)
    assert _rel(p, p_ref) < 1e-6
    z = (normed @ w.T + bias).requires_grad_(True)  # the logits path (half precision, capped logits) as well
    p_logits = U.target_prob(z, tids)
    (gz,) = torch.autograd.grad(p_logits.sum(), z)
    g_logits = gz @ w
    for r in range(len(tids)):  # each row's (small) gradient to its own scale
        assert _rel(grad[r], g_ref[r]) < 1e-4
        assert _rel(g_logits[r], g_ref[r]) < 1e-4  # 1 − P_y as a difference: 0.03 to 1.5 here


def test_readout_falls_back_where_it_cannot_fuse(tiny_gpt2):
    """Half precision and soft-capped logits take the logits path: still P(target), to float rounding."""
    capped = make_tiny("gemma2", seed=0)
    assert U._readout_linear(capped) is None
    normed = U.final_norm(capped, torch.randn(2, capped.d_model, generator=torch.Generator().manual_seed(2)))
    tids = torch.tensor([3, 4])
    p = U.target_probs(capped, normed, tids)
    p_ref = U.unembed(capped, normed).float().softmax(-1)[torch.arange(2), tids]
    assert _rel(p, p_ref) < 1e-6
    half = U.final_norm(tiny_gpt2, torch.randn(2, tiny_gpt2.d_model)).to(torch.bfloat16)
    assert U.target_probs(tiny_gpt2, half, tids).dtype == torch.float32  # _TargetProb's float32 softmax
