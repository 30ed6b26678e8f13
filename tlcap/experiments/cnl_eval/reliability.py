"""Reliability (CNL paper §3.2): do the methods' own validations single out the located parameters?

Over a fact dataset (the first rewrite of each fact is its prompt):

- **KN** — locate, then double (×``enhance_factor``) and zero (×``suppress_factor``) the located
  activations at the last position, and do the same with ``n_random`` random sets matched to the
  located set (same count per layer, :meth:`NeuronSet.random_like`). A sample "rises" / "falls"
  when P(target) goes up / down. Paper: doubling 85.1 / 14.9 % vs random 72.3 / 27.7 %; zeroing
  27.4 / 72.4 % vs 17.6 / 82.6 %.
- **ROME** — edit the fact (subject → another object of its relation) at every layer separately
  (:func:`tlcap.intervene.rome.rome_sweep`): efficacy, paraphrase (the fact's other rewrites) and
  specificity (other facts' prompts) per layer, with the causal-traced layer marked. The paper's
  Fig. 2: non-located layers edit about as well as the located one.
- **KC** — the circuit alone (every other edge zero-ablated): recall = the target ranks first;
  the circuit's share of block parameters; the same for ``n_random_circuits`` random circuits of
  as many edges. Paper: recall 12.3 %, circuits of 1.6–2.6 % of the parameters.

Example:
    >>> from tlcap.data.rewrites import rewrite_facts
    >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
    >>> res = reliability(model, facts, parts=("kn", "kc"), kn__steps=2, n_random=2, n_random_circuits=2,
    ...                   top_n=20, kc__steps=2, run=RunControl(progress=False))
    >>> res.summary()["kn"]["double"]["located_rise"]["text"]
    '1.000 [0.34, 1.00] (n=2)'
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from tlcap.config import (
    Config,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_layers_below,
    check_nested,
    check_sequence,
)
from tlcap.data.rewrites import RewriteFact
from tlcap.errors import EmptyDatasetError, InvalidConfigError
from tlcap.experiments.cnl_eval.common import (
    ItemCheckpoint,
    OnItem,
    ParamCounts,
    Stopwatch,
    cnl_circuit,
    cnl_trace,
    fingerprint,
    kn_neurons_facts,
    knowledge_circuits,
    param_counts,
    traced_layers_facts,
)
from tlcap.experiments.cnl_eval.reliability_result import KCRow, KNRow, ReliabilityResult, RomeRow
from tlcap.experiments.knowledge_neurons import KNConfig
from tlcap.intervene.activations import scale_neurons
from tlcap.intervene.covariance import key_covariance
from tlcap.intervene.rome import RomeConfig, rome_sweep
from tlcap.locate.causal_trace import TraceConfig
from tlcap.locate.circuits import Circuit, EAPConfig, evaluate_circuit, evaluate_masks, make_task
from tlcap.metrics.probs import target_prob
from tlcap.metrics.set_probs import scaled_target_probs
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime import device as runtime_device
from tlcap.runtime.batching import auto_batch_rows, circuit_row_bytes
from tlcap.runtime.run_control import RunControl

PARTS: tuple[str, ...] = ("kn", "rome", "kc")


def _reliability_kn() -> KNConfig:
    return KNConfig(n_random=20)


@dataclass(frozen=True)
class ReliabilityConfig(Config):
    """Settings of :func:`reliability` (the options of ``tlcap cnl reliability``): the configs of the
    methods it validates, each under its own name (routing of overrides: :class:`FidelityConfig`).

    Attributes:
        parts: Which of ``kn``, ``rome``, ``kc`` to run.
        kn: KN attribution and selection (:class:`~tlcap.experiments.knowledge_neurons.KNConfig`);
            ``kn.n_random`` matched random neuron sets per fact (>= 1; >= 20 for the p-value's
            resolution; 200 at the ``cpu`` scale).
        enhance_factor: KN "increase" factor (the paper: double, 2.0).
        suppress_factor: KN "zero" factor (0.0).
        batched: Score the located and every random set, doubled and zeroed, in batched forward
            passes (:func:`tlcap.metrics.set_probs.scaled_target_probs`, one row per set and
            factor; the same probabilities as one run per set); ``False``: one run per set.
        rome: ROME hyper-parameters (:class:`~tlcap.intervene.rome.RomeConfig`).
        rome_layers: Layers to edit (``None`` = every layer).
        rome_add_traced: With ``rome_layers``, also edit each fact's traced layer when it is not
            listed, so every fact has its traced-vs-other-layers comparison and enters the IPP; the
            per-layer table keeps the listed layers only (an added layer holds only the facts
            traced there).
        rome_facts: Edit only the first ``rome_facts`` facts (``None`` = all).
        rome_from: Edit only facts from this position on (with ``rome_facts``: the facts
            ``rome_from <= i < rome_facts``), so ROME's long part can run as several processes
            over one fact file and be joined with :func:`merge_reliability`.
        n_neighbours: Other facts' prompts used for ROME's specificity.
        trace: The causal trace that marks each fact's located layer (its top one;
            :func:`~tlcap.experiments.cnl_eval.common.cnl_trace`).
        kc: Knowledge circuits (:func:`~tlcap.experiments.cnl_eval.common.cnl_circuit`).
        n_random_circuits: Random circuits of as many edges per fact.
        bos: The trace and the ROME edit (its keys, value optimisation and evaluation prompts)
            prepend the model's BOS token, so the subject is not the attention sink at position 0
            (one setting: ``trace.bos`` and ``rome.bos`` follow it). The KN and KC parts keep the
            model's default tokenisation.
        seed: Seed of the random sets, neighbourhoods and trace noise (one setting: the nested
            configs' ``seed`` follow it).
    """

    shared_fields: ClassVar[tuple[str, ...]] = ("seed", "bos")

    parts: tuple[str, ...] = PARTS
    kn: KNConfig = field(default_factory=_reliability_kn)
    enhance_factor: float = 2.0
    suppress_factor: float = 0.0
    batched: bool = True
    rome: RomeConfig = field(default_factory=RomeConfig)
    rome_layers: tuple[int, ...] | None = None
    rome_add_traced: bool = True
    rome_facts: int | None = None
    rome_from: int = 0
    n_neighbours: int = 10
    trace: TraceConfig = field(default_factory=cnl_trace)
    kc: EAPConfig = field(default_factory=cnl_circuit)
    n_random_circuits: int = 20
    bos: bool = False
    seed: int = 0

    def validate(self) -> None:
        self._set("parts", check_sequence("parts", self.parts, min_len=1, unique=True,
                                         item=lambda n, x: check_choice(n, x, PARTS, cli="--parts")))
        check_nested(self, kn=KNConfig, rome=RomeConfig, trace=TraceConfig, kc=EAPConfig)
        check_int("kn.n_random", self.kn.n_random, min=1, cli="--n-random")
        check_float("enhance_factor", self.enhance_factor, ge=0)
        check_float("suppress_factor", self.suppress_factor, ge=0)
        check_bool("batched", self.batched)
        if self.rome_layers is not None:
            self._set("rome_layers", check_sequence("rome_layers", self.rome_layers, min_len=1, unique=True,
                                                    item=lambda n, x: check_int(n, x, min=0, cli="--rome-layers")))
        check_bool("rome_add_traced", self.rome_add_traced)
        if self.rome_facts is not None:
            check_int("rome_facts", self.rome_facts, min=1)
        check_int("rome_from", self.rome_from, min=0)
        if self.rome_facts is not None and self.rome_from >= self.rome_facts:
            raise InvalidConfigError(f"rome_from (--rome-from) must be below rome_facts (--rome-facts), got "
                                     f"{self.rome_from} >= {self.rome_facts}")
        check_int("n_neighbours", self.n_neighbours, min=1)
        check_int("n_random_circuits", self.n_random_circuits, min=1)
        check_bool("bos", self.bos)
        check_int("seed", self.seed, min=0)


def draw_seed(seed: int, item: int, draw: int) -> int:
    """The seed of random draw ``draw`` for item ``item`` (independent of resumes and of other items).

    Args:
        seed: The run's seed.
        item: Position of the fact.
        draw: Index of the random draw.

    Returns:
        A seed in ``[0, 2**31 - 1)``.
    """
    return (seed * 1_000_003 + item * 10_007 + draw) % (2**31 - 1)


def _kn_rows(model: Model, i: int, fact: RewriteFact, cfg: ReliabilityConfig, counts: ParamCounts,
             sw: Stopwatch, ns: NeuronSet) -> list[KNRow]:
    prompt = fact.rewrites[0]
    with sw("kn_interventions"):
        sets = [("located", -1, ns)] + [("random", d, ns.random_like(seed=draw_seed(cfg.seed, i, d)))
                                        for d in range(cfg.kn.n_random)]
        if cfg.batched:  # every (set, factor) pair as one row of a few forward passes
            base, p = scaled_target_probs(model, prompt, fact.target, [s for _, _, s in sets],
                                          (cfg.enhance_factor, cfg.suppress_factor))
            probs = p.T.tolist()
        else:
            base = target_prob(model, prompt, fact.target)
            probs = [[target_prob(model, prompt, fact.target, hooks=scale_neurons(model, s, f))
                      for f in (cfg.enhance_factor, cfg.suppress_factor)] for _, _, s in sets]
        rows = [KNRow(i, fact.uid, kind, d, len(s), counts.neurons_share(len(s)), base, up, down)
                for (kind, d, s), (up, down) in zip(sets, probs)]
    return rows


def neighbourhood(facts: Sequence[RewriteFact], i: int, n: int, seed: int) -> list[str] | None:
    """Prompts of up to ``n`` other facts, seeded per fact.

    Facts of other relations with another answer first; if there are none, facts of the same
    relation with another answer; if there are none either, ``None`` (ROME's default unrelated
    prompts).

    Args:
        facts: The dataset.
        i: Position of the fact being edited.
        n: Most prompts.
        seed: The run's seed (with ``i``, via :func:`draw_seed`).

    Returns:
        The first rewrites of up to ``n`` facts, or ``None``.
    """
    me = facts[i]
    others = [f for k, f in enumerate(facts) if k != i and f.target != me.target]
    pool = [f.rewrites[0] for f in others if not me.relation or f.relation != me.relation] or \
        [f.rewrites[0] for f in others]
    if not pool:
        return None
    rng = random.Random(draw_seed(seed, i, 0))
    return rng.sample(pool, min(n, len(pool)))


def _edits(i: int, fact: RewriteFact, cfg: ReliabilityConfig) -> bool:
    """Whether the ROME part edits fact ``i``."""
    return fact.target_new is not None and (cfg.rome_facts is None or i < cfg.rome_facts) and i >= cfg.rome_from


def _located(model: Model, window: Sequence[int], facts: Sequence[RewriteFact], cfg: ReliabilityConfig,
             sw: Stopwatch) -> dict[str, dict[int, Any]]:
    """Each part's located set for the facts of ``window`` (first rewrites), their prompts in shared batches."""
    out: dict[str, dict[int, Any]] = {"kn": {}, "rome": {}, "kc": {}}
    if "kn" in cfg.parts:
        with sw("kn_locate"):
            found = kn_neurons_facts(model, [(facts[i].rewrites[0], facts[i].target) for i in window], cfg.kn)
        out["kn"] = {i: ns for i, (ns, _) in zip(window, found)}
    edit = [i for i in window if _edits(i, facts[i], cfg)]
    if "rome" in cfg.parts and edit:
        with sw("trace"):
            traced = traced_layers_facts(model, [(facts[i].rewrites[0], facts[i].subject, facts[i].target) for i in edit],
                                         cfg.trace)
        out["rome"] = {i: top for i, (top, _, _) in zip(edit, traced)}
    if "kc" in cfg.parts:
        with sw("kc_locate"):
            circs = knowledge_circuits(model, [(facts[i].rewrites[0], facts[i].target) for i in window], cfg.kc)
        out["kc"] = dict(zip(window, circs))
    return out


def _rome_rows(model: Model, i: int, facts: Sequence[RewriteFact], cfg: ReliabilityConfig, sw: Stopwatch,
               top: list[int] | None, covs: dict[int, Any]) -> list[RomeRow]:
    fact = facts[i]
    if top is None:
        return []
    prompt = fact.rewrites[0]
    layers = list(range(model.n_layers)) if cfg.rome_layers is None else list(cfg.rome_layers)
    if any(l >= model.n_layers for l in layers):
        raise InvalidConfigError(f"rome_layers (--rome-layers) must be below {model.n_layers} for {model.name}")
    if cfg.rome_add_traced and top[0] not in layers:
        layers = sorted([*layers, top[0]])
    with sw("rome"):
        missing = [l for l in layers if l not in covs]
        if cfg.rome.mom2_adjustment and missing:  # read once per run, shared by every fact's sweep
            covs.update(key_covariance(model, missing, n_tokens=cfg.rome.cov_tokens, seq_len=cfg.rome.cov_seq_len))
        sweep = rome_sweep(model, prompt, fact.subject, fact.target_new, layers, target_old=fact.target,
                           paraphrases=list(fact.rewrites[1:]),
                           neighbourhood=neighbourhood(facts, i, cfg.n_neighbours, cfg.seed), config=cfg.rome,
                           covs=covs if cfg.rome.mom2_adjustment else None)
    return [RomeRow(i, fact.uid, r.layer, top[0], r.layer == top[0], r.layer in top, bool(r.efficacy),
                    float(r.paraphrase), float(r.specificity), r.new_prob_before, r.new_prob_after, r.old_prob_after)
            for r in sweep.results]


KC_ROWS = 32
"""Random circuits per circuit-only pass on an accelerator (fewer when :func:`circuit_row_bytes` says they do not
fit); a CPU keeps :data:`KC_CPU_ROWS`."""

KC_CPU_ROWS = 8
"""Random circuits per circuit-only pass on a CPU (:func:`tlcap.locate.circuits.evaluate_masks`' default)."""


def kc_rows_per_pass(model: Model, context_len: int, n_circuits: int) -> int:
    """Random circuits one circuit-only pass of the KC part evaluates (exact: results do not depend on it).

    Args:
        model: The model (its device and shapes).
        context_len: Tokens of the fact's task.
        n_circuits: Random circuits to evaluate.

    Returns:
        :data:`KC_CPU_ROWS` on a CPU; on an accelerator up to :data:`KC_ROWS`, as many as fit its free memory.
    """
    if not runtime_device.one_pass_default(model):
        return KC_CPU_ROWS
    fit = auto_batch_rows(circuit_row_bytes(model, context_len), max(int(n_circuits), 1), None, model.device,
                          cpu_max=KC_ROWS, model=model)
    return max(1, min(KC_ROWS, fit))


def _kc_rows(model: Model, i: int, fact: RewriteFact, cfg: ReliabilityConfig, sw: Stopwatch,
             circ: Circuit) -> list[KCRow]:
    prompt = fact.rewrites[0]
    with sw("kc_evaluate"):
        ev = evaluate_circuit(model, circ)
        rows = [KCRow(i, fact.uid, "located", -1, ev.n_edges, ev.n_nodes, ev.param_fraction,
                      ev.circuit_target_rank, ev.hit_at_1, ev.hit_at_10, ev.circuit_nll)]
        rnd = [circ.random_like(seed=draw_seed(cfg.seed, i, d)) for d in range(cfg.n_random_circuits)]
        task = make_task(model, prompt, fact.target, None)
        r = evaluate_masks(model, circ.graph, task, torch.stack([c.mask for c in rnd]),
                           batch=kc_rows_per_pass(model, int(task.clean.shape[-1]), len(rnd)))
        for d, c in enumerate(rnd):
            rank = int(r["rank"][d])
            rows.append(KCRow(i, fact.uid, "random", d, c.n_edges, c.n_nodes, c.param_fraction, rank,
                              rank == 1, rank <= 10, float(r["nll"][d])))
    return rows


def reliability(
    model: Model,
    facts: Sequence[RewriteFact],
    *,
    config: ReliabilityConfig | None = None,
    run: RunControl | None = None,
    on_item: OnItem | None = None,
    fact_batch: int = 4,
    **overrides: Any,
) -> ReliabilityResult:
    """The reliability experiment over a fact dataset (module docstring).

    Args:
        model: The model (ROME edits are undone after each measurement).
        facts: Facts (:func:`tlcap.data.rewrites.rewrite_facts`); the first rewrite is the
            prompt, the others are ROME's paraphrases; ``target_new`` is ROME's new object
            (facts without one are not edited).
        config: A :class:`ReliabilityConfig`.
        run: The streamed checkpoint (``checkpoint_dir``; a rerun with the same folder, inputs and settings
            resumes after the last saved item; ``checkpoint_every`` default 2), ``resume`` and the progress
            bar (:class:`~tlcap.runtime.run_control.RunControl`).
        on_item: Called with each fact's position before its rows are computed and added (the
            window's located sets are computed together before).
        fact_batch: Facts whose prompts are located at once (KN rows, trace cells, circuit passes share
            batches); exact, results do not depend on it. Locating time is split evenly over the window.
        **overrides: :class:`ReliabilityConfig` fields (``parts=("kn",)``, ``n_random=30`` → ``kn.n_random``,
            ``kc__steps=2``, ...).

    Returns:
        A :class:`ReliabilityResult`.

    Example:
        >>> from tlcap.data.rewrites import rewrite_facts
        >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
        >>> res = reliability(model, facts, parts=("kn",), enhance_factor=2.0, kn__steps=2, n_random=2,
        ...                   run=RunControl(progress=False))
        >>> shares = res.kn_shares("double")     # facts whose P(target) rises / falls: located vs random KNs
        >>> sorted(shares)
        ['fall_located_minus_random', 'located_fall', 'located_rise', 'random_fall', 'random_rise',
         'rise_located_minus_random', 'test']
    """
    cfg = ReliabilityConfig.resolve(config, **overrides)
    rc = RunControl.resolve(run)
    check_int("fact_batch", fact_batch, min=1, cli=None)
    if not facts:
        raise EmptyDatasetError("reliability needs at least one fact")
    if "rome" in cfg.parts and cfg.rome_layers is not None:  # before any fact's work, not at the first ROME edit
        check_layers_below("rome_layers", cfg.rome_layers, model.n_layers, model.name)
    ck = ItemCheckpoint(rc.checkpoint_dir, fingerprint("reliability", cfg.to_dict(), model.name,
                                                    [f.to_dict() for f in facts]),
                        rc.every(2), rc.resume)
    counts = param_counts(model)
    covs: dict[int, Any] = {}  # ROME's key covariances, read once for every fact
    bar = tqdm(total=len(facts), initial=ck.done, desc="reliability", unit="fact", disable=not rc.progress)
    with ck.saving():  # items done so far are saved on every exit, Ctrl-C included
        for s in range(ck.done, len(facts), fact_batch):  # a window's prompts located at once, saved fact by fact
            window = list(range(s, min(s + fact_batch, len(facts))))
            shared, t_loc = Stopwatch(), time.perf_counter()
            found = _located(model, window, facts, cfg, shared)
            loc_wall = (time.perf_counter() - t_loc) / len(window)
            for i in window:
                if on_item is not None:
                    on_item(i)
                sw, t0 = Stopwatch(), time.perf_counter()
                sw.add({k: v / len(window) for k, v in shared.seconds.items()})
                item: dict[str, Any] = {"kn": [], "rome": [], "kc": []}
                if "kn" in cfg.parts:
                    item["kn"] = [list(astuple(r)) for r in _kn_rows(model, i, facts[i], cfg, counts, sw, found["kn"][i])]
                if "rome" in cfg.parts:
                    item["rome"] = [list(astuple(r)) for r in _rome_rows(model, i, facts, cfg, sw, found["rome"].get(i), covs)]
                if "kc" in cfg.parts:
                    item["kc"] = [list(astuple(r)) for r in _kc_rows(model, i, facts[i], cfg, sw, found["kc"][i])]
                item.update(seconds=sw.seconds, wall=time.perf_counter() - t0 + loc_wall)
                ck.add(item)
                bar.update(1)
    bar.close()
    total = Stopwatch()
    for it in ck.items:
        total.add(it["seconds"])
    return ReliabilityResult(
        kn_rows=tuple(tuple(r) for it in ck.items for r in it["kn"]),
        rome_rows=tuple(tuple(r) for it in ck.items for r in it["rome"]),
        kc_rows=tuple(tuple(r) for it in ck.items for r in it["kc"]),
        parts=tuple(cfg.parts), n_facts=len(facts), n_layers=model.n_layers, model_name=model.name,
        config=cfg.to_dict(), method_seconds=total.seconds, wall_seconds=sum(it["wall"] for it in ck.items),
        provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


__all__ = ["KC_CPU_ROWS", "KC_ROWS", "PARTS", "ReliabilityConfig", "draw_seed", "kc_rows_per_pass", "neighbourhood",
           "reliability"]
