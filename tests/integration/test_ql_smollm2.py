"""Query Localization end to end on the real SmolLM2-135M (a few facts, few steps)."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ql_setup(smollm2):
    from tlcap.data.pararel import load_pararel
    from tlcap.experiments import ql

    # 3 queries per fact: with fewer, CS1 ≡ CS2 and the fact is reported apart (issue 10 item 7); top-1 so that
    # the modification experiment (which edits only queries the model answers) has a query to edit
    facts = load_pararel(None, ["P36", "P103"], n_facts=2, model=smollm2, known_top_k=1, max_queries=3)
    locs = ql.localize_facts(smollm2, facts, "ig", steps=4, progress=False)
    return facts, locs


def test_consistency_smollm2(ql_setup):
    from tlcap.experiments import ql

    facts, locs = ql_setup
    assert len(facts) == 2
    for fk in locs:
        assert all(0 < p <= 1 for p in fk.probs)
        assert all(len(s) > 0 for s in fk.sets())
    s = ql.consistency_analysis({"ig": locs}).summary()
    assert s["n_facts"] == 2
    for f in s["facts"]:
        assert f["cs1"] == pytest.approx(f["intersection"] / f["union"] if f["union"] else 0.0)  # CS1 = |∩| / |∪|
        if f["n_queries"] >= 3:  # K_I iff CS2 > the static threshold (QL Table 4: 0.1)
            assert f["group"] == ("K_I" if f["cs2"] > 0.1 else "K_II") and f["cs2"] >= f["cs1"]
        assert f["group"] in (("K_I", "K_II") if f["n_queries"] >= 3 else ("excluded",))  # P103: 2 queries
    assert s["k1_ratio"] + s["k2_ratio"] == pytest.approx(1.0)


def test_erasure_lowers_own_probability(smollm2, ql_setup):
    from tlcap.experiments import ql

    _, locs = ql_setup
    groups, _ = ql.groups_for(locs)
    texts = ql.wikitext_sample(2)
    res = ql.modification_experiment(smollm2, locs[:1], groups[:1], operations=("erasure",), sets=("local",),
                                     edit_queries=1, ppl_texts=texts, ppl_max_tokens=48, progress=False)
    df = res.to_frame()
    assert len(df) == 1
    row = df.iloc[0]
    assert row.p_after < row.p_before  # erasing N_i lowers the query's own probability
    assert 0 <= row.rel <= 1 and 0 <= row.gen <= 1 and math.isfinite(row.dppl) and row.ppl_before > 1


def test_synapse_experiment_smollm2(smollm2, ql_setup):
    from tlcap.experiments import ql

    _, locs = ql_setup
    groups, _ = ql.groups_for(locs)
    res = ql.synapse_experiment(smollm2, locs[:1], groups[:1], progress=False)  # S_ir from a fixed unrelated prompt
    df = res.to_frame()
    assert len(df) == locs[0].k * 4
    assert df[["dprob", "p_before", "p_after"]].notna().all().all()
    assert ((df.p_after >= 0) & (df.p_after <= 1)).all()
    assert torch.isfinite(torch.tensor(df.dvalue.to_numpy(dtype=float))).all()
    assert all(0 < r.predominance <= 1 for r in res.predominance)
    # suppressing the query's own synapses changes its answer probability
    own = df[(df.synapses == "self") & (df.op == "sup") & (df.n_synapses > 0)]
    assert len(own) and (own.p_after != own.p_before).any()
