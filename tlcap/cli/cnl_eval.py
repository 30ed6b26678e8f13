"""``tlcap cnl fidelity|reliability|decouple|compare``: the CNL paper's case against individual-knowledge
localization, over datasets (parse → config → call → write outputs).

Each command streams with a progress bar and checkpoints beside ``--out``
(``.<out>.checkpoints``): rerunning the same command after an interrupt resumes where it
stopped; the checkpoints are removed once the outputs are in place. Outputs: ``summary.json``
(every number with its 95 % CI and the paper's value beside it), CSV tables, HTML + PNG
figures, ``result/`` (the saved result value) and the dataset used (``facts.json`` /
``pairs.json``). See ``docs/cnl_eval.md``.

Example:
    tlcap cnl fidelity --model smollm2-135m --n 50 --out runs/fidelity
    tlcap cnl reliability --model smollm2-135m --n 50 --parts kn,kc --out runs/reliability
    tlcap cnl decouple --model smollm2-135m --n 200 --out runs/decouple
    tlcap cnl compare --fidelity runs/fidelity --reliability runs/reliability --out runs/table4
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from tlcap.atomic import json_digest
from tlcap.attribution import IGConfig
from tlcap.cli._checks import layers_fit, spec, trace_k_fits
from tlcap.cli._common import (
    check_device_dtype,
    device_option,
    dtype_option,
    load,
    model_option,
    overwrite_option,
    seed_everything,
    staged_output,
    write_outputs,
)
from tlcap.cli.cnl import cnl_app
from tlcap.cli.localize import parse_sets
from tlcap.config import check_int
from tlcap.data.comparative import check_pair_options, comparative_pairs, load_pairs, save_pairs
from tlcap.data.rewrites import MAX_MISSES, check_rewrite_options, load_rewrites, rewrite_facts, save_rewrites
from tlcap.errors import DataFormatError, InvalidConfigError, MissingFileError, TlcapError
from tlcap.experiments.cnl.erase import EraseResult
from tlcap.experiments.cnl.locate import CNLLocation
from tlcap.experiments.cnl_eval import (
    DecouplingConfig,
    FidelityConfig,
    FidelityResult,
    ReliabilityConfig,
    ReliabilityResult,
    compare,
    decoupling,
    fidelity,
    merge_reliability,
    reliability,
)
from tlcap.experiments.cnl_eval.common import param_counts
from tlcap.provenance import model_identity
from tlcap.results import load_result
from tlcap.runtime.run_control import RunControl

_FACTS = typer.Option(None, help="A JSON file of your own facts with rewrites (docs/cnl_eval.md); default: ParaRel.")
_N_FACTS = typer.Option(50, help="Facts to draw from ParaRel (the first N of --facts when given).")
_KNOWN = typer.Option(1, help="Keep a ParaRel rewrite only if the answer is in the model's top-k (0 = keep all).")
_MAX_SCAN = typer.Option(300, help="ParaRel draw: facts tried per relation at most.")
_MAX_MISSES = typer.Option(MAX_MISSES, help="ParaRel draw: stop a relation after this many failing facts in a row "
                           "(0 = only --max-scan).")
_STEPS = typer.Option(20, help="KN integrated-gradients steps (>= 1).")
_RULE = typer.Option("midpoint", help="KN quadrature rule (docs/kn.md): midpoint, gauss_legendre, right, cnl, ... "
                     "(the reproduce cpu scale: --steps 4 --rule gauss_legendre).")
_THRESHOLD = typer.Option(0.2, help="KN: keep neurons with score > threshold * max, in (0, 1] (Dai: 0.2).")
_TOP_K = typer.Option(None, help="KN: keep the top-k neurons (>= 1) instead of thresholding.")
_EVERY = typer.Option(5, "--checkpoint-every", help="Items (facts, pairs) between checkpoint saves (>= 1); a rerun "
                     "after an interrupt resumes after the last save.")
_BOS = typer.Option(False, "--bos", help="Causal tracing (and reliability's ROME edit): prepend the model's BOS token so "
                    "a subject that starts the prompt is not the attention sink at position 0 (many ParaRel rewrites "
                    "start with the subject).")


def _list(spec: str, name: str) -> tuple[str, ...]:
    items = tuple(s.strip() for s in spec.split(",") if s.strip())
    if not items:
        raise InvalidConfigError(f"{name} needs at least one comma-separated value, got {spec!r}")
    return items


def _ints(spec: str | None, name: str) -> tuple[int, ...] | None:
    if not spec:
        return None
    try:
        return tuple(int(s) for s in _list(spec, name))
    except ValueError:
        raise InvalidConfigError(f"{name} must be comma-separated integers, e.g. '0,5,10', got {spec!r}") from None


def _facts(m, facts: Path | None, n: int, n_rewrites: int, known_top_k: int, seed: int, max_scan: int,  # noqa: ANN001, ANN202
           max_misses: int, keep: Path | None = None):
    """The facts of a run: ``--facts`` (its first ``n``), or a ParaRel draw kept in ``keep`` (the checkpoint folder),
    so that a rerun after an interrupt or a failure does not draw (and scan the model's answers) again."""
    if facts is not None:
        return load_rewrites(facts)[:n]
    settings = {"model": model_identity(m) or m.name, "dtype": str(m.dtype), "n": n, "n_rewrites": n_rewrites,
                "known_top_k": known_top_k, "seed": seed, "max_scan": max_scan, "max_misses": max_misses}
    kept = keep / f"drawn-facts-{json_digest(settings)[:16]}.json" if keep is not None else None
    if kept is not None and kept.exists():
        try:
            return load_rewrites(kept)
        except TlcapError:  # damaged: draw again
            pass
    drawn = rewrite_facts(m, n, n_rewrites=n_rewrites, known_top_k=known_top_k or None, seed=seed, max_scan=max_scan,
                          max_misses=max_misses or None)
    if kept is not None:
        save_rewrites(drawn, kept)
    return drawn


def _check_n(n: int) -> None:
    if isinstance(n, bool) or n < 1:
        raise InvalidConfigError(f"n (--n) must be >= 1, got {n!r}")


def _check_draw(n: int, n_rewrites: int, known_top_k: int, max_scan: int, max_misses: int) -> None:
    _check_n(n)
    if max_misses < 0:
        raise InvalidConfigError(f"max_misses (--max-misses) must be >= 0 (0 = only --max-scan), got {max_misses}")
    check_rewrite_options(n, n_rewrites, known_top_k or None, max_scan, max_misses or None)


@cnl_app.command("fidelity")
def fidelity_cmd(
    model: str = model_option("smollm2-135m"),
    device: str = device_option(),
    dtype: str = dtype_option(),
    n: int = _N_FACTS,
    facts: Path | None = _FACTS,
    n_rewrites: int = typer.Option(5, help="Rewrites per ParaRel fact (the paper: 5)."),
    known_top_k: int = _KNOWN,
    max_scan: int = _MAX_SCAN,
    max_misses: int = _MAX_MISSES,
    methods: str = typer.Option("kn,trace,kc", help="Comma-separated: kn, trace, kc."),
    steps: int = _STEPS,
    rule: str = _RULE,
    threshold: float = _THRESHOLD,
    top_k: int | None = _TOP_K,
    trace_top_k: int = typer.Option(3, help="Causal tracing (trace.top_k): located MLP layers at the last subject "
                                            "token (paper: 3)."),
    trace_samples: int = typer.Option(10, help="Causal tracing (trace.samples): noise draws per cell (ROME: 10)."),
    bos: bool = _BOS,
    kc_top_n: int = typer.Option(300, help="Knowledge circuit (kc.top_n): edges kept (fixed top-n)."),
    kc_steps: int = typer.Option(5, help="Knowledge circuit (kc.steps): EAP-IG steps (1 = plain EAP)."),
    seed: int = typer.Option(0, help="Seed of the fact draw and the trace noise."),
    set_: list[str] | None = typer.Option(None, "--set", help="Any other setting, KEY=VALUE with its config name "
                                          "(repeatable): trace.window=5, kn.ig.method=joint, kc.metric=logit_diff."),
    checkpoint_every: int = _EVERY,
    out: Path = typer.Option(..., help="Output folder."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Fidelity: do rewrites of a fact get the same KN neurons / traced layers / circuit edges?"""
    _check_draw(n, n_rewrites, known_top_k, max_scan, max_misses)
    check_int("checkpoint_every", checkpoint_every, min=1)
    cfg = FidelityConfig.resolve(methods=_list(methods, "--methods"), seed=seed, **{
        "kn.ig": IGConfig(steps=steps, rule=rule), "kn.threshold": threshold, "kn.top_k": top_k,
        "trace.top_k": trace_top_k, "trace.samples": trace_samples, "trace.bos": bos, "kc.top_n": kc_top_n,
        "kc.steps": kc_steps}).with_overrides(parse_sets(set_ or []))
    if "trace" in cfg.methods:
        check_device_dtype(device, dtype)
        trace_k_fits(spec(model), cfg.trace.top_k)  # before the model load and the draw
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        data = _facts(m, facts, n, n_rewrites, known_top_k, seed, max_scan, max_misses, keep=stage.checkpoints)
        res = fidelity(m, data, config=cfg, run=RunControl(checkpoint_dir=stage.checkpoints, checkpoint_every=checkpoint_every))
        save_rewrites(data, stage.path / "facts.json")
        write_outputs(stage.path, res, figures={"fidelity": res.figure()},
                      tables={"fidelity": res.to_frame(), "fidelity_rewrites": res.rewrite_frame()},
                      extra={"facts_file": str(facts) if facts else None})
    typer.echo(f"wrote {stage.out}")
    for meth in res.methods:
        typer.echo(f"{meth}: overlap {res.estimate(meth)} (chance {res.estimate(meth, 'chance').value:.3f})")


@cnl_app.command("reliability")
def reliability_cmd(
    model: str = model_option("smollm2-135m"),
    device: str = device_option(),
    dtype: str = dtype_option(),
    n: int = _N_FACTS,
    facts: Path | None = _FACTS,
    known_top_k: int = _KNOWN,
    max_scan: int = _MAX_SCAN,
    max_misses: int = _MAX_MISSES,
    parts: str = typer.Option("kn,rome,kc", help="Comma-separated: kn, rome, kc."),
    steps: int = _STEPS,
    rule: str = _RULE,
    threshold: float = _THRESHOLD,
    top_k: int | None = _TOP_K,
    enhance_factor: float = typer.Option(2.0, help="KN: factor of the 'double' intervention."),
    n_random: int = typer.Option(20, help="KN (kn.n_random): random neuron sets per fact (same count per layer)."),
    rome_layers: str | None = typer.Option(None, help="ROME: layers to edit, e.g. '0,4,8' (default: every layer)."),
    rome_add_traced: bool = typer.Option(True, "--rome-add-traced/--no-rome-add-traced",
                                         help="ROME with --rome-layers: also edit each fact's traced layer."),
    rome_facts: int | None = typer.Option(None, help="ROME: edit only the first N facts."),
    rome_from: int = typer.Option(0, help="ROME: edit only facts from this position on (run ROME in several "
                                          "processes over one --facts file; join with `tlcap cnl reliability-merge`)."),
    rome_steps: int = typer.Option(20, help="ROME: Adam steps for the value vector."),
    trace_samples: int = typer.Option(10, help="Causal tracing (trace.samples; the marked layer): noise draws per cell."),
    bos: bool = _BOS,
    kc_top_n: int = typer.Option(300, help="KC (kc.top_n): edges kept."),
    kc_steps: int = typer.Option(5, help="KC (kc.steps): EAP-IG steps."),
    n_random_circuits: int = typer.Option(20, help="KC: random circuits of as many edges per fact."),
    seed: int = typer.Option(0, help="Seed of the fact draw, random sets and trace noise."),
    set_: list[str] | None = typer.Option(None, "--set", help="Any other setting, KEY=VALUE with its config name "
                                          "(repeatable): trace.window=5, kn.ig.method=joint, kc.metric=logit_diff."),
    checkpoint_every: int = _EVERY,
    out: Path = typer.Option(..., help="Output folder."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Reliability: KN double/zero vs random sets, ROME at every layer, KC recall of the circuit alone."""
    _check_draw(n, 5, known_top_k, max_scan, max_misses)
    check_int("checkpoint_every", checkpoint_every, min=1)
    cfg = ReliabilityConfig.resolve(
        parts=_list(parts, "--parts"), enhance_factor=enhance_factor, rome_layers=_ints(rome_layers, "--rome-layers"),
        rome_add_traced=rome_add_traced, rome_facts=rome_facts, rome_from=rome_from, n_random_circuits=n_random_circuits,
        bos=bos, seed=seed, **{"kn.ig": IGConfig(steps=steps, rule=rule), "kn.threshold": threshold, "kn.top_k": top_k,
                               "kn.n_random": n_random, "rome.steps": rome_steps, "trace.samples": trace_samples,
                               "kc.top_n": kc_top_n, "kc.steps": kc_steps}).with_overrides(parse_sets(set_ or []))
    if "rome" in cfg.parts:
        check_device_dtype(device, dtype)
        layers_fit(spec(model), cfg.rome_layers, "rome_layers", "--rome-layers")  # before the model load and the draw
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        data = _facts(m, facts, n, 5, known_top_k, seed, max_scan, max_misses, keep=stage.checkpoints)
        res = reliability(m, data, config=cfg,
                          run=RunControl(checkpoint_dir=stage.checkpoints, checkpoint_every=checkpoint_every))
        _write_reliability(stage.path, res, data, {"facts_file": str(facts) if facts else None})
    _echo_reliability(stage.out, res)


def _write_reliability(path: Path, res: ReliabilityResult, data: list, extra: dict) -> None:
    save_rewrites(data, path / "facts.json")
    figs, tables = {}, {"reliability": res.to_frame()}
    if res.kn_rows:
        figs["reliability_kn"], tables["reliability_kn"] = res.figure(), res.kn_frame()
    if res.rome_rows:
        figs["reliability_rome"], tables["reliability_rome"] = res.rome_figure(), res.rome_frame()
    if res.kc_rows:
        figs["reliability_kc"], tables["reliability_kc"] = res.kc_figure(), res.kc_frame()
    write_outputs(path, res, figures=figs, tables=tables, extra=extra)


def _echo_reliability(out: Path, res: ReliabilityResult) -> None:
    typer.echo(f"wrote {out}")
    for row in res.to_frame().itertuples():
        typer.echo(f"{row.part}: {row.statistic} = {row.value:.3f} [{row.low:.3f}, {row.high:.3f}] (paper {row.paper})")


@cnl_app.command("reliability-merge")
def reliability_merge_cmd(
    runs: list[Path] = typer.Argument(..., help="Output folders of `tlcap cnl reliability` over the same --facts file."),
    out: Path = typer.Option(..., help="Output folder."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Join reliability runs that computed different parts, ROME fact ranges (--rome-from/--rome-facts) or ROME layers."""
    results, facts = [], []
    for run in runs:
        results.append(_result(run, ReliabilityResult, "`tlcap cnl reliability`"))
        facts.append(load_rewrites(run / "facts.json") if (run / "facts.json").exists() else None)
    if any(f is None for f in facts) or any(f != facts[0] for f in facts[1:]):
        raise InvalidConfigError("the runs must share one facts.json (run each with --facts FILE of the same facts)")
    merged = merge_reliability(results)
    with staged_output(out, overwrite=overwrite) as stage:
        _write_reliability(stage.path, merged, list(facts[0] or []), {"merged_from": [str(r) for r in runs]})
    _echo_reliability(stage.out, merged)


@cnl_app.command("decouple")
def decouple_cmd(
    model: str = model_option("smollm2-135m"),
    device: str = device_option(),
    dtype: str = dtype_option(),
    n: int = typer.Option(200, help="Comparative pairs."),
    pairs: Path | None = typer.Option(None, help="A JSON list of {a, op, b} problems (default: generated)."),
    sources: str = typer.Option("template,gsm8k,svamp", help="Where main parts come from: template, gsm8k, svamp."),
    ops: str = typer.Option("+,-,*", help="Operators drawn."),
    max_operand: int = typer.Option(99, help="Largest operand."),
    steps: int = _STEPS,
    rule: str = _RULE,
    threshold: float = _THRESHOLD,
    top_k: int | None = _TOP_K,
    seed: int = typer.Option(0, help="Seed of the pair draw."),
    set_: list[str] | None = typer.Option(None, "--set", help="Any other setting, KEY=VALUE with its config name "
                                          "(repeatable): trace.window=5, kn.ig.method=joint, kc.metric=logit_diff."),
    checkpoint_every: int = _EVERY,
    out: Path = typer.Option(..., help="Output folder."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Decoupling: KN on two framings of one arithmetic problem; coincidence rates C^{1,2}, C^{1,1}, C^{2,2}."""
    src, op = _list(sources, "--sources"), _list(ops, "--ops")
    check_pair_options(n, src, op, max_operand)
    check_int("checkpoint_every", checkpoint_every, min=1)
    cfg = DecouplingConfig.resolve(**{"kn.ig": IGConfig(steps=steps, rule=rule), "kn.threshold": threshold,
                                      "kn.top_k": top_k}).with_overrides(parse_sets(set_ or []))
    data = load_pairs(pairs)[:n] if pairs is not None else comparative_pairs(n, seed=seed, sources=src, ops=op,
                                                                            max_operand=max_operand)
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        res = decoupling(m, data, config=cfg,
                         run=RunControl(checkpoint_dir=stage.checkpoints, checkpoint_every=checkpoint_every))
        save_pairs(data, stage.path / "pairs.json")
        write_outputs(stage.path, res, figures={"decoupling": res.figure()},
                      tables={"decoupling_pairs": res.to_frame(), "decoupling_rates": res.rates().to_frame()})
    typer.echo(f"wrote {stage.out}")
    r = res.rates()
    typer.echo(f"C12 {r.c12_overlap:.3f} (literal {r.c12:.2e}), C11 {r.c11_overlap:.3f}, C22 {r.c22_overlap:.3f} "
               "(overlap-normalised; paper 0.156 / 0.073 / 0.086)")


def _json(path: Path | None, what: str, kind: type | None = None) -> dict | None:
    """A command's summary: its ``summary.json``, its ``--out`` folder, or a saved result folder (e.g. a
    ``tlcap reproduce`` stage's ``location/`` or ``sigma3/``), whose ``summary()`` is that summary."""
    if path is None:
        return None
    path = Path(path)
    if path.name == "result.json" and path.is_file():
        path = path.parent
    if path.is_dir() and not (path / "summary.json").is_file() and (path / "result.json").is_file():
        res = load_result(path)
        if kind is not None and not isinstance(res, kind):
            raise DataFormatError(f"{path} holds a {type(res).__name__}, not the result of {what}")
        return res.summary()
    if path.is_dir():
        path = path / "summary.json"
    if not path.is_file():
        raise MissingFileError(f"{path} not found; pass the summary.json (or the --out folder) of {what}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise DataFormatError(f"{path} is not valid JSON ({exc}); pass the summary.json of {what}") from None


def _result(path: Path | None, kind: type, what: str):  # noqa: ANN202
    if path is None:
        return None
    path = Path(path)
    res = load_result(path / "result" if (path / "result").is_dir() else path)
    if not isinstance(res, kind):
        raise DataFormatError(f"{path} holds a {type(res).__name__}, not the result of {what}")
    return res


@cnl_app.command("compare")
def compare_cmd(
    fidelity_dir: Path | None = typer.Option(None, "--fidelity", help="--out folder of `tlcap cnl fidelity`."),
    reliability_dir: Path | None = typer.Option(None, "--reliability", help="--out folder of `tlcap cnl reliability`."),
    cnl_locate: Path | None = typer.Option(None, help="summary.json (or --out, or a saved result such as a reproduce "
                                                      "stage's location/) of `tlcap cnl locate`: CNL overlap."),
    cnl_erase: Path | None = typer.Option(None, help="summary.json (or --out, or a saved result such as a reproduce "
                                                     "stage's sigma3/) of `tlcap cnl erase --n-random 5`: CNL IPP."),
    model: str | None = model_option(None, help="Model whose parameter counts give the CNL neuron share."),
    out: Path = typer.Option(..., help="Output folder."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Table 4: Overlap, Neuron (% of parameters) and IPP for KN, ROME, KC and CNL beside the paper's row."""
    if fidelity_dir is None and reliability_dir is None and cnl_locate is None:
        raise InvalidConfigError("compare needs at least one of --fidelity, --reliability, --cnl-locate")
    fid = _result(fidelity_dir, FidelityResult, "`tlcap cnl fidelity`")
    rel = _result(reliability_dir, ReliabilityResult, "`tlcap cnl reliability`")
    loc = _json(cnl_locate, "`tlcap cnl locate`", CNLLocation)
    era = _json(cnl_erase, "`tlcap cnl erase`", EraseResult)
    with staged_output(out, overwrite=overwrite) as stage:
        counts = param_counts(load(model)) if model else None
        res = compare(fid, rel, cnl_locate=loc, cnl_erase=era, counts=counts)
        write_outputs(stage.path, res, figures={"table4": res.figure()}, tables={"table4": res.to_frame()})
    typer.echo(f"wrote {stage.out}")
    for r in res.records():
        note = f"  [{r.note}]" if r.note else ""
        typer.echo(f"{r.method:5s} overlap {100 * r.overlap:5.1f} (paper {r.paper_overlap})  neuron {100 * r.neuron:5.2f} "
                   f"(paper {r.paper_neuron})  IPP {100 * r.ipp:5.1f} (paper {r.paper_ipp}){note}")


__all__ = ["compare_cmd", "decouple_cmd", "fidelity_cmd", "reliability_cmd"]
