"""``tlcap ql ...``: the Query Localization analyses (consistency, modify, cas, mapping, synapses).

Every command is parse → configs (every option checked before the model loads) → load ParaRel
facts → localize each neighbor query's KNs → K_I / K_II split → its analysis → ``write_outputs``
(``summary.json`` from the result's ``summary()``, HTML + PNG figures, CSV tables, the saved
result) inside ``staged_output`` (nothing is left behind on failure).

Example:
    tlcap ql consistency --model smollm2-135m --relations P36,P103 \\
        --n-facts 4 --method ig --out runs/ql_consistency
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from tlcap.atomic import json_digest, write_text_atomic
from tlcap.attribution.config import IGConfig
from tlcap.attribution.methods import METHODS
from tlcap.cli import app
from tlcap.cli._common import (
    device_option,
    dtype_option,
    load,
    model_option,
    overwrite_option,
    seed_everything,
    staged_output,
    write_outputs,
)
from tlcap.config import check_choice, check_int
from tlcap.data.pararel import Fact, ParaRelConfig, ParaRelSample, RelationScan, relation_objects, scan_pararel
from tlcap.errors import InvalidConfigError
from tlcap.experiments import ql
from tlcap.models.adapter import Model
from tlcap.provenance import model_identity

ql_app = typer.Typer(help="Query Localization (QL paper): consistency, modification, query-KN mapping, synapses, CAS.",
                     no_args_is_help=True)
app.add_typer(ql_app, name="ql")

_MODEL = model_option("smollm2-135m")
_DATA = typer.Option(None, "--data-dir", "-d",
                     help="Folder holding pararel/ (default: $TLCAP_DATA, else the ParaRel copy bundled with tlcap).")
_RELS = typer.Option("P36,P103", "--relations", "-r", help="Comma-separated ParaRel relations, e.g. P36,P103.")
_NF = typer.Option(4, "--n-facts", "-n", help="Total facts (>= 1), taken round-robin over the relations.")
_METHOD = typer.Option("ig", "--method", help="ig | sig | amig (consistency also takes a comma list or 'all').")
_STEPS = typer.Option(20, "--steps", help="Riemann steps per layer (per word for SIG), >= 1.")
_KN_T = typer.Option(0.2, "--kn-threshold", help="KNs of a query: score > t · max, t in (0, 1] (Dai: 0.2).")
_STATIC = typer.Option(0.1, "--static-threshold", help="CS2 threshold of the static K_I/K_II split, in [0, 1] (QL Table 4: 0.1).")
_SELECTION = typer.Option("own", "--selection",
                          help="KNs of a query: own (each method's rule: IG/SIG score > t·max, AMIG eq. 19 score > τ) "
                               "| relative (score > t·max for every method).")
_AMIG_TAU = typer.Option(0.01, "--amig-tau", help="τ of AMIG's eq. 19 on eq. 18-normalised scores (> 0).")
_AMIG_WORDS = typer.Option("all", "--amig-words", help="AMIG: all (eq. 18, sum over the query's words) | last (last word only).")
_SPLIT = typer.Option("static", "--split", help="static | otsu: the split the headline numbers use.")
_RULE = typer.Option("activation", "--rule",
                     help="Update rule: activation (sign/size of each KN's activation at the query) | paper (eq. 2 as printed).")
_SIZE = typer.Option(1.0, "--update-size",
                     help="--rule activation: write added at the query, in units of the KNs' own output there (> 0).")
_ALLQ = typer.Option(False, "--all-queries",
                     help="Edit every query, also those the model does not answer top-1 before the edit.")
_KNOWN = typer.Option(10, "--known-top-k",
                      help="Keep facts whose answer is in the model's top-k for every query (0: keep all).")
_MAXQ = typer.Option(0, "--max-queries", help="At most this many neighbor queries per fact (0: all, the paper).")
_SCAN = typer.Option(1000, "--max-scan",
                     help="Known-fact filter: test at most this many facts per relation (>= 1); report the hit rate.")
_OPERATIONS = typer.Option("erasure,update", help="Comma list: erasure, update.")
_EDIT_QUERIES = typer.Option(0, help="Edit only the first n queries of each fact (0: all).")


def _out(cmd: str) -> Any:
    return typer.Option(Path(f"runs/ql_{cmd}"), "--out", "-o",
                        help="Output folder; must not hold another run unless --overwrite.")


_OUT = {c: _out(c) for c in ("consistency", "modify", "cas", "mapping", "synapses")}


_DEVICE = device_option()
_DTYPE = dtype_option()
_SEED = typer.Option(0, "--seed", help="Seed of torch, numpy and random (>= 0).")


@dataclass(frozen=True)
class _Plan:
    """The checked options shared by every ``tlcap ql`` command."""

    data: ParaRelConfig
    config: ql.QLConfig
    methods: tuple[str, ...]
    relations: tuple[str, ...]


def _methods(method: str, many: bool) -> tuple[str, ...]:
    ms = list(METHODS) if many and method.strip() == "all" else [x.strip() for x in method.split(",") if x.strip()]
    if len(ms) != 1 and not many:
        raise InvalidConfigError(f"--method takes one of {', '.join(METHODS)} for this command, got {method!r}")
    for x in ms or [method]:
        check_choice("method", x, METHODS)
    return tuple(ms)


def _plan(data_dir: Path | None, relations: str, n_facts: int, known_top_k: int, max_queries: int, method: str,
          steps: int, kn_threshold: float, static_threshold: float, split: str, seed: int, max_scan: int = 1000,
          many: bool = False, selection: str = "own", amig_tau: float = 0.01, amig_words: str = "all") -> _Plan:
    """Every shared option checked (raises before any model load)."""
    check_int("seed", seed, min=0)
    check_int("known_top_k", known_top_k, min=0)
    check_int("max_queries", max_queries, min=0)
    rels = tuple(r.strip() for r in relations.split(",") if r.strip())
    data = ParaRelConfig(relations=rels or None, n_facts=n_facts, known_top_k=known_top_k or None,
                         max_queries=max_queries or None, max_scan=max_scan, seed=seed)
    qcfg = ql.QLConfig(ig=IGConfig(steps=steps), kn_threshold=kn_threshold, selection=selection,
                       amig_tau=amig_tau, amig_words=amig_words, static_threshold=static_threshold, split=split)
    methods = _methods(method, many)
    if not rels:
        raise InvalidConfigError("relations (--relations) must not be empty; give e.g. P36,P103")
    return _Plan(data, qcfg, methods, data.check_relations(data_dir))


_SHARED = ("data_dir", "relations", "n_facts", "known_top_k", "max_queries", "method", "steps", "kn_threshold",
           "static_threshold", "split", "seed", "max_scan", "selection", "amig_tau", "amig_words")


def _plan_of(options: dict[str, Any], many: bool = False) -> _Plan:
    """:func:`_plan` of a command's shared options (its ``locals()`` before anything else is bound)."""
    return _plan(**{k: options[k] for k in _SHARED if k in options}, many=many)


def _scan(m: Model, data_dir: Path | None, plan: _Plan, keep: Path | None) -> ParaRelSample:
    """The ParaRel scan (the known-fact filter runs the model), kept in ``keep`` (the run's checkpoint folder) so a
    retry of a failed or interrupted run does not scan again."""
    key = json_digest({"model": model_identity(m) or m.name, "dtype": str(m.dtype), "data": plan.data.to_dict(),
                       "data_dir": str(data_dir) if data_dir else None})[:16]
    kept = keep / f"pararel-scan-{key}.json" if keep is not None else None
    if kept is not None and kept.exists():
        try:
            d = json.loads(kept.read_text())
            return ParaRelSample(tuple(Fact(**{**f, "queries": tuple(f["queries"])}) for f in d["facts"]),
                                 tuple(RelationScan(**r) for r in d["relations"]), d["requested"], d["config"])
        except (ValueError, KeyError, TypeError):  # damaged: scan again
            pass
    sample = scan_pararel(data_dir, model=m, config=plan.data)
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(kept, json.dumps({"facts": [dataclasses.asdict(f) for f in sample.facts],
                                            "relations": [dataclasses.asdict(r) for r in sample.relations],
                                            "requested": sample.requested, "config": sample.config}))
    return sample


def _facts(m: Model, data_dir: Path | None, plan: _Plan, keep: Path | None = None) -> tuple[list[Fact], ParaRelSample]:
    typer.echo(f"loading ParaRel facts {list(plan.relations)} ...", err=True)
    sample = _scan(m, data_dir, plan, keep)
    for r in sample.relations:
        rate = f", {r.kept}/{r.tested} known ({r.hit_rate:.0%})" if r.tested else ""
        typer.echo(f"  {r.relation}: {r.used} facts used, {r.n_patterns} queries/fact{rate}, scan {r.stopped}", err=True)
    facts = list(sample.facts)
    typer.echo(f"{len(facts)} facts, {sum(len(f.queries) for f in facts)} queries", err=True)
    return facts, sample


def _locs_and_groups(m: Model, facts: list[Fact], plan: _Plan) -> tuple[list[ql.FactKNs], list[str]]:
    locs = ql.localize_facts(m, facts, plan.methods[0], config=plan.config)
    groups, _ = ql.groups_for(locs, config=plan.config)
    return locs, groups


def _extra(model: str, plan: _Plan, facts: list[Fact], sample: ParaRelSample) -> dict[str, Any]:
    return {"pararel": sample.summary(), "model": model, "relations": list(plan.relations),
            "steps": plan.config.ig.steps,
            "kn_threshold": plan.config.kn_threshold, "data": plan.data.to_dict(), "config": plan.config.to_dict(),
            "n_queries": sum(len(f.queries) for f in facts)}


@ql_app.command("consistency")
def consistency(model: str = _MODEL, device: str = _DEVICE, dtype: str = _DTYPE,
        data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
                method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
                split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ, max_scan: int = _SCAN,
                selection: str = _SELECTION, amig_tau: float = _AMIG_TAU, amig_words: str = _AMIG_WORDS,
                out: Path = _OUT["consistency"],
                seed: int = _SEED, overwrite: bool = overwrite_option()) -> None:
    """KN-consistency CS1/CS2 per fact, K_I/K_II split, Welch's t-test (QL Table 1, Fig. 3)."""
    plan = _plan_of(locals(), many=True)
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        facts, sample = _facts(m, data_dir, plan, keep=stage.checkpoints)
        locs = {me: ql.localize_facts(m, facts, me, config=plan.config) for me in plan.methods}
        res = ql.consistency_analysis(locs, config=plan.config)
        table1 = res.table1()
        table1.columns = [":".join(c for c in col if c) for col in table1.columns]
        extra = _extra(model, plan, facts, sample) | {
            "seconds_per_fact": {me: sum(fk.seconds for fk in ls) / max(len(ls), 1) for me, ls in locs.items()}}
        write_outputs(stage.path, res, figures={f"cs2_violin_{me}": res.violin(me) for me in plan.methods},
                      tables={"facts": res.to_frame(), "table1": table1}, extra=extra)
    typer.echo(f"wrote {stage.out}")


def _modification(model: str, device: str, dtype: str, data_dir: Path | None, plan: _Plan, out: Path, overwrite: bool, seed: int,
                  cfg: ql.ModificationConfig, stem: str, cas: bool) -> None:
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        facts, sample = _facts(m, data_dir, plan, keep=stage.checkpoints)
        locs, groups = _locs_and_groups(m, facts, plan)
        run = ql.cas_experiment if cas else ql.modification_experiment
        objs = {r: relation_objects(data_dir, r) for r in plan.relations}
        res = run(m, locs, groups, config=cfg, new_objects=objs)
        write_outputs(stage.path, res, figures={stem: res.figure()}, tables={"edits": res.to_frame(), stem: res.table()},
                      extra=_extra(model, plan, facts, sample))
    typer.echo(f"wrote {stage.out}")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@ql_app.command("modify")
def modify(model: str = _MODEL, device: str = _DEVICE, dtype: str = _DTYPE,
        data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
           method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
           split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ, max_scan: int = _SCAN,
           operations: str = _OPERATIONS,
           sets: str = typer.Option("local,global", help="Comma list of KN sets: local (N_i), global (∪N_j), cas."),
           edit_queries: int = _EDIT_QUERIES,
           lambda1: float = typer.Option(2.0, help="Update: weight of the old object's embedding removed (>= 0; paper 2)."),
           lambda2: float = typer.Option(2.0, help="Update: weight of the new object's embedding added (>= 0; paper 2)."),
           rule: str = _RULE, update_size: float = _SIZE, all_queries: bool = _ALLQ,
           out: Path = _OUT["modify"], seed: int = _SEED, overwrite: bool = overwrite_option()) -> None:
    """Erasure / update of N_i vs N_g: Rel, Gen, Loc, ΔPPL per K_I / K_II (QL Table 2)."""
    plan = _plan_of(locals())
    check_int("edit_queries", edit_queries, min=0)
    cfg = ql.ModificationConfig(operations=_names(operations), sets=_names(sets), lambda1=lambda1, lambda2=lambda2,
                                edit_queries=edit_queries or None, update_rule=rule, update_size=update_size,
                                only_known=not all_queries, seed=seed)
    _modification(model, device, dtype, data_dir, plan, out, overwrite, seed, cfg, "table2", cas=False)


@ql_app.command("cas")
def cas(model: str = _MODEL, device: str = _DEVICE, dtype: str = _DTYPE,
        data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
        method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
        split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ, max_scan: int = _SCAN,
        operations: str = _OPERATIONS,
        edit_queries: int = _EDIT_QUERIES,
        beta1: float = typer.Option(0.7, help="CAS weight β1 of the mean score over the queries (paper 0.7)."),
        beta2: float = typer.Option(0.3, help="CAS weight β2 of the scores' spread (paper 0.3)."),
        cas_threshold: float = typer.Option(0.3, help="CAS KNs: CAS > t · max, t in (0, 1] (paper 0.3)."),
        rule: str = _RULE, update_size: float = _SIZE, all_queries: bool = _ALLQ,
        out: Path = _OUT["cas"], seed: int = _SEED, overwrite: bool = overwrite_option()) -> None:
    """Consistency-Aware KN modification vs N_i and N_g (QL Table 3)."""
    plan = _plan_of(locals())
    check_int("edit_queries", edit_queries, min=0)
    cfg = ql.ModificationConfig(operations=_names(operations), sets=("local", "global", "cas"), beta1=beta1, beta2=beta2,
                                cas_threshold=cas_threshold, edit_queries=edit_queries or None, update_rule=rule,
                                update_size=update_size, only_known=not all_queries, seed=seed)
    _modification(model, device, dtype, data_dir, plan, out, overwrite, seed, cfg, "table3", cas=True)


@ql_app.command("mapping")
def mapping(model: str = _MODEL, device: str = _DEVICE, dtype: str = _DTYPE,
        data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
            method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
            split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ, max_scan: int = _SCAN,
            factor: float = typer.Option(2.0, help="Enhancement factor of the KN activations (>= 0)."),
            out: Path = _OUT["mapping"], seed: int = _SEED, overwrite: bool = overwrite_option()) -> None:
    """Query-KN mapping: enhance / suppress N_i vs union / intersection / refine of neighbors (QL Fig. 4)."""
    plan = _plan_of(locals())
    cfg = ql.MappingConfig(factor=factor)
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        facts, sample = _facts(m, data_dir, plan, keep=stage.checkpoints)
        locs, groups = _locs_and_groups(m, facts, plan)
        res = ql.query_kn_mapping(m, locs, groups, config=cfg)
        write_outputs(stage.path, res, figures={"fig4_query_kn_mapping": res.figure()},
                      tables={"mapping": res.to_frame(), "fig4": res.table()}, extra=_extra(model, plan, facts, sample))
    typer.echo(f"wrote {stage.out}")


@ql_app.command("synapses")
def synapses(model: str = _MODEL, device: str = _DEVICE, dtype: str = _DTYPE,
        data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
             method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
             split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ, max_scan: int = _SCAN,
             alpha: float = typer.Option(0.3, help="Synapse scaling factor α > 0 (τ = α · mean attention mass; paper 0.3)."),
             factor: float = typer.Option(2.0, help="Enhancement factor of the synapses' attention (>= 0)."),
             keep_first: bool = typer.Option(False, help="Keep position 0 (the attention sink) as a synapse candidate."),
             out: Path = _OUT["synapses"], seed: int = _SEED, overwrite: bool = overwrite_option()) -> None:
    """Dynamic KN selection: predominance (Fig. 5), knowledge synapses (Fig. 6), KN heatmaps (Figs. 1/7/10)."""
    plan = _plan_of(locals())
    cfg = ql.SynapseConfig(alpha=alpha, factor=factor, skip_first=not keep_first, seed=seed)
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        facts, sample = _facts(m, data_dir, plan, keep=stage.checkpoints)
        locs, groups = _locs_and_groups(m, facts, plan)
        res = ql.synapse_experiment(m, locs, groups, config=cfg)
        figs = {"fig6_synapses": res.figure(), "fig5_predominance": res.predominance_figure()}
        if res.heatmap_values is not None:
            figs["fig7_kn_activations"] = res.heatmap()
        write_outputs(stage.path, res, figures=figs, tables={"synapses": res.to_frame(), "fig6": res.table()},
                      extra=_extra(model, plan, facts, sample))
    typer.echo(f"wrote {stage.out}")
