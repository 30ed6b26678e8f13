"""``tlcap cnl``: locate capability neurons on datasets (CNL) and test them.

Commands: ``locate`` (σ-mask, split-half, convergence; ``--shard i/n`` partial runs and
``--distributed`` under torchrun), ``merge`` (shard runs → located set), ``erase`` (one set, or a σ
sweep re-thresholded from the saved scores), ``enhance``, ``cross`` (overlap / erase / enhance
matrices between datasets). Each: parse → config (bad options fail here, before any model load)
→ call → write outputs inside a staged ``--out``.

Example:
    tlcap cnl locate --model smollm2-135m --dataset imdb --n 200 --sigma 3 --out runs/imdb
    tlcap cnl erase --model smollm2-135m --dataset imdb --neurons runs/imdb --sigma 3,6,12 --n 200 --out runs/imdb_erase
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from tlcap.attribution.config import IGConfig
from tlcap.attribution.dataset import merge_scores
from tlcap.cli import app
from tlcap.cli._checks import layers_fit
from tlcap.cli._checks import spec as model_shapes
from tlcap.cli._cnl import floats, ints, layers, neuron_source, parse_steps, print_warnings, skips_line
from tlcap.cli._common import (
    StagedOutput,
    batch_rows_option,
    batch_rows_value,
    checkpoint_dir,
    device_option,
    dtype_option,
    load,
    max_memory_option,
    model_option,
    overwrite_option,
    seed_everything,
    staged_output,
    write_outputs,
)
from tlcap.config import check_int
from tlcap.data.sample import DataReport, DataWarning
from tlcap.data.tasks import get_task, load_task
from tlcap.errors import EmptyDatasetError, InvalidConfigError
from tlcap.experiments.cnl import (
    CNLConfig,
    CNLLocation,
    CrossConfig,
    EnhanceConfig,
    EraseConfig,
    check_sigmas,
    cross_dataset,
    enhance_effect,
    erase_effect,
    erase_sweep,
    finalize,
    load_parts,
    located_sets_figure,
    merge_parts,
    save_parts,
    score_parts,
)
from tlcap.provenance import Provenance
from tlcap.runtime.run_control import RunControl, parse_shard

cnl_app = typer.Typer(help="CNL: commonality neurons of a capability dataset (locate, erase, enhance, cross).",
                      no_args_is_help=True)
app.add_typer(cnl_app, name="cnl")

_MODEL = model_option("smollm2-135m")
_DATA_DIR = typer.Option(None, help="Folder holding the dataset folders (default: $TLCAP_DATA, else the data bundled with "
                                    "tlcap, downloading the full Emotion/IMDB files if asked for more); 'hf:' for HF datasets.")
_STRICT = typer.Option(False, "--strict", help="Refuse data files with malformed rows or unknown labels (default: skip "
                                               "them, counted in the summary and warned about with file and line).")
_SEED = typer.Option(0, help="Seed of the sample draw, the split into halves and the random neurons (>= 0).")
_OUT = typer.Option(..., help="Output folder (summary.json, figures, tables, result/); must not hold a finished run.")


def _write_location(stage: Path, loc: CNLLocation, extra: dict) -> None:
    write_outputs(stage, loc, figures={"located_neurons": loc.located_figure(), "convergence": loc.convergence_figure(),
                                       "scores_heatmap": loc.heatmap()},
                  tables={"convergence": loc.to_frame()}, extra=extra)


@contextmanager
def _stage(out: Path, overwrite: bool, rank: int) -> Iterator[StagedOutput]:
    """``staged_output`` on rank 0; other torchrun ranks write nothing (only their checkpoints)."""
    if rank == 0:
        with staged_output(out, overwrite=overwrite) as stage:
            yield stage
    else:
        yield StagedOutput(out=Path(out), path=Path(out), checkpoints=checkpoint_dir(out))


@cnl_app.command("locate")
def locate(
    model: str = _MODEL,
    device: str = device_option(),
    dtype: str = dtype_option(),
    dataset: str = typer.Option(..., help="Task: gsm8k, svamp, mbpp, emotion, imdb (or a registered one)."),
    data_dir: Path | None = _DATA_DIR,
    n: int = typer.Option(200, help="Samples to score (>= 2; split into two halves for the split-half test)."),
    sigma: float = typer.Option(3.0, help="σ of the mask |score − mean| > σ·spread, > 0 (paper: 3, 6, 12)."),
    spread: str = typer.Option("std", help="std (default) or var (the paper's literal text)."),
    split: str = typer.Option("train", help="Dataset split to locate on."),
    method: str = typer.Option("ig", help="ig (exact, S steps per layer) or the cheaper estimators joint / grad_x_act."),
    steps: str = typer.Option("20", help="IG steps S (>= 1), or auto: doubled per layer until completeness error <= --tol."),
    rule: str = typer.Option("midpoint", help="Quadrature rule (see docs/kn.md); gauss_legendre suits --steps auto."),
    tol: float = typer.Option(0.01, help="Completeness target of --steps auto (0.01 = 1 %)."),
    layers_: str | None = typer.Option(None, "--layers", help="Layers to score, e.g. '0-29' or '10,12' (default all)."),
    max_answer_tokens: int = typer.Option(8, help="Answer tokens scored per sample (the first ones, >= 1)."),
    batch_rows: str = batch_rows_option(),
    max_memory: str | None = max_memory_option(),
    sample_batch: int = typer.Option(1, help="Samples whose IG rows share forward passes (exact IG; same results)."),
    convergence_points: int = typer.Option(4, help="Points of the convergence curve (>= 1)."),
    checkpoint_every: int = typer.Option(25, help="Samples between checkpoints (>= 1)."),
    checkpoint_dir_: Path | None = typer.Option(None, "--checkpoint-dir",
                                                help="Checkpoint folder (default .<out>.checkpoints beside --out)."),
    resume: bool = typer.Option(True, help="Resume from the checkpoints of an interrupted run (--no-resume: start over)."),
    shard: str | None = typer.Option(None, help="i/n: score only shard i of n; merge the runs with `tlcap cnl merge`."),
    distributed: bool = typer.Option(False, help="Under torchrun: shard by rank, all-reduce (gloo on CPU); rank 0 writes."),
    strict: bool = _STRICT,
    seed: int = _SEED,
    out: Path = _OUT,
    overwrite: bool = overwrite_option(),
) -> None:
    """Score every MLP neuron on a dataset (CNL eq. 7), select by σ-mask, test split-half stability."""
    ig = IGConfig(method=method, steps=parse_steps(steps), rule=rule, tol=tol, layers=layers(layers_),
                  batch_rows=batch_rows_value(batch_rows, max_memory), max_memory=max_memory, sample_batch=sample_batch)
    cfg = CNLConfig(ig=ig, sigma=sigma,
                    spread=spread, max_answer_tokens=max_answer_tokens, convergence_points=convergence_points, seed=seed)
    check_int("n", n, min=2)
    check_int("checkpoint_every", checkpoint_every, min=1)
    parse_shard(shard)
    if shard is not None and distributed:
        raise InvalidConfigError("--shard and --distributed exclude each other (torchrun shards by rank)")
    get_task(dataset)
    layers_fit(model_shapes(model), cfg.ig.layers, "layers", "--layers")
    rank = int(os.environ.get("RANK", "0")) if distributed else 0
    with print_warnings(), _stage(out, overwrite, rank) as stage:
        seed_everything(seed)
        samples = load_task(dataset, data_dir, split, n, seed, strict=strict)
        if len(samples) < 2:
            raise EmptyDatasetError(f"{dataset} {split!r} has {len(samples)} usable sample (asked for {n}); the split-half "
                                    "test needs at least 2: point --data-dir at a file with more samples")
        m = load(model, device, dtype)
        t0 = time.perf_counter()
        run = RunControl(checkpoint_dir=str(checkpoint_dir_ or stage.checkpoints), checkpoint_every=checkpoint_every,
                         resume=resume, shard=shard, distributed=distributed)
        parts = score_parts(m, samples, config=cfg, task=dataset, run=run)
        wall = time.perf_counter() - t0
        if rank != 0:
            return
        report = DataReport.of(samples, dataset, split)
        extra = {"model": model, "split": split, "seed": seed, "data_dir": str(data_dir) if data_dir else None,
                 "wall_seconds": wall, "samples_per_s": len(samples) / wall if wall else None}
        save_parts(parts, stage.path / "parts")
        prov = Provenance.collect(m, cfg, seed)
        if shard is not None:
            ds = merge_scores(list(parts.values())).with_provenance(prov)
            write_outputs(stage.path, ds, extra={**extra, "partial": True, "shard": shard, "parts": sorted(parts),
                                                 "data": report.summary()})
            typer.echo(skips_line(report.summary(), ds.skipped))
            typer.echo(f"partial sums in {stage.out / 'parts'}; merge with `tlcap cnl merge --parts ... --out DIR`")
            return
        loc = finalize(parts, cfg.sigma, cfg.spread, config=cfg, data=report).with_provenance(prov)
        _write_location(stage.path, loc, extra)
    typer.echo(skips_line(loc.data, loc.skipped))
    typer.echo(f"{loc.n_neurons} neurons ({100 * loc.neuron_ratio:.3f} %), split overlap {loc.split_overlap:.3f}, "
               f"IoU {loc.split_iou:.3f}; wrote {stage.out}")


@cnl_app.command("merge")
def merge(
    parts: list[Path] = typer.Option(..., help="--out folders of `locate --shard i/n` runs (repeat the option; each once)."),
    sigma: float = typer.Option(3.0, help="σ of the mask |score − mean| > σ·spread, > 0."),
    spread: str = typer.Option("std", help="std (default) or var."),
    out: Path = _OUT,
    overwrite: bool = overwrite_option(),
) -> None:
    """Merge shard runs exactly (integer sums) and select the located neurons; refuses shards given twice."""
    CNLConfig(sigma=sigma, spread=spread)
    with print_warnings(), staged_output(out, overwrite=overwrite) as stage:
        runs = [load_parts(Path(p) / "parts" if (Path(p) / "parts").is_dir() else p) for p in parts]
        merged = merge_parts(runs, names=[str(p) for p in parts])
        shards = sorted({r.shard[1] for run in runs for r in run.values()})
        if len(shards) == 1 and shards[0] > len(runs):
            warnings.warn(DataWarning(f"merged {len(runs)} of {shards[0]} shards: the result covers part of the data"),
                          stacklevel=1)
        save_parts(merged, stage.path / "parts")
        loc = finalize(merged, sigma, spread)
        loc = loc.with_provenance(Provenance.collect(None, loc.config))
        _write_location(stage.path, loc, {"merged_from": [str(p) for p in parts]})
    typer.echo(f"{loc.n_neurons} neurons ({100 * loc.neuron_ratio:.3f} %), split overlap {loc.split_overlap:.3f}; "
               f"wrote {stage.out}")


@cnl_app.command("erase")
def erase(
    model: str = _MODEL,
    device: str = device_option(),
    dtype: str = dtype_option(),
    dataset: str = typer.Option(..., help="Task evaluated."),
    data_dir: Path | None = _DATA_DIR,
    neurons: Path = typer.Option(..., help="--out folder (or summary.json) of `tlcap cnl locate`."),
    sigma: str | None = typer.Option(None, help="Re-threshold the saved scores at these σ (e.g. 3,6,12; CNL Table 3) "
                                                "instead of erasing the located set; nothing is re-scored."),
    spread: str | None = typer.Option(None, help="With --sigma: std or var (default: the locate run's)."),
    n: int = typer.Option(200, help="Evaluation samples (>= 1)."),
    split: str = typer.Option("test", help="Held-out split to evaluate on."),
    n_random: int = typer.Option(3, help="Random draws (same count per layer) averaged for the baseline; 0 = none."),
    strict: bool = _STRICT,
    seed: int = _SEED,
    out: Path = _OUT,
    overwrite: bool = overwrite_option(),
) -> None:
    """Zero the located neurons' down-projection rows vs as many random neurons → accuracy (or a σ sweep)."""
    cfg = EraseConfig(n_random=n_random, seed=seed)
    sigmas = check_sigmas(floats("--sigma", sigma)) if sigma is not None else None
    if spread is not None:
        CNLConfig(spread=spread)
    check_int("n", n, min=1)
    get_task(dataset)
    src = neuron_source(neurons, allow_empty=sigmas is not None)
    src.check_model(model)
    with print_warnings(), staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        samples = load_task(dataset, data_dir, split, n, seed, strict=strict)
        m = load(model, device, dtype)
        extra = {"model": model, "split": split, "neurons_file": str(src.summary_path)}
        if sigmas is not None:
            sweep = erase_sweep(m, dataset, samples, src.location(m), sigmas, spread=spread, config=cfg, progress=True)
            write_outputs(stage.path, sweep, figures={"erase_sweep": sweep.figure()}, tables={"erase_sweep": sweep.to_frame()},
                          extra=extra)
            typer.echo(skips_line(sweep.data))
            typer.echo(f"base {sweep.base_accuracy:.3f}")
            for r in sweep.rows:
                typer.echo(f"σ={r.sigma:g}: " + ("located set empty, nothing erased" if r.empty else
                                                 f"{r.n_neurons} neurons, located erased {r.located_accuracy:.3f}, "
                                                 f"random erased {r.random_accuracy:.3f}"))
            return
        res = erase_effect(m, dataset, samples, src.neuron_set(m), config=cfg, source=src.task,
                           run=RunControl(progress=True))
        write_outputs(stage.path, res, figures={"erase": res.figure()}, tables={"erase": res.to_frame()}, extra=extra)
    typer.echo(skips_line(res.data))
    rnd = "none (--n-random 0)" if not res.random_accuracies else f"{res.random_accuracy:.3f}"
    typer.echo(f"base {res.base_accuracy:.3f}  located erased {res.located_accuracy:.3f}  random erased {rnd}")


@cnl_app.command("enhance")
def enhance(
    model: str = _MODEL,
    device: str = device_option(),
    dtype: str = dtype_option(),
    dataset: str = typer.Option(..., help="Task trained (train split) and evaluated (test split)."),
    data_dir: Path | None = _DATA_DIR,
    neurons: Path = typer.Option(..., help="--out folder (or summary.json) of `tlcap cnl locate`."),
    n_train: int = typer.Option(100, help="Training samples (train split, >= 1)."),
    n: int = typer.Option(100, help="Held-out evaluation samples (test split, >= 1)."),
    epochs: int = typer.Option(10, help="Fine-tuning epochs (>= 1)."),
    eval_epochs: str | None = typer.Option(None, help="Epochs after which to evaluate (default 1,5,10 up to --epochs, "
                                                      "and the last)."),
    lr: float = typer.Option(1e-5, help="Adam learning rate, > 0 (paper: 1e-5)."),
    modes: str = typer.Option("located,random,wo_located",
                              help="Which neurons learn: located, random, wo_located (the paper's W/o located: located "
                                   "erased, all others trained), except_frozen (all others trained, located kept)."),
    max_answer_tokens: int = typer.Option(16, help="Answer tokens in the loss (>= 1)."),
    n_random: int = typer.Option(1, help="Random sets fine-tuned in mode random (>= 1; the paper: 1). With 2 or more, "
                                         "located − random is tested against random sets, not one draw."),
    strict: bool = _STRICT,
    seed: int = _SEED,
    out: Path = _OUT,
    overwrite: bool = overwrite_option(),
) -> None:
    """Fine-tune only the located neurons vs random neurons vs all others (CNL Table 2); held-out accuracy."""
    cfg = EnhanceConfig(epochs=epochs, eval_epochs=ints("--eval-epochs", eval_epochs) if eval_epochs else None, lr=lr,
                        modes=tuple(x.strip() for x in modes.split(",") if x.strip()),
                        max_answer_tokens=max_answer_tokens, seed=seed, n_random=n_random)
    check_int("n_train", n_train, min=1)
    check_int("n", n, min=1)
    get_task(dataset)
    src = neuron_source(neurons)
    src.check_model(model)
    with print_warnings(), staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        train = load_task(dataset, data_dir, "train", n_train, seed, strict=strict)
        test = load_task(dataset, data_dir, "test", n, seed, strict=strict)
        m = load(model, device, dtype)
        res = enhance_effect(m, dataset, train, test, src.neuron_set(m), config=cfg, source=src.task)
        write_outputs(stage.path, res, figures={"enhance": res.figure()}, tables={"enhance": res.to_frame()},
                      extra={"model": model, "neurons_file": str(src.summary_path)})
    typer.echo(skips_line(res.data["train"]) + " (train)")
    typer.echo(skips_line(res.data["test"]) + " (test)")
    typer.echo(f"base {res.base_accuracy:.3f}\n{res.table().to_string()}")


@cnl_app.command("cross")
def cross(
    model: str = _MODEL,
    device: str = device_option(),
    dtype: str = dtype_option(),
    neurons: list[str] = typer.Option(..., help="NAME=path per dataset (a `tlcap cnl locate` --out folder or summary.json; "
                                                "NAME a task; repeat the option)."),
    data_dir: Path | None = _DATA_DIR,
    n: int = typer.Option(100, help="Evaluation samples per dataset (test split, >= 1)."),
    n_random: int = typer.Option(3, help="Random draws for the erase baseline (>= 0; 0 = none)."),
    enhance: bool = typer.Option(False, help="Also fine-tune and measure the enhance matrices (slow)."),
    train_on: str = typer.Option("source", help="With --enhance: source (the paper's App. G: A's neurons trained on A's "
                                                "data, evaluated on every B) or target (A's neurons trained on B's data)."),
    modes: str = typer.Option("located,random,wo_located", help="With --enhance: modes compared (see `cnl enhance`)."),
    n_train: int = typer.Option(50, help="With --enhance: training samples per dataset (>= 1)."),
    epochs: int = typer.Option(1, help="With --enhance: fine-tuning epochs (>= 1)."),
    lr: float = typer.Option(1e-5, help="With --enhance: Adam learning rate (> 0)."),
    strict: bool = _STRICT,
    seed: int = _SEED,
    out: Path = _OUT,
    overwrite: bool = overwrite_option(),
) -> None:
    """Overlap matrix between datasets' neuron sets, and the erase (/enhance) effect of each on every other."""
    cfg = CrossConfig(n_random=n_random, seed=seed, train_on=train_on, epochs=epochs, lr=lr,
                      modes=tuple(x.strip() for x in modes.split(",") if x.strip()))
    check_int("n", n, min=1)
    check_int("n_train", n_train, min=1)
    sources = {}
    for spec in neurons:
        if "=" not in spec:
            raise InvalidConfigError(f"--neurons takes NAME=path/to/summary.json, got {spec!r}")
        name, path = spec.split("=", 1)
        get_task(name)
        if name in sources:
            raise InvalidConfigError(f"--neurons names {name!r} twice; give each dataset once")
        sources[name] = neuron_source(Path(path))
        sources[name].check_model(model)
    with print_warnings(), staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        evals = {k: load_task(k, data_dir, "test", n, seed, strict=strict) for k in sources}
        trains = {k: load_task(k, data_dir, "train", n_train, seed, strict=strict) for k in sources} if enhance else None
        m = load(model, device, dtype)
        located = {k: s.neuron_set(m) for k, s in sources.items()}
        res = cross_dataset(m, located, evals, train_sets=trains, config=cfg, progress=True)
        figs = {"located_neurons": located_sets_figure(located)}
        for which in ("overlap", "iou", "erase_delta", "random_delta", *(f"enhance_{x}" for x in res.enhance_modes)):
            figs[f"cross_{which}"] = res.matrix_figure(which)
        write_outputs(stage.path, res, figures=figs, tables={"cross": res.to_frame()}, extra={"model": model})
    typer.echo(res.to_frame().to_string())
    if res.transfer():
        typer.echo("enhance transfer (mean change on datasets not trained on, App. G): "
                   + ", ".join(f"{k} {v:+.3f}" for k, v in res.transfer().items()))
