"""Unit tests of the Query Localization pieces: statistics, loader, SIG/AMIG, synapse hooks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tlcap.metrics.sets import NeuronSet
from tlcap.metrics.stats import (
    _otsu_hand,
    consistency_aware_scores,
    cs1,
    cs2,
    otsu_threshold,
    predominance,
    refined_set,
    relative_change,
    split_groups,
    welch_t_test,
)

SHAPE = (3, 10)


def ns(*neurons):
    return NeuronSet.from_list(neurons, SHAPE)


# ------------------------------------------------------------------ CS1 / CS2
def test_cs1_cs2_hand_computed():
    a = ns((0, 1), (0, 2), (1, 3))
    b = ns((0, 1), (1, 3), (2, 5))
    c = ns((0, 1), (2, 7))
    # union {01,02,13,25,27} = 5; in all three: {01} -> CS1 = 1/5
    # in more than one: {01 (3x), 13 (2x)} -> CS2 = 2/5
    assert cs1([a, b, c]) == pytest.approx(1 / 5)
    assert cs2([a, b, c]) == pytest.approx(2 / 5)
    assert cs1([a, a]) == 1.0 and cs2([a, a]) == 1.0
    assert cs1([a, ns((2, 9))]) == 0.0 and cs2([a, ns((2, 9))]) == 0.0
    assert cs1([ns(), ns()]) == 0.0 and cs2([ns(), ns()]) == 0.0
    assert refined_set([a, b, c]).neurons == ((0, 1), (1, 3))
    with pytest.raises(ValueError):
        cs2([a])


def test_cs1_cs2_equal_mask_arithmetic_on_random_sets():
    # An independent computation on boolean masks: CS1 = |AND| / |OR|, CS2 = |count >= 2| / |OR|.
    g = torch.Generator().manual_seed(0)
    for k in (2, 3, 5):
        for _ in range(10):
            masks = [torch.rand(SHAPE, generator=g) > 0.7 for _ in range(k)]
            stack = torch.stack(masks)
            union = int(stack.any(0).sum())
            sets = [NeuronSet.from_mask(m) for m in masks]
            assert cs1(sets) == pytest.approx(int(stack.all(0).sum()) / union)
            assert cs2(sets) == pytest.approx(int((stack.sum(0) >= 2).sum()) / union)


# ------------------------------------------------------------------ Otsu, t-test
def test_otsu_two_clusters_hand():
    # two tight clusters: every threshold between them maximises the between-class variance;
    # with 256 bins over [0.1, 0.9] the first maximiser is the last bin center of the low cluster.
    v = [0.1, 0.1, 0.1, 0.9, 0.9]
    th = otsu_threshold(v)
    assert 0.1 <= th < 0.9
    assert th == pytest.approx(0.1 + 0.8 / 256 / 2, abs=1e-9)
    assert split_groups(v, th) == ["K_II", "K_II", "K_II", "K_I", "K_I"]


def test_otsu_matches_brute_force_between_class_variance():
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.normal(0.05, 0.02, 40), rng.normal(0.3, 0.05, 25)])
    th = otsu_threshold(v, nbins=64)
    assert th == pytest.approx(_otsu_hand(v, nbins=64))
    # brute force over candidate thresholds: the Otsu threshold maximises w0 w1 (m0 - m1)^2 on the bins
    hist, edges = np.histogram(v, bins=64, range=(v.min(), v.max()))
    centers = (edges[:-1] + edges[1:]) / 2
    best, best_t = -1.0, None
    for k in range(63):
        lo, hi = hist[: k + 1], hist[k + 1:]
        if lo.sum() == 0 or hi.sum() == 0:
            continue
        m0 = (lo * centers[: k + 1]).sum() / lo.sum()
        m1 = (hi * centers[k + 1:]).sum() / hi.sum()
        var = lo.sum() * hi.sum() * (m0 - m1) ** 2
        if var > best + 1e-15:
            best, best_t = var, centers[k]
    assert th == pytest.approx(best_t)
    assert otsu_threshold([0.2, 0.2]) == 0.2


def test_welch_t_test_hand_computed():
    a = [1.0, 2.0, 3.0, 4.0]
    b = [2.0, 4.0, 6.0, 8.0, 10.0]
    t, p = welch_t_test(a, b)
    ma, mb = 2.5, 6.0
    va, vb = np.var(a, ddof=1), np.var(b, ddof=1)  # 5/3 and 10
    se = math.sqrt(va / 4 + vb / 5)
    assert t == pytest.approx((ma - mb) / se)
    dof = (va / 4 + vb / 5) ** 2 / ((va / 4) ** 2 / 3 + (vb / 5) ** 2 / 4)
    from scipy import stats

    assert p == pytest.approx(2 * stats.t.sf(abs((ma - mb) / se), dof))
    assert all(math.isnan(x) for x in welch_t_test([1.0], [1.0, 2.0]))


def test_predominance_cas_relative_change():
    assert predominance([" Paris", "paris", " capital"]) == pytest.approx(2 / 3)
    assert predominance(["a", "b"]) == 0.5
    s = torch.tensor([[[1.0, 0.0]], [[3.0, 0.0]]])  # k=2, 1 layer, 2 neurons
    cas = consistency_aware_scores(s, 0.7, 0.3)
    # neuron 0: mu 2, sigma 1 -> 0.7*2 - 0.3*1 = 1.1
    assert cas[0, 0] == pytest.approx(1.1) and cas[0, 1] == 0.0
    assert relative_change(0.5, 1.0, -1.0) == pytest.approx(0.5)
    assert math.isnan(relative_change(1.0, 0.0))


# ------------------------------------------------------------------ ParaRel loader
def test_pararel_loader(tiny_gpt2):
    from tlcap.data.pararel import causal_patterns, load_pararel
    from tlcap.errors import MissingFileError

    pats = causal_patterns(None, "P36")
    assert "The capital of [X] is" in pats and all(not p.endswith("[Y]") for p in pats)
    assert all("[Y]" not in p for p in pats)
    facts = load_pararel(None, ["P36", "P103"], n_facts=4, model=tiny_gpt2, max_queries=3)
    assert len(facts) == 4
    assert [f.relation for f in facts] == ["P36", "P103", "P36", "P103"]  # round-robin
    for f in facts:
        assert 2 <= len(f.queries) <= 3 and f.target == " " + f.object
        for q in f.queries:
            assert f.subject in q and len(tiny_gpt2.target_ids(q, f.target)) == 1
    with pytest.raises(MissingFileError):
        load_pararel(None, ["P99999"], n_facts=1, model=tiny_gpt2)


# ------------------------------------------------------------------ SIG / AMIG
def test_sig_amig_completeness_and_normalisation(tiny_llama):
    from tlcap.attribution import integrated_gradients
    from tlcap.attribution.amig import amig, eos_baseline
    from tlcap.attribution.methods import localize
    from tlcap.attribution.sig import masked_baselines, sig

    prompt, target = "The capital of France is", " Paris"
    a = amig(tiny_llama, prompt, target, steps=16, words="last")
    assert a.method == "amig" and a.completeness_rel_error < 1e-2
    if a.meta["normaliser"] == "sum":
        assert float(a.scores.double().sum()) == pytest.approx(1.0, rel=1e-4)
    # AMIG before normalisation is IG from the eos baseline
    base = eos_baseline(tiny_llama, len(tiny_llama.encode(prompt)))
    ig_b = integrated_gradients(tiny_llama, prompt, target, steps=16, baseline=base)
    assert torch.allclose(a.scores.double() * a.meta["denominator"], ig_b.scores.double(), atol=1e-7)

    s = sig(tiny_llama, prompt, target, steps=6)
    assert s.method == "sig" and s.completeness_rel_error < 2e-2
    assert float(s.scores.norm()) == pytest.approx(1.0, rel=1e-5)
    # SIG = Σ_i IG(baseline = prompt with word i masked), normalised
    ids = tiny_llama.encode(prompt)
    bases = masked_baselines(tiny_llama, ids, s.meta["mask_id"])
    tot = sum(integrated_gradients(tiny_llama, prompt, target, steps=6, baseline=bases[i]).scores.double()
              for i in range(len(ids)))
    assert torch.allclose(s.scores.double(), tot / tot.norm(), atol=1e-5)
    # masked baseline for the last word differs from the clean activations
    assert not torch.allclose(bases[-1], ig_b.activations[0])
    assert localize(tiny_llama, prompt, target, method="ig", steps=4).method == "ig"
    with pytest.raises(ValueError):
        localize(tiny_llama, prompt, target, method="nope")  # type: ignore[arg-type]


# ------------------------------------------------------------------ synapses and pattern hooks
@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_pattern_hook_changes_output_and_head_suppression_equals_zeroed_columns(fixture, request):
    from tlcap.intervene.synapses import scale_synapses
    from tlcap.locate.synapses import attention_patterns, synapse_mask

    model = request.getfixturevalue(fixture)
    prompt = "The capital of France is"
    toks = model.to_tokens(prompt)
    clean = model.logits(toks)
    A = attention_patterns(model, prompt)
    L, Hh, C, _ = A.shape
    # columns of head (l=1, h=2) that are synapses at a low α, then all of them suppressed
    mask, col, tau = synapse_mask(A, alpha=0.05, skip_first=False)
    assert tau == pytest.approx(0.05 * C, rel=1e-5)  # rows of a softmax pattern sum to 1
    assert torch.equal(mask, col > tau)
    head_mask = torch.zeros_like(mask)
    head_mask[1, 2] = mask[1, 2]
    cols = mask[1, 2].nonzero().flatten()
    assert len(cols) > 0
    out = model.logits(toks, hooks=scale_synapses(head_mask, 0.0))

    def zero_cols(act, hook):
        o = act.clone()
        o[:, 2, :, cols] = 0.0
        return o

    ref = model.logits(toks, hooks=[("blocks.1.attn.hook_pattern", zero_cols)])
    assert torch.allclose(out, ref, atol=1e-6)
    assert (out - clean).abs().max() > 1e-4  # modifying hook_pattern really changes the output
    # enhancing doubles exactly those entries
    seen = {}

    def grab(act, hook):
        seen["p"] = act.detach().clone()
        return None

    model.logits(toks, hooks=scale_synapses(head_mask, 2.0) + [("blocks.1.attn.hook_pattern", grab)])
    p2 = seen["p"][0]
    assert torch.allclose(p2[2][:, cols], 2 * A[1, 2][:, cols], atol=1e-6)
    other = [h for h in range(Hh) if h != 2]
    assert torch.allclose(p2[other], A[1, other], atol=1e-6)
    # skip_first drops the sink column; mask_for crops/pads to another prompt length
    m2, _, _ = synapse_mask(A, alpha=0.05, skip_first=True)
    assert not m2[..., 0].any()


def test_knowledge_synapses_mask_for(tiny_gpt2):
    from tlcap.locate.synapses import locate_synapses

    ks = locate_synapses(tiny_gpt2, "The capital of France is", alpha=0.05, skip_first=False)
    C = ks.mask.shape[-1]
    longer, shorter = ks.mask_for(C + 3), ks.mask_for(C - 2)
    assert longer.shape[-1] == C + 3 and not longer[..., C:].any() and torch.equal(longer[..., :C], ks.mask)
    assert torch.equal(shorter, ks.mask[..., : C - 2])
    assert len(ks) == int(ks.mask.sum()) and len(ks.to_frame()) == len(ks)


# ------------------------------------------------------------------ experiments on a tiny model
def test_ql_pipeline_tiny(tiny_gpt2, tmp_path):
    from tlcap.data.pararel import load_pararel
    from tlcap.experiments import ql
    from tlcap.results import load_result

    m = tiny_gpt2
    facts = load_pararel(None, ["P36", "P103"], n_facts=3, model=m, max_queries=3)
    locs = ql.localize_facts(m, facts, "ig", steps=3, progress=False)
    cons = ql.consistency_analysis({"ig": locs})
    for r in cons.rows:
        sets = locs[[l.fact.subject for l in locs].index(r.subject)].sets()
        assert r.cs2 == pytest.approx(cs2(sets)) and r.cs1 == pytest.approx(cs1(sets))
    s = cons.summary()
    for k in ("n_facts", "k1_ratio", "k2_ratio", "mean_cs2_k1", "mean_cs2_k2", "threshold", "welch_t", "welch_p", "facts"):
        assert k in s
    assert s["n_facts"] == 3 and s["k1_ratio"] + s["k2_ratio"] == pytest.approx(1.0)
    cons.save(tmp_path / "c")
    again = load_result(tmp_path / "c")
    assert again.summary()["facts"] == s["facts"]
    assert cons.table1().shape[0] == 2
    groups = cons.groups()
    assert groups[1] == "excluded" and groups[0] != "excluded"  # the P103 fact has 2 queries (CS1 ≡ CS2)
    # weights are restored exactly after the modification experiment
    before = {n: p.detach().clone() for n, p in m.backend.named_parameters()}
    texts = ["The quick brown fox jumps over the lazy dog. " * 3]
    mod = ql.cas_experiment(m, locs, groups, edit_queries=1, ppl_texts=texts, only_known=False, progress=False)
    for n, p in m.backend.named_parameters():
        assert torch.equal(p, before[n]), n
    df = mod.to_frame()
    assert set(df["set"]) == {"local", "global", "cas"} and set(df.operation) == {"erasure", "update"}
    assert df[["rel", "gen", "avg"]].apply(lambda c: c.between(0, 1).all()).all()
    assert len(mod.table()) > 0
    mp = ql.query_kn_mapping(m, locs, groups, progress=False)
    assert set(mp.to_frame()["set"]) == {"self", "union", "intersection", "refine"}
    sy = ql.synapse_experiment(m, locs, groups, alpha=0.05, progress=False)
    assert [r.fact for r in sy.predominance] == [0, 2] and all(0 < r.predominance <= 1 for r in sy.predominance)
    assert sy.heatmap_values is not None and sy.heatmap_values.shape[0] == len(sy.heatmap_rows)
    for fig in (cons.violin(), mod.figure(), mp.figure(), sy.figure(), sy.predominance_figure(), sy.heatmap()):
        assert len(fig.data) > 0


def test_update_neurons_formula(tiny_llama):
    from tlcap.intervene.update import update_neurons

    m = tiny_llama
    neurons = NeuronSet.from_list([(0, 3), (1, 5)], (m.n_layers, m.d_mlp))
    W0 = m.mlp_down_matrix(0).clone()
    with update_neurons(m, neurons, 10, 20, 2.0, 2.0):
        W = m.mlp_down_matrix(0)
        expect = W0[:, 3] - 2 * m.W_E[10] + 2 * m.W_E[20]
        assert torch.allclose(W[:, 3], expect, atol=1e-6)
        assert torch.equal(W[:, 4], W0[:, 4])
    assert torch.equal(m.mlp_down_matrix(0), W0)
