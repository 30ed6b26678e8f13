"""Model loading paths on the real offline model: registry, local directory, wrapping, hub errors."""

from __future__ import annotations

import pytest
import torch

import tlcap
from tlcap.errors import HubUnavailableError
from tlcap.models import smollm2_float32_dir

pytestmark = pytest.mark.integration


def test_local_dir_and_wrapping_match_registry(smollm2):
    toks = smollm2.to_tokens("The capital of France is")
    ref = smollm2.logits(toks)
    local = tlcap.load_model(str(smollm2_float32_dir()))
    assert local.n_layers == 30 and local.d_mlp == 1536 and local.n_kv_heads == 3
    assert torch.allclose(local.logits(toks), ref, atol=1e-4)
    wrapped = tlcap.load_model(smollm2.backend)
    assert wrapped.n_layers == 30 and torch.equal(wrapped.logits(toks), ref)
    assert tlcap.load_model(smollm2) is smollm2
    p = tlcap.target_prob(smollm2, "The capital of France is", " Paris")
    assert 0.7 < p < 0.85


def test_hub_without_network_says_what_to_do(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailableError, match="local model directory"):
        tlcap.load_model("gpt2")
