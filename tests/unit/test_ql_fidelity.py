"""QL fidelity (issue 10 items 3–5): the Update rule, scoring only known queries, o' of the same relation."""

from __future__ import annotations

import pytest
import torch

from tlcap.data.pararel import Fact
from tlcap.errors import TlcapError
from tlcap.experiments.ql import FactKNs, ModificationConfig, modification_experiment
from tlcap.intervene.update import update_coefficients, update_neurons
from tlcap.metrics.sets import NeuronSet
from tlcap.runtime.sites import get_site

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "A second text about the weather in the city today."]


def _acts(m, prompt):
    names = [get_site("mlp_post").hook_name(l) for l in range(m.n_layers)]
    return m.last_position_activations(m.to_tokens(prompt), names)[0][0].float()


def test_update_activation_rule_writes_the_kns_own_scale_at_query(tiny_llama):
    """Item 3: at the query the KNs add ρ·δ, ‖ρ·δ‖ = size·‖Σ a_p W_p‖ (default), (Σa)·δ (literal)."""
    m = tiny_llama
    acts = _acts(m, "The capital of France is")
    flat = acts.flatten()
    pos, neg = int(flat.argmax()), int(flat.argmin())
    assert flat[pos] > 0 > flat[neg]  # a mixed-sign KN set, as on SwiGLU models
    d = m.d_mlp
    kns = NeuronSet.from_list([(pos // d, pos % d), (neg // d, neg % d)], (m.n_layers, d))
    delta = (-2.0 * m.W_E[10] + 3.0 * m.W_E[20]).float()
    a = torch.tensor([float(acts[l, p]) for l, p in kns.neurons])
    # by hand: what the KNs write at the query now
    w = sum(float(acts[l, p]) * m.mlp_down_matrix(l)[:, p].float() for l, p in kns.neurons)

    def write(rule, **kw):
        before = {l: m.mlp_down_matrix(l).clone() for l in range(m.n_layers)}
        with update_neurons(m, kns, 10, 20, 2.0, 3.0, rule=rule, activations=acts, **kw):
            return sum((m.mlp_down_matrix(l)[:, p] - before[l][:, p]).float() * float(acts[l, p]) for l, p in kns.neurons)

    for size in (1.0, 0.5):
        rho = size * float(w.norm()) / float(delta.norm())
        assert torch.allclose(write("activation", size=size), rho * delta, atol=1e-4)
        # the added write is `size` times the KNs' own output, along the paper's δ
        assert float(write("activation", size=size).norm()) == pytest.approx(size * float(w.norm()), rel=1e-4)
    assert torch.allclose(write("paper"), a.sum() * delta, atol=1e-4)
    # least squares: c_p = ρ a_p / Σ a², the sign of each activation; the literal rule is c = 1
    rho = float(w.norm()) / float(delta.norm())
    c = update_coefficients(kns, acts, "activation", rho)
    for n in kns.neurons:
        assert c[n] == pytest.approx(rho * float(acts[n]) / float((a * a).sum()), rel=1e-6)
    assert update_coefficients(kns, acts, "paper") == {n: 1.0 for n in kns.neurons}
    with pytest.raises(TlcapError, match="write scale"):
        update_coefficients(kns, acts, "activation")
    assert ModificationConfig().update_rule == "activation" and ModificationConfig().update_size == 1.0
    with pytest.raises(TlcapError, match="update_size"):
        ModificationConfig(update_size=0)


def _fk(m, relation, subject, obj, queries, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(len(queries), m.n_layers, m.d_mlp, generator=g)
    return FactKNs(scores, tuple(0.0 for _ in queries), Fact(relation, subject, obj, tuple(queries)))


def _ranked_word(m, query, rank):
    """The model's rank-th token after ``query`` when it is a space-led word (else ``None``)."""
    tid = int(m.last_logits(m.to_tokens(query))[0].argsort(descending=True)[rank])
    word = m.to_str_tokens([tid])[0]
    if not word.startswith(" ") or not word.strip() or m.target_ids(query, word) != [tid]:
        return None
    return word[1:]


def test_modification_scores_only_queries_answered_top1(tiny_gpt2):
    """Item 4: queries the model does not answer top-1 before the edit are skipped with a reason."""
    m = tiny_gpt2
    locs = []
    for i, subj in enumerate(["France", "Italy", "Spain", "Japan", "Canada", "Peru"]):
        qs = [f"The capital of {subj} is", f"{subj}'s capital is", f"The capital city of {subj} is"]
        obj = _ranked_word(m, qs[0], 0 if i % 2 == 0 else 1)  # odd facts: the model's second choice
        if obj is not None:
            locs.append(_fk(m, "P36", subj, obj, qs, seed=i))
    assert len(locs) >= 2
    known = {(fi, qi) for fi, fk in enumerate(locs) for qi, q in enumerate(fk.queries)
             if int(m.last_logits(m.to_tokens(q))[0].argmax()) == m.target_ids(q, fk.target)[0]}
    assert (0, 0) in known and 0 < len(known) < 3 * len(locs)
    res = modification_experiment(m, locs, ["K_I"] * len(locs), operations=("erasure",), sets=("local",),
                                  ppl_texts=TEXTS, n_ppl_texts=1, progress=False)
    df = res.to_frame()
    assert set(zip(df.fact, df["query"])) == known
    sk = res.skipped_frame()
    assert set(zip(sk.fact, sk["query"])) == {(fi, qi) for fi in range(len(locs)) for qi in range(3)} - known
    assert set(sk.reason) == {"not answered top-1 before the edit"}
    assert res.summary()["n_skipped"] == len(sk)
    everything = modification_experiment(m, locs, ["K_I"] * len(locs), operations=("erasure",), sets=("local",),
                                         ppl_texts=TEXTS, n_ppl_texts=1, only_known=False, progress=False)
    assert len(everything.to_frame()) == 3 * len(locs) and not everything.skipped


def test_new_object_comes_from_the_same_relation_or_is_skipped(tiny_gpt2):
    """Item 5: o' is another object of the fact's relation (seeded); a relation with none is skipped."""
    m = tiny_gpt2
    qs36 = ["The capital of {} is", "{}'s capital is"]
    qs103 = ["The native language of {} is", "{} spoke the language"]
    locs = [_fk(m, "P36", "France", "Paris", [q.format("France") for q in qs36], 0),
            _fk(m, "P36", "Italy", "Rome", [q.format("Italy") for q in qs36], 1),
            _fk(m, "P103", "Victor Hugo", "French", [q.format("Victor Hugo") for q in qs103], 2)]
    kw = dict(operations=("update",), sets=("local",), ppl_texts=TEXTS, n_ppl_texts=1, only_known=False,
              edit_queries=1, progress=False)
    res = modification_experiment(m, locs, ["K_I"] * 3, **kw)
    df = res.to_frame()
    assert dict(zip(df.subject, df.new_object)) == {"France": "Rome", "Italy": "Paris"}
    sk = res.skipped_frame()
    assert list(sk.subject) == ["Victor Hugo"] and list(sk.reason) == ["no other single-token object of the same relation"]
    more = modification_experiment(m, locs, ["K_I"] * 3, new_objects={"P103": ["English", "German", "Dutch"]}, **kw)
    again = modification_experiment(m, locs, ["K_I"] * 3, new_objects={"P103": ["English", "German", "Dutch"]}, **kw)
    hugo = more.to_frame().set_index("subject").new_object["Victor Hugo"]
    assert hugo in {"English", "German", "Dutch"}
    assert list(again.to_frame().new_object) == list(more.to_frame().new_object)


def test_update_rule_is_validated():
    with pytest.raises(TlcapError, match="--rule"):
        ModificationConfig(update_rule="foo")


def test_dppl_texts_are_drawn_per_query_and_shared_by_its_edits(tiny_gpt2):
    """ΔPPL is paired: every edit of one query (erasure / update × N_i / N_g) is scored on the same
    seeded draw of texts, and the unedited perplexity is that draw's."""
    import random

    from tlcap.metrics.perplexity import perplexity

    m = tiny_gpt2
    pool = [f"Text number {i} talks about {w} and the weather in the city." for i, w in
            enumerate(["rivers", "trains", "music", "bread", "stars", "roads", "birds", "tea"])]
    qs = ["The capital of {} is", "{}'s capital is"]
    locs = [_fk(m, "P36", "France", "Paris", [q.format("France") for q in qs], 0),
            _fk(m, "P36", "Italy", "Rome", [q.format("Italy") for q in qs], 1)]
    res = modification_experiment(m, locs, ["K_I", "K_I"], operations=("erasure", "update"), sets=("local", "global"),
                                  ppl_texts=pool, n_ppl_texts=2, only_known=False, edit_queries=2, progress=False)
    df = res.to_frame()
    assert len(df) == 2 * 2 * 2 * 2
    for (fi, qi), g in df.groupby(["fact", "query"]):
        idx = sorted(random.Random(f"0:ppl:{fi}:{qi}").sample(range(len(pool)), 2))
        want = perplexity(m, [pool[j] for j in idx], 128)
        assert g.ppl_before.nunique() == 1 and g.ppl_before.iloc[0] == pytest.approx(want, rel=1e-6)
    assert df.groupby(["fact", "query"]).ppl_before.first().nunique() > 1  # queries draw their own texts


def test_ppl_texts_are_a_seeded_random_draw_of_wikitext():
    """Item 6: ΔPPL texts are random WikiText-2 paragraphs (seeded), not the first n."""
    from tlcap.data.wikitext import load_wikitext
    from tlcap.experiments.ql import wikitext_sample

    pool = load_wikitext()
    a, b = wikitext_sample(5, seed=0), wikitext_sample(5, seed=1)
    assert a == wikitext_sample(5, seed=0) and a != b
    assert len(set(a)) == 5 and set(a) <= set(pool) and a != pool[:5]


def test_irrelevant_synapse_columns_are_mapped_by_token_role():
    """Item 9: S_ir moves to the query's columns by role (subject, relation, last), not by index."""
    from tlcap.locate.synapses import map_columns

    src = ("relation", "subject", "subject", "relation", "last")
    dst = ("relation", "relation", "subject", "relation", "relation", "last")
    mask = torch.zeros(1, 1, 5, dtype=torch.bool)
    mask[0, 0, [1, 2, 3, 4]] = True
    out = map_columns(mask, src, dst, skip_first=False)
    # subject k=0,1 → dst subject (one token); relation k=1 → dst relation k=1 (col 1); last → last
    assert out[0, 0].nonzero().flatten().tolist() == [1, 2, 5]
    first = torch.zeros(1, 1, 5, dtype=torch.bool)
    first[0, 0, 0] = True
    assert not map_columns(first, src, dst, skip_first=True).any()
    assert map_columns(first, src, dst, skip_first=False)[0, 0].nonzero().flatten().tolist() == [0]


def test_irrelevant_synapses_come_from_a_random_fact_of_another_relation(tiny_gpt2):
    """Item 9: the source of S_ir is a query of a fact of another relation, drawn with the seed."""
    from tlcap.experiments.ql import synapse_experiment
    from tlcap.locate.synapses import token_roles

    m = tiny_gpt2
    assert token_roles(m, "The capital of France is", "France") == ("relation",) * 3 + ("subject", "last")
    locs = [_fk(m, "P36", "France", "Paris", ["The capital of France is", "France's capital is"], 0),
            _fk(m, "P36", "Italy", "Rome", ["The capital of Italy is", "Italy's capital is"], 1),
            _fk(m, "P103", "Victor Hugo", "French", ["The native language of Victor Hugo is"] * 2, 2),
            _fk(m, "P30", "Kenya", "Africa", ["Kenya is located in", "Kenya is a part of the continent of"], 3)]
    res = synapse_experiment(m, locs, ["K_I"] * 4, alpha=0.05, heatmap_max_cols=2, progress=False)
    df = res.to_frame()
    ir = df[df.synapses == "irrelevant"]
    rel_of = {q: fk.fact.relation for fk in locs for q in fk.queries}
    assert all(rel_of[s] != r for s, r in zip(ir.source, ir.relation))
    assert len(set(ir[ir.relation == "P36"].source)) > 1  # drawn, not always the next fact's query
    again = synapse_experiment(m, locs, ["K_I"] * 4, alpha=0.05, heatmap_max_cols=2, progress=False)
    assert list(again.to_frame().source) == list(df.source)


def test_irrelevant_synapses_of_a_one_relation_run_warn(tiny_gpt2):
    """Item 9: a run whose facts share one relation cannot draw S_ir from another relation; it says so."""
    from tlcap.data.sample import DataWarning
    from tlcap.experiments.ql import synapse_experiment

    m = tiny_gpt2
    locs = [_fk(m, "P36", "France", "Paris", ["The capital of France is", "France's capital is"], 0),
            _fk(m, "P36", "Italy", "Rome", ["The capital of Italy is", "Italy's capital is"], 1)]
    with pytest.warns(DataWarning, match="every fact shares relation P36"):
        res = synapse_experiment(m, locs, ["K_I"] * 2, alpha=0.05, heatmap_max_cols=2, progress=False)
    ir = res.to_frame().query("synapses == 'irrelevant'")
    own = {q: fk.fact.subject for fk in locs for q in fk.queries}
    assert all(own[s] != subj for s, subj in zip(ir.source, ir.subject))  # another fact, same relation


def _fk_sets(relation, subject, obj, kn_sets, shape=(2, 8)):
    """A FactKNs whose queries select exactly ``kn_sets`` (score 1 on the set, 0 elsewhere; rule 0.2·max)."""
    scores = torch.zeros(len(kn_sets), *shape)
    for q, s in enumerate(kn_sets):
        for layer, j in s:
            scores[q, layer, j] = 1.0
    qs = tuple(f"q{q} {subject}" for q in range(len(kn_sets)))
    return FactKNs(scores, tuple(0.5 for _ in kn_sets), Fact(relation, subject, obj, qs))


def test_facts_with_fewer_than_three_queries_are_reported_apart():
    """Item 7: facts with < 3 queries (CS1 ≡ CS2) are left out of K_I/K_II, Welch and Otsu, and counted."""
    import warnings

    from tlcap.data.sample import DataWarning
    from tlcap.experiments.ql import consistency_analysis
    from tlcap.metrics.stats import otsu_threshold, welch_t_test

    a, b, c, d = (0, 0), (0, 1), (1, 2), (1, 3)
    locs = [
        _fk_sets("P1", "s0", "o", [{a, b}, {a, b}, {a, b}]),      # CS2 1: K_I
        _fk_sets("P1", "s1", "o", [{a}, {a, b}, {a, c}]),         # CS2 1/3: share of the union in > 1 set
        _fk_sets("P1", "s2", "o", [{a}, {b}, {c}]),               # CS2 0: K_II
        _fk_sets("P1", "s3", "o", [{a, b, c}, {a}, {d}]),         # CS2 1/4 (only a is in two sets)
        _fk_sets("P2", "s4", "o", [{c}, {d}]),                    # 2 queries: CS2 0
        _fk_sets("P2", "s5", "o", [{c, d}, {c, d}]),              # 2 queries: CS2 1
    ]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = consistency_analysis({"ig": locs}, static_threshold=0.3)
    assert any(issubclass(x.category, DataWarning) and "2 fact(s) have fewer than 3 queries" in str(x.message) for x in w)
    df = res.to_frame()
    assert list(df.cs2) == pytest.approx([1.0, 1 / 3, 0.0, 0.25, 0.0, 1.0])
    st = res.stats("ig", "static")
    # only the four facts with 3 queries: K_I = CS2 > 0.3 = {s0, s1}, K_II = {s2, s3}
    assert st["k1_ratio"] == 0.5 and st["k2_ratio"] == 0.5
    assert st["mean_cs2_k1"] == pytest.approx(2 / 3) and st["mean_cs2_k2"] == pytest.approx(0.125)
    assert (st["welch_t"], st["welch_p"]) == pytest.approx(welch_t_test([1.0, 1 / 3], [0.0, 0.25]))
    assert st["n_few_queries"] == 2 and st["mean_cs2_few_queries"] == pytest.approx(0.5)
    assert st["mean_cs2"] == pytest.approx((1 + 1 / 3 + 0 + 0.25) / 4)
    assert res.otsu_thresholds["ig"] == pytest.approx(otsu_threshold([1.0, 1 / 3, 0.0, 0.25]))


def test_locality_prompts_are_a_seeded_draw_of_other_relations_and_objects(tiny_gpt2, monkeypatch):
    """Item 6: Loc is measured on first queries of facts of other relations with other objects (seeded)."""
    import random

    import tlcap.experiments.ql.modification as mod

    m = tiny_gpt2
    rel = {"P36": ("The capital of {} is", "{}'s capital is"), "P103": ("The language of {} is", "{} spoke")}
    facts = [("P36", "France", "Paris"), ("P36", "Italy", "Rome"), ("P103", "Hugo", "French"),
             ("P103", "Dante", "Italian"), ("P103", "Rome", "Paris")]
    locs = [_fk(m, r, s, o, [q.format(s) for q in rel[r]], i) for i, (r, s, o) in enumerate(facts)]
    seen: list[list[str]] = []
    real = mod._query_and_locality_logits

    def spy(model, queries, loc_prompts, *args, **kwargs):
        seen.append([*queries, *loc_prompts])
        return real(model, queries, loc_prompts, *args, **kwargs)

    monkeypatch.setattr(mod, "_query_and_locality_logits", spy)
    modification_experiment(m, locs, ["K_I"] * 5, operations=("erasure",), sets=("local",), ppl_texts=TEXTS,
                            n_ppl_texts=1, n_locality=2, only_known=False, edit_queries=1, progress=False)
    # per fact: its queries then its locality prompts in one pass, clean and under each edit
    for fi, (r, _, o) in enumerate(facts):
        pool = [j for j, (r2, _, o2) in enumerate(facts) if r2 != r and o2 != o]
        want = [locs[j].queries[0] for j in random.Random(f"0:loc:{fi}").sample(pool, min(2, len(pool)))]
        assert [*locs[fi].queries, *want] in seen, (fi, want)
        if fi == 0:  # fact 4 is of another relation but has fact 0's object (Paris): never a source of fact 0
            assert pool == [2, 3]


def test_table2_names_the_update_rule_and_size(tiny_gpt2):
    """Item 3: Table 2 and summary.json say which Update rule (and write size) produced the rows."""
    m = tiny_gpt2
    qs = ["The capital of {} is", "{}'s capital is"]
    locs = [_fk(m, "P36", "France", "Paris", [q.format("France") for q in qs], 0),
            _fk(m, "P36", "Italy", "Rome", [q.format("Italy") for q in qs], 1)]
    kw = dict(sets=("local",), ppl_texts=TEXTS, n_ppl_texts=1, only_known=False, edit_queries=1, progress=False)
    for rule, size in (("activation", 2.0), ("paper", 1.0)):
        res = modification_experiment(m, locs, ["K_I", "K_I"], update_rule=rule, update_size=size, **kw)
        t = res.table()
        assert dict(zip(t.operation, t.rule)) == {"erasure": "erasure", "update": rule}
        s = res.summary()
        assert (s["update_rule"], s["update_size"]) == (rule, size)
        assert {r["rule"] for r in s["table"]} == {"erasure", rule}
        assert set(res.to_frame().rule) == {"erasure", rule}


def test_the_cost_model_counts_the_forward_calls_of_a_modification_run(tiny_gpt2):
    """``ql.table2``'s plan counts the experiment's forward calls as it makes them (each a batch): per fact 1 (its
    queries with its locality prompts and their activations), per edited query 1 (the unedited ΔPPL texts), per
    edit 2 (the queries with the locality prompts, the ΔPPL texts) (:func:`tlcap.reproduce.ql_stages.modification_calls`)."""
    from tlcap.reproduce.ql_stages import modification_calls

    m = tiny_gpt2
    locs = [_fk(m, "P36", "France", "Paris", ["The capital of France is", "France's capital is", "Paris is in"], 0),
            _fk(m, "P36", "Italy", "Rome", ["The capital of Italy is", "Italy's capital is"], 1),
            _fk(m, "P103", "Victor Hugo", "French", ["The native language of Victor Hugo is", "Hugo spoke"], 2)]
    pool = [f"Text number {i} is about the weather in a city on day {i}." for i in range(200)]
    calls = []
    handle = m.backend.register_forward_pre_hook(lambda mod, args: calls.append(1))
    try:
        res = modification_experiment(m, locs, ["K_I"] * 3, operations=("erasure", "update"), sets=("local", "global"),
                                      ppl_texts=pool, n_ppl_texts=2, only_known=False, edit_queries=2,
                                      new_objects={"P103": ["English", "German"]}, progress=False)
    finally:
        handle.remove()
    edited = len({(r.fact, r.query) for r in res.rows})
    assert edited == 6 and len(res.rows) == 6 * 2 * 2 and not res.skipped
    assert len(calls) == modification_calls(3, edited, len(res.rows)) == 1 * 3 + 6 + 2 * 24


def test_irrelevant_synapse_columns_are_mapped_on_the_mask_s_device():
    """S_ir built from an accelerator's patterns: map_columns builds its mask where the source mask is (the
    ``meta`` device stands in for a GPU here; a host-built output OR-ed with it raised, as ql.fig5-7 did on an
    H200 on 2026-12-04)."""
    from tlcap.locate.synapses import map_columns

    src = ("relation", "subject", "last")
    mask = torch.ones(2, 3, 3, dtype=torch.bool, device="meta")
    out = map_columns(mask, src, ("subject", "relation", "last"), skip_first=False)
    assert out.device.type == "meta" and tuple(out.shape) == (2, 3, 3)
