"""The runtime on a TransformerLens 3.9 ``HookedTransformer`` (not a TransformerBridge).

Builds a tiny random GPT-2-style ``HookedTransformer`` from a ``HookedTransformerConfig``
(no hub) with the real GPT-2 tokenizer, wraps it with ``tlcap.load_model`` and checks that
hooks, prefix KV reuse, integrated gradients and weight edits behave exactly as on the bridge.

Every test here is marked ``tl39``: the main run (TransformerLens 4.x, where
``HookedTransformer`` is gone) deselects them (``-m "not tl39"`` in the pytest config), and
``tests/run_tl39.sh`` runs them in a TL 3.9 venv (``make test`` does both). Nothing is skipped.
"""

from __future__ import annotations

import pytest
import torch

import tlcap
from tlcap.attribution import integrated_gradients, reference_ig
from tlcap.intervene import erase_neurons
from tlcap.models import gpt2_tokenizer
from tlcap.runtime import hooks as H

pytestmark = pytest.mark.tl39

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def hooked():
    # TL 3.9 only: imported here so that this module is collected (and deselected) under TL 4.x
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tok = gpt2_tokenizer()
    assert tok is not None, "the vendored GPT-2 tokenizer files are missing from tlcap/assets"
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=64, d_head=16, n_heads=4, d_mlp=256, d_vocab=50257, n_ctx=128,
        act_fn="gelu", normalization_type="LN", seed=0, model_name="tiny-hooked-gpt2",
    )
    torch.manual_seed(0)
    ht = HookedTransformer(cfg, tokenizer=tok)
    # Default init leaves biases at zero and logits near uniform; give every parameter some
    # signal so attributions and probabilities are not degenerate.
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in ht.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return ht.eval()


@pytest.fixture(scope="module")
def model(hooked):
    return tlcap.load_model(hooked)


def _n_hooks(ht) -> int:
    return sum(len(hp._forward_hooks) + len(hp._backward_hooks) for hp in ht.hook_dict.values())


def test_wraps_hooked_transformer(model, hooked):
    assert not model.is_bridge and model.hf_model is None
    assert (model.n_layers, model.d_model, model.d_mlp, model.n_heads, model.d_vocab) == (2, 64, 256, 4, 50257)
    toks = model.to_tokens(PROMPT)
    assert toks.shape == (1, 5)  # no BOS by default
    with torch.no_grad():
        torch.testing.assert_close(model.logits(toks), hooked(toks), rtol=0, atol=0)


def test_hooks_removed_after_exception(model, hooked):
    toks = model.to_tokens(PROMPT)
    with torch.no_grad():
        clean = model.logits(toks)

    def boom(act, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd=[("blocks.0.mlp.hook_post", H.scale(0.0)), ("blocks.1.mlp.hook_post", boom)]):
            model.logits(toks)
    assert _n_hooks(hooked) == 0
    with pytest.raises(RuntimeError, match="boom"):
        model.logits(toks, hooks=[("blocks.1.hook_resid_pre", boom)])
    assert _n_hooks(hooked) == 0
    with torch.no_grad():
        torch.testing.assert_close(model.logits(toks), clean, rtol=0, atol=0)


def test_hook_changes_output_and_run_with_cache(model):
    toks = model.to_tokens(PROMPT)
    with torch.no_grad():
        clean, cache = model.run_with_cache(toks, ["blocks.0.mlp.hook_post", "blocks.1.hook_resid_post"])
        ablated = model.logits(toks, hooks=[("blocks.0.mlp.hook_post", H.ablate())])
    assert cache["blocks.0.mlp.hook_post"].shape == (1, 5, 256)
    assert cache["blocks.1.hook_resid_post"].shape == (1, 5, 64)
    assert not torch.allclose(clean, ablated)


def test_prefix_cache_matches_full_forward(model):
    toks = model.to_tokens(PROMPT)
    pc = model.prefix_cache(toks[:, :-1])
    with torch.no_grad():
        full = model.logits(toks)[:, -1]
        again = model.logits(toks[:, -1:], prefix=pc)[:, -1]
        batched = model.logits(toks[:, -1:].expand(3, -1), prefix=pc)[:, -1]
    torch.testing.assert_close(again, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched, full.expand(3, -1), rtol=1e-5, atol=1e-5)
    # the cache is reusable: a second call sees the same prefix
    with torch.no_grad():
        torch.testing.assert_close(model.logits(toks[:, -1:], prefix=pc)[:, -1], full, rtol=1e-5, atol=1e-5)


def _rel_close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    err = float((a - b).abs().max())
    scale = float(b.abs().max())
    assert scale > 0, "reference attribution is all zeros"
    assert err <= rel * scale, f"max abs diff {err:.3g} > {rel:g} x max |ref| {scale:.3g}"


@pytest.mark.parametrize("site", ["mlp_post", "mlp_pre"])
def test_integrated_gradients_equals_reference(model, site):
    attr = integrated_gradients(model, PROMPT, " Paris", steps=6, site=site)
    ref = reference_ig(model, PROMPT, " Paris", steps=6, site=site)
    _rel_close(attr.scores, ref)
    assert attr.completeness_rel_error < 0.5  # 6 midpoint steps on a random model


def test_integrated_gradients_multi_token_target(model):
    attr = integrated_gradients(model, PROMPT, " Paris and Lyon", steps=4, batch_rows=7)
    ref = reference_ig(model, PROMPT, " Paris and Lyon", steps=4)
    assert attr.prob_full.shape[0] == 3
    _rel_close(attr.scores, ref)


def test_prefix_reuse_equals_full_sequence(model):
    a = integrated_gradients(model, PROMPT, " Paris", steps=5, prefix_reuse=True)
    b = integrated_gradients(model, PROMPT, " Paris", steps=5, prefix_reuse=False)
    _rel_close(a.scores, b.scores)
    torch.testing.assert_close(a.prob_baseline, b.prob_baseline, rtol=1e-5, atol=1e-7)


def test_cheaper_estimators_run(model):
    for method in ("joint", "grad_x_act"):
        attr = integrated_gradients(model, PROMPT, " Paris", steps=4, method=method)
        assert attr.scores.shape == (2, 256) and torch.isfinite(attr.scores).all()


def test_erase_neurons_undo_is_exact(model, hooked):
    ws = model.mlp_out_weight(1)
    assert ws.param is hooked.blocks[1].mlp.W_out and ws.neuron_dim == 0
    toks = model.to_tokens(PROMPT)
    before = {n: p.detach().clone() for n, p in hooked.named_parameters()}
    with torch.no_grad():
        clean = model.logits(toks)
    neurons = [(0, 3), (1, 7), (1, 200)]
    edit = erase_neurons(model, neurons, include_input=True)
    try:
        assert torch.all(hooked.blocks[1].mlp.W_out[7] == 0) and torch.all(hooked.blocks[0].mlp.W_out[3] == 0)
        assert torch.all(hooked.blocks[1].mlp.W_in[:, 200] == 0)
        with torch.no_grad():
            assert not torch.allclose(model.logits(toks), clean)
    finally:
        edit.undo()
    for n, p in hooked.named_parameters():
        assert torch.equal(p, before[n]), n
    with torch.no_grad():
        torch.testing.assert_close(model.logits(toks), clean, rtol=0, atol=0)


# ---------------------------------------------------------------------------- adapter API on TL 3.9
def test_last_logits_and_padded_batches(model):
    prompts = [PROMPT, "Paris", "The Eiffel Tower is located in the city of"]
    with torch.no_grad():
        toks = model.to_tokens(PROMPT)
        torch.testing.assert_close(model.last_logits(toks), model.logits(toks)[:, -1], rtol=0, atol=1e-5)
        singles = torch.stack([model.logits(model.to_tokens(p))[0, -1] for p in prompts])
        for side in ("right", "left"):
            got = model.last_logits(model.encode_batch(prompts, side=side))
            torch.testing.assert_close(got, singles, rtol=0, atol=1e-5)


def test_record_stops_and_matches_full_run(model):
    toks = model.to_tokens(PROMPT)
    names = [model.hook_name("mlp_post", 0), model.hook_name("resid_mid", 0)]
    later: list[int] = []
    with torch.no_grad():
        _, full = model.run_with_cache(toks, names)
        with model.hooks(fwd=[(model.hook_name("resid_post", 1), lambda act, hook: later.append(1))]):
            got = model.record(toks, names)
    assert later == [] and all(torch.equal(got[n], full[n]) for n in names)


def test_multi_row_prefix_cache(model):
    g = torch.Generator().manual_seed(0)
    pre, suf = torch.randint(0, 1000, (3, 5), generator=g), torch.randint(0, 1000, (6, 2), generator=g)
    with torch.no_grad():
        pc = model.prefix_cache(pre)
        ref = model.logits(torch.cat([pre.repeat_interleave(2, 0), suf], 1))[:, 5:]
        torch.testing.assert_close(model.logits(suf, prefix=pc), ref, rtol=0, atol=1e-5)


def test_generate_cached_equals_recompute(model):
    ids = model.encode("Alice went to the market and bought")
    hooks = [("blocks.0.mlp.hook_post", H.scale(3.0))]
    a = model.generate(ids, 6, hooks=hooks)
    assert a == model.generate(ids, 6, hooks=hooks, use_cache=False)


def test_edge_hooks_and_parameter_groups(model, hooked):
    with pytest.raises(RuntimeError):
        with model.edge_hooks():
            assert all(model.edge_hook_flags().values())
            raise RuntimeError("boom")
    assert not any(model.edge_hook_flags().values())
    pg = model.parameter_groups()
    d, dh = 64, 16
    assert pg.total == model.parameter_count() == sum(p.numel() for p in hooked.parameters())
    assert sum(pg.node_counts().values()) == pg.total
    assert pg.group("a0.h1").numel == 2 * d * dh + dh  # W_Q, b_Q, W_O slices
    assert pg.group("a0.kv1").numel == 2 * (d * dh + dh)  # W_K, W_V, b_K, b_V slices
    assert pg.group("a0").numel == d + 2 * d  # b_O, ln1
    params = list(hooked.parameters())
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.zero_()
            for grp in pg.groups:
                for part in grp.parts:
                    part.view().add_(1.0)
            assert all(bool((p == 1).all()) for p in params)
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


def test_causal_trace_prefix_reuse_equals_reference(model):
    from tlcap.locate.causal_trace import causal_trace, trace_reference

    kw = dict(samples=2, window=2, seed=1)
    fast = causal_trace(model, PROMPT, "France", batch_rows=6, **kw)  # several chunks, sample-row prefix caches
    ref = trace_reference(model, PROMPT, "France", **kw)
    torch.testing.assert_close(fast.scores, ref.scores, rtol=1e-4, atol=1e-7)


def test_rows_of_one_pass_carry_their_own_synapse_and_neuron_edits(model):
    """The QL analyses' batched edits on TL 3.9: each row of one pass equals its edit run alone (attention-pattern
    columns, ``scale_synapses_rows``; neuron sets at the last position, ``SetFactors``)."""
    from tlcap.intervene import enhance
    from tlcap.intervene.set_rows import SetFactors
    from tlcap.intervene.synapses import scale_synapses, scale_synapses_rows
    from tlcap.locate.synapses import locate_synapses
    from tlcap.metrics import NeuronSet

    ks = locate_synapses(model, PROMPT, alpha=0.05)
    assert ks.mask.any()
    toks = model.to_tokens(PROMPT)
    rows = model.last_logits(toks.expand(3, -1), hooks=scale_synapses_rows([None, ks.mask, ks.mask], [1.0, 2.0, 0.0]))
    assert torch.allclose(rows[0], model.last_logits(toks)[0], atol=1e-5)
    for r, f in ((1, 2.0), (2, 0.0)):
        with model.hooks(scale_synapses(ks.mask, f)):
            alone = model.last_logits(toks)[0]
        assert torch.allclose(rows[r], alone, atol=1e-5) and not torch.allclose(rows[r], rows[0], atol=1e-4)
    ns = NeuronSet(((0, 3), (1, 7)), (model.n_layers, model.d_mlp))
    plan = SetFactors.of(model, [NeuronSet((), ns.shape), ns], [1.0, 3.0])
    two = model.last_logits(toks.expand(2, -1), hooks=plan.hooks(model, torch.arange(2), pos=-1))
    assert torch.allclose(two[1], model.last_logits(toks, hooks=enhance(model, ns, 3.0))[0], atol=1e-5)
    assert torch.allclose(two[0], model.last_logits(toks)[0], atol=1e-5)


def test_queries_of_several_prompts_share_padded_passes(model):
    """The accelerator's passes over many queries on TL 3.9: SIG's masked rows of two prompts in one right-padded
    pass equal each prompt's own batch; the knowledge-synapse rows of two queries of unequal length (each row its
    own mask, read at its own last token) equal each query's rows alone."""
    from tlcap.attribution.sig import mask_token_id, masked_baselines, masked_baselines_many
    from tlcap.experiments.ql.synapses import _kn_value_probs
    from tlcap.locate.synapses import locate_synapses
    from tlcap.metrics import NeuronSet

    prompts = [PROMPT, "Paris is the capital city of"]
    ids = [model.encode(p) for p in prompts]
    assert len(ids[0]) != len(ids[1])
    mid = mask_token_id(model)
    names = [model.hook_name("mlp_post", layer) for layer in range(model.n_layers)]
    for p, b in zip(ids, masked_baselines_many(model, ids, mid)):
        torch.testing.assert_close(b, masked_baselines(model, p, mid), rtol=1e-5, atol=1e-6)
        alone = [model.last_position_activations(torch.tensor([[mid if j == i else t for j, t in enumerate(p)]]),
                                                 names)[0][0].float() for i in range(len(p))]  # each masked row alone
        torch.testing.assert_close(b, torch.stack(alone), rtol=1e-5, atol=1e-6)
    ns = NeuronSet(((0, 3), (1, 7)), (model.n_layers, model.d_mlp))
    jobs = []
    for p in prompts:
        mask = locate_synapses(model, p, alpha=0.05).mask
        assert mask.any()
        jobs.append((p, 11, ns, [None, mask, mask], [1.0, 2.0, 0.0]))
    for job, rows in zip(jobs, _kn_value_probs(model, jobs)):
        for (v, p, a), (v1, p1, a1) in zip(rows, _kn_value_probs(model, [job])[0]):
            assert v == pytest.approx(v1, rel=1e-5) and p == pytest.approx(p1, rel=1e-5, abs=1e-12)
            torch.testing.assert_close(a, a1, rtol=1e-5, atol=1e-6)


def test_rows_carry_their_own_update_edit(model):
    """Table 2's Update edits as rows on TL 3.9 (``SetFactors(writes=)`` at ``mlp_out``): each row equals its weight
    edit (``update_neurons``), an erasure row its ``erase_neurons``."""
    from tlcap.intervene.set_rows import SetFactors
    from tlcap.intervene.update import update_neurons, update_write
    from tlcap.metrics import NeuronSet

    ns = NeuronSet(((0, 3), (1, 7), (1, 9)), (model.n_layers, model.d_mlp))
    toks = model.to_tokens(PROMPT)
    acts = torch.rand(model.n_layers, model.d_mlp) - 0.3
    kw = dict(rule="activation", activations=acts)
    plan = SetFactors.of(model, [NeuronSet((), ns.shape), ns, ns], [1.0, 0.0, 1.0],
                         writes=[None, None, update_write(model, ns, 11, 22, **kw)])
    rows = model.logits(toks.expand(3, -1), hooks=plan.hooks(model, torch.arange(3)))
    assert torch.allclose(rows[0], model.logits(toks)[0], atol=1e-5)
    with erase_neurons(model, ns):
        assert torch.allclose(rows[1], model.logits(toks)[0], atol=1e-5)
    with update_neurons(model, ns, 11, 22, **kw):
        edited = model.logits(toks)[0]
    assert torch.allclose(rows[2], edited, atol=1e-5) and not torch.allclose(rows[2], rows[0], atol=1e-3)


def test_rome_sweep_layers_as_rows(model):
    """``rome_sweep(layers_per_pass=2)`` on TL 3.9 (keys of both layers from one pass, the values optimised together,
    the edits measured as rank-one writes) equals one weight edit at a time."""
    from tlcap.intervene.covariance import key_covariance
    from tlcap.intervene.rome import rome_sweep

    covs = key_covariance(model, [0, 1], n_tokens=256, seq_len=32, cache=False)
    kw = dict(target_old=" Paris", paraphrases=["Fact: The capital of France is"], neighbourhood=["Paris is in"],
              covs=covs, steps=4, bos=False, lr=0.2, weight_decay=0.0)
    alone, rows = (rome_sweep(model, PROMPT, "France", " Rome", [0, 1], layers_per_pass=b, **kw) for b in (1, 2))
    for a, r in zip(alone.results, rows.results):
        assert (a.efficacy, a.paraphrase_success, a.neighbourhood_kept) == (r.efficacy, r.paraphrase_success,
                                                                            r.neighbourhood_kept)
        assert r.losses == pytest.approx(a.losses, rel=1e-4)
        assert r.new_prob_after == pytest.approx(a.new_prob_after, rel=1e-4) and r.new_prob_after != r.new_prob_before


def test_compensated_fine_tuning_equals_torch_adam(model):
    """Masked fine-tuning's compensated step (each parameter stepping in the backward pass) on TL 3.9's
    HookedTransformer: in float32 the weights of torch's Adam bit for bit, in ``"except"`` mode (whole matrices)."""
    from tlcap.data.sample import Sample
    from tlcap.intervene.finetune import masked_finetune, neuron_params, trained_params
    from tlcap.metrics.sets import NeuronSet

    train = [Sample(PROMPT, " Paris", uid="0"), Sample("The capital of Italy is", " Rome", uid="1")]
    ns = NeuronSet(((0, 1), (1, 2)), shape=(model.n_layers, model.d_mlp))
    params = trained_params(neuron_params(model, ns, "except"))[0]
    got = {}
    for precision in ("param", "compensated"):
        edit = masked_finetune(model, train, ns, mode="except", epochs=2, lr=1e-3, precision=precision, progress=False)
        got[precision] = [p.detach().clone() for p in params]
        edit.undo()
    assert all(torch.equal(a, b) for a, b in zip(got["param"], got["compensated"]))
    assert not torch.equal(got["param"][0], params[0].detach())
