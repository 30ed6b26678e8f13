"""Attribution over fact lists: the rows of several facts share batches and each result equals its own run.

On every family (GPT-2, Llama/GQA, NeoX and GPT-J parallel blocks, Qwen2, Gemma-2 with a prefix beyond
its sliding window): staged rows (each row joins the pass at its own layer) give each row the logits and
gradients of that row run alone; IG over a fact list equals each fact through the batch-row engine
(``packed_rows = False``: prefix cache and late expansion, one fact at a time); SIG and AMIG over a fact
list equal the fact-at-a-time functions; KN location over a fact list equals one fact at a time.
"""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution import integrated_gradients, integrated_gradients_facts
from tlcap.attribution.amig import amig, amig_facts, eos_baselines, word_attributions_facts
from tlcap.attribution.batched import fact_tokens
from tlcap.attribution.config import IGConfig
from tlcap.attribution.methods import localize, localize_prompts
from tlcap.attribution.sig import sig, sig_facts
from tlcap.attribution.word_ig import words_one_fact
from tlcap.errors import InvalidConfigError
from tlcap.experiments.knowledge_neurons import locate_knowledge_neurons, locate_knowledge_neurons_facts
from tlcap.models import make_tiny
from tlcap.models.staged_rows import Staging
from tlcap.runtime.sites import get_site

FAMILIES = ["gpt2", "llama", "neox", "gptj", "qwen2", "gemma2"]
# unequal prompt lengths, a multi-token target (teacher forcing: several units per fact)
FACTS = [("The capital of France is", " Paris"), ("Hi", " there you go"), ("One two three four five six", " seven")]


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.heavy]  # one torch thread; after the fast gate


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request, tiny_gpt2, tiny_llama):
    if request.param == "gpt2":
        return tiny_gpt2
    if request.param == "llama":
        return tiny_llama
    return make_tiny(request.param, seed=0)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def _batch_rows(model, fn):
    """``fn()`` with the batch-row engine (no packed or staged rows)."""
    old = model.packed_rows
    try:
        model.packed_rows = False
        return fn()
    finally:
        model.packed_rows = old


def test_staged_rows_equal_each_row_alone(fam):
    """Pieces of rows join at layers 0 and 1 after prefixes of one cached run (shared rows, unequal lengths,
    an empty prefix, 70 tokens: beyond Gemma-2's window); every row sets neurons of its layer."""
    model = fam
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, model.d_vocab, (n,), generator=g).tolist() for n in (9, 4, 70)]
    ctxs = [(0, 8), (0, 5), (1, 3), (2, 69), (2, 0)]  # (cached run, prefix length)
    names = [get_site("mlp_post").hook_name(l) for l in range(model.n_layers)]
    states_names = [get_site("resid_pre").hook_name(l) for l in range(model.n_layers)]
    runs = [model.context_states(s, names, states_names) for s in seqs]
    prefix = model.stack_prefixes([(r[3], len(s)) for r, s in zip(runs, seqs)])
    plan = [(c, l) for c in range(len(ctxs)) for l in range(model.n_layers) for _ in range(3 if c != 4 else 1)]
    width = 2
    pieces = sorted(((c, l, [i for i, p in enumerate(plan) if p == (c, l)][s:s + width])
                     for c in range(len(ctxs)) for l in range(model.n_layers) for s in (0, 2) if s < plan.count((c, l))),
                    key=lambda p: p[1])
    staging = Staging(torch.tensor([p[0] for p in pieces]), torch.tensor([p[1] for p in pieces]),
                      torch.tensor([len(p[2]) for p in pieces]), width)
    states = torch.stack([runs[ctxs[c][0]][1][ctxs[c][1], l] for c, l, _ in pieces])
    pos = {i: pi * width + s for pi, p in enumerate(pieces) for s, i in enumerate(p[2])}
    vals = torch.randn(len(plan), model.d_mlp, generator=g)
    leaf = vals.clone().requires_grad_(True)
    hooks = []
    for l in range(model.n_layers):
        ids = [i for i, p in enumerate(plan) if p[1] == l]
        idx, lv = torch.tensor([pos[i] for i in ids]), leaf[torch.tensor(ids)]
        hooks.append((names[l], lambda act, hook=None, idx=idx, lv=lv: act.flatten(0, 1).index_copy(0, idx, lv).view_as(act)))
    out = model.continue_staged(prefix, torch.tensor([c[0] for c in ctxs]), torch.tensor([c[1] for c in ctxs]),
                                torch.tensor([seqs[a][b] for a, b in ctxs]), staging, states, hooks)
    grad = torch.autograd.grad(out.log_softmax(-1)[:, 7].sum(), leaf)[0]
    order = [i for p in pieces for i in p[2]]
    for k, i in enumerate(order):  # each row alone: its context, its neurons set at the last position
        (_, l), (a, b) = plan[i], ctxs[plan[i][0]]
        lf = vals[i].clone().requires_grad_(True)

        def put(act, hook=None, lf=lf):
            o = act.clone()
            o[:, -1] = lf
            return o

        with torch.enable_grad():
            ref = model.logits(torch.tensor([seqs[a][: b + 1]]), hooks=[(names[l], put)])[0, -1]
            ref_grad = torch.autograd.grad(ref.log_softmax(-1)[7], lf)[0]
        torch.testing.assert_close(out[k].detach(), ref.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad[i], ref_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("rule", ["midpoint", "linspace"])  # linspace: the α = 0 node is the baseline row
def test_ig_facts_equal_one_fact_at_a_time(fam, rule):
    model = fam
    batched = integrated_gradients_facts(model, FACTS, steps=3, rule=rule, batch_rows=40, fact_batch=2)
    for (p, t), b in zip(FACTS, batched):
        one = _batch_rows(model, lambda p=p, t=t: integrated_gradients(model, p, t, steps=3, rule=rule))
        assert _rel(b.scores, one.scores) < 1e-5
        torch.testing.assert_close(b.prob_baseline, one.prob_baseline, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(b.layer_sums, one.layer_sums, rtol=1e-4, atol=1e-7)
        assert (b.prompt, b.target, b.target_tokens, b.steps) == (one.prompt, one.target, one.target_tokens, 3)
    assert batched[1].completeness_rel_error < 0.5 and len(batched[1].target_tokens) == 3


def test_ig_facts_estimators_layers_and_baselines(tiny_gpt2):
    """Estimators run fact by fact; a layer subset and per-fact baselines reach each fact."""
    joint = integrated_gradients_facts(tiny_gpt2, FACTS[:2], steps=2, method="joint")
    assert [a.method for a in joint] == ["joint", "joint"]
    base = torch.rand(tiny_gpt2.n_layers, tiny_gpt2.d_mlp, generator=torch.Generator().manual_seed(3))
    two = integrated_gradients_facts(tiny_gpt2, FACTS[:2], steps=2, layers=[1], baselines=[None, base])
    ref = integrated_gradients(tiny_gpt2, *FACTS[1], steps=2, layers=[1], baseline=base)
    assert two[0].layers == (1,) and float(two[0].scores[0].abs().max()) == 0.0
    assert _rel(two[1].scores, ref.scores) < 1e-5
    with pytest.raises(InvalidConfigError, match="one entry per fact"):
        integrated_gradients_facts(tiny_gpt2, FACTS[:2], baselines=[None])


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama"])
def test_sig_and_amig_facts_equal_one_fact_at_a_time(request, name):
    model = request.getfixturevalue(name)
    facts = FACTS[:2]
    for batched_fn, one_fn, kw in ((sig_facts, sig, {}), (amig_facts, amig, {}), (amig_facts, amig, {"words": "last"})):
        batched = batched_fn(model, facts, steps=2, **kw)
        for (p, t), b in zip(facts, batched):
            one = _batch_rows(model, lambda p=p, t=t, one_fn=one_fn, kw=kw: one_fn(model, p, t, steps=2, **kw))
            assert _rel(b.scores, one.scores) < 2e-5, (batched_fn.__name__, kw)
            torch.testing.assert_close(b.layer_sums, one.layer_sums, rtol=1e-4, atol=1e-7)
            assert b.meta["n_words"] == one.meta["n_words"] and b.method == one.method


def test_localize_prompts_is_localize_per_prompt(tiny_llama):
    pairs = [(p, t) for p, t in FACTS]
    for method in ("ig", "amig"):
        many = localize_prompts(tiny_llama, pairs, method, steps=2, fact_batch=2)
        for (p, t), a in zip(pairs, many):
            assert _rel(a.scores, localize(tiny_llama, p, t, method, steps=2).scores) < 2e-5


def test_kn_facts_equal_one_fact_at_a_time(tiny_gpt2):
    facts = [("The capital of France is", " Paris", ["France's capital city is"]), ("Hi", " there you go")]
    many = locate_knowledge_neurons_facts(tiny_gpt2, facts, steps=3, n_random=2, threshold=0.3, progress=False)
    for f, res in zip(facts, many):
        one = locate_knowledge_neurons(tiny_gpt2, f[0], f[1], f[2] if len(f) > 2 else (), steps=3, n_random=2,
                                       threshold=0.3, progress=False)
        assert res.neurons.to_list() == one.neurons.to_list() and len(res.neurons) > 0
        assert _rel(res.scores, one.scores) < 1e-5 and res.prompts == one.prompts
        for k in ("suppress_located", "enhance_located", "suppress_random"):
            assert res.effects[k] == pytest.approx(one.effects[k], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama"])
def test_amig_word_units_equal_the_word_by_word_path(request, name):
    """AMIG's words as units (rows continuing the prefix before each word, batched across facts) equal the
    word-by-word path that TL 3.9 models take (a prefix cache per word, rows after it)."""
    model = request.getfixturevalue(name)
    cfg = IGConfig(steps=2, batch_rows=5)
    layers = list(range(model.n_layers))
    names = [get_site("mlp_post").hook_name(l) for l in layers]
    for (p, t), (attr, p_base, p_clean) in zip(FACTS, word_attributions_facts(model, FACTS, config=cfg)):
        p_ids, t_ids = fact_tokens(model, p, t)
        bases = eos_baselines(model, len(p_ids) + len(t_ids) - 1)[:, layers]
        ref = words_one_fact(model, p_ids, t_ids, bases, names, layers, cfg)
        assert attr.shape == ref[0].shape and _rel(attr, ref[0]) < 2e-5
        torch.testing.assert_close(p_base, ref[1], rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(p_clean, ref[2], rtol=1e-5, atol=1e-8)
