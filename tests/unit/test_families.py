"""Every method on tiny random GPT-J, GPT-NeoX, Qwen2 and Gemma-2 models, against its slow reference.

GPT-2 and Llama have their own tests; circuits on NeoX/Qwen2 run in test_circuits.py (``model``
fixture, EAP vs patching every edge). Here: each family boots with the right block layout, exact IG
equals the per-step reference, dataset scoring equals the in-memory per-sample sum, the batched
causal trace equals the per-cell loop, a ROME edit is rank one and undone exactly, and the
family whose attention pattern TransformerLens 4.x cannot patch (GPT-J) is refused by synapse
edits, not run wrongly. Circuits on GPT-J (split inputs rebuilt by the adapter) and Gemma-2
(post-norms: a head's output is its share of the post-norm's output) run in test_circuits.py with
the other families.
"""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution import integrated_gradients, reference_ig
from tlcap.attribution.dataset import score_dataset, score_in_memory
from tlcap.data.tasks import Sample
from tlcap.errors import UnknownModelError, UnsupportedModelError
from tlcap.experiments.ql import synapse_experiment
from tlcap.intervene.covariance import key_covariance
from tlcap.intervene.rome import RomeConfig, rome_edit
from tlcap.intervene.synapses import scale_synapses
from tlcap.locate.causal_trace import causal_trace, trace_reference
from tlcap.locate.circuits import EdgeGraph
from tlcap.locate.synapses import attention_patterns, synapse_mask
from tlcap.models import FAMILIES, load_model, make_tiny
from tlcap.runtime.run_control import RunControl

PROMPT, TARGET, SUBJECT = "The capital of France is", " Paris", "France"
LAYOUT = {  # family: (parallel blocks, post-norms, patchable attention, n_kv_heads)
    "gptj": (True, False, False, 4),
    "neox": (True, False, True, 4),
    "qwen2": (False, False, True, 2),
    "gemma2": (False, True, True, 2),
}


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.heavy]  # seconds per module: after the fast gate


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def fam(request):
    return request.param, make_tiny(request.param, seed=0)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_layout_and_logits_match_hf(fam):
    name, m = fam
    parallel, post, patchable, kv = LAYOUT[name]
    assert (m.parallel_attn_mlp, m.post_norm_blocks, m.attention_internals_patchable, m.n_kv_heads) == (
        parallel, post, patchable, kv)
    toks = m.to_tokens(PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(m.logits(toks), m.hf_model(toks).logits, atol=1e-5, rtol=1e-5)
    assert load_model(f"{name}-tiny").name == m.name  # registered, same seed, same weights


def test_ig_and_dataset_scores_equal_their_references(fam):
    _, m = fam
    fast = integrated_gradients(m, PROMPT, TARGET, steps=3)
    assert _rel(fast.scores, reference_ig(m, PROMPT, TARGET, steps=3)) < 1e-5
    samples = [Sample("Item 1 is", " very red", uid="1"), Sample("Item 2 is", " old", uid="2")]
    ds = score_dataset(m, samples, max_answer_tokens=2, steps=3, run=RunControl(progress=False))
    ref = score_in_memory(m, samples, max_answer_tokens=2, steps=3)
    assert ref.abs().max() > 0
    torch.testing.assert_close(ds.scores, ref, rtol=0, atol=1e-12)


def test_batched_trace_equals_per_cell_reference(fam):
    _, m = fam
    kw = dict(samples=2, window=1, seed=1, kinds=("mlp", "attn"))
    ref = trace_reference(m, PROMPT, SUBJECT, **kw)
    fast = causal_trace(m, PROMPT, SUBJECT, batch_rows=7, **kw)
    torch.testing.assert_close(fast.scores, ref.scores, atol=1e-6, rtol=1e-5)
    assert fast.clean_prob == ref.clean_prob and fast.corrupted_prob != fast.clean_prob


def test_rome_edit_is_rank_one_and_undone(fam):
    _, m = fam
    before = {n: p.detach().clone() for n, p in m.backend.named_parameters()}
    w0 = m.mlp_down_matrix(0).clone()
    cfg = RomeConfig(steps=2, cov_tokens=128, cov_seq_len=32, clamp_norm_factor=1e3, weight_decay=0.0, prefixes=("",))
    texts = ["The quick brown fox jumps over the lazy dog. " * 20]
    cov = key_covariance(m, [0], n_tokens=128, seq_len=32, texts=texts)[0]
    with rome_edit(m, PROMPT, SUBJECT, " Rome", 0, config=cfg, cov=cov):
        dw = (m.mlp_down_matrix(0) - w0).double()
        assert torch.linalg.matrix_rank(dw, rtol=1e-4).item() == 1
    assert all(torch.equal(p, before[n]) for n, p in m.backend.named_parameters())


def test_synapse_edits_run_or_are_refused(fam):
    name, m = fam
    toks = m.to_tokens(PROMPT)
    A = attention_patterns(m, PROMPT)
    assert A.shape == (m.n_layers, m.n_heads, toks.shape[1], toks.shape[1])
    torch.testing.assert_close(A.sum(-1), torch.ones_like(A.sum(-1)), atol=1e-5, rtol=0)  # softmax rows
    mask, _, _ = synapse_mask(A, alpha=0.05, skip_first=False)
    moved = (m.logits(toks, hooks=scale_synapses(mask, 0.0)) - m.logits(toks)).abs().max()
    if LAYOUT[name][2]:
        assert moved > 1e-4
    else:  # GPT-J on TL 4.x: hook_pattern fires after the HF module ran; the edit changes nothing ...
        assert moved == 0
        with pytest.raises(UnsupportedModelError, match="AttentionBridge"):  # ... so the experiment refuses
            synapse_experiment(m, [], [])


def test_circuit_graph_built_or_refused(fam):
    name, m = fam
    assert m.emulated_split_inputs is (name == "gptj")  # GPT-J: the adapter rebuilds the split-input points
    g = EdgeGraph.from_model(m)
    assert (g.parallel, g.post_norm) == LAYOUT[name][:2]
    # parallel blocks: the MLP of layer 1 has no edge from layer 1's heads; sequential: it has
    mlp1 = g.readers.index("m1")
    assert bool(g.valid_mask()[g.head_index(1, 0), mlp1]) is not g.parallel
    assert bool(g.valid_mask()[g.head_index(0, 0), mlp1])


def test_unknown_family():
    with pytest.raises(UnknownModelError):
        make_tiny("bloom")
