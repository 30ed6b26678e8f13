"""CNL reliability experiment: every statistic of the result against a hand computation on
hand-made rows, and the tiny-model run against the methods' own APIs (identities included)."""

from __future__ import annotations

import importlib
from dataclasses import astuple, replace

import numpy as np
import pytest
import torch

from tests.reliability_rows import RND, _kc_rows, _kn_rows, _rome_rows
from tlcap.attribution import IGConfig, integrated_gradients
from tlcap.data.rewrites import RewriteFact
from tlcap.errors import CheckpointMismatchError, InvalidConfigError
from tlcap.experiments.cnl_eval.common import cnl_circuit, cnl_trace, knowledge_circuit, traced_layers, traced_layers_facts
from tlcap.experiments.cnl_eval.reliability import ReliabilityConfig, draw_seed, neighbourhood, reliability
from tlcap.experiments.cnl_eval.reliability_merge import merge_reliability
from tlcap.experiments.cnl_eval.reliability_result import KNRow, ReliabilityResult
from tlcap.intervene.activations import scale_neurons
from tlcap.intervene.rome import RomeConfig, rome_sweep
from tlcap.locate.circuits import evaluate_circuit
from tlcap.locate.selection import top_k_select
from tlcap.metrics.probs import target_prob
from tlcap.models import TokenBatch
from tlcap.results import load_result
from tlcap.runtime.run_control import RunControl

pytestmark = pytest.mark.heavy  # seconds per module: runs after the fast gate (make unit)

FACTS = [
    RewriteFact("France", " Paris", ("The capital of France is", "France's capital is"), "P36", "a", " Rome"),
    RewriteFact("Germany", " Berlin", ("The capital of Germany is", "Germany's capital is"), "P36", "b", " Paris"),
]
IG = IGConfig(steps=2)
ROME = RomeConfig(steps=2, cov_tokens=256, cov_seq_len=64, prefixes=("",))

@pytest.fixture(scope="module")
def hand():
    return ReliabilityResult(kn_rows=_kn_rows(), rome_rows=_rome_rows(), kc_rows=_kc_rows(), parts=("kn", "rome", "kc"),
                             n_facts=4, n_layers=3, model_name="hand", config={"n_random": 5})


def test_kn_shares_by_hand(hand):
    d = hand.kn_shares("double")
    assert d["located_rise"].value == pytest.approx(2 / 3)
    assert d["located_fall"].value == pytest.approx(1 / 3)
    # random doubled vs base 0.2: rises at 0.3, 0.3, 0.3, 0.25×3 → 6 of 15 rows
    assert d["random_rise"].value == pytest.approx(6 / 15)
    assert d["random_fall"].value == pytest.approx(9 / 15)  # 0.1 in 3 + 2 + 1 + 3 rows
    assert d["test"] is None  # 5 draws: too few for a rank test (>= 20)
    z = hand.kn_shares("zero")
    assert z["located_fall"].value == pytest.approx(2 / 3) and z["located_rise"].value == pytest.approx(1 / 3)
    assert z["random_rise"].value == 1.0 and z["random_fall"].value == 0.0
    # IPP (double, higher is better): mean located doubled − max over draws of the draw's mean
    ipp = hand.kn_ipp("double")
    assert ipp.value == pytest.approx(np.mean([0.3, 0.1, 0.4]) - max(RND.mean(1)))
    # zero: lower is better → min over draws of the random mean (0.25) − located mean
    assert hand.kn_ipp("zero").value == pytest.approx(0.25 - np.mean([0.1, 0.1, 0.3]))


def test_kn_rise_test_is_two_sided_against_the_draws():
    # The paper's claim is "similar to random" (sign 0): a difference either way refutes it, so the
    # rank test is two-sided. 3 facts, located doubled rises in all 3; 20 draws: 19 rise in none, 1 in all.
    rows = []
    for f in range(3):
        rows.append(astuple(KNRow(f, str(f), "located", -1, 4, 0.01, 0.2, 0.3, 0.1)))
        for d in range(20):
            rows.append(astuple(KNRow(f, str(f), "random", d, 4, 0.01, 0.2, 0.3 if d == 0 else 0.1, 0.25)))
    res = ReliabilityResult(kn_rows=tuple(rows), parts=("kn",), n_facts=3, n_layers=3, model_name="hand")
    test = res.kn_shares("double")["test"]
    # observed 1.0; null: one draw at 1.0, 19 at 0.0 → p_greater = (1 + 1) / 21, p_less = (1 + 20) / 21
    assert test.alternative == "two-sided" and test.p_value == pytest.approx(2 * 2 / 21)


def test_rome_by_hand(hand):
    by = hand.rome_by_layer()
    assert [e.value for e in by["efficacy"]] == [0.5, 0.5, 1.0]
    assert [e.value for e in by["paraphrase"]] == pytest.approx([0.25, 0.75, 0.5])
    lo = hand.rome_located_vs_other("efficacy")
    assert lo["located"].value == pytest.approx(0.5)  # fact 0 at layer 1: 0; fact 1 at layer 2: 1
    assert lo["other_layers"].value == pytest.approx(0.75)  # fact 0: (1 + 1)/2; fact 1: (0 + 1)/2
    assert lo["located_minus_other"].value == pytest.approx(-0.25)
    assert hand.traced_counts() == [0, 1, 1]


def test_kc_by_hand(hand):
    k = hand.kc_stats()
    assert k["recall_at_1"].value == 0.5
    assert k["param_share"].value == pytest.approx(0.035)
    assert k["param_share_recalled"].value == pytest.approx(0.03)  # facts 0 and 2
    # random draws: draw d hits fact (5 − d) mod 5 if < 4 → draws 0, 2, 3, 4 hit one fact each, draw 1 hits fact 4 (absent)
    assert k["random_recall_at_1"].value == pytest.approx(4 / 20)
    assert hand.kc_ipp().value == pytest.approx(0.5 - 0.25)
    assert k["test"] is None  # 5 random draws: fewer than the 20 a test needs
    # 20 draws (draw d's rows copied from draw d % 5): recall 0.5 above every draw's (≤ 0.25) → two-sided floor 2/21
    import dataclasses

    recs = hand.kc_records()
    loc = [r for r in recs if r.set == "located"]
    rnd = [dataclasses.replace(r, draw=r.draw + 5 * j) for j in range(4) for r in recs if r.set == "random"]
    rows = tuple(dataclasses.astuple(r) for r in loc + rnd)
    t = dataclasses.replace(hand, kc_rows=rows).kc_stats()["test"]
    assert t.alternative == "two-sided" and t.observed == pytest.approx(0.5) and len(t.null_values) == 20
    assert t.p_value == pytest.approx(2 / 21)


def test_hand_result_contract(hand, tmp_path):
    df = hand.to_frame()
    assert set(df.part) == {"kn", "rome", "kc"}
    s = hand.summary()
    assert s["kn"]["double"]["located_rise"]["paper"] == 0.851 and s["kc"]["recall_at_1"]["paper"] == 0.123
    hand.figure(), hand.rome_figure(), hand.kc_figure()
    hand.save(tmp_path / "r")
    assert load_result(tmp_path / "r").to_frame().equals(df)


def test_neighbourhood_falls_back():
    # both facts share the relation: fall back to the same relation with another answer
    assert neighbourhood(FACTS, 0, 5, 0) == [FACTS[1].rewrites[0]]
    assert neighbourhood(FACTS[:1], 0, 5, 0) is None
    assert draw_seed(0, 1, 2) != draw_seed(0, 2, 1)


# ---------------------------------------------------------------- tiny-model runs
def test_kn_reliability_matches_direct_interventions(tiny_llama):
    res = reliability(tiny_llama, FACTS[:1], parts=("kn",), ig=IG, kn__top_k=5, n_random=2, enhance_factor=1.0,
                      run=RunControl(progress=False))
    rows = res.kn_records()
    assert [r.set for r in rows] == ["located", "random", "random"]
    assert all(r.n_neurons == 5 for r in rows)
    for r in rows:  # factor 1.0 changes nothing
        assert r.enhanced_prob == pytest.approx(r.base_prob, rel=1e-5)
    fact = FACTS[0]
    ns = top_k_select(integrated_gradients(tiny_llama, fact.rewrites[0], fact.target, config=IG).scores, 5)
    zeroed = target_prob(tiny_llama, fact.rewrites[0], fact.target, hooks=scale_neurons(tiny_llama, ns, 0.0))
    assert rows[0].suppressed_prob == pytest.approx(zeroed, rel=1e-5)
    rnd = ns.random_like(seed=draw_seed(0, 0, 1))
    assert [sum(1 for l, _ in rnd if l == k) for k in range(2)] == [sum(1 for l, _ in ns if l == k) for k in range(2)]
    z1 = target_prob(tiny_llama, fact.rewrites[0], fact.target, hooks=scale_neurons(tiny_llama, rnd, 0.0))
    assert rows[2].suppressed_prob == pytest.approx(z1, rel=1e-5)


def test_rome_reliability_every_layer_and_restores(tiny_llama):
    before = {n: p.detach().clone() for n, p in tiny_llama.backend.named_parameters()}
    res = reliability(tiny_llama, FACTS, parts=("rome",), rome=ROME, trace__samples=1, trace__window=1,
                      run=RunControl(progress=False))
    rows = res.rome_records()
    assert [(r.fact, r.layer) for r in rows] == [(f, l) for f in (0, 1) for l in range(tiny_llama.n_layers)]
    top, _, _ = traced_layers(tiny_llama, FACTS[0].rewrites[0], FACTS[0].subject, FACTS[0].target,
                              cnl_trace().replace(samples=1, window=1))
    assert {r.traced_layer for r in rows if r.fact == 0} == {top[0]}
    assert sum(r.located for r in rows if r.fact == 0) == 1
    for n, p in tiny_llama.backend.named_parameters():
        assert torch.equal(p, before[n]), n
    assert res.rome_figure().layout.title.text.startswith("ROME edits at every layer (")
    sub = reliability(tiny_llama, FACTS, parts=("rome",), rome=ROME, trace__samples=1, trace__window=1,
                      rome_layers=(0,), rome_add_traced=False, run=RunControl(progress=False))
    hidden = sum(1 for f in (0, 1) if next(r.traced_layer for r in rows if r.fact == f) != 0)
    title = sub.rome_figure().layout.title.text  # a layer subset says so, and counts the facts traced elsewhere
    assert f"1 of {tiny_llama.n_layers} layers" in title and "2 facts" in title
    assert (f"{hidden} facts traced to unlisted layers" in title) is (hidden > 0)


def test_kc_reliability_matches_evaluate_circuit(tiny_llama):
    res = reliability(tiny_llama, FACTS[:1], parts=("kc",), kc__top_n=12, kc__steps=1, n_random_circuits=3,
                      run=RunControl(progress=False))
    rows = res.kc_records()
    circ = knowledge_circuit(tiny_llama, FACTS[0].rewrites[0], FACTS[0].target, cnl_circuit().replace(top_n=12, steps=1))
    ev = evaluate_circuit(tiny_llama, circ)
    assert rows[0].rank == ev.circuit_target_rank and rows[0].n_edges == circ.n_edges
    assert [r.set for r in rows] == ["located"] + ["random"] * 3
    assert all(r.n_edges == circ.n_edges for r in rows)
    rnd = circ.random_like(seed=draw_seed(0, 0, 0))
    assert rows[1].rank == evaluate_circuit(tiny_llama, rnd).circuit_target_rank


def test_rome_reliability_bos_reaches_the_trace(tiny_llama, monkeypatch):
    # the trace that marks ROME's located layer is called with bos=True and its layer is marked
    rel_mod = importlib.import_module("tlcap.experiments.cnl_eval.reliability")  # the package re-exports the function
    seen = []

    def spy(*args, **kwargs):
        seen.append(args[2].bos)
        return traced_layers_facts(*args, **kwargs)

    monkeypatch.setattr(rel_mod, "traced_layers_facts", spy)
    res = reliability(tiny_llama, FACTS[:1], parts=("rome",), rome=ROME, rome_layers=(0,), trace__samples=1,
                      trace__window=1, bos=True, rome_add_traced=False, run=RunControl(progress=False))
    assert seen == [True] and res.config["bos"] is True
    top, _, _ = traced_layers(tiny_llama, FACTS[0].rewrites[0], FACTS[0].subject, FACTS[0].target,
                              cnl_trace().replace(samples=1, window=1, bos=True))
    assert [r.traced_layer for r in res.rome_records()] == [top[0]]


def test_rome_subset_adds_the_traced_layer(tiny_llama):
    # --rome-layers lists a layer that is not the fact's traced one: the traced layer is edited too
    # (its row equals rome_sweep's at that layer), the per-layer table keeps the listed layer only,
    # and the fact enters the traced-vs-other comparison; rome_add_traced=False edits the list only
    top, _, _ = traced_layers(tiny_llama, FACTS[0].rewrites[0], FACTS[0].subject, FACTS[0].target,
                              cnl_trace().replace(samples=1, window=1, bos=False))
    other = next(l for l in range(tiny_llama.n_layers) if l != top[0])
    kw = dict(parts=("rome",), rome=ROME, rome_layers=(other,), trace__samples=1, trace__window=1)
    res = reliability(tiny_llama, FACTS[:1], **kw)
    assert sorted(r.layer for r in res.rome_records()) == sorted([other, top[0]])
    assert res.rome_layers() == [other] and len(res.rome_by_layer()["efficacy"]) == 1
    cmp = res.rome_located_vs_other("paraphrase")
    at = {r.layer: r for r in res.rome_records()}
    assert cmp is not None and cmp["located"].value == pytest.approx(at[top[0]].paraphrase)
    assert cmp["other_layers"].value == pytest.approx(at[other].paraphrase)
    fact = FACTS[0]
    direct = rome_sweep(tiny_llama, fact.rewrites[0], fact.subject, fact.target_new, [top[0]], target_old=fact.target,
                        paraphrases=list(fact.rewrites[1:]), neighbourhood=neighbourhood(FACTS[:1], 0, 10, 0),
                        config=ROME).results[0]
    assert at[top[0]].new_prob_after == pytest.approx(direct.new_prob_after, rel=1e-5)
    only = reliability(tiny_llama, FACTS[:1], **kw, rome_add_traced=False)
    assert [r.layer for r in only.rome_records()] == [other] and only.rome_located_vs_other() is None


def test_rome_ranges_in_two_runs_merge_into_one_run(tiny_llama):
    # KN + KC + ROME on fact 0 in one run, ROME on fact 1 in another: merged, the rows equal one
    # run over both facts; overlapping ranges and other settings are refused
    kw = dict(rome=ROME, ig=IG, n_random=2, n_random_circuits=2, kc__top_n=5, kc__steps=1, trace__samples=1,
              trace__window=1)
    whole = reliability(tiny_llama, FACTS, **kw)
    a = reliability(tiny_llama, FACTS, rome_facts=1, **kw)
    b = reliability(tiny_llama, FACTS, parts=("rome",), rome_from=1, **kw)
    assert {r[0] for r in a.rome_rows} == {0} and {r[0] for r in b.rome_rows} == {1} and not b.kn_rows
    merged = merge_reliability([b, a])
    assert merged.parts == ("kn", "rome", "kc")
    for part in ("kn_rows", "rome_rows", "kc_rows"):
        assert getattr(merged, part) == getattr(whole, part), part
    assert merged.config["rome_from"] == 0 and merged.config["rome_facts"] is None
    assert merged.rome_by_layer() == whole.rome_by_layer()
    with pytest.raises(InvalidConfigError, match="fact 0 has kn rows in runs 0 and 1"):
        merge_reliability([a, whole])
    exact = reliability(tiny_llama, FACTS, parts=("rome",), rome_from=1, **{**kw, "ig": IG.replace(batch_rows=3)})
    assert merge_reliability([a, exact]).rome_rows == whole.rome_rows  # a batch size changes no number
    other = reliability(tiny_llama, FACTS, parts=("rome",), rome_from=1, **{**kw, "trace__samples": 2})
    with pytest.raises(InvalidConfigError, match="different settings.*trace.samples"):
        merge_reliability([a, other])
    with pytest.raises(InvalidConfigError, match="rome_from"):
        ReliabilityConfig(rome_from=3, rome_facts=2)


def test_rome_layer_shards_merge_into_the_every_layer_run(tiny_llama):
    # ROME at layer 0 (+ each fact's traced layer) in one run, at the other layers in another: merged,
    # every (fact, layer) edit is there once and the per-layer table equals one run at every layer
    kw = dict(parts=("rome",), rome=ROME, trace__samples=1, trace__window=1)
    whole = reliability(tiny_llama, FACTS, **kw)
    rest = tuple(range(1, tiny_llama.n_layers))
    a = reliability(tiny_llama, FACTS, rome_layers=(0,), **kw)
    b = reliability(tiny_llama, FACTS, rome_layers=rest, rome_add_traced=False, **kw)
    traced = {r.fact: r.traced_layer for r in whole.rome_records()}
    assert {(r[0], r[2]) for r in a.rome_rows} == {(f, l) for f, t in traced.items() for l in {0, t}}
    assert any(t != 0 for t in traced.values())  # so one edit is in both runs and must be kept once
    merged = merge_reliability([a, b])
    assert sorted(merged.rome_rows, key=lambda r: (r[0], r[2])) == sorted(whole.rome_rows, key=lambda r: (r[0], r[2]))
    assert merged.config["rome_layers"] is None and merged.config["rome_add_traced"] is True
    assert merged.rome_layers() == list(range(tiny_llama.n_layers))
    assert merged.rome_by_layer() == whole.rome_by_layer()
    assert merged.rome_located_vs_other() == whole.rome_located_vs_other()
    part = merge_reliability([a, reliability(tiny_llama, FACTS, rome_layers=rest[:1], rome_add_traced=False, **kw)])
    assert part.config["rome_layers"] == (None if tiny_llama.n_layers == 2 else [0, 1])  # the union of the lists


def test_rome_reliability_bos_reaches_the_edit(tiny_llama, monkeypatch):
    # bos=True puts the BOS first in the ROME edit's prompt tokens (the keys at the subject), and
    # the rows are those of rome_sweep with RomeConfig(bos=True)
    bos_id = tiny_llama.special_token_id("bos")
    assert tiny_llama.encode(FACTS[0].rewrites[0])[0] != bos_id  # the model's default tokenisation has none
    firsts, real = [], tiny_llama.record

    def spy(tokens, *args, **kwargs):
        if isinstance(tokens, TokenBatch):  # subject_keys' prompts (the covariance passes a tensor of text windows)
            firsts.extend(tokens.tokens[:, 0].tolist())
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(tiny_llama, "record", spy)
    res = reliability(tiny_llama, FACTS[:1], parts=("rome",), rome=ROME, rome_layers=(1,), trace__samples=1,
                      trace__window=1, bos=True, rome_add_traced=False, run=RunControl(progress=False))
    monkeypatch.undo()
    assert firsts and set(firsts) == {bos_id}
    assert res.config["rome"]["bos"] is True
    fact = FACTS[0]
    direct = rome_sweep(tiny_llama, fact.rewrites[0], fact.subject, fact.target_new, [1], target_old=fact.target,
                        paraphrases=list(fact.rewrites[1:]), neighbourhood=neighbourhood(FACTS[:1], 0, 10, 0),
                        config=replace(ROME, bos=True)).results[0]
    row = res.rome_records()[0]
    assert row.new_prob_after == pytest.approx(direct.new_prob_after, rel=1e-5)
    assert row.new_prob_before == pytest.approx(direct.new_prob_before, rel=1e-5)
    assert ReliabilityConfig(rome=ROME).rome.bos is False and ReliabilityConfig(rome=ROME, bos=True).rome.bos is True


def test_reliability_checkpoint_resume(tiny_llama, tmp_path):
    # interrupted at the second fact, the rerun computes only that fact and equals an uninterrupted run
    opts = dict(parts=("kn", "kc"), ig=IG, kn__top_k=4, n_random=2, kc__top_n=12, kc__steps=1, n_random_circuits=2)
    full = reliability(tiny_llama, FACTS, **opts)

    def boom(i):
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reliability(tiny_llama, FACTS, on_item=boom, **opts, run=RunControl(checkpoint_dir=tmp_path, checkpoint_every=5))
    seen = []
    res = reliability(tiny_llama, FACTS, on_item=seen.append, **opts, run=RunControl(checkpoint_dir=tmp_path))
    assert seen == [1]  # fact 0 came from the checkpoint saved on the interrupt (not by checkpoint_every)
    assert res.kn_rows == full.kn_rows and res.kc_rows == full.kc_rows
    with pytest.raises(CheckpointMismatchError):
        reliability(tiny_llama, FACTS, **dict(opts, kn__top_k=3), run=RunControl(checkpoint_dir=tmp_path))
