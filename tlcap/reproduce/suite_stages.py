"""The CNL evaluation suite's stages (issue 11), wired to :mod:`tlcap.experiments.cnl_eval`.

===================  ================================================  ====================================
stage                computes (tlcap API)                              feeds
===================  ================================================  ====================================
``cnl.fidelity``     :func:`~tlcap.experiments.cnl_eval.fidelity` on   §3.1 fidelity, Table 4 (Overlap,
                     :func:`~tlcap.data.rewrites.rewrite_facts`        Neuron of KN / ROME / KC)
``cnl.reliability``  :func:`~tlcap.experiments.cnl_eval.reliability`   §3.2 reliability, Fig. 2, Table 4
                     on the same facts                                 (IPP of KN / ROME / KC)
``cnl.decoupling``   :func:`~tlcap.experiments.cnl_eval.decoupling` on  §4 decoupling
                     :func:`~tlcap.data.comparative.comparative_pairs`
``cnl.compare``      :func:`~tlcap.experiments.cnl_eval.compare` of    Table 4
                     the two above and of ``cnl.locate.<ds>`` /
                     ``cnl.erase.<ds>`` (CNL's row; nothing re-run)
===================  ================================================  ====================================

Every size comes from the :class:`~tlcap.reproduce.scales.ScaleConfig` (``cnl_eval_*`` knobs); the
workloads (:mod:`tlcap.reproduce.suite_cost`) follow the calls each experiment makes per item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tlcap.atomic import json_digest
from tlcap.config import Config, check_choice, check_int
from tlcap.data.comparative import comparative_pairs
from tlcap.data.rewrites import load_rewrites, rewrite_facts, save_rewrites
from tlcap.errors import TlcapError
from tlcap.experiments.cnl import CNLLocation, EraseResult
from tlcap.experiments.cnl_eval import FidelityResult, ReliabilityResult, compare, decoupling, fidelity, reliability
from tlcap.experiments.cnl_eval.common import cnl_circuit, cnl_trace, param_counts
from tlcap.experiments.cnl_eval.reliability import neighbourhood
from tlcap.experiments.knowledge_neurons import KNConfig
from tlcap.intervene.rome.config import RomeConfig
from tlcap.locate.causal_trace import TraceConfig
from tlcap.locate.circuits import EAPConfig
from tlcap.reproduce.cost import ModelShape, Workload, n_tokens, set_rows
from tlcap.reproduce.scales import ScaleConfig
from tlcap.reproduce.stages import Stage, StageContext, StageError, code_hash
from tlcap.reproduce.suite_cost import kc_work, kn_work, rome_work, trace_work
from tlcap.results import Result
from tlcap.runtime.run_control import RunControl

CODE = ("tlcap.experiments.cnl_eval", "tlcap.data.rewrites", "tlcap.data.comparative", "tlcap.attribution",
        "tlcap.locate", "tlcap.intervene")
EXPERIMENTS = ("fidelity", "reliability", "decoupling", "compare")
ITEMS: dict[str, tuple[str, ...]] = {
    "fidelity": ("CNL §3.1 fidelity", "CNL Table 4"), "reliability": ("CNL §3.2 reliability", "CNL Fig. 2", "CNL Table 4"),
    "decoupling": ("CNL §4 decoupling",), "compare": ("CNL Table 4",),
}


@dataclass(frozen=True)
class SuiteConfig(Config):
    """A ``tlcap.experiments.cnl_eval`` stage: its data and the method configs it runs (from the scale's
    ``cnl_eval_*`` knobs).

    Attributes:
        experiment: ``fidelity``, ``reliability``, ``decoupling`` or ``compare``.
        n: Facts (fidelity, reliability) or comparative pairs (decoupling).
        seed: Seed of the facts / pairs and of every random draw (the nested configs' ``seed`` follow it).
        known_top_k: Keep rewrites the model answers within its top-k (``None``: no filter).
        n_rewrites: Rewrites per fact.
        kn: KN attribution and selection; ``kn.n_random`` matched random neuron sets per fact (reliability).
        trace: Causal tracing (:func:`~tlcap.experiments.cnl_eval.common.cnl_trace` with the scale's samples).
        kc: Knowledge circuits (:func:`~tlcap.experiments.cnl_eval.common.cnl_circuit` with the scale's
            top-n and EAP-IG steps).
        rome: ROME hyper-parameters (the scale's value-optimisation steps).
        n_random_circuits: Random circuits per fact.
        rome_layers: Layers ROME edits (``None``: every layer).
        rome_facts: Facts ROME edits (the first ones; ``None``: all).
        dataset: ``compare``: the dataset of CNL's row (its locate and erase stages).
        sigma: ``compare``: the σ of CNL's erase row.
    """

    shared_fields: ClassVar[tuple[str, ...]] = ("seed",)

    experiment: str = "fidelity"
    n: int = 50
    seed: int = 0
    known_top_k: int | None = 1
    n_rewrites: int = 5
    kn: KNConfig = field(default_factory=KNConfig)
    trace: TraceConfig = field(default_factory=cnl_trace)
    kc: EAPConfig = field(default_factory=cnl_circuit)
    rome: RomeConfig = field(default_factory=RomeConfig)
    n_random_circuits: int = 20
    rome_layers: tuple[int, ...] | None = None
    rome_facts: int | None = None
    dataset: str = ""
    sigma: float = 3.0

    def validate(self) -> None:
        check_choice("experiment", self.experiment, EXPERIMENTS)
        check_int("n", self.n, min=1)

    def overrides(self) -> dict[str, Any]:
        """The experiment's config fields (``fidelity(..., **overrides)``).

        Returns:
            The keyword arguments passed to the experiment function: fidelity and reliability get their nested configs
            and ``seed`` (reliability also its ROME and random-circuit settings), the others ``kn`` only.
        """
        if self.experiment == "fidelity":
            return {"kn": self.kn, "trace": self.trace, "kc": self.kc, "seed": self.seed}
        if self.experiment == "reliability":
            return {"kn": self.kn, "trace": self.trace, "kc": self.kc, "n_random_circuits": self.n_random_circuits,
                    "rome_layers": self.rome_layers, "rome_facts": self.rome_facts, "rome": self.rome, "seed": self.seed}
        return {"kn": self.kn}


def suite_config(scale: ScaleConfig, experiment: str, seed: int = 0) -> SuiteConfig:
    """The :class:`SuiteConfig` of ``experiment`` at ``scale``.

    Args:
        scale: The scale's sizes (facts or pairs, IG, tracing, circuit and ROME settings).
        experiment: ``fidelity``, ``reliability``, ``decoupling`` or ``compare``.
        seed: Seed of the draws (shared with the nested configs).

    Returns:
        The validated :class:`SuiteConfig`.
    """
    return SuiteConfig(
        experiment=experiment, n=scale.cnl_eval_pairs if experiment == "decoupling" else scale.cnl_eval_facts, seed=seed,
        known_top_k=scale.cnl_eval_known_top_k, n_rewrites=scale.cnl_eval_rewrites,
        kn=KNConfig(ig=scale.cnl_eval_ig, n_random=scale.n_random),
        trace=cnl_trace().replace(samples=scale.cnl_eval_trace_samples),
        kc=cnl_circuit().replace(top_n=scale.cnl_eval_kc_top_n, steps=scale.cnl_eval_kc_steps),
        rome=RomeConfig(steps=scale.cnl_eval_rome_steps), n_random_circuits=scale.n_random,
        rome_layers=scale.cnl_eval_rome_layers, rome_facts=scale.cnl_eval_rome_facts,
        dataset=compare_dataset(scale) if experiment == "compare" else "", sigma=scale.cnl_sigma,
    )


def compare_dataset(scale: ScaleConfig) -> str:
    """CNL's Table 4 row: GSM8K (the paper's 96.4) when it is located and erased, else the first erased dataset.

    Args:
        scale: The scale's sizes (``cnl_datasets``, ``cnl_eval_datasets``).

    Returns:
        The dataset's name, or ``""`` when no dataset is both located and erased.
    """
    both = [d for d in scale.cnl_eval_datasets if d in scale.cnl_datasets]
    return "gsm8k" if "gsm8k" in both else (both[0] if both else "")


# ------------------------------------------------------------------ data
def _facts(ctx: StageContext) -> list:
    """The suite's ParaRel draw (it runs the model): computed once per model and settings, kept in the cache
    (``CACHE/draws/``) so a rerun — a retry after a failure, or a run whose stages are cached — does not draw again
    to compute the stage keys."""
    cfg: SuiteConfig = ctx.config
    settings = {"model": ctx.runner.model_id, "n": cfg.n, "n_rewrites": cfg.n_rewrites, "seed": cfg.seed,
                "known_top_k": cfg.known_top_k, "code": code_hash(("tlcap.data.rewrites", "tlcap.data.pararel"))}
    kept = ctx.runner.cache_dir / "draws" / f"rewrite-facts-{json_digest(settings)[:16]}.json"
    if kept.exists() and getattr(getattr(ctx.model, "device", None), "type", "") != "meta":
        try:
            return load_rewrites(kept)
        except TlcapError:  # damaged: draw again
            pass
    # a shape-only model (meta device: a plan replaying a probe) cannot answer: its plan counts the first candidates
    # (the filter picks which facts, not how many); such a draw is not kept
    meta = getattr(getattr(ctx.model, "device", None), "type", "") == "meta"
    facts = rewrite_facts(ctx.model, cfg.n, n_rewrites=cfg.n_rewrites, seed=cfg.seed,
                          known_top_k=None if meta else cfg.known_top_k)
    if meta:
        return facts
    if facts:
        save_rewrites(facts, kept)
    return facts


def _pairs(ctx: StageContext) -> list:
    cfg: SuiteConfig = ctx.config
    return comparative_pairs(cfg.n, seed=cfg.seed)


# ------------------------------------------------------------------ stage functions
def _run(ctx: StageContext) -> RunControl:
    """The stage's checkpoint folder (``items``, resumed after an interruption) and progress setting."""
    return RunControl(checkpoint_dir=str(ctx.checkpoint / "items"), progress=ctx.progress)


def _fidelity(ctx: StageContext) -> dict[str, Result]:
    cfg: SuiteConfig = ctx.config
    kw = cfg.overrides()
    if ctx.model.n_layers <= 3:  # a tiny test model: the paper's top-3 would locate every layer (refused)
        kw["trace"] = cfg.trace.replace(top_k=max(1, ctx.model.n_layers - 1))
    return {"fidelity": fidelity(ctx.model, ctx.inputs(), run=_run(ctx), **kw)}


def _reliability(ctx: StageContext) -> dict[str, Result]:
    cfg: SuiteConfig = ctx.config
    return {"reliability": reliability(ctx.model, ctx.inputs(), run=_run(ctx), **cfg.overrides())}


def _decoupling(ctx: StageContext) -> dict[str, Result]:
    cfg: SuiteConfig = ctx.config
    return {"decoupling": decoupling(ctx.model, ctx.inputs(), run=_run(ctx), **cfg.overrides())}


def _compare(ctx: StageContext) -> dict[str, Result]:
    cfg: SuiteConfig = ctx.config
    fid = ctx.dep("cnl.fidelity")["fidelity"]
    rel = ctx.dep("cnl.reliability")["reliability"]
    if not isinstance(fid, FidelityResult) or not isinstance(rel, ReliabilityResult):
        raise StageError("cnl.fidelity / cnl.reliability hold other results; delete their cache folders")
    loc_summary = erase_summary = None
    if cfg.dataset:
        loc = ctx.dep(f"cnl.locate.{cfg.dataset}")["location"]
        if isinstance(loc, CNLLocation):
            loc_summary = loc.summary()
        er = ctx.dep(f"cnl.erase.{cfg.dataset}").get(f"sigma{cfg.sigma:g}")
        if isinstance(er, EraseResult):  # absent: no neuron above mean + σ·std; compare notes the missing IPP
            erase_summary = er.summary()
    return {"table4": compare(fid, rel, cnl_locate=loc_summary, cnl_erase=erase_summary, counts=param_counts(ctx.model))}


# ------------------------------------------------------------------ workloads
def _fidelity_work(ctx: StageContext) -> Workload:
    cfg: SuiteConfig = ctx.config
    m, w = ctx.model, Workload()
    for f in ctx.inputs():
        for p in f.rewrites:
            w = w + kn_work(m, p, f.target, cfg.kn.ig) + trace_work(m, p, f.subject, cfg.trace.samples, "last_subject") \
                + kc_work(m, p, f.target, cfg.kc.steps)
    return w


def _reliability_work(ctx: StageContext) -> Workload:
    cfg: SuiteConfig = ctx.config
    m, facts, w = ctx.model, ctx.inputs(), Workload()
    shape = ModelShape.of(m)
    layers = list(range(m.n_layers)) if cfg.rome_layers is None else list(cfg.rome_layers)
    # a listed subset: each fact's traced layer is edited too when not listed (ReliabilityConfig's
    # rome_add_traced default; an upper bound: +1)
    n_edit = len(layers) + (1 if cfg.rome_layers is not None and len(layers) < m.n_layers else 0)
    rome = cfg.rome
    edited = 0
    for i, f in enumerate(facts):
        p = f.rewrites[0]
        T = n_tokens(m, p + f.target)
        q = T - n_tokens(m, p) or 1  # the predicting positions each (set, factor) row runs
        rows = 1 + 2 * (1 + cfg.kn.n_random)  # the base, the located and every random set, doubled and zeroed (batched)
        w = w + kn_work(m, p, f.target, cfg.kn.ig) + set_rows(shape, T - q + rows * q, rows * q, T)
        w = w + kc_work(m, p, f.target, cfg.kc.steps, 1 + cfg.n_random_circuits)
        if f.target_new is not None and (cfg.rome_facts is None or i < cfg.rome_facts):
            nb = neighbourhood(facts, i, 10, cfg.seed) or []
            w = w + trace_work(m, p, f.subject, cfg.trace.samples, "last_subject") + \
                rome_work(m, p, f.target_new, n_edit, rome, 1 + len(f.rewrites) - 1 + len(nb),
                          layers if edited == 0 else [])
            edited += 1
    return w


def _decoupling_work(ctx: StageContext) -> Workload:
    cfg: SuiteConfig = ctx.config
    w = Workload()
    for pair in ctx.inputs():
        for t in (1, 2):
            prompt, target = pair.framing(t)
            w = w + kn_work(ctx.model, prompt, target, cfg.kn.ig)
    return w


def suite_stages(scale: ScaleConfig, *, seed: int = 0) -> list[Stage]:
    """The four stages of the CNL evaluation suite at ``scale`` (module table).

    Args:
        scale: The scale's sizes.
        seed: Seed of the draws.

    Returns:
        ``cnl.fidelity``, ``cnl.reliability``, ``cnl.decoupling`` and ``cnl.compare`` (which depends on the others'
        results and on CNL's locate and erase stages of :func:`compare_dataset`).
    """
    out = []
    for exp, fn, data, work in (("fidelity", _fidelity, _facts, _fidelity_work),
                                ("reliability", _reliability, _facts, _reliability_work),
                                ("decoupling", _decoupling, _pairs, _decoupling_work)):
        out.append(Stage(f"cnl.{exp}", fn, suite_config(scale, exp, seed), code=CODE, data=data, workload=work,
                         items=ITEMS[exp], description=f"tlcap.experiments.cnl_eval.{exp}"))
    cfg = suite_config(scale, "compare", seed)
    deps = ("cnl.fidelity", "cnl.reliability") + ((f"cnl.locate.{cfg.dataset}", f"cnl.erase.{cfg.dataset}")
                                                 if cfg.dataset else ())
    out.append(Stage("cnl.compare", _compare, cfg, deps=deps, code=CODE, workload=lambda ctx: Workload(),
                     items=ITEMS["compare"], description="Table 4: tlcap.experiments.cnl_eval.compare of the results above"))
    return out


__all__ = ["SuiteConfig", "suite_stages", "suite_config", "compare_dataset", "EXPERIMENTS"]
