"""One reproduction end to end: stages → probe → predicted cost → run (cached, resumable) → report.

:func:`reproduce` is what ``tlcap reproduce`` calls. It builds the stages of the chosen papers at
the chosen scale (:func:`build_stages`), calibrates the cost model with a short probe on the
loaded model (cached per model and machine in the cache folder), prints the predicted wall time
and peak memory of every stage, runs the stages (a cached stage is loaded, an interrupted one
resumes from its checkpoint), builds the report rows from the stages' outputs and writes
``report.md``, ``report.html``, the figures and CSV tables into ``out``, with predicted vs
measured cost per stage.

Example:
    >>> import tempfile
    >>> run = reproduce(model, tempfile.mkdtemp(), papers=("ql",), scale="smoke", only=["ql.table2"])
    >>> run.computed                               # ql.table2 and the stages it needs
    ['ql.facts', 'ql.localize.ig', 'ql.table2']
    >>> run.report.summary()["verdicts"]           # a tiny random model: nothing to compare yet
    {'agrees': 0, 'disagrees': 0, 'undecided': 1, 'not comparable': 46, 'descriptive': 2}

With SmolLM2: ``reproduce(load_model("smollm2-135m"), "runs/repro", papers=("ql",), scale="smoke")``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tlcap.atomic import storage_error, write_text_atomic
from tlcap.config import check_int
from tlcap.errors import InvalidConfigError, TlcapError, UnknownNameError
from tlcap.reproduce.cnl_stages import cnl_stages
from tlcap.reproduce.cost import (
    PROBE_KEY,
    UNITS,
    Calibration,
    ModelShape,
    Prediction,
    dominant,
    fmt_bytes,
    fmt_seconds,
    load_calibration,
    predict,
    save_calibrations,
)
from tlcap.reproduce.items import DEFAULT_REFERENCE
from tlcap.reproduce.parallel import makespan, run_parallel, threads_per_job, worker_spec
from tlcap.reproduce.probe import calibrate
from tlcap.reproduce.ql_stages import ql_stages
from tlcap.reproduce.render import write_report
from tlcap.reproduce.report import Report, RowBuilder, StageRow
from tlcap.reproduce.report_cnl import cnl_report
from tlcap.reproduce.report_ql import ql_report
from tlcap.reproduce.scales import ScaleConfig, get_scale
from tlcap.reproduce.stages import Runner, Stage, StageRecord
from tlcap.results import Result
from tlcap.runtime.device import dtype_name

PAPERS = ("cnl", "ql")
REFERENCE = DEFAULT_REFERENCE
CACHE = "cache"
Echo = Callable[[str], None]


def papers_of(which: str) -> tuple[str, ...]:
    """``"cnl"`` → ``("cnl",)``, ``"all"`` → ``("cnl", "ql")`` (:class:`UnknownNameError` otherwise).

    Args:
        which: ``"cnl"``, ``"ql"`` or ``"all"`` (the CLI's PAPER argument).

    Returns:
        The papers, in :data:`PAPERS` order.
    """
    if which == "all":
        return PAPERS
    if which not in PAPERS:
        raise UnknownNameError.of("paper", which, (*PAPERS, "all"), option="PAPER")
    return (which,)


def build_stages(papers: Sequence[str], scale: ScaleConfig, *, seed: int = 0, data_dir: str | None = None) -> list[Stage]:
    """Every stage of ``papers`` at ``scale`` (CNL first).

    Args:
        papers: The papers whose stages to build (``"cnl"``, ``"ql"``).
        scale: The scale's sizes.
        seed: Seed of every sample draw and random set.
        data_dir: Data folder (``None``: the bundled data).

    Returns:
        The stages in dependency order.
    """
    out: list[Stage] = []
    if "cnl" in papers:
        out += cnl_stages(scale, seed=seed, data_dir=data_dir)
    if "ql" in papers:
        out += ql_stages(scale, seed=seed, data_dir=data_dir)
    return out


def cached_calibration(model: Any, cache_dir: Path, model_id: str, *, reprobe: bool = False,
                       calibration: str | Path | None = None, save_to: str | Path | None = None) -> Calibration:
    """The probe's calibration for this model and machine, measured once and kept in ``cache_dir``.

    Args:
        model: The loaded model (on the ``meta`` device only with ``calibration``).
        cache_dir: Where the probe is cached (per model, device, dtype, threads).
        model_id: The model's identity (part of the cache key).
        reprobe: Measure again even when cached.
        calibration: A calibration file (:func:`tlcap.reproduce.cost.save_calibrations`) to replay instead of
            probing: the probe in it of this model's shape and dtype.
        save_to: Also write the probe into this calibration file (kept with the file's other probes).

    Returns:
        The :class:`Calibration` (from ``calibration``, the cache, or a new probe).
    """
    if calibration is not None:
        return load_calibration(calibration, ModelShape.of(model), dtype_name(model.dtype))
    dev = torch.device(getattr(model, "device", "cpu"))
    tag = json.dumps({"model": model_id, "device": str(dev), "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                      **({"gpu": torch.cuda.get_device_name(dev), "dtype": str(model.dtype)} if dev.type == "cuda" else {})},
                     sort_keys=True)
    path = cache_dir / f"calibration-{hashlib.sha256(tag.encode()).hexdigest()[:16]}.json"
    if path.exists() and not reprobe:
        try:
            cal = Calibration.from_dict(json.loads(path.read_text()))
            if not set(UNITS) <= set(cal.seconds_per_flop):  # a probe from before a unit was added is measured again
                cal = None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):  # unreadable (e.g. by an old tlcap): probe again
            cal = None
    else:
        cal = None
    if cal is None:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, cache_dir) from None
        cal = calibrate(model)
        write_text_atomic(path, json.dumps(cal.to_dict(), indent=1))
    if save_to is not None:
        save_calibrations(save_to, [cal])
    return cal


def predictions(runner: Runner, plan: Sequence[Stage], cal: Calibration) -> dict[str, Prediction | None]:
    """Predicted cost of every planned stage that will compute (``None``: cached, pending or no cost model).

    Args:
        runner: The runner of the plan (tells which stages are cached; gives each stage its context).
        plan: The stages to run, in dependency order.
        cal: The machine's calibration.

    Returns:
        ``{stage name: Prediction or None}`` for every stage of ``plan``.
    """
    out: dict[str, Prediction | None] = {}
    for s in plan:
        if s.pending or s.workload is None or runner.is_cached(s.name):
            out[s.name] = None
            continue
        try:
            out[s.name] = predict(s.workload(runner.context(s.name)), cal)
        except TlcapError:  # e.g. a prompt longer than the model's context: the stage itself will report it
            out[s.name] = None
    return out


def plan_lines(runner: Runner, plan: Sequence[Stage], pred: dict[str, Prediction | None], jobs: int = 1) -> list[str]:
    """The plan as printed before starting: one line per stage with its predicted time and peak memory.

    With ``jobs > 1`` the last line adds the predicted wall time of the parallel run (:func:`makespan`).

    Args:
        runner: The runner of the plan (cached status and plan notes).
        plan: The stages to run, in dependency order.
        pred: The predictions (:func:`predictions`).
        jobs: Worker processes of the run.

    Returns:
        The table's lines: a header, one line per stage, the total (and the share of ``batch_rows="auto"``'s
        throughput probes in it, on an accelerator), the FLOP floor (every stage's FLOPs at the calibration's
        matmul peak, where it measured one), the dominant stages (each with its distance from its own floor)
        and (``jobs > 1``) the wall time.
    """
    lines = [f"{'stage':<22} {'status':<9} {'predicted':>10} {'peak mem':>9}  what"]
    total, peak = 0.0, 0
    for s in plan:
        p = pred.get(s.name)
        status = "pending" if s.pending else "cached" if runner.is_cached(s.name) else "to run"
        if p is not None:
            total += p.seconds
            peak = max(peak, p.peak_bytes)
        note = runner.plan_notes.get(s.name)
        lines.append(f"{s.name:<22} {status:<9} {fmt_seconds(p.seconds) if p else '–':>10} "
                     f"{fmt_bytes(p.peak_bytes) if p else '–':>9}  {s.pending or s.description}"
                     + (f" [{note}]" if note else ""))
    lines.append(f"{'total':<22} {'':<9} {fmt_seconds(total):>10} {fmt_bytes(peak):>9}")
    probes = sum(p.by_unit.get(PROBE_KEY, 0.0) for s in plan if (p := pred.get(s.name)) is not None)
    if probes > 0:
        lines.append(f"{'  of which probes':<22} {'':<9} {fmt_seconds(probes):>10} {'':>9}  batch_rows=\"auto\"'s "
                     "throughput probes, one per kind and stage (a process probes once per context length)")
    floors = {n: p.floor_seconds for n, p in pred.items() if p is not None and p.floor_seconds is not None}
    floor = sum(floors.values())
    if floor > 0:
        lines.append(f"{'  FLOP floor':<22} {'':<9} {fmt_seconds(floor):>10} {'':>9}  every stage's FLOPs at the "
                     f"calibration's matmul peak; the prediction is {total / floor:.1f}x it")
    top = dominant({n: p.seconds for n, p in pred.items() if p is not None})

    def over(n: str) -> str:  # how far a dominant stage is from its compute floor
        f = floors.get(n)
        return f" ({pred[n].seconds / f:.1f}x its floor)" if f else ""  # type: ignore[union-attr]

    if top:
        lines.append(f"{'dominant':<22} {'':<9} " + ", ".join(f"{n} {share:.0%}{over(n)}" for n, share in top)
                     + f" ({sum(x for _, x in top):.0%} of the predicted time)")
    if jobs > 1:
        wall = makespan(plan, {n: p.seconds if p else None for n, p in pred.items()}, jobs)
        lines.append(f"{'wall, ' + str(jobs) + ' jobs':<22} {'':<9} {fmt_seconds(wall):>10} {fmt_bytes(peak * jobs):>9}"
                     f"  {jobs} processes of {threads_per_job(jobs)} thread(s), longest ready stage first")
    return lines


def _why(runner: Runner, plan_names: set[str]) -> Callable[[str], str]:
    def why(name: str) -> str:
        rec = runner.records.get(name)
        if name not in runner.stages:
            return "not part of this scale"
        if name not in plan_names:
            return "not run: stage not selected in this run (--only)"
        if rec is None:
            return "not run"
        if rec.status == "pending":
            return rec.note
        if rec.status == "blocked":
            return f"not run: {rec.note}"
        if rec.status == "failed":
            return f"stage failed: {rec.note}"
        return "no result"
    return why


def _get(runner: Runner) -> Callable[[str], dict[str, Result] | None]:
    def get(name: str) -> dict[str, Result] | None:
        rec = runner.records.get(name)
        if rec is None or rec.status not in ("computed", "cached"):
            return None
        return runner.outputs(name)
    return get


def stage_rows(plan: Sequence[Stage], records: dict[str, StageRecord],
               pred: dict[str, Prediction | None]) -> list[StageRow]:
    """Predicted vs measured cost per stage (measured: this run's time, or the cached run's).

    Args:
        plan: The planned stages, in order.
        records: The stage records of the run (a missing one: ``"not run"``).
        pred: The predictions (:func:`predictions`).

    Returns:
        One :class:`StageRow` per planned stage (measured values only for computed or cached stages).
    """
    out = []
    for s in plan:
        r = records.get(s.name)
        p = pred.get(s.name)
        measured = r is not None and r.status in ("computed", "cached")
        out.append(StageRow(s.name, r.status if r else "not run", p.seconds if p else None,
                            r.seconds if measured and r else None, p.peak_bytes if p else None,
                            r.peak_bytes if measured and r and r.peak_bytes else None, r.note if r else ""))
    return out


def cost_lines(rows: Sequence[StageRow]) -> list[str]:
    """Predicted vs measured, printed at the end.

    Args:
        rows: The stages' rows (:func:`stage_rows`).

    Returns:
        The table's lines: a header and one line per stage.
    """
    lines = [f"{'stage':<22} {'status':<9} {'predicted':>10} {'measured':>10} {'pred. mem':>9} {'peak mem':>9}"]
    for r in rows:
        lines.append(f"{r.name:<22} {r.status:<9} {fmt_seconds(r.predicted_s) if r.predicted_s is not None else '–':>10} "
                     f"{fmt_seconds(r.measured_s) if r.measured_s is not None else '–':>10} "
                     f"{fmt_bytes(r.predicted_bytes or 0):>9} {fmt_bytes(r.measured_bytes or 0):>9}")
    return lines


@dataclass(frozen=True)
class ReproduceRun:
    """What :func:`reproduce` did: the report, the stage records, the written files."""

    report: Report
    records: tuple[StageRecord, ...]
    files: tuple[Path, ...]
    executed: tuple[str, ...]

    @property
    def computed(self) -> list[str]:
        return [r.name for r in self.records if r.status == "computed"]


def reproduce(model: Any, out: str | Path, *, papers: Sequence[str] = PAPERS, scale: str | ScaleConfig = "smoke",
              seed: int = 0, data_dir: str | None = None, only: Sequence[str] | None = None, n_boot: int | None = None,
              cache_dir: str | Path | None = None, reprobe: bool = False, progress: bool = False,
              keep_going: bool = True, echo: Echo | None = None, model_name: str | None = None, jobs: int = 1,
              load: Callable[[], Any] | None = None, calibration: str | Path | None = None,
              save_calibration: str | Path | None = None) -> ReproduceRun:
    """Run (or load from the cache) every stage of ``papers`` at ``scale`` and write the report into ``out``.

    Args:
        model: A loaded :class:`tlcap.models.Model`.
        out: Output folder (``report.md``, ``report.html``, ``figures/``, CSVs, ``cache/``).
        papers: ``("cnl",)``, ``("ql",)`` or both.
        scale: ``smoke`` / ``cpu`` / ``full`` or a :class:`ScaleConfig`.
        seed: Seed of every sample draw and random set.
        data_dir: Data folder (default: the bundled data).
        only: Run only these stages (and what they need); names or prefixes (``"ql.*"``).
        n_boot: Bootstrap resamples (default: the scale's).
        cache_dir: Stage cache (default ``out/cache``); share it between outputs to share stages.
        reprobe: Re-run the calibration probe even when a cached calibration exists.
        progress: Progress bars inside stages.
        keep_going: A failing stage is reported (its dependents blocked) instead of stopping the run.
        echo: Where the plan and the cost table are printed (default: nowhere).
        model_name: Our model's name in the report (default ``model.name``).
        jobs: Stages computed at once by worker processes of ``cpus // jobs`` threads each
            (:mod:`tlcap.reproduce.parallel`); 1 = in this process.
        load: With ``jobs > 1``: a picklable zero-argument callable that loads the same model in a
            worker (``functools.partial(load_model, "smollm2-135m")``).
        calibration: Replay the probe in this calibration file instead of probing (:func:`cached_calibration`).
        save_calibration: Also write the probe into this calibration file.

    Returns:
        A :class:`ReproduceRun`.

    Example:
        >>> import tempfile
        >>> run = reproduce(model, tempfile.mkdtemp(), papers=("ql",), scale="smoke", only=["ql.facts"], echo=print)
        calibration probe: cpu (1 threads), ...
        stage                  status     predicted  peak mem  what
        ql.facts               to run           0 s ... ParaRel facts with neighbor queries
        ...
        predicted vs measured:
        ...
        >>> [p.name for p in run.files]
        ['report.md', 'report.html', 'report_rows.csv', 'stages.csv']
    """
    say = echo or (lambda _s: None)
    check_int("jobs", jobs, min=1, cli="--jobs")
    if n_boot is not None:
        check_int("n_boot", n_boot, min=1, cli="--n-boot")
    if jobs > 1 and load is None:
        raise InvalidConfigError("jobs > 1 needs load=, a picklable callable that loads the model in a worker "
                                 "(e.g. functools.partial(load_model, 'smollm2-135m'))")
    if jobs > 1:  # the probe calibrates the workers' thread count
        torch.set_num_threads(threads_per_job(jobs))
    sc = scale if isinstance(scale, ScaleConfig) else get_scale(scale)
    papers = tuple(p for p in PAPERS if p in papers)
    out = Path(out)
    cache = Path(cache_dir) if cache_dir is not None else out / CACHE
    runner = Runner(build_stages(papers, sc, seed=seed, data_dir=data_dir), cache, model, progress=progress,
                    keep_going=keep_going)
    runner.on_wait = lambda name: say(f"  {name}: another process is computing it (shared cache); waiting for it")
    plan = runner.plan(only)
    needs_probe = any(not s.pending and not runner.is_cached(s.name) for s in plan)
    cal = cached_calibration(model, cache, runner.model_id, reprobe=reprobe, calibration=calibration,
                             save_to=save_calibration) if needs_probe or reprobe or save_calibration else None
    pred = predictions(runner, plan, cal) if cal is not None else dict.fromkeys(s.name for s in plan)
    if cal is not None:
        say(f"calibration probe: {cal.device}, load {cal.load if cal.load is not None else '?'}, {cal.seconds:.0f} s")
    for line in plan_lines(runner, plan, pred, jobs):
        say(line)

    def on_stage(stage: Stage, status: str) -> None:
        if status != "start":
            rec = runner.records[stage.name]
            say(f"  {stage.name}: {status} ({fmt_seconds(rec.seconds)}){' - ' + rec.note if rec.note else ''}")

    if jobs > 1:
        assert load is not None
        spec = worker_spec(load, functools.partial(build_stages, papers, sc, seed=seed, data_dir=data_dir), cache, jobs,
                           keep_going=keep_going)
        records = run_parallel(runner, plan, spec, jobs, {n: p.seconds if p else None for n, p in pred.items()},
                               on_stage=on_stage)
    else:
        records = runner.run(plan, on_stage=on_stage)
    rb = RowBuilder(model_name or str(getattr(model, "name", "model")), papers)
    get, why = _get(runner), _why(runner, {s.name for s in plan})
    boots = n_boot if n_boot is not None else sc.n_boot
    if "cnl" in papers:
        cnl_report(rb, get, why, sc, n_boot=boots, seed=seed)
    if "ql" in papers:
        ql_report(rb, get, why, sc, n_boot=boots, seed=seed)
    for r in records:
        if r.status in ("pending", "blocked", "failed"):
            rb.skip(r.name.split(".")[0], ", ".join(runner.stage(r.name).items) or r.name,
                    f"{r.name}: {why(r.name)}")
    rows = stage_rows(plan, runner.records, pred)
    report = Report.build(rb, papers=papers, model=rb.our_model, scale=sc.name, stages=rows,
                          calibration=cal.to_dict() if cal is not None else {})
    out.mkdir(parents=True, exist_ok=True)
    files = write_report(report, rb.figures, out)
    say("predicted vs measured:")
    for line in cost_lines(rows):
        say(line)
    executed = runner.executed if jobs == 1 else [r.name for r in records if r.status == "computed"]
    return ReproduceRun(report, tuple(records), tuple(files), tuple(executed))


__all__ = ["reproduce", "ReproduceRun", "build_stages", "papers_of", "cached_calibration", "predictions", "plan_lines",
           "stage_rows", "cost_lines", "PAPERS", "REFERENCE"]
