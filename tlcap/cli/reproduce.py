"""``tlcap reproduce {cnl,ql,all}``: both papers' tables and figures beside the papers' numbers.

Writes ``OUT/report.md`` and ``OUT/report.html`` (per table: the paper's value, ours with its
95 % CI and n, a verdict with its reason; figures inline; what was not reproduced and why),
``OUT/figures/``, ``OUT/report_rows.csv``, ``OUT/stages.csv`` and the stage cache ``OUT/cache``
(content-addressed: a rerun loads what it computed; an interrupted run resumes). Before starting
it prints the predicted wall time and peak memory of each stage; at the end, predicted vs measured.

Example:
    tlcap reproduce all --model smollm2-135m --scale smoke --out runs/repro
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import typer

from tlcap.atomic import is_storage_error, storage_error
from tlcap.cli import app
from tlcap.cli._common import Interrupted, device_option, dtype_option, load, model_option, seed_everything, writable_folder
from tlcap.config import check_int
from tlcap.errors import InvalidConfigError, MissingFileError
from tlcap.models import load_model


def load_shapes(model: str, dtype: str | None) -> Any:
    """``model`` on the meta device (shapes and tokenizer, no weights: a 7B shape is never allocated here), or
    on the CPU where its backend cannot boot without weights (a fused QKV projection, GPT-2)."""
    try:
        return load(model, device="meta", dtype=dtype)
    except (NotImplementedError, RuntimeError) as exc:
        typer.echo(f"{model} cannot be built without weights ({type(exc).__name__}); loading it on the CPU", err=True)
        return load(model, device="cpu", dtype=dtype)


@app.command("reproduce")
def reproduce_cmd(
    paper: str = typer.Argument(..., help="cnl | ql | all"),
    model: str = model_option("smollm2-135m"),
    scale: str = typer.Option("smoke", "--scale", help="smoke (minutes) | cpu (~4–5 h on 2 cores) | full (papers' sizes)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (report.md, report.html, figures/, cache/)."),
    only: str | None = typer.Option(None, "--only", help="Comma-separated stages or prefixes (e.g. 'ql.*'); "
                                                         "default every stage."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Stage cache (default OUT/cache); share it between "
                                                                     "outputs to share stages."),
    data_dir: str | None = typer.Option(None, "--data-dir", "-d", help="Data folder (default: the data bundled with tlcap)."),
    seed: int = typer.Option(0, "--seed", help="Seed of sample draws and random sets."),
    n_boot: int | None = typer.Option(None, "--n-boot", help="Bootstrap resamples (default: the scale's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan with predicted cost and stop."),
    reprobe: bool = typer.Option(False, "--reprobe", help="Re-run the calibration probe (it is cached per machine)."),
    calibration: Path | None = typer.Option(None, "--calibration", help="Replay a probe saved on another machine (a file of "
                                            "--save-calibration) instead of probing; with --dry-run the model is loaded "
                                            "on the meta device (shapes and tokenizer, no weights) unless a --device "
                                            "other than auto is given."),
    save_calibration: Path | None = typer.Option(None, "--save-calibration", help="Write this machine's probe into FILE "
                                                 "(other models' probes in it are kept)."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars inside stages."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Stages computed at once, each in its own process with "
                                                     "cpus/jobs threads (e.g. 2 on a 2-core CPU)."),
) -> None:
    """Reproduce the CNL and/or QL paper: every table and figure, with CIs and verdicts."""
    from tlcap.reproduce.parallel import threads_per_job  # noqa: PLC0415
    from tlcap.reproduce.run import build_stages, cached_calibration, papers_of, plan_lines, predictions, reproduce  # noqa: PLC0415
    from tlcap.reproduce.scales import get_scale  # noqa: PLC0415 - commands import lazily (fast --help)
    from tlcap.reproduce.stages import Runner  # noqa: PLC0415

    papers = papers_of(paper)
    sc = get_scale(scale)
    stages_only = [s.strip() for s in only.split(",") if s.strip()] if only else None
    check_int("jobs", jobs, min=1, cli="--jobs")
    if calibration is not None and not calibration.is_file():
        raise MissingFileError(f"--calibration {calibration}: no such file")
    if calibration is not None and save_calibration is not None:
        raise InvalidConfigError("--calibration replays a probe and --save-calibration writes one: give one of them")
    if n_boot is not None:
        check_int("n_boot", n_boot, min=1, cli="--n-boot")
    Runner(build_stages(papers, sc, seed=seed, data_dir=data_dir), cache_dir or out / "cache").plan(stages_only)  # --only
    if not dry_run:  # --out (and --cache-dir) checked before the model load: a folder, writable
        writable_folder(out, "--out")
        if cache_dir is not None:
            writable_folder(cache_dir, "--cache-dir")
    seed_everything(seed)
    if dry_run and calibration is not None and device.strip().lower() == "auto":
        m = load_shapes(model, dtype)
    else:
        m = load(model, device=device, dtype=dtype)
    if jobs > 1:
        torch.set_num_threads(threads_per_job(jobs))
    if dry_run:
        cache = cache_dir or out / "cache"
        runner = Runner(build_stages(papers, sc, seed=seed, data_dir=data_dir), cache, m, plan_only=True)
        plan = runner.plan(stages_only)
        cal = cached_calibration(m, cache, runner.model_id, reprobe=reprobe, calibration=calibration,
                                 save_to=save_calibration)
        typer.echo(f"calibration: {cal.device} ({cal.model or '?'}, {cal.dtype or '?'}, {cal.meta.get('date', '?')}; "
                   f"probe {cal.seconds:.0f} s{cal.timing_note()}){' from ' + str(calibration) if calibration else ''}")
        if save_calibration is not None:
            typer.echo(f"probe written to {save_calibration}")
        for line in plan_lines(runner, plan, predictions(runner, plan, cal), jobs):
            typer.echo(line)
        return
    loader = functools.partial(load_model, model, device=str(m.device), dtype=m.dtype) if jobs > 1 else None
    cache = cache_dir or out / "cache"
    try:
        run = reproduce(m, out, papers=papers, scale=sc, seed=seed, data_dir=data_dir, only=stages_only, n_boot=n_boot,
                        cache_dir=cache_dir, reprobe=reprobe, progress=progress and jobs == 1, echo=typer.echo,
                        model_name=model, jobs=jobs, load=loader, calibration=calibration,
                        save_calibration=save_calibration)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; the finished stages are cached in {cache} and the interrupted one keeps its "
                          "checkpoint there: rerun the same command to resume") from None
    except OSError as exc:
        if not is_storage_error(exc):
            raise
        raise storage_error(exc, then=f"the stages already in {cache} are intact; rerun the same command to resume") from None
    s = run.report.summary()
    typer.echo(f"{s['n_rows']} rows: " + ", ".join(f"{v} {k}" for k, v in s["verdicts"].items()))
    typer.echo(f"report: {out / 'report.md'}  {out / 'report.html'}")
    failed = [r.name for r in run.records if r.status == "failed"]
    if failed:
        typer.echo(f"failed stages (see the report): {', '.join(failed)}", err=True)
