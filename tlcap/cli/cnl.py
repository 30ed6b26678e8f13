"""``tlcap cnl``: locate capability neurons on datasets (CNL) and test them.

Commands: ``locate`` (σ-mask, split-half, convergence; ``--shard i/n`` partial runs and
``--distributed`` under torchrun), ``merge`` (shard runs → located set), ``erase``, ``enhance``,
``cross`` (overlap / erase / enhance matrices between datasets).

Example:
    tlcap cnl locate --model smollm2-135m --dataset emotion --n 200 --sigma 3 --out runs/emo
    tlcap cnl erase --model smollm2-135m --dataset emotion \\
        --neurons runs/emo/summary.json --n 200 --out runs/emo_erase
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from tlcap.cli import app
from tlcap.cli._common import load, out_dir, seed_everything, write_summary
from tlcap.errors import MissingFileError, TlcapError

cnl_app = typer.Typer(help="CNL: commonality neurons of a capability dataset (locate, erase, enhance, cross).",
                      no_args_is_help=True)
app.add_typer(cnl_app, name="cnl")
_DATA_DIR = typer.Option(None, help="Folder holding the dataset folders (default: $TLCAP_DATA, else the data bundled with "
                                    "tlcap, downloading the full Emotion/IMDB files if asked for more); 'hf:' for HF datasets.")


def _layers(spec: str | None) -> list[int] | None:
    if not spec:
        return None
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def _read_neurons(path: Path, shape: tuple[int, int]):  # noqa: ANN202
    from tlcap.metrics.sets import NeuronSet

    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    if not path.exists():
        raise MissingFileError(f"{path} not found; pass the summary.json written by `tlcap cnl locate`")
    data = json.loads(path.read_text())
    if "neurons" not in data:
        raise TlcapError(f"{path} has no 'neurons' list; pass the summary.json written by `tlcap cnl locate`")
    try:
        return NeuronSet.from_list(data["neurons"], shape), data.get("task", "")
    except ValueError as exc:
        raise TlcapError(f"neurons in {path} do not fit this model ({exc}); locate them on the same model") from None


def _write_location(loc, out: Path, extra: dict) -> None:  # noqa: ANN001
    from tlcap.viz.export import save_figure

    loc.save(out / "result")
    save_figure(loc.located_figure(), out, "located_neurons")
    save_figure(loc.convergence_figure(), out, "convergence")
    save_figure(loc.heatmap(), out, "scores_heatmap")
    loc.to_frame().to_csv(out / "convergence.csv", index=False)
    write_summary(out, {**loc.summary(), **extra})


@cnl_app.command("locate")
def locate(
    model: str = typer.Option("smollm2-135m", help="Model name (tlcap.load_model)."),
    dataset: str = typer.Option(..., help="Task: gsm8k, svamp, mbpp, emotion, imdb (or a registered one)."),
    data_dir: Path | None = _DATA_DIR,
    n: int = typer.Option(200, help="Samples to score (split into two halves for the split-half test)."),
    sigma: float = typer.Option(3.0, help="σ of the mask |score − mean| > σ·spread (paper: 3, 6, 12)."),
    spread: str = typer.Option("std", help="std (default) or var (the paper's literal text)."),
    split: str = typer.Option("train", help="Dataset split to locate on."),
    method: str = typer.Option("ig", help="ig (exact, S steps per layer) or the cheaper estimators joint / grad_x_act."),
    steps: int = typer.Option(20, help="IG steps S."),
    layers: str | None = typer.Option(None, help="Layers to score, e.g. '0-29' or '10,12' (default all)."),
    max_answer_tokens: int = typer.Option(8, help="Answer tokens scored per sample (the first ones)."),
    batch_rows: int = typer.Option(128, help="IG rows per forward pass (memory knob)."),
    convergence_points: int = typer.Option(4, help="Points of the convergence curve."),
    checkpoint_every: int = typer.Option(25, help="Samples between checkpoints."),
    checkpoint_dir: Path | None = typer.Option(None, help="Checkpoint folder (default OUT/checkpoints)."),
    resume: bool = typer.Option(True, help="Resume from checkpoints in the checkpoint folder."),
    shard: str | None = typer.Option(None, help="i/n: score only shard i of n; merge the runs with `tlcap cnl merge`."),
    distributed: bool = typer.Option(False, help="Under torchrun: shard by rank, all-reduce (gloo on CPU); rank 0 writes."),
    seed: int = typer.Option(0, help="Sampling / split seed."),
    out: Path = typer.Option(..., help="Output folder."),
) -> None:
    """Score every MLP neuron on a dataset (CNL eq. 7), select by σ-mask, test split-half stability."""
    from tlcap.data.tasks import load_task
    from tlcap.experiments.cnl import finalize, save_parts, score_parts

    if spread not in ("std", "var"):
        raise TlcapError(f"--spread must be std or var, got {spread!r}")
    seed_everything(seed)
    out = out_dir(out)
    samples = load_task(dataset, data_dir, split, n, seed)
    m = load(model)
    t0 = time.perf_counter()
    parts = score_parts(
        m, samples, task=dataset, seed=seed, convergence_points=convergence_points,
        checkpoint_dir=checkpoint_dir or out / "checkpoints", shard=shard, distributed=distributed, method=method,
        steps=steps, layers=_layers(layers), max_answer_tokens=max_answer_tokens, batch_rows=batch_rows,
        checkpoint_every=checkpoint_every, resume=resume,
    )
    wall = time.perf_counter() - t0
    rank = 0
    if distributed:
        import torch.distributed as dist

        rank = dist.get_rank()
    if rank != 0:
        return
    extra = {"model": model, "split": split, "seed": seed, "data_dir": str(data_dir) if data_dir else None,
             "wall_seconds": wall, "samples_per_s": len(samples) / wall if wall else None}
    if shard is not None:
        save_parts(parts, out / "parts")
        write_summary(out, {"task": dataset, "shard": shard, "partial": True, "parts": sorted(parts),
                            "n_samples": sum(p.n_samples for p in parts.values()), **extra})
        typer.echo(f"partial sums in {out / 'parts'}; merge with `tlcap cnl merge --parts ... --out DIR`")
        return
    save_parts(parts, out / "parts")
    loc = finalize(parts, sigma, spread)  # type: ignore[arg-type]
    _write_location(loc, out, extra)
    typer.echo(f"{loc.n_neurons} neurons ({100 * loc.neuron_ratio:.3f} %), split overlap {loc.split_overlap:.3f}, "
               f"IoU {loc.split_iou:.3f}")


@cnl_app.command("merge")
def merge(
    parts: list[Path] = typer.Option(..., help="OUT folders of `locate --shard i/n` runs (repeat the option)."),
    sigma: float = typer.Option(3.0), spread: str = typer.Option("std"),
    out: Path = typer.Option(..., help="Output folder."),
) -> None:
    """Merge shard runs exactly (integer sums) and select the located neurons."""
    from tlcap.experiments.cnl import finalize, load_parts, merge_parts, save_parts

    out = out_dir(out)
    runs = [load_parts(Path(p) / "parts" if (Path(p) / "parts").is_dir() else p) for p in parts]
    merged = merge_parts(runs)
    save_parts(merged, out / "parts")
    loc = finalize(merged, sigma, spread)  # type: ignore[arg-type]
    _write_location(loc, out, {"merged_from": [str(p) for p in parts]})


@cnl_app.command("erase")
def erase(
    model: str = typer.Option("smollm2-135m"),
    dataset: str = typer.Option(..., help="Task evaluated."),
    data_dir: Path | None = _DATA_DIR,
    neurons: Path = typer.Option(..., help="summary.json of `tlcap cnl locate` (or its folder)."),
    n: int = typer.Option(200, help="Evaluation samples."),
    split: str = typer.Option("test", help="Held-out split to evaluate on."),
    n_random: int = typer.Option(3, help="Random draws (same count per layer) averaged for the baseline."),
    seed: int = typer.Option(0),
    out: Path = typer.Option(...),
) -> None:
    """Zero the located neurons' down-projection rows vs as many random neurons → accuracy."""
    from tlcap.data.tasks import load_task
    from tlcap.experiments.cnl import erase_effect
    from tlcap.viz.export import save_figure

    seed_everything(seed)
    out = out_dir(out)
    samples = load_task(dataset, data_dir, split, n, seed)
    m = load(model)
    ns, src = _read_neurons(neurons, (m.n_layers, m.d_mlp))
    res = erase_effect(m, dataset, samples, ns, n_random=n_random, seed=seed, source=src, progress=True)
    res.save(out / "result")
    save_figure(res.figure(), out, "erase")
    write_summary(out, {**res.summary(), "model": model, "split": split, "neurons_file": str(neurons)})
    typer.echo(f"base {res.base_accuracy:.3f}  located erased {res.located_accuracy:.3f}  random erased {res.random_accuracy:.3f}")


@cnl_app.command("enhance")
def enhance(
    model: str = typer.Option("smollm2-135m"),
    dataset: str = typer.Option(...),
    data_dir: Path | None = _DATA_DIR,
    neurons: Path = typer.Option(..., help="summary.json of `tlcap cnl locate`."),
    n_train: int = typer.Option(100, help="Training samples (train split)."),
    n: int = typer.Option(100, help="Held-out evaluation samples (test split)."),
    epochs: int = typer.Option(10), eval_epochs: str = typer.Option("1,5,10", help="Epochs after which to evaluate."),
    lr: float = typer.Option(1e-5, help="Adam learning rate (paper: 1e-5)."),
    modes: str = typer.Option("located,random,except", help="Which neuron groups to fine-tune."),
    max_answer_tokens: int = typer.Option(16, help="Answer tokens in the loss."),
    seed: int = typer.Option(0),
    out: Path = typer.Option(...),
) -> None:
    """Fine-tune only the located neurons vs random neurons vs all other neurons; held-out accuracy."""
    from tlcap.data.tasks import load_task
    from tlcap.experiments.cnl import enhance_effect
    from tlcap.viz.export import save_figure

    seed_everything(seed)
    out = out_dir(out)
    train = load_task(dataset, data_dir, "train", n_train, seed)
    test = load_task(dataset, data_dir, "test", n, seed)
    m = load(model)
    ns, src = _read_neurons(neurons, (m.n_layers, m.d_mlp))
    ev = tuple(int(x) for x in eval_epochs.split(",") if x.strip())
    res = enhance_effect(m, dataset, train, test, ns, epochs=epochs, eval_epochs=ev, lr=lr, modes=tuple(modes.split(",")),
                         seed=seed, max_answer_tokens=max_answer_tokens, source=src)
    res.save(out / "result")
    save_figure(res.figure(), out, "enhance")
    write_summary(out, {**res.summary(), "model": model, "neurons_file": str(neurons)})
    typer.echo(res.table().to_string())


@cnl_app.command("cross")
def cross(
    model: str = typer.Option("smollm2-135m"),
    neurons: list[str] = typer.Option(..., help="NAME=path/to/summary.json per dataset (repeat the option)."),
    data_dir: Path | None = _DATA_DIR,
    n: int = typer.Option(100, help="Evaluation samples per dataset (test split)."),
    n_random: int = typer.Option(3),
    enhance: bool = typer.Option(False, help="Also fine-tune A's neurons on B's training data (slow)."),
    n_train: int = typer.Option(50), epochs: int = typer.Option(1), lr: float = typer.Option(1e-5),
    seed: int = typer.Option(0),
    out: Path = typer.Option(...),
) -> None:
    """Overlap matrix between datasets' neuron sets and the erase (/enhance) effect of each on every other."""
    from tlcap.data.tasks import load_task
    from tlcap.experiments.cnl import cross_dataset, located_sets_figure
    from tlcap.viz.export import save_figure

    seed_everything(seed)
    out = out_dir(out)
    m = load(model)
    located = {}
    for spec in neurons:
        if "=" not in spec:
            raise TlcapError(f"--neurons takes NAME=path/to/summary.json, got {spec!r}")
        name, path = spec.split("=", 1)
        located[name], _ = _read_neurons(Path(path), (m.n_layers, m.d_mlp))
    evals = {k: load_task(k, data_dir, "test", n, seed) for k in located}
    trains = {k: load_task(k, data_dir, "train", n_train, seed) for k in located} if enhance else None
    res = cross_dataset(m, located, evals, n_random=n_random, seed=seed, train_sets=trains, epochs=epochs, lr=lr, progress=True)
    res.save(out / "result")
    save_figure(located_sets_figure(located), out, "located_neurons")
    for which in ("overlap", "iou", "erase_delta", "random_delta") + (("enhance_delta",) if enhance else ()):
        save_figure(res.matrix_figure(which), out, f"cross_{which}")
    res.to_frame().to_csv(out / "cross.csv", index=False)
    write_summary(out, {"model": model, "names": list(res.names), "n_neurons": list(res.n_neurons),
                        "base_accuracy": list(res.base_accuracy), "overlap": res.overlap, "iou": res.iou,
                        "erase_delta": res.erase_delta, "random_delta": res.random_delta,
                        "enhance_delta": res.enhance_delta if enhance else None})
    typer.echo(res.to_frame().to_string())
