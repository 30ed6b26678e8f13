"""QL sizes in ``reproduce`` (issue 24): facts drawn with enough known queries for an out-of-sample consistency
test, IG on all of a fact's queries, SIG / AMIG on their first ones."""

from __future__ import annotations

import pytest

from tlcap.attribution.config import IGConfig
from tlcap.errors import InvalidConfigError
from tlcap.experiments.ql import FactKNs
from tlcap.reproduce.run import build_stages
from tlcap.reproduce.scales import ScaleConfig, get_scale
from tlcap.reproduce.stages import Runner


def test_cpu_scale_draws_facts_with_up_to_six_known_queries_and_keeps_sig_amig_at_three():
    stages = {s.name: s for s in build_stages(("ql",), get_scale("cpu"))}
    facts = stages["ql.facts"].config
    assert (facts.known_top_k, facts.known_policy, facts.max_queries, facts.min_queries) == (10, "any", 6, 3)
    assert [(stages[f"ql.localize.{m}"].config.n_facts, stages[f"ql.localize.{m}"].config.max_queries)
            for m in ("ig", "sig", "amig")] == [(None, None), (10, 3), (10, 3)]
    # Tables 2-3 and Figs. 4-7 (and their K_I / K_II split) use each fact's first 3 queries, one edit per fact
    assert {(stages[n].config.max_queries, stages[n].config.edit_queries)
            for n in ("ql.table2", "ql.table3", "ql.fig4", "ql.fig5-7")} == {(3, 1)}
    smoke = get_scale("smoke")
    assert smoke.ql_max_queries >= smoke.ql_min_queries == 3  # smoke facts are not all "excluded"
    with pytest.raises(InvalidConfigError, match="ql_max_queries"):
        ScaleConfig(ql_max_queries=2)  # every fact would have CS1 ≡ CS2
    with pytest.raises(InvalidConfigError, match="ql_known_policy"):
        ScaleConfig(ql_known_policy="most")
    with pytest.raises(InvalidConfigError, match="ql_analysis_queries"):
        ScaleConfig(ql_analysis_queries=2)


def test_ig_attributes_every_query_and_sig_its_first_ones(tiny_llama, tmp_path):
    scale = ScaleConfig(ql_relations=("P36", "P37"), ql_n_facts=2, ql_max_queries=4, ql_sig_facts=1, ql_amig_facts=1,
                        ql_sig_amig_queries=3, ql_analysis_queries=3, ql_ig=IGConfig(steps=1))
    runner = Runner(build_stages(("ql",), scale), tmp_path, tiny_llama)
    runner.run(runner.plan(["ql.localize.ig", "ql.localize.sig", "ql.fig4"]))

    def locs(m: str) -> list[FactKNs]:
        out = runner.outputs(f"ql.localize.{m}")
        return [out[k] for k in sorted(out)]  # type: ignore[misc]

    ig, sig = locs("ig"), locs("sig")
    assert [fk.k for fk in ig] == [4, 4] and [fk.fact.relation for fk in ig] == ["P36", "P37"]
    assert len(sig) == 1 and sig[0].k == 3 and sig[0].queries == ig[0].queries[:3]
    # the analyses see the first 3 queries: query 3 is held out, the neighbor sets are over queries 0-2
    mp = runner.outputs("ql.fig4")["mapping"].to_frame()
    assert set(mp["query"]) == {0, 1, 2} and set(mp.fact) == {0, 1}
    inter = mp[(mp.fact == 0) & (mp["query"] == 0) & (mp["set"] == "intersection")].n_neurons.iloc[0]
    assert inter == len(ig[0].take([0, 1, 2]).neighbor_sets(0)["intersection"])
