"""The QL analyses' edits of one query run as rows of one pass (issue 25): the query-KN mapping (Fig. 4: the clean run
and eight neuron-set edits) and the knowledge-synapse edits (Figs. 5-7: the unedited run and four attention edits)
equal each edit run alone with the single-run interventions (``enhance`` / ``suppress`` / ``scale_synapses``)."""

from __future__ import annotations

import pytest
import torch

from tlcap.data.pararel import Fact
from tlcap.errors import ShapeMismatchError
from tlcap.experiments.ql import FactKNs, query_kn_mapping, synapse_experiment
from tlcap.experiments.ql.config import SynapseConfig
from tlcap.experiments.ql.synapses import _irrelevant
from tlcap.intervene.activations import enhance, suppress
from tlcap.intervene.synapses import scale_synapses, scale_synapses_rows
from tlcap.locate.synapses import locate_synapses, token_roles
from tlcap.metrics.perplexity import next_token_logits
from tlcap.models import make_gpt2, make_llama, make_tiny

pytestmark = pytest.mark.usefixtures("one_thread")

CAPITAL = ("The capital of {} is", "{}'s capital is", "The capital city of {} is")


def _model(name):
    return make_gpt2("tiny", seed=0) if name == "gpt2" else make_llama(seed=0) if name == "llama" else make_tiny(name, seed=0)


def _locs(m):
    """Two facts of two relations, three queries each, with overlapping planted neuron sets over every layer."""
    g = torch.Generator().manual_seed(0)
    out = []
    for rel, subj, obj, queries in (
            ("P36", "France", "Paris", [q.format("France") for q in CAPITAL]),
            ("P30", "Kenya", "Africa", ["Kenya is located in", "Kenya is in the continent of",
                                        "Kenya belongs to the continent of"])):
        scores = torch.zeros(3, m.n_layers, m.d_mlp)
        shared = torch.randint(0, m.d_mlp, (m.n_layers, 6), generator=g)
        for q in range(3):
            own = torch.randint(0, m.d_mlp, (m.n_layers, 6), generator=g)
            for layer in range(m.n_layers):
                scores[q, layer, shared[layer, : 3 + q]] = 1.0
                scores[q, layer, own[layer]] = 1.0
        out.append(FactKNs(scores, (0.5,) * 3, Fact(rel, subj, obj, tuple(queries))))
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("accelerator", [False, True])
def test_mapping_rows_of_one_pass_equal_each_edit_run_alone(name, accelerator):
    """Fig. 4: every enhance/suppress row equals its edit run alone (hooks on one query), on a CPU (per query one
    pass after its cached prefix: 2 passes) and on an accelerator (a fact's queries as right-padded rows of one
    pass, each scaled at its own last token; the policy forced here)."""
    m = _model(name)
    locs = _locs(m)
    res, n = _counted(m, accelerator, lambda: query_kn_mapping(m, locs, ["K_I", "K_II"], factor=3.0, progress=False))
    assert n == (len(locs) if accelerator else 2 * sum(fk.k for fk in locs))
    assert len(res.rows) == 2 * 3 * 4 * 2
    changed = 0
    for r in res.rows:
        fk = locs[r.fact]
        q = fk.queries[r.query]
        tid = m.target_ids(q, fk.target)[0]
        ns = {"self": fk.sets()[r.query], **fk.neighbor_sets(r.query)}[r.set]
        p_b = float(next_token_logits(m, [q])[0].softmax(-1)[tid])
        hooks = enhance(m, ns, 3.0) if r.op == "enh" else suppress(m, ns)
        p_a = float(next_token_logits(m, [q], hooks)[0].softmax(-1)[tid]) if len(ns) else p_b
        assert r.p_before == pytest.approx(p_b, rel=1e-5, abs=1e-9)
        assert r.p_after == pytest.approx(p_a, rel=1e-5, abs=1e-9), (r.query, r.set, r.op)
        changed += abs(p_a - p_b) > 1e-4 * p_b
    assert changed >= len(res.rows) // 2  # the edits are not no-ops


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_synapse_rows_of_one_pass_equal_each_edit_run_alone(name):
    m = _model(name)
    locs = _locs(m)
    cfg = SynapseConfig(alpha=0.05, heatmap_max_cols=4)
    res = synapse_experiment(m, locs, ["K_I", "K_II"], config=cfg, progress=False)
    assert len(res.rows) == 2 * 3 * 2 * 2
    names = [m.hook_name("mlp_post", layer) for layer in range(m.n_layers)]
    heat = iter(res.heatmap_values)
    changed = 0
    for r in res.rows:
        fk = locs[r.fact]
        q = fk.queries[r.query]
        tid = m.target_ids(q, fk.target)[0]
        toks = m.to_tokens(q)
        if r.synapses == "self":
            mask = locate_synapses(m, q, cfg.alpha, cfg.skip_first).mask_for(toks.shape[1])
        else:
            mask = _irrelevant(m, locs, r.fact, r.query, cfg, token_roles(m, q, fk.fact.subject))[1]
        kn = fk.sets()[r.query].mask()
        f = cfg.factor if r.op == "enh" else 0.0
        acts, logits = m.last_position_activations(toks, names, hooks=scale_synapses(mask, f))
        acts0, logits0 = m.last_position_activations(toks, names)
        assert r.n_synapses == int(mask.sum()) > 0
        assert r.p_after == pytest.approx(float(logits[0].float().softmax(-1)[tid]), rel=1e-5, abs=1e-9)
        assert r.p_before == pytest.approx(float(logits0[0].float().softmax(-1)[tid]), rel=1e-5, abs=1e-9)
        assert r.value_after == pytest.approx(float(acts[0][kn].abs().mean()), rel=1e-5, abs=1e-9)
        assert r.value_before == pytest.approx(float(acts0[0][kn].abs().mean()), rel=1e-5, abs=1e-9)
        changed += abs(r.p_after - r.p_before) > 1e-3 * r.p_before
    assert changed >= len(res.rows) // 2  # the edits are not no-ops
    # the heatmap (fact 0): per query the unedited row, then the self edits (enhanced, suppressed)
    cols = res.heatmap_cols
    idx = [(int(c[1:].split(".")[0]), int(c.split(".")[1])) for c in cols]
    for q in locs[0].queries:
        toks = m.to_tokens(q)
        mask = locate_synapses(m, q, cfg.alpha, cfg.skip_first).mask_for(toks.shape[1])
        for hooks in ((), scale_synapses(mask, cfg.factor), scale_synapses(mask, 0.0)):
            acts = m.last_position_activations(toks, names, hooks=hooks)[0][0]
            torch.testing.assert_close(next(heat), acts[[a for a, _ in idx], [b for _, b in idx]], rtol=1e-5, atol=1e-6)


def test_synapse_heatmap_draws_the_first_fact_with_rows():
    """``heatmap_fact=None`` (default) draws the first fact in K_I / K_II: with fact 0 excluded (no rows) it is fact 1,
    the same heatmap as asking for fact 1; asking for the excluded fact draws none (it once drew none by default)."""
    m = _model("llama")
    locs = _locs(m)
    cfg = SynapseConfig(alpha=0.05, heatmap_max_cols=4)
    auto = synapse_experiment(m, locs, ["excluded", "K_II"], config=cfg, progress=False)
    one = synapse_experiment(m, locs, ["excluded", "K_II"], config=cfg.replace(heatmap_fact=1), progress=False)
    zero = synapse_experiment(m, locs, ["excluded", "K_II"], config=cfg.replace(heatmap_fact=0), progress=False)
    assert auto.heatmap_values is not None and len(auto.heatmap_rows) == 3 * len(locs[1].queries)
    assert auto.heatmap_cols == one.heatmap_cols and auto.heatmap_rows == one.heatmap_rows
    torch.testing.assert_close(auto.heatmap_values, one.heatmap_values)
    assert auto.provenance.config["heatmap_fact_drawn"] == 1 and zero.heatmap_values is None
    assert {r.fact for r in auto.rows} == {1}


def test_scale_synapses_rows_checks_its_rows(tiny_gpt2):
    m = tiny_gpt2
    ks = locate_synapses(m, "The capital of France is", alpha=0.1)
    assert scale_synapses_rows([None, None], [1.0, 2.0]) == []  # no row edits anything: no hook
    with pytest.raises(ShapeMismatchError, match="2 factors for 3 synapse masks"):
        scale_synapses_rows([None, ks.mask, ks.mask], [1.0, 2.0])
    with pytest.raises(ShapeMismatchError, match="share a shape"):
        scale_synapses_rows([ks.mask, ks.mask[..., :3]], [1.0, 2.0])
    hooks = scale_synapses_rows([None, ks.mask], [1.0, 0.0])
    with pytest.raises(ShapeMismatchError, match="one row per batch row"):
        m.last_logits(m.to_tokens(ks.prompt).expand(3, -1), hooks=hooks)


def test_known_fact_test_reads_ranks_in_passes_of_known_batch(tiny_gpt2):
    """The known-fact test runs its queries in passes of KNOWN_BATCH rows and keeps a query when fewer than
    ``top_k`` tokens rank above the target's first token — each query's hit equals its rank computed alone;
    ``known_test_calls`` (``ql.facts``' plan) counts the scan's passes, CHUNK facts at a time."""
    from tlcap.data.pararel import KNOWN_BATCH, _known_hits, known_test_calls

    m = tiny_gpt2
    facts = [(Fact("P36", s, o, ()), [q.format(s) for q in CAPITAL][: 1 + k % 3])
             for k, (s, o) in enumerate([("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid")] * 50)]
    asked = [len(qs) for _, qs in facts]
    calls = []
    handle = m.backend.register_forward_pre_hook(lambda mod, args: calls.append(1))
    try:
        hits = _known_hits(m, facts, 25000, "all")
    finally:
        handle.remove()
    assert len(calls) == -(-sum(asked) // KNOWN_BATCH) == 3  # 300 queries in one call: passes of 128
    assert known_test_calls(asked) == 5  # the scan's chunks of 32 facts ask 63, 64, 65, 63 and 45 queries
    assert known_test_calls([100] * 3) == 3 and known_test_calls([5] * 32 + [200]) == 2 + 2
    for (f, qs), h in zip(facts, hits):
        for q, got in zip(qs, h):
            row = m.last_logits(m.to_tokens(q))[0].float()
            tid = m.target_ids(q, f.target)[0]
            assert got == (int((row > row[tid]).sum()) < 25000)
    assert 0 < sum(map(sum, hits)) < sum(asked)  # some queries in the top 25,000, some not


def _table_alone_and_rows(m, sets, rule):
    """The modification experiment run one weight edit at a time and with the accelerator's rows (forced on the CPU),
    and the forward passes each made."""
    from tlcap.experiments.ql import modification_experiment

    texts = [f"Text number {i} is about the weather in a city on day {i}." for i in range(20)] + ["x"]
    kw = dict(operations=("erasure", "update"), sets=sets, ppl_texts=texts, n_ppl_texts=3, update_rule=rule,
              only_known=False, edit_queries=2, new_objects={"P36": ["Rome"], "P30": ["Europe"]}, progress=False)
    return {key: _counted(m, policy, lambda: modification_experiment(m, _locs(m), ["K_I", "K_II"], **kw))
            for key, policy in (("alone", False), ("rows", True))}


def _counted(m, policy, run):
    """``(run(), forward passes it made)`` with the accelerator's batching policy forced to ``policy``."""
    from unittest import mock

    from tlcap.runtime import device

    n = []
    handle = m.backend.register_forward_pre_hook(lambda mod, args: n.append(1))
    try:
        with mock.patch.object(device, "one_pass_default", lambda model: policy):
            return run(), len(n)
    finally:
        handle.remove()


def _same_tables(alone, rows):
    assert len(alone.rows) == len(rows.rows) and not alone.skipped and not rows.skipped
    for a, b in zip(alone.rows, rows.rows):
        assert (a.operation, a.set, a.query, a.rel, a.gen, a.loc) == (b.operation, b.set, b.query, b.rel, b.gen, b.loc)
        for f in ("p_after", "p_new_after", "ppl_after", "ppl_before", "gap_new_after"):
            assert getattr(b, f) == pytest.approx(getattr(a, f), rel=1e-5, abs=1e-9), (f, a.operation, a.set)
        assert b.dppl == pytest.approx(a.dppl, abs=2e-5)  # a difference of two perplexities equal to 1e-5
    for op in ("erasure", "update"):  # the edits change the scores, so equal values are not the unedited ones
        assert any(a.ppl_after != a.ppl_before for a in alone.rows if a.operation == op)
        assert any(abs(a.p_after / a.p_before - 1) > 1e-3 for a in alone.rows if a.operation == op)


@pytest.mark.parametrize("name,rule", [("gpt2", "activation"), ("llama", "activation"), ("llama", "paper")])
def test_table2_edits_as_rows_of_two_passes_equal_each_weight_edit(name, rule):
    """On an accelerator Table 2 measures every edit (erasure and Update of N_i and N_g) as rows: the queries with the
    locality prompts of all a fact's edits in one pass (``_edit_query_rows``), then per edited query its ΔPPL texts
    with the unedited model as one more row (``_edit_ppl_rows``), instead of a weight edit and two passes per edit:
    every row of the table is the same (Rel / Gen / Loc exactly, probabilities, logit gaps and perplexities to float
    rounding)."""
    from tlcap.reproduce.ql_stages import modification_calls

    m = _model(name)
    runs = _table_alone_and_rows(m, ("local", "global"), rule)
    (alone, n_alone), (rows, n_rows) = runs["alone"], runs["rows"]
    _same_tables(alone, rows)
    assert len(rows.rows) == 2 * 2 * 2 * 2
    edited, edits = 4, len(rows.rows)  # per edited query: 1 + 2·4 passes -> 1, plus 1 per fact
    assert n_alone == modification_calls(2, edited, edits) == 2 + 4 + 32
    assert n_rows == modification_calls(2, edited, edits, rows=True) == 2 + 2 + 4


def test_a_facts_edit_rows_split_over_passes_keep_every_value(monkeypatch):
    """A fact whose edits hold more rows than ``EDIT_ROWS`` runs them over several passes: the same table."""
    from tlcap.experiments.ql import modification as M

    monkeypatch.setattr(M, "EDIT_ROWS", 20)
    runs = _table_alone_and_rows(_model("llama"), ("local", "global"), "activation")
    _same_tables(runs["alone"][0], runs["rows"][0])
    assert runs["rows"][1] > 2 + 2 + 4  # more than one pass of query rows per fact


def test_table3_cas_edits_as_rows_and_a_post_norm_model_keeps_weight_edits_for_updates():
    """Table 3 edits one set per query (CAS): its erasure and Update are rows too. Gemma-2's MLP output is normalised
    after the down projection, so there an Update cannot be a row: the updates stay weight edits, the erasures rows,
    and the table is still the same."""
    from tlcap.errors import InvalidConfigError
    from tlcap.intervene.set_rows import SetFactors
    from tlcap.intervene.update import update_write

    runs = _table_alone_and_rows(_model("llama"), ("cas",), "activation")
    _same_tables(runs["alone"][0], runs["rows"][0])
    assert (runs["alone"][1], runs["rows"][1]) == (2 + 4 * (1 + 2 * 2), 2 + 2 + 4)
    g = make_tiny("gemma2", seed=0)
    runs = _table_alone_and_rows(g, ("local",), "activation")
    _same_tables(runs["alone"][0], runs["rows"][0])
    # clean passes, a fact's erasures' query rows, per query its ΔPPL rows (the unedited model one), each update its
    # weight edit and two passes
    assert (runs["alone"][1], runs["rows"][1]) == (2 + 4 + 4 * 2 * 2, 2 + 2 + 4 + 4 * 2)
    kns = _locs(g)[0].global_set()
    with pytest.raises(InvalidConfigError, match="post-norm"):
        SetFactors.of(g, [kns], 1.0, writes=[update_write(g, kns, 1, 2)])


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "neox", "gptj"])
def test_update_rows_equal_the_weight_edit_on_every_family(name):
    """A row of ``SetFactors(writes=)`` adds ``(Σ_p a_p c_p)·δ`` to its ``mlp_out``: the model ``update_neurons``
    makes by editing the down projection's columns (parallel attention+MLP blocks included), at every position, with
    the literal and the activation rule, beside an erasure row and an unedited row of the same pass."""
    from tlcap.intervene.set_rows import SetFactors
    from tlcap.intervene.update import update_neurons, update_write
    from tlcap.intervene.weights import erase_neurons
    from tlcap.metrics.sets import NeuronSet

    m = _model(name)
    ns = _locs(m)[0].global_set()
    toks = m.to_tokens("The capital of France is a city")
    acts = torch.randn(m.n_layers, m.d_mlp, generator=torch.Generator().manual_seed(1))
    rules = [dict(rule="paper"), dict(rule="activation", activations=acts, size=2.0)]
    plan = SetFactors.of(m, [NeuronSet((), ns.shape), ns, ns, ns], [1.0, 0.0, 1.0, 1.0],
                         writes=[None, None, *(update_write(m, ns, 11, 22, **kw) for kw in rules)])
    rows = m.logits(toks.expand(4, -1), hooks=plan.hooks(m, torch.arange(4))).float()
    clean = m.logits(toks)[0].float()
    assert torch.allclose(rows[0], clean, atol=1e-5)
    with erase_neurons(m, ns):
        assert torch.allclose(rows[1], m.logits(toks)[0].float(), atol=1e-5)
    for r, kw in zip((2, 3), rules):
        with update_neurons(m, ns, 11, 22, **kw):
            edited = m.logits(toks)[0].float()
        assert torch.allclose(rows[r], edited, atol=1e-4, rtol=1e-5), (name, kw["rule"])
        assert (rows[r] - clean).abs().max() > 100 * (rows[r] - edited).abs().max()  # the edit moved the logits


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_synapse_patterns_of_a_fact_in_one_pass_and_irrelevant_synapses_read_not_rerun(name):
    """Figs. 5-7: every query's attention patterns are read once (the queries of every fact in one padded pass on an
    accelerator) and S_ir, another query's synapses, comes from those; on an accelerator the edit rows of every
    query share one pass too: the same table as the CPU path (synapse counts and predominance exactly,
    probabilities and KN values to float rounding), in 2 passes on an accelerator (``PATTERN_ROWS`` queries and
    ``SYN_ROWS`` rows fit one each) and ``2·n_q`` on a CPU (was ``3·n_q``); with one query's rows a pass and one
    query's patterns a pass, the accelerator's path makes ``2·n_q`` passes and the same table."""
    m = _model(name)
    locs = _locs(m)
    cfg = SynapseConfig(alpha=0.05, heatmap_max_cols=4)
    (cpu, n_cpu), (acc, n_acc) = (_counted(m, policy, lambda: synapse_experiment(m, locs, ["K_I", "K_II"], config=cfg,
                                                                                 progress=False))
                                  for policy in (False, True))
    n_q = sum(fk.k for fk in locs)
    assert (n_cpu, n_acc) == (2 * n_q, 2)
    assert [r.tokens for r in cpu.predominance] == [r.tokens for r in acc.predominance]
    assert len(cpu.rows) == len(acc.rows) == 2 * 3 * 2 * 2
    for a, b in zip(cpu.rows, acc.rows):
        assert (a.query, a.synapses, a.op, a.source, a.n_synapses) == (b.query, b.synapses, b.op, b.source, b.n_synapses)
        for f in ("p_before", "p_after", "value_before", "value_after"):
            assert getattr(b, f) == pytest.approx(getattr(a, f), rel=1e-5, abs=1e-9), (f, a.query, a.synapses)
    torch.testing.assert_close(acc.heatmap_values, cpu.heatmap_values, rtol=1e-5, atol=1e-6)
    from unittest import mock

    import tlcap.experiments.ql.synapses as S

    with mock.patch.object(S, "PATTERN_ROWS", 1), mock.patch.object(S, "SYN_ROWS", 5):
        small, n_small = _counted(m, True, lambda: synapse_experiment(m, locs, ["K_I", "K_II"], config=cfg,
                                                                      progress=False))
    assert n_small == 2 * n_q
    for a, b in zip(acc.rows, small.rows):
        assert (a.query, a.synapses, a.op, a.source) == (b.query, b.synapses, b.op, b.source)
        assert b.p_after == pytest.approx(a.p_after, rel=1e-5, abs=1e-9)
        assert b.value_after == pytest.approx(a.value_after, rel=1e-5, abs=1e-9)


def test_set_rows_pick_a_batch_layers_without_reading_device_values():
    """``SetFactors.hooks`` chooses which layers a batch's rows change from host masks (``touched``): with every
    factor and write moved to the ``meta`` device (whose values cannot be read) it returns the same hook sites as the
    plan itself, for batches that touch some layers, none, or all."""
    import dataclasses

    from tlcap.intervene.set_rows import SetFactors
    from tlcap.intervene.update import update_write
    from tlcap.metrics.sets import NeuronSet

    m = _model("llama")
    shape = (m.n_layers, m.d_mlp)
    only0, only1 = NeuronSet(((0, 3),), shape), NeuronSet(((1, 5), (1, 7)), shape)
    plan = SetFactors.of(m, [NeuronSet((), shape), only0, only1, only1], [1.0, 0.0, 2.0, 1.0],
                         writes=[None, None, None, update_write(m, only1, 1, 2)])
    meta = dataclasses.replace(plan, factors={l: f.to("meta") for l, f in plan.factors.items()},
                               writes={l: (c.to("meta"), d.to("meta")) for l, (c, d) in plan.writes.items()})
    for rows, sites in (([0, 0], []), ([1], ["blocks.0.mlp.hook_post"]), ([2, 0], ["blocks.1.mlp.hook_post"]),
                        ([3], ["blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out"]),
                        ([0, 1, 2, 3], ["blocks.0.mlp.hook_post", "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out"])):
        idx = torch.tensor(rows)
        assert [n for n, _ in plan.hooks(m, idx)] == [n for n, _ in meta.hooks(m, idx)] == sites, rows
    with pytest.raises(RuntimeError):  # without the host masks the choice reads the (meta) values
        dataclasses.replace(meta, touched={}).hooks(m, torch.tensor([1]))


def test_per_row_start_positions_are_checked(tiny_gpt2):
    """``starts=`` scales factors only: sets that carry writes refuse it, and ``scale_rows`` takes ``pos`` or
    ``starts``, not both; with ``starts`` a row is scaled from its start on and unchanged before."""
    from tlcap.errors import InvalidConfigError
    from tlcap.intervene.set_rows import SetFactors
    from tlcap.metrics.sets import NeuronSet
    from tlcap.runtime import hooks as H

    m = tiny_gpt2
    ns = NeuronSet(((0, 1),), (m.n_layers, m.d_mlp))
    plan = SetFactors.of(m, [ns], 1.0, writes=[({(0, 1): 0.5}, torch.ones(m.d_model))])
    with pytest.raises(InvalidConfigError, match="starts"):
        plan.hooks(m, torch.tensor([0]), starts=torch.tensor([1]))
    with pytest.raises(ShapeMismatchError, match="pos= or starts="):
        H.scale_rows(torch.ones(1, 4), pos=[0], starts=torch.tensor([0]))
    act = torch.ones(2, 4, 3)
    out = H.scale_rows(torch.full((2, 3), 2.0), starts=torch.tensor([1, 3]))(act)
    assert out[:, :, 0].tolist() == [[1.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 2.0]]
