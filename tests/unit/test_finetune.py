"""Masked fine-tuning's Adam on the trained neurons' slices equals the full masked step (CNL enhance)."""

from __future__ import annotations

import pytest
import torch

from tlcap.metrics.sets import NeuronSet

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_located_steps_on_slices_equal_the_full_masked_adam_step(name, monkeypatch):
    """``"located"`` mode runs Adam on the trained neurons' slices only (``_Slice``): every weight after two epochs
    equals the full masked step's (Adam over whole matrices, gradients masked), bit for bit; the frozen neurons keep
    their values and the trained ones moved."""
    from tlcap.data.tasks import load_task
    from tlcap.intervene import finetune as F
    from tlcap.models import make_gpt2, make_llama

    m = make_gpt2("tiny", seed=0) if name == "gpt2" else make_llama(seed=0)
    train = load_task("emotion", split="train", n=3)
    ns = NeuronSet(((0, 1), (0, 7), (1, 2)), shape=(m.n_layers, m.d_mlp))
    params = {ws.param for ws, _ in F.neuron_params(m, ns)}
    got = {}
    for share in (0.5, -1.0):  # -1: never slice (the full masked step)
        monkeypatch.setattr(F, "SLICE_SHARE", share)
        edit = F.masked_finetune(m, train, ns, epochs=2, lr=1e-2, progress=False)
        got[share] = {id(p): p.detach().clone() for p in params}
        edit.undo()
    before = {id(p): p.detach().clone() for p in params}
    for p in params:
        assert torch.equal(got[0.5][id(p)], got[-1.0][id(p)])
    moved = [ws for ws, _ in F.neuron_params(m, ns) if not torch.equal(got[0.5][id(ws.param)], before[id(ws.param)])]
    assert len(moved) == len(params)  # every trained matrix moved
    out = m.mlp_out_weight(1)
    changed = (got[0.5][id(out.param)] != before[id(out.param)]).movedim(out.neuron_dim, 0).flatten(1).any(1)
    assert changed.nonzero()[:, 0].tolist() == [2]  # only neuron (1, 2) of layer 1's down projection
