"""Fidelity (CNL paper §3.1): do rewrites of one fact get the same located parameters?

For every fact, each method locates on each of its ``k`` rewrites (KN neurons, the top-3 MLP
layers of causal tracing at the last subject token, the top-n edges of a knowledge circuit); the
fact's fidelity for a method is the mean overlap ``(|a∩b|/|a| + |a∩b|/|b|)/2`` over the
``k(k−1)/2`` pairs of rewrites (:func:`tlcap.metrics.mean_pairwise_overlap`), and a method's
fidelity is the mean over facts with a bootstrap 95 % CI (facts are the unit). The paper, on
GPT-J: KN 37.3 %, ROME (tracing) 32.7 %, KC 7.2 %.

Beside each overlap: the IoU, and the **chance overlap** — the expected overlap of random sets
of the same sizes (KN: the same number of neurons in each layer, ``E|A∩B| = Σ_l a_l b_l / d_mlp``;
layers and edges: uniform, ``E|A∩B| = |A||B| / U``), so "37 %" can be read against what random
sets would give (three of 30 layers overlap by 10 % by chance).

Example:
    >>> import tempfile
    >>> from tlcap.data.rewrites import rewrite_facts
    >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
    >>> res = fidelity(model, facts, kn__steps=2, trace__top_k=1, samples=2, top_n=20, kc__steps=2,
    ...                run=RunControl(checkpoint_dir=tempfile.mkdtemp(), progress=False))   # resumable: reruns skip done facts
    >>> print(res.estimate("kn"))
    0.940 [0.93, 0.95] (n=2)
    >>> fig = res.figure()
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from itertools import combinations
from typing import Any, ClassVar

from tqdm.auto import tqdm

from tlcap.config import Config, check_choice, check_int, check_nested, check_sequence
from tlcap.data.rewrites import RewriteFact
from tlcap.errors import EmptyDatasetError, InvalidConfigError
from tlcap.experiments.cnl_eval.common import (
    ItemCheckpoint,
    OnItem,
    Stopwatch,
    cnl_circuit,
    cnl_trace,
    edge_ids,
    fingerprint,
    kn_neurons_facts,
    knowledge_circuits,
    neuron_ids,
    param_counts,
    traced_layers_facts,
)
from tlcap.experiments.cnl_eval.results import FidelityResult, FidelityRow, RewriteRow
from tlcap.experiments.knowledge_neurons import KNConfig
from tlcap.locate.causal_trace import TraceConfig
from tlcap.locate.circuits import EAPConfig, EdgeGraph
from tlcap.metrics.localization import mean_pairwise_overlap
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime.run_control import RunControl

METHODS: tuple[str, ...] = ("kn", "trace", "kc")


@dataclass(frozen=True)
class FidelityConfig(Config):
    """Settings of :func:`fidelity` (the options of ``tlcap cnl fidelity``): the configs of the three
    methods it compares, each under its own name.

    An override names a field of one of them dotted (``kn.threshold``, ``trace.samples``,
    ``kc.top_n``; ``trace__samples=`` as a keyword) or flat where only one has it
    (``samples=2`` → ``trace.samples``, ``top_n=100`` → ``kc.top_n``); ``steps`` (KN's IG steps or
    EAP-IG's) and ``threshold`` need the prefix.

    Attributes:
        methods: Which of ``kn``, ``trace``, ``kc`` to run.
        kn: KN attribution (``kn.ig``: steps, rule, ...) and selection (``Attr > kn.threshold · max``,
            Dai's 0.2, or the ``kn.top_k`` best) (:class:`~tlcap.experiments.knowledge_neurons.KNConfig`).
        trace: Causal tracing (:class:`~tlcap.locate.causal_trace.TraceConfig`; default
            :func:`~tlcap.experiments.cnl_eval.common.cnl_trace`: MLP cells of the last subject
            token, ROME's 10 samples, window 10, ν = 3 × std); its ``top_k`` located layers (the paper:
            3). ``trace.bos`` prepends the model's BOS token, so a subject that starts the rewrite is not
            the attention sink at position 0 (KN and KC keep the model's default tokenisation).
        kc: Knowledge circuits (:class:`~tlcap.locate.circuits.EAPConfig`; default
            :func:`~tlcap.experiments.cnl_eval.common.cnl_circuit`: EAP-IG 5 steps, top 300 edges,
            dead nodes pruned).
        seed: Seed of the trace noise (one setting: the nested configs' ``seed`` follow it).

    Example:
        >>> cfg = FidelityConfig.resolve(None, samples=2, **{"kn.steps": 4, "kc.top_n": 50}, seed=1)
        >>> cfg.trace.samples, cfg.kn.ig.steps, cfg.kc.top_n, cfg.trace.seed
        (2, 4, 50, 1)
    """

    shared_fields: ClassVar[tuple[str, ...]] = ("seed",)

    methods: tuple[str, ...] = METHODS
    kn: KNConfig = field(default_factory=KNConfig)
    trace: TraceConfig = field(default_factory=cnl_trace)
    kc: EAPConfig = field(default_factory=cnl_circuit)
    seed: int = 0

    def validate(self) -> None:
        self._set("methods", check_sequence("methods", self.methods, min_len=1, unique=True,
                                           item=lambda n, x: check_choice(n, x, METHODS, cli="--methods")))
        check_nested(self, kn=KNConfig, trace=TraceConfig, kc=EAPConfig)
        check_int("seed", self.seed, min=0)


def chance_overlap(a: Sequence[int], b: Sequence[int], universe: int, per_layer: int | None = None) -> float:
    """Expected overlap of random sets of the sizes of ``a`` and ``b`` (module docstring).

    With ``per_layer`` (= d_mlp) the ids are neurons and the random sets keep each layer's count;
    otherwise they are uniform in ``range(universe)``. 0 when either set is empty.

    Args:
        a: Flat ids of one set (neurons ``l·d_mlp + j``, layers or edges).
        b: Flat ids of the other set.
        universe: How many ids there are (used without ``per_layer``).
        per_layer: ``d_mlp`` when the ids are neurons; ``None`` = uniform random sets.

    Returns:
        The expected overlap ``(|a∩b|/|a| + |a∩b|/|b|) / 2`` of the random sets, in ``[0, 1]``.
    """
    if not a or not b:
        return 0.0
    if per_layer:
        ca: dict[int, int] = {}
        cb: dict[int, int] = {}
        for i in a:
            ca[i // per_layer] = ca.get(i // per_layer, 0) + 1
        for i in b:
            cb[i // per_layer] = cb.get(i // per_layer, 0) + 1
        inter = sum(n * cb.get(l, 0) for l, n in ca.items()) / per_layer
    else:
        inter = len(a) * len(b) / universe
    return 0.5 * (inter / len(a) + inter / len(b))


def _locate_window(model: Model, method: str, facts: Sequence[RewriteFact], cfg: FidelityConfig, counts: Any,
                   sw: Stopwatch) -> list[list[tuple[tuple[int, ...], float, float]]]:
    """Every rewrite's located set as ids, its parameter share and a probability (see RewriteRow), per fact;
    the rewrites of all ``facts`` share batches."""
    flat = [(p, f) for f in facts for p in f.rewrites]
    with sw(method):
        if method == "kn":
            located = [(neuron_ids(ns), counts.neurons_share(len(ns)), p) for ns, p in
                       kn_neurons_facts(model, [(p, f.target) for p, f in flat], cfg.kn)]
        elif method == "trace":
            located = [(tuple(layers), counts.layers_share(layers), p) for layers, p, _ in
                       traced_layers_facts(model, [(p, f.subject, f.target) for p, f in flat], cfg.trace)]
        else:
            located = [(edge_ids(c), c.param_fraction, float("nan")) for c in
                       knowledge_circuits(model, [(p, f.target) for p, f in flat], cfg.kc)]
    out, k = [], 0
    for f in facts:
        out.append(located[k:k + len(f.rewrites)])
        k += len(f.rewrites)
    return out


def _universe(model: Model, method: str) -> int:
    if method == "kn":
        return model.n_layers * model.d_mlp
    if method == "trace":
        return model.n_layers
    return int(EdgeGraph.from_model(model).valid_mask().sum())


def _fact_item(model: Model, i: int, fact: RewriteFact, cfg: FidelityConfig, universe: dict[str, int],
               found: dict[str, list[tuple[tuple[int, ...], float, float]]], seconds: dict[str, float], wall: float) -> dict:
    rows, rw_rows, sets = [], [], {}
    for method in cfg.methods:
        located = found[method]
        ids = [x[0] for x in located]
        sets[method] = [list(s) for s in ids]
        po = mean_pairwise_overlap([set(s) for s in ids])
        pi = mean_pairwise_overlap([set(s) for s in ids], measure="iou")
        per = model.d_mlp if method == "kn" else None
        chance = [chance_overlap(ids[a], ids[b], universe[method], per) for a, b in combinations(range(len(ids)), 2)]
        sizes = [len(s) for s in ids]
        rows.append(FidelityRow(i, fact.uid, fact.relation, fact.subject, fact.target, method, po.mean, pi.mean,
                                sum(chance) / len(chance), sum(sizes) / len(sizes), min(sizes), max(sizes),
                                sum(x[1] for x in located) / len(located)))
        rw_rows += [RewriteRow(i, r, method, fact.rewrites[r], len(s), share, p)
                    for r, (s, share, p) in enumerate(located)]
    return {"rows": [list(astuple(r)) for r in rows], "rewrite_rows": [list(astuple(r)) for r in rw_rows],
            "sets": sets, "seconds": seconds, "wall": wall}


def fidelity(
    model: Model,
    facts: Sequence[RewriteFact],
    *,
    config: FidelityConfig | None = None,
    run: RunControl | None = None,
    on_item: OnItem | None = None,
    fact_batch: int = 4,
    **overrides: Any,
) -> FidelityResult:
    """The fidelity experiment over a rewriting dataset (module docstring).

    Args:
        model: The model.
        facts: Facts with their rewrites (:func:`tlcap.data.rewrites.rewrite_facts` or
            :func:`~tlcap.data.rewrites.load_rewrites`).
        config: A :class:`FidelityConfig` (default: its defaults).
        run: The streamed checkpoint (``checkpoint_dir``; a rerun with the same folder, inputs and settings
            resumes after the last saved item; ``checkpoint_every`` default 5), ``resume`` and the progress
            bar (:class:`~tlcap.runtime.run_control.RunControl`).
        on_item: Called with each fact's position before its rows are computed and added (the
            window's located sets are computed together before).
        fact_batch: Facts located at once: the rewrites of all of them share batches (KN rows, trace
            cells, circuit passes); exact, results do not depend on it. Per-method seconds are each
            window's time split evenly over its facts.
        **overrides: :class:`FidelityConfig` fields (``methods=("kn",)``, ``top_n=100``, ``trace__samples=3``,
            ``**{"kn.steps": 5}``, ...; :class:`FidelityConfig` says how they are routed).

    Returns:
        A :class:`FidelityResult` (per-fact rows, per-rewrite sets, estimates with CIs).

    Raises:
        EmptyDatasetError: no facts.
        CheckpointMismatchError: ``run.checkpoint_dir`` holds another run's checkpoint.

    Example:
        >>> from tlcap.data.rewrites import rewrite_facts
        >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
        >>> res = fidelity(model, facts, methods=("kn", "trace"), kn__steps=2, trace__top_k=1, samples=2,
        ...                run=RunControl(progress=False))
        >>> res.summary()["kn"]["overlap"]["text"]
        '0.940 [0.93, 0.95] (n=2)'
    """
    cfg = FidelityConfig.resolve(config, **overrides)
    rc = RunControl.resolve(run)
    check_int("fact_batch", fact_batch, min=1, cli=None)
    if not facts:
        raise EmptyDatasetError("fidelity needs at least one fact")
    if "trace" in cfg.methods and cfg.trace.top_k >= model.n_layers:
        raise InvalidConfigError(f"trace.top_k (--trace-top-k) must be below the {model.n_layers} layers of {model.name}, "
                                 f"got {cfg.trace.top_k}: with every layer located the overlap is 1 by construction")
    ck = ItemCheckpoint(rc.checkpoint_dir, fingerprint("fidelity", cfg.to_dict(), model.name, [f.to_dict() for f in facts]),
                        rc.every(5), rc.resume)
    counts = param_counts(model)
    universe = {m: _universe(model, m) for m in cfg.methods}
    bar = tqdm(total=len(facts), initial=ck.done, desc="fidelity", unit="fact", disable=not rc.progress)
    with ck.saving():  # items done so far are saved on every exit, Ctrl-C included
        for s in range(ck.done, len(facts), fact_batch):  # a window of facts located at once, saved fact by fact
            window = list(range(s, min(s + fact_batch, len(facts))))
            t0 = time.perf_counter()
            sw = Stopwatch()
            found = {m: _locate_window(model, m, [facts[i] for i in window], cfg, counts, sw) for m in cfg.methods}
            share = {m: v / len(window) for m, v in sw.seconds.items()}
            wall = (time.perf_counter() - t0) / len(window)
            for j, i in enumerate(window):
                if on_item is not None:
                    on_item(i)
                ck.add(_fact_item(model, i, facts[i], cfg, universe, {m: found[m][j] for m in cfg.methods}, share, wall))
                bar.update(1)
    bar.close()
    sw = Stopwatch()
    for it in ck.items:
        sw.add(it["seconds"])
    return FidelityResult(
        rows=tuple(tuple(r) for it in ck.items for r in it["rows"]),
        rewrite_rows=tuple(tuple(r) for it in ck.items for r in it["rewrite_rows"]),
        sets={m: [it["sets"][m] for it in ck.items] for m in cfg.methods},
        universe=universe, methods=tuple(cfg.methods), n_facts=len(facts), model_name=model.name,
        shape=(model.n_layers, model.d_mlp), config=cfg.to_dict(), method_seconds=sw.seconds,
        wall_seconds=sum(it["wall"] for it in ck.items),
        provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


__all__ = ["METHODS", "FidelityConfig", "chance_overlap", "fidelity"]
