"""QL groups and edits (issue 24): 2-query facts are "excluded" everywhere, K_II facts are edited on a
query the model knows, empty neighbor sets are flagged in the query-KN mapping."""

from __future__ import annotations

import warnings

import pytest
import torch

from tlcap.data.pararel import Fact
from tlcap.experiments.ql import (
    EXCLUDED,
    FactKNs,
    groups_for,
    modification_experiment,
    query_kn_mapping,
    synapse_experiment,
)
from tlcap.experiments.ql.modification import EXCLUDED_REASON
from tlcap.metrics.stats import cs2

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "A second text about the weather in the city today."]
CAPITAL = ("The capital of {} is", "{}'s capital is", "The capital city of {} is", "{} has its capital at")


def _planted(m, relation, subject, obj, queries, kn_sets):
    """A FactKNs whose query q selects exactly ``kn_sets[q]`` (score 1 there, 0 elsewhere; rule 0.2 · max)."""
    scores = torch.zeros(len(queries), m.n_layers, m.d_mlp)
    for q, s in enumerate(kn_sets):
        for layer, j in s:
            scores[q, layer, j] = 1.0
    return FactKNs(scores, tuple(0.5 for _ in queries), Fact(relation, subject, obj, tuple(queries)))


def _top_word(m, query):
    """The model's top-1 token after ``query`` as a ParaRel object (``None`` unless a space-led single token)."""
    tid = int(m.last_logits(m.to_tokens(query))[0].argmax())
    word = m.to_str_tokens([tid])[0]
    if not word.startswith(" ") or not word[1:].strip() or m.target_ids(query, word) != [tid]:
        return None
    return word[1:]


def _known(m, fk):
    oid = m.target_ids(fk.queries[0], fk.target)[0]
    return [int(m.last_logits(m.to_tokens(q))[0].argmax()) == oid for q in fk.queries]


def test_two_query_facts_are_excluded_by_groups_and_every_analysis(tiny_gpt2):
    """A fact with 2 queries (CS1 ≡ CS2) is neither K_I nor K_II: ``groups_for`` labels it "excluded", Otsu and
    the split ignore it, and the modification / mapping / synapse experiments give it no row."""
    m = tiny_gpt2
    a, b, c, d = (0, 1), (0, 2), (1, 3), (1, 4)
    locs = [
        _planted(m, "P36", "France", "Paris", [q.format("France") for q in CAPITAL[:3]], [{a, b}, {a, b}, {a}]),
        _planted(m, "P103", "Hugo", "French", ["The native language of Hugo is", "Hugo spoke"], [{c}, {d}]),
        _planted(m, "P30", "Kenya", "Africa", ["Kenya is located in", "Kenya is in the continent of",
                                                 "Kenya belongs to the continent of"], [{a}, {b}, {c}]),
    ]
    assert [cs2(fk.sets()) for fk in locs] == pytest.approx([1.0, 0.0, 0.0])  # CS2 = 0 for the 2-query fact too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups, cons = groups_for(locs, static_threshold=0.1)
        otsu, _ = groups_for(locs, split="otsu")
    assert groups == ["K_I", EXCLUDED, "K_II"] and otsu[1] == EXCLUDED
    assert cons.groups(split="otsu")[1] == EXCLUDED and cons.summary()["facts"][1]["group"] == EXCLUDED
    st = cons.stats()
    assert (st["k1_ratio"], st["k2_ratio"], st["n_few_queries"]) == (0.5, 0.5, 1)

    kw = dict(ppl_texts=TEXTS, n_ppl_texts=1, only_known=False, edit_queries=1, progress=False)
    mod = modification_experiment(m, locs, groups, operations=("erasure", "update"), sets=("local",),
                                  new_objects={"P103": ["English"], "P36": ["Rome"], "P30": ["Europe"]}, **kw)
    df, sk = mod.to_frame(), mod.skipped_frame()
    assert set(df.fact) == {0, 2} and set(df.group) == {"K_I", "K_II"}
    assert list(zip(sk.fact, sk["query"], sk.operation, sk.reason)) == [
        (1, 0, "erasure", EXCLUDED_REASON), (1, 0, "update", EXCLUDED_REASON)]
    assert set(mod.table().group) == {"K_I", "K_II"}
    mp = query_kn_mapping(m, locs, groups, progress=False).to_frame()
    assert set(mp.fact) == {0, 2} and len(mp) == 2 * 3 * 4 * 2  # 2 facts × 3 queries × 4 sets × enh/sup
    sy = synapse_experiment(m, locs, groups, alpha=0.05, progress=False)
    assert set(sy.to_frame().fact) == {0, 2} and [r.fact for r in sy.predominance] == [0, 2]


def test_k2_fact_is_edited_on_the_first_query_the_model_answers(tiny_gpt2):
    """``edit_queries=1`` edits the first query answered top-1, not query 0 (the committed cpu report had no K_II
    edit because query 0 of every K_II fact was not answered top-1 and nothing else was tried)."""
    m = tiny_gpt2
    # the random tiny GPT-2 repeats a prompt's last word: " in" is its answer after "... in", not after "... is"
    qs = ["The capital of France is", "France is located in", "The capital city of France is", "France lies in"]
    fk = _planted(m, "P30", "France", "in", qs, [{(0, 1)}, {(0, 2)}, {(1, 3)}, {(1, 4)}])  # CS2 = 0: K_II
    known = _known(m, fk)
    assert known == [False, True, False, True]
    other = _planted(m, "P36", "Ghana", "Rome", [q.format("Ghana") for q in CAPITAL[:3]], [{(0, 1)}] * 3)
    groups, _ = groups_for([fk, other])
    assert groups == ["K_II", "K_I"]
    res = modification_experiment(m, [fk], ["K_II"], operations=("erasure",), sets=("local", "global"),
                                  ppl_texts=TEXTS, n_ppl_texts=1, edit_queries=1, progress=False)
    df, sk = res.to_frame(), res.skipped_frame()
    assert list(zip(df["query"], df["set"], df.group)) == [(1, "local", "K_II"), (1, "global", "K_II")]
    assert list(zip(sk["query"], sk.reason)) == [(0, "not answered top-1 before the edit")]
    # two edited queries: the first two known ones; the unknown queries passed over (0, 2) are listed
    two = modification_experiment(m, [fk], ["K_II"], operations=("erasure",), sets=("local",), ppl_texts=TEXTS,
                                  n_ppl_texts=1, edit_queries=2, progress=False)
    assert list(two.to_frame()["query"]) == [1, 3] and list(two.skipped_frame()["query"]) == [0, 2]
    # a fact with fewer known queries than asked: every unknown query is listed
    three = modification_experiment(m, [fk], ["K_II"], operations=("erasure",), sets=("local",), ppl_texts=TEXTS,
                                    n_ppl_texts=1, edit_queries=3, progress=False)
    assert list(three.to_frame()["query"]) == [1, 3] and list(three.skipped_frame()["query"]) == [0, 2]
    # all queries, unknown ones included: the first one
    allq = modification_experiment(m, [fk], ["K_II"], operations=("erasure",), sets=("local",), ppl_texts=TEXTS,
                                   n_ppl_texts=1, edit_queries=1, only_known=False, progress=False)
    assert list(allq.to_frame()["query"]) == [0] and not allq.skipped


def test_mapping_rows_flag_empty_neighbor_sets(tiny_gpt2):
    """Each (query, set) row says whether the set is empty; an empty set is not run: p_after = p_before, ΔProb 0."""
    m = tiny_gpt2
    a, b, c, d = (0, 1), (0, 2), (1, 3), (1, 4)
    fk = _planted(m, "P36", "France", "Paris", [q.format("France") for q in CAPITAL[:3]], [{a, b}, {b, c}, {c, d}])
    res = query_kn_mapping(m, [fk], ["K_II"], progress=False)
    df = res.to_frame()
    # neighbors of q0: {b,c},{c,d} → ∩ {c}, refine {c}; of q1: {a,b},{c,d} → ∩ ∅, refine ∅; of q2: {a,b},{b,c} → {b}
    sizes = {(i, s): n for i, s, n in zip(df["query"], df["set"], df.n_neurons)}
    assert sizes == {(0, "self"): 2, (0, "union"): 3, (0, "intersection"): 1, (0, "refine"): 1,
                     (1, "self"): 2, (1, "union"): 4, (1, "intersection"): 0, (1, "refine"): 0,
                     (2, "self"): 2, (2, "union"): 3, (2, "intersection"): 1, (2, "refine"): 1}
    assert (df.empty_set == (df.n_neurons == 0)).all() and df.empty_set.sum() == 4  # q1's ∩ and refine, enh and sup
    e = df[df.empty_set]
    assert (e.p_after == e.p_before).all() and (e.dprob == 0).all()
    full = df[~df.empty_set & (df.op == "sup")]
    assert (full.p_after != full.p_before).all()  # a non-empty set is really suppressed


def test_take_restricts_a_fact_to_some_queries_for_split_half_consistency(tiny_gpt2):
    """``FactKNs.take`` keeps the chosen queries' scores and texts (no new attribution): CS2 of each half by hand."""
    from tlcap.errors import InvalidConfigError

    m = tiny_gpt2
    a, b, c, d = (0, 1), (0, 2), (1, 3), (1, 4)
    qs = [q.format("France") for q in CAPITAL] + ["France's seat of government is", "France is governed from"]
    fk = _planted(m, "P36", "France", "Paris", qs, [{a, b}, {c}, {a}, {c, d}, {b}, {d}])
    even, odd = fk.take([0, 2, 4]), fk.take([1, 3, 5])
    assert even.queries == [qs[0], qs[2], qs[4]] and odd.k == 3 and torch.equal(odd.scores[1], fk.scores[3])
    # even: {a,b},{a},{b} → union {a,b}, both in > 1 set: CS2 1; odd: {c},{c,d},{d} → CS2 1; across: {a,b},{c} → 0
    assert (cs2(even.sets()), cs2(odd.sets()), cs2(fk.take([0, 1]).sets())) == (1.0, 1.0, 0.0)
    assert cs2(fk.sets()) == pytest.approx(1.0)
    with pytest.raises(InvalidConfigError, match="distinct indices"):
        fk.take([0, 0])
    with pytest.raises(InvalidConfigError, match="distinct indices"):
        fk.take([6])


def test_a_relation_with_fewer_patterns_than_min_queries_is_named(tiny_gpt2):
    """``reproduce`` draws facts with >= 3 queries; a 2-pattern relation then gives none, and the warning says why."""
    from tlcap.data.pararel import scan_pararel
    from tlcap.data.sample import DataWarning

    with pytest.warns(DataWarning, match="P103 gave no fact: it has 2 queries per fact, fewer than min_queries=3"):
        sample = scan_pararel(None, ["P36", "P103"], n_facts=2, model=tiny_gpt2, min_queries=3, max_queries=3,
                              progress=False)
    assert [f.relation for f in sample.facts] == ["P36", "P36"] and all(len(f.queries) == 3 for f in sample.facts)
