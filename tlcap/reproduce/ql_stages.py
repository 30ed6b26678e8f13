"""The QL paper's stages, wired to :mod:`tlcap.experiments.ql`.

====================  ==============================================  ===============================
stage                 computes (tlcap API)                            feeds
====================  ==============================================  ===============================
``ql.facts``          :func:`load_pararel` (known facts, balanced     every QL stage
                      over the relations)
``ql.localize.<m>``   :func:`localize_facts` per fact, for m in ig,   Table 1 (all three), Fig. 3,
                      sig, amig (checkpointed per fact; SIG / AMIG:   the rest (ig)
                      the first facts and queries of the scale)
``ql.table2``         :func:`modification_experiment` (erasure,      Table 2
                      update × N_i, N_g) on the IG localizations
``ql.table3``         the CAS rows (:func:`modification_experiment`  Table 3 (N_i and N_g rows
                      with ``sets=("cas",)``) + Table 2's rows         reused from ``ql.table2``)
``ql.fig4``           :func:`query_kn_mapping`                        Fig. 4
``ql.fig5-7``         :func:`synapse_experiment`                      Figs. 5, 6, 7
====================  ==============================================  ===============================

K_I / K_II for Tables 2–3 and Figs. 4–7 is the static split (CS2 > 0.1, QL Table 4) of the IG
localizations (:func:`groups_for`), as in the paper's §2.2, on each fact's first
``ql_analysis_queries`` queries (``cpu``: 3; the rest of its queries are held out for a split-half
consistency test); facts with fewer than 3 queries are ``"excluded"`` there and skipped by every analysis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go

from tlcap.attribution.config import IGConfig
from tlcap.attribution.methods import PROMPT_BATCH
from tlcap.attribution.sig import MASK_ROWS
from tlcap.config import Config, check_choice, check_int, check_nested
from tlcap.data.pararel import (
    KNOWN_BATCH,
    KNOWN_POLICIES,
    Fact,
    causal_patterns,
    iter_facts,
    known_test_calls,
    list_relations,
    load_pararel,
)
from tlcap.experiments.ql import (
    FactKNs,
    groups_for,
    localize_facts,
    modification_experiment,
    query_kn_mapping,
    synapse_experiment,
)
from tlcap.experiments.ql.synapses import PATTERN_ROWS, SYN_ROWS
from tlcap.metrics.set_probs import PROB_ROWS
from tlcap.reproduce.cost import ModelShape, Workload, forward, ig_rows_batched, n_tokens, prefill_tokens
from tlcap.reproduce.scales import ScaleConfig
from tlcap.reproduce.stages import Stage, StageContext, StageError
from tlcap.reproduce.suite_cost import ig_token_rows
from tlcap.results import Result
from tlcap.results import load_result as _load
from tlcap.rows import RowFields, frame

CODE = ("tlcap.experiments.ql", "tlcap.attribution", "tlcap.metrics.stats", "tlcap.intervene", "tlcap.data.pararel")
METHODS = ("ig", "sig", "amig")
PPL_TEXTS, PPL_TOKENS, N_LOCALITY = 5, 128, 5


@dataclass(frozen=True)
class FactRow:
    relation: str
    subject: str
    object: str
    n_queries: int


@dataclass(frozen=True)
class FactSet(RowFields, Result):
    """The ParaRel facts a QL reproduction runs on."""

    _row_types: ClassVar[dict[str, type]] = {"facts": Fact}

    facts: tuple[Fact, ...] = ()

    def to_facts(self) -> list[Fact]:
        """The facts as a list.

        Returns:
            The :class:`Fact` rows of :attr:`facts`, in order.
        """
        return list(self.facts)

    def summary(self) -> dict[str, Any]:
        rels = sorted({f.relation for f in self.facts}, key=lambda r: int(r[1:]) if r[1:].isdigit() else 0)
        return {"n_facts": len(self.facts), "n_queries": sum(len(f.queries) for f in self.facts), "relations": rels}

    def to_frame(self) -> pd.DataFrame:
        return frame([FactRow(f.relation, f.subject, f.object, len(f.queries)) for f in self.facts], FactRow)

    def figure(self) -> go.Figure:
        df = self.to_frame()
        counts = df.groupby("relation").size() if len(df) else pd.Series(dtype=int)
        fig = go.Figure(go.Bar(x=list(counts.index), y=list(counts.values)))
        fig.update_layout(title=f"QL facts per relation ({len(df)} facts)", xaxis_title="relation", yaxis_title="facts",
                          template="plotly_white", width=700, height=420)
        return fig


@dataclass(frozen=True)
class FactsConfig(Config):
    """``ql.facts``: which ParaRel facts."""

    relations: tuple[str, ...] = ()
    n_facts: int | None = 100
    max_queries: int | None = 4
    known_top_k: int | None = 10
    seed: int = 0
    data_dir: str | None = None
    known_policy: str = "all"
    min_queries: int = 2

    def validate(self) -> None:
        if self.n_facts is not None:
            check_int("n_facts", self.n_facts, min=1)
        check_choice("known_policy", self.known_policy, KNOWN_POLICIES)
        check_int("min_queries", self.min_queries, min=2)


@dataclass(frozen=True)
class LocalizeConfig(Config):
    """``ql.localize.<method>``: attribution of the first ``max_queries`` neighbor queries (``None``: all)
    of each of the first ``n_facts`` facts (``None``: all)."""

    method: str = "ig"
    ig: IGConfig = field(default_factory=IGConfig)
    threshold: float = 0.2
    n_facts: int | None = None
    max_queries: int | None = None

    def validate(self) -> None:
        check_choice("method", self.method, METHODS)
        check_nested(self, ig=IGConfig)
        if self.max_queries is not None:
            check_int("max_queries", self.max_queries, min=2)


@dataclass(frozen=True)
class EditConfig(Config):
    """``ql.table2`` / ``ql.table3`` / ``ql.fig4`` / ``ql.fig5-7``: the analysis settings; ``max_queries``: each
    fact's first queries the analysis (and its K_I / K_II split) uses (``None``: all that IG attributed)."""

    analysis: str = "table2"
    static_threshold: float = 0.1
    edit_queries: int | None = 1
    lambda1: float = 2.0
    lambda2: float = 2.0
    cas: tuple[float, float, float] = (0.7, 0.3, 0.3)
    factor: float = 2.0
    alpha: float = 0.3
    max_queries: int | None = None

    def validate(self) -> None:
        check_choice("analysis", self.analysis, ("table2", "table3", "fig4", "fig5-7"))
        if self.max_queries is not None:
            check_int("max_queries", self.max_queries, min=3)


# ------------------------------------------------------------------ facts
def _relations(cfg: FactsConfig) -> list[str]:
    return list(cfg.relations) or list_relations(cfg.data_dir)


def _facts_data(ctx: StageContext) -> dict[str, list[dict]]:
    cfg: FactsConfig = ctx.config
    return {r: [f.to_dict() for f in iter_facts(cfg.data_dir, r)] for r in _relations(cfg)}


def _facts(ctx: StageContext) -> dict[str, Result]:
    cfg: FactsConfig = ctx.config
    facts = load_pararel(cfg.data_dir, _relations(cfg), cfg.n_facts, ctx.model, known_top_k=cfg.known_top_k,
                         max_queries=cfg.max_queries, seed=cfg.seed, known_policy=cfg.known_policy,
                         min_queries=cfg.min_queries)
    return {"facts": FactSet(tuple(facts))}


def _candidate_facts(ctx: StageContext, n: int | None) -> list[Fact]:
    """The facts ``ql.facts`` gave (when cached), else the first candidates round-robin (an estimate)."""
    if ctx.runner.is_cached("ql.facts"):
        fs = ctx.runner.outputs("ql.facts")["facts"]
        if isinstance(fs, FactSet):
            return fs.to_facts()[:n]
    cfg: FactsConfig = ctx.runner.stage("ql.facts").config
    per = {r: list(iter_facts(cfg.data_dir, r, cfg.min_queries)) for r in _relations(cfg)}
    out: list[Fact] = []
    want = n if n is not None else (cfg.n_facts or sum(len(v) for v in per.values()))
    if ctx.runner.plan_only and cfg.n_facts is None and cfg.known_top_k:  # every candidate priced: an upper bound
        ctx.runner.note(ctx.stage.name, f"upper bound: all {want} candidate facts priced; the scan keeps those the model "
                                        f"knows (top-{cfg.known_top_k}), which only a run can count")
    i = 0
    while len(out) < want and any(i < len(v) for v in per.values()):
        out += [v[i] for v in per.values() if i < len(v)]
        i += 1
    out = out[:want]
    q = cfg.max_queries
    return [Fact(f.relation, f.subject, f.object, f.queries[:q] if q else f.queries, f.uuid) for f in out]


def _facts_work(ctx: StageContext) -> Workload:
    cfg: FactsConfig = ctx.config
    facts = _candidate_facts(ctx, cfg.n_facts)
    shape = ModelShape.of(ctx.model)
    if not cfg.known_top_k:  # no known-fact test: the scan only tokenizes
        return forward(shape, 0.0)
    if cfg.known_policy == "any":  # the scan asks every pattern of a fact, not the first few
        pats = {r: causal_patterns(cfg.data_dir, r) for r in {f.relation for f in facts}}
        asked = [[p.replace("[X]", f.subject) for p in pats[f.relation]] for f in facts]
    else:
        asked = [list(f.queries[:1] if cfg.known_policy == "first" else f.queries) for f in facts]
    texts = [q for qs in asked for q in qs]
    prefill_tokens(ctx.model, texts)
    toks = sum(n_tokens(ctx.model, q) for q in texts)
    # the queries of pararel.CHUNK facts at a time, in passes of KNOWN_BATCH
    calls = known_test_calls([len(qs) for qs in asked])
    # with a fact budget the scan tests about 3 facts per fact kept (top-10 hit rates of SmolLM2 on the cpu
    # relations); without one (full scale) it tests every candidate once
    k = 3 if cfg.n_facts is not None else 1
    return forward(shape, toks * k, 8, 32 * min(KNOWN_BATCH, max(len(texts), 1)), calls * k)


def facts_of(ctx: StageContext) -> list[Fact]:
    """The facts of the ``ql.facts`` stage a QL stage depends on.

    Args:
        ctx: The running stage's context (it must depend on ``ql.facts``).

    Returns:
        The :class:`Fact` rows of the stored :class:`FactSet`, in order.

    Raises:
        StageError: the stored output is not a :class:`FactSet` (a stale cache).
    """
    fs = ctx.dep("ql.facts")["facts"]
    if not isinstance(fs, FactSet):
        raise StageError(f"ql.facts holds a {type(fs).__name__}, not a FactSet; delete its cache folder")
    return fs.to_facts()


def _first_queries(facts: list[Fact], n: int | None) -> list[Fact]:
    """The facts with their first ``n`` queries (``None``: all)."""
    return [Fact(f.relation, f.subject, f.object, f.queries[:n] if n else f.queries, f.uuid) for f in facts]


# ------------------------------------------------------------------ localize
def _localize(ctx: StageContext) -> dict[str, Result]:
    cfg: LocalizeConfig = ctx.config
    facts = _first_queries(facts_of(ctx)[: cfg.n_facts], cfg.max_queries)
    out: dict[str, Result] = {}
    todo = []
    for i, _ in enumerate(facts):
        name = f"fact_{i:04d}"
        if (ctx.checkpoint / name / "result.json").exists():  # resume: facts finished before an interruption
            out[name] = _load(ctx.checkpoint / name)
        else:
            todo.append(i)
    for s in range(0, len(todo), LOCALIZE_WINDOW):  # the queries of a window of facts share batches
        window = todo[s:s + LOCALIZE_WINDOW]
        fks = localize_facts(ctx.model, [facts[i] for i in window], cfg.method, ig=cfg.ig,
                             kn_threshold=cfg.threshold, progress=False, fact_batch=LOCALIZE_WINDOW)
        for i, fk in zip(window, fks):
            fk.save(ctx.checkpoint / f"fact_{i:04d}")
            out[f"fact_{i:04d}"] = fk
    return out


LOCALIZE_WINDOW = 8
"""Facts localized together by ``ql.localize.*`` (their queries' rows share batches; saved fact by fact)."""


def sig_clean_runs(lens: Sequence[int], batch: int = PROMPT_BATCH) -> list[list[int]]:
    """The queries (indices into ``lens``) whose clean run each of SIG's calls makes, one list per call.

    :func:`~tlcap.attribution.sig.sig_facts` runs every (query, word) pair as one fact, ``batch`` pairs per call of
    :func:`~tlcap.attribution.ig.integrated_gradients_facts`, and a call runs each distinct query once
    (:func:`~tlcap.attribution.grouped.make_units`), so a call's clean runs are the queries its pairs belong to.

    Args:
        lens: The token count (= words) of each query, in order.
        batch: Pairs per call.

    Returns:
        Per call, the indices of the queries it runs.
    """
    owner = [q for q, n in enumerate(lens) for _ in range(int(n))]
    return [sorted(set(owner[s:s + batch])) for s in range(0, len(owner), batch)]


def localize_passes(method: str, windows: Sequence[Sequence[int]], rows: bool = False) -> int:
    """The no-grad forward passes of ``ql.localize.<method>`` (clean runs and baselines; the IG rows apart).

    Per query on a CPU: IG its clean run; SIG its masked baselines (one batch) and its clean run once in each call
    its (query, word) pairs fall in (:func:`sig_clean_runs`); AMIG (words ``"all"``) its clean run and its
    all-``<eos>`` baseline. On an accelerator (``rows=True``) a call's clean runs are one padded pass
    per :data:`~tlcap.attribution.methods.PROMPT_BATCH` items, SIG's masked rows of a window one pass per
    :data:`~tlcap.attribution.sig.MASK_ROWS` and AMIG's baselines one sentence per chunk (tested against counted
    runs, ``test_ql_localize_passes_are_the_counted_ones``).

    Args:
        method: ``"ig"``, ``"sig"`` or ``"amig"``.
        windows: Per window of :data:`LOCALIZE_WINDOW` facts, the token count of each of its queries.
        rows: The accelerator's path.

    Returns:
        The number of forward passes.
    """
    n = 0
    for w in windows:
        words = sum(int(x) for x in w)
        if not rows:
            n += len(w) if method == "ig" else 2 * len(w) if method == "amig" else \
                len(w) + sum(len(c) for c in sig_clean_runs(w))
        elif method == "sig":
            n += math.ceil(words / MASK_ROWS) + math.ceil(words / PROMPT_BATCH)
        else:
            n += math.ceil(len(w) / PROMPT_BATCH) * (1 if method == "ig" else 2)
    return n


def _localize_work(ctx: StageContext) -> Workload:
    cfg: LocalizeConfig = ctx.config
    m = ctx.model
    shape = ModelShape.of(m)
    rows, toks, items, reads, row_reads = 0.0, 0.0, 0, 0.0, 0.0
    facts = _first_queries(_candidate_facts(ctx, cfg.n_facts), cfg.max_queries)
    prefill_tokens(m, [q for f in facts for q in f.queries])
    per_token = ig_token_rows(m, cfg.ig, cfg.method)
    windows = []
    for s in range(0, len(facts), LOCALIZE_WINDOW):  # a window of facts: its queries' rows share passes
        window_items = 0.0
        lens = [n_tokens(m, q) for f in facts[s:s + LOCALIZE_WINDOW] for q in f.queries]
        if cfg.method == "sig":  # each call's distinct queries' clean runs (the (query, word) pairs share them)
            clean = [q for c in sig_clean_runs(lens) for q in c]
            toks += sum(lens[q] for q in clean)
            reads += len(clean)
        else:
            reads += len(lens)  # a query's clean run, read at its last position
        for n in lens:
            per = per_token  # the quadrature points and the baseline rows
            # SIG: one IG run per word; AMIG (eq. 18): one per word, each recomputing the positions from its word on
            # (read at the last one)
            rows += per * (n if cfg.method == "sig" else n * (n + 1) / 2 if cfg.method == "amig" else 1)
            row_reads += per * (n if cfg.method != "ig" else 1)
            # clean runs (SIG: above) and baselines (SIG: a masked row per word; AMIG: the <eos> sentence; both read
            # at the MLP, not unembedded)
            toks += n if cfg.method == "ig" else n * n if cfg.method == "sig" else 2 * n
            window_items += n if cfg.method == "sig" else 1  # a (query, word) pair (SIG) or a query
        items += math.ceil(window_items / PROMPT_BATCH)  # localize_prompts' calls of up to PROMPT_BATCH items
        windows.append(lens)
    calls = localize_passes(cfg.method, windows)
    w = ig_rows_batched(shape, rows, items, ctx=16, reads=row_reads) + forward(shape, toks, 8, 32, calls, reads=reads)
    return replace(w, accelerator_passes={"fwd_token": float(localize_passes(cfg.method, windows, rows=True) - calls)})


def locs_of(ctx: StageContext, method: str = "ig") -> list[FactKNs]:
    """The :class:`FactKNs` of ``ql.localize.<method>`` in fact order.

    Args:
        ctx: The running stage's context (it must depend on ``ql.localize.<method>``).
        method: ``"ig"``, ``"sig"`` or ``"amig"``.

    Returns:
        One :class:`FactKNs` per localized fact, ordered by their ``fact_NNNN`` names.
    """
    out = ctx.dep(f"ql.localize.{method}")
    locs = [out[k] for k in sorted(out)]
    if not all(isinstance(x, FactKNs) for x in locs):
        raise StageError(f"ql.localize.{method} holds other results than FactKNs; delete its cache folder")
    return locs  # type: ignore[return-value]


# ------------------------------------------------------------------ analyses
def _analysis(ctx: StageContext) -> dict[str, Result]:
    cfg: EditConfig = ctx.config
    locs = [fk.take(range(min(fk.k, cfg.max_queries))) if cfg.max_queries else fk for fk in locs_of(ctx)]
    groups, _ = groups_for(locs, static_threshold=cfg.static_threshold, split="static")
    m = ctx.model
    if cfg.analysis == "table2":
        res = modification_experiment(m, locs, groups, operations=("erasure", "update"), sets=("local", "global"),
                                      lambda1=cfg.lambda1, lambda2=cfg.lambda2, edit_queries=cfg.edit_queries,
                                      progress=ctx.progress)
        return {"modification": res}
    if cfg.analysis == "table3":
        beta1, beta2, cas_t = cfg.cas
        cas = modification_experiment(m, locs, groups, operations=("erasure", "update"), sets=("cas",), lambda1=cfg.lambda1,
                                      lambda2=cfg.lambda2, edit_queries=cfg.edit_queries, beta1=beta1, beta2=beta2,
                                      cas_threshold=cas_t, title="Consistency-Aware KN modification (QL Table 3)",
                                      progress=ctx.progress)
        t2 = ctx.dep("ql.table2")["modification"]
        merged = dataclasses.replace(cas, rows=tuple(t2.rows) + tuple(cas.rows))  # type: ignore[arg-type]
        return {"modification": merged, "cas": cas}
    if cfg.analysis == "fig4":
        return {"mapping": query_kn_mapping(m, locs, groups, factor=cfg.factor, progress=ctx.progress)}
    return {"synapses": synapse_experiment(m, locs, groups, alpha=cfg.alpha, factor=cfg.factor, progress=ctx.progress)}


def modification_calls(facts: int, edited: int, edits: int, rows: bool = False) -> int:
    """Forward calls of :func:`~tlcap.experiments.ql.modification_experiment` (each a batch of prompts or texts).

    Per fact: its queries and its locality prompts, unedited, with the activations the ``activation`` update rule
    reads (one pass); per edited query: the unedited perplexity of its ΔPPL texts; per edit: the queries with the
    locality prompts (one pass) and the ΔPPL texts under the edit (tested against a counted run). On an
    accelerator (``rows=True``) every edit is a row: the queries with the locality prompts of all a fact's edits
    share one pass (up to ``EDIT_ROWS`` rows), and each edited query's ΔPPL texts under its edits and the unedited
    model another: one pass per fact with an edited query and one per edited query, whatever the number of edits.

    Args:
        facts: Facts of the experiment.
        edited: Queries edited (over every fact).
        edits: Edits (edited queries × operations × neuron sets).
        rows: Whether the edits run as rows (an accelerator; a model without post-norm blocks).

    Returns:
        The number of forward calls.
    """
    return facts + min(facts, edited) + edited if rows else facts + edited + 2 * edits


def _analysis_work(ctx: StageContext) -> Workload:
    cfg: EditConfig = ctx.config
    m = ctx.model
    shape = ModelShape.of(m)
    facts = _first_queries(_candidate_facts(ctx, None), cfg.max_queries)
    prefill_tokens(m, [q for f in facts for q in f.queries])
    q_tok = sum(n_tokens(m, q) for f in facts for q in f.queries)
    n_q = sum(len(f.queries) for f in facts)
    if cfg.analysis in ("table2", "table3"):
        sets = 2 if cfg.analysis == "table2" else 1
        edited = sum(min(len(f.queries), cfg.edit_queries or len(f.queries)) for f in facts)
        edits = edited * 2 * sets
        per_q = q_tok / max(n_q, 1)
        # every edit scores all its fact's queries with the locality prompts (_edit_query_rows), and the ΔPPL texts
        edit_tok = sum(min(len(f.queries), cfg.edit_queries or len(f.queries)) * 2 * sets
                       * (sum(n_tokens(m, q) for q in f.queries) + N_LOCALITY * per_q + PPL_TEXTS * PPL_TOKENS)
                       for f in facts)
        calls = modification_calls(len(facts), edited, edits)
        rows = modification_calls(len(facts), edited, edits, rows=True)  # an accelerator's rows
        # ΔPPL: the unedited perplexity once per edited query (its edits share the texts), then once per edit
        w = forward(shape, edit_tok + edited * PPL_TEXTS * PPL_TOKENS + q_tok * 2, 48, PPL_TOKENS, calls)
        return replace(w, accelerator_passes={"fwd_token": float(rows - calls)}) if rows != calls else w
    if cfg.analysis == "fig4":  # per query its cached prefix, then one pass of its clean row and its eight set edits
        # (query_kn_mapping); on an accelerator a fact's queries are rows of shared passes (PROB_ROWS rows each)
        w = forward(shape, q_tok * (1 + 4 * 2), 8, 32 * (1 + 4 * 2), 2 * n_q)
        shared = sum(-(-len(f.queries) * (1 + 4 * 2) // PROB_ROWS) for f in facts)
        return replace(w, accelerator_passes={"fwd_token": float(shared - 2 * n_q)})
    # per query (synapse_experiment): its attention patterns (eq. 4 and its synapses; the irrelevant synapses are
    # another query's, read from those), then one pass of the unedited row and its four synapse edits; on an
    # accelerator the queries of several facts share passes: PATTERN_ROWS queries' patterns, SYN_ROWS edit rows
    w = forward(shape, q_tok * (1 + 5), 8, 32 * 5, n_q * 2)
    shared = math.ceil(n_q / PATTERN_ROWS) + math.ceil(5 * n_q / SYN_ROWS)
    return replace(w, accelerator_passes={"fwd_token": float(shared - 2 * n_q)})


# ------------------------------------------------------------------ the stage list
def ql_stages(scale: ScaleConfig, *, seed: int = 0, data_dir: str | None = None) -> list[Stage]:
    """Every QL stage at ``scale`` (see the module table).

    Args:
        scale: The scale's sizes (relations, facts, queries, IG settings).
        seed: Seed of the fact sampling.
        data_dir: Folder holding ParaRel (``None``: the default data folder).

    Returns:
        The stages in dependency order: ``ql.facts``, ``ql.localize.{ig,sig,amig}``, then the analyses.
    """
    fcfg = FactsConfig(relations=scale.ql_relations, n_facts=scale.ql_n_facts, max_queries=scale.ql_max_queries,
                       known_top_k=scale.ql_known_top_k, seed=seed, data_dir=data_dir,
                       known_policy=scale.ql_known_policy, min_queries=scale.ql_min_queries)
    stages = [Stage("ql.facts", _facts, fcfg, code=("tlcap.data.pararel",), data=_facts_data, workload=_facts_work,
                    items=("QL Table 1",), description="ParaRel facts with neighbor queries")]
    for m in METHODS:
        lcfg = LocalizeConfig(method=m, ig=scale.ql_ig,
                              n_facts={"sig": scale.ql_sig_facts, "amig": scale.ql_amig_facts}.get(m),
                              max_queries=None if m == "ig" else scale.ql_sig_amig_queries)
        stages.append(Stage(f"ql.localize.{m}", _localize, lcfg, deps=("ql.facts",), code=CODE, workload=_localize_work,
                            items=("QL Table 1", "QL Fig. 3"), description=f"{m.upper()} knowledge neurons of every query"))
    deps = ("ql.facts", "ql.localize.ig")
    for name, analysis, extra, items, desc in (
        ("ql.table2", "table2", (), ("QL Table 2",), "erasure / update of N_i and N_g"),
        ("ql.table3", "table3", ("ql.table2",), ("QL Table 3",), "Consistency-Aware KN modification"),
        ("ql.fig4", "fig4", (), ("QL Fig. 4",), "query-KN mapping"),
        ("ql.fig5-7", "fig5-7", (), ("QL Fig. 5", "QL Fig. 6", "QL Fig. 7"), "predominance and knowledge synapses"),
    ):
        ecfg = EditConfig(analysis=analysis, edit_queries=scale.ql_edit_queries, max_queries=scale.ql_analysis_queries)
        stages.append(Stage(name, _analysis, ecfg, deps=deps + extra, code=CODE, workload=_analysis_work, items=items,
                            description=desc))
    return stages


__all__ = ["sig_clean_runs", "FactSet", "FactsConfig", "LocalizeConfig", "EditConfig", "ql_stages", "locs_of", "facts_of",
           "METHODS"]
