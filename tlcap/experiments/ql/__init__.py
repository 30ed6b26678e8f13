"""Query Localization (Chen et al.): every analysis of the paper, composed from the shared runtime.

Pipeline (each step a function returning a result value; ``tlcap ql ...`` composes them)::

    facts = load_pararel(...)                                  # facts with neighbor queries
    locs = localize_facts(model, facts, "ig", steps=10)        # per-query scores and KN sets N_i
    cons = consistency_analysis({"ig": locs})                  # CS1/CS2, K_I/K_II, Welch   (Table 1, Fig. 3)
    groups = cons.groups()                                     # "K_I", "K_II", or "excluded" (< 3 queries)
    mod = modification_experiment(model, locs, groups)         # erasure / update, N_i vs N_g (Table 2)
    qkm = query_kn_mapping(model, locs, groups)                # enhance/suppress N_i vs neighbors (Fig. 4)
    syn = synapse_experiment(model, locs, groups)              # predominance, synapses (Figs. 5, 6, 7, 10)
    cas = cas_experiment(model, locs, groups)                  # Consistency-Aware KNs (Table 3)

Modules: :mod:`~tlcap.experiments.ql.config` (the configs), :mod:`~tlcap.experiments.ql.facts`
(per-fact localization), :mod:`~tlcap.experiments.ql.consistency`,
:mod:`~tlcap.experiments.ql.modification` (+ CAS), :mod:`~tlcap.experiments.ql.mapping`,
:mod:`~tlcap.experiments.ql.synapses`. The reusable pieces live in their layers:
knowledge synapses in :mod:`tlcap.locate.synapses`, their scaling in
:mod:`tlcap.intervene.synapses`, the Update edit in :mod:`tlcap.intervene.update`, perplexity in
:mod:`tlcap.metrics.perplexity`; they are re-exported here under their old names. Design notes:
``docs/ql.md``.
"""

from tlcap.experiments.ql.config import (
    EXCLUDED,
    KN_THRESHOLD,
    STATIC_THRESHOLD,
    MappingConfig,
    ModificationConfig,
    QLConfig,
    SynapseConfig,
)
from tlcap.experiments.ql.consistency import ConsistencyResult, ConsistencyRow, consistency_analysis, groups_for
from tlcap.experiments.ql.facts import FactKNs, QueryRow, localize_facts
from tlcap.experiments.ql.mapping import MappingResult, MappingRow, query_kn_mapping
from tlcap.experiments.ql.modification import cas_experiment, modification_experiment, wikitext_sample
from tlcap.experiments.ql.modification_result import EditRow, ModificationResult
from tlcap.experiments.ql.synapses import PredominanceRow, SynapseEditRow, SynapseResult, synapse_experiment

__all__ = [
    "EXCLUDED", "KN_THRESHOLD", "STATIC_THRESHOLD",
    "QLConfig", "ModificationConfig", "MappingConfig", "SynapseConfig",
    "FactKNs", "QueryRow", "localize_facts",
    "ConsistencyResult", "ConsistencyRow", "consistency_analysis", "groups_for",
    "EditRow", "ModificationResult", "modification_experiment", "cas_experiment", "wikitext_sample",
    "MappingResult", "MappingRow", "query_kn_mapping",
    "PredominanceRow", "SynapseEditRow", "SynapseResult", "synapse_experiment",
]
