"""Helpers shared by CLI commands: the output-folder policy, writing outputs, model loading, seeding.

Every command follows parse → config → call → write outputs::

    cfg = KNConfig(steps=steps, ...)                       # bad option: one-line error, exit 2
    with staged_output(out, overwrite=overwrite) as stage: # --out checked before any work
        m = load(model)
        res = locate_knowledge_neurons(m, prompt, target, config=cfg)
        write_outputs(stage.path, res, figures={"kn_heatmap": res.heatmap()})

Output-folder policy (:func:`staged_output`):

- ``--out`` is checked before any model load or compute: it must not be a file, its nearest
  existing parent must be writable, and if it already holds a finished run (a ``summary.json``)
  the command refuses with :class:`OutputExistsError` unless ``--overwrite``.
- Outputs are written into a hidden staging folder beside ``--out``
  (``.<name>.staging-<pid>``) and moved into place when the command succeeds, ``summary.json``
  last: a failing or interrupted command leaves no ``--out`` (and no half-written one) behind.
- Commands that checkpoint for resume keep their checkpoints in ``stage.checkpoints``
  (``.<name>.checkpoints`` beside ``--out``), which survives failures and interrupts and is reused
  by the next run with the same ``--out``; on success it is removed, or moved into
  ``--out/checkpoints`` with ``keep_checkpoints=True``.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import typer

from tlcap.atomic import is_storage_error, storage_error, write_text_atomic
from tlcap.cli import note_interrupt
from tlcap.cli._options import batch_rows_option, batch_rows_value, device_option, dtype_option, max_memory_option, model_option  # noqa: E402,F401,E501
from tlcap.errors import InvalidConfigError, OutputExistsError, OutputPathError
from tlcap.models import Model, load_model
from tlcap.results import Result
from tlcap.runtime.device import dtype_name, resolve_device, resolve_dtype
from tlcap.viz.export import save_figures

SUMMARY = "summary.json"
MANIFEST = ".tlcap-run.json"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def out_dir(path: Path) -> Path:
    """Create ``path`` (old style: no staging; commands move to :func:`staged_output`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def overwrite_option() -> Any:
    """The ``--overwrite`` option every command that writes ``--out`` takes."""
    return typer.Option(False, "--overwrite", help="Replace the outputs of a finished run already in --out.")


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, torch.Tensor):
        return _clean(o.tolist())
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    return o


def write_summary(out: Path, summary: dict[str, Any]) -> Path:
    """Write ``out/summary.json`` (NaN/inf become null) and echo where it went."""
    path = write_text_atomic(Path(out) / SUMMARY, json.dumps(_clean(summary), indent=1))
    typer.echo(f"wrote {path}")
    return path


def check_output(out: Path, overwrite: bool = False) -> Path:
    """Check ``--out`` before any work (see the module docstring); returns it as a Path.

    Raises:
        OutputPathError: ``out`` is a file, or no folder can be created there.
        OutputExistsError: ``out`` holds a finished run (``summary.json``) and not ``overwrite``.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"--out {out} is a file; give a folder path")
    parent = out if out.exists() else out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"--out {out} cannot be created: {parent} is a file; give a folder path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"--out {out} cannot be written ({parent} is read-only); choose another --out")
    probe_writable(parent, f"--out {out}")
    if (out / SUMMARY).exists() and not overwrite:
        raise OutputExistsError(
            f"{out} already holds a finished run ({SUMMARY}); pass --overwrite to replace it or choose another --out"
        )
    return out


def writable_folder(path: Path, option: str) -> Path:
    """Check a folder a command writes into and may reuse (``reproduce --out``): not a file, writable.

    Raises:
        OutputPathError: ``path`` is a file, below a file, or nothing can be created there.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{option} {path} is a file; give a folder path")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{option} {path} cannot be created: {parent} is a file; give a folder path")
    probe_writable(parent, f"{option} {path}")
    return path


def probe_writable(folder: Path, what: str) -> None:
    """Create and remove a folder in ``folder``: permissions alone do not tell (root, ``/proc``, a read-only mount).

    Raises:
        OutputPathError: nothing can be created there.
    """
    try:
        probe = Path(tempfile.mkdtemp(prefix=".tlcap-probe-", dir=folder))
        probe.rmdir()
    except OSError as exc:
        raise OutputPathError(f"{what} cannot be written ({folder}: {exc.strerror or exc}); choose another folder") from None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) inside a command, with what the user can do next (``hint``, printed at the exit)."""

    def __init__(self, hint: str) -> None:
        super().__init__(hint)
        self.hint = hint
        note_interrupt(hint)


def resume_hint(checkpoints: Path) -> str:
    """What an interrupted or failed run says about resuming from ``checkpoints``."""
    if checkpoints.exists() and any(p.is_file() for p in checkpoints.rglob("*")):
        return f"rerun the same command to resume: the work done so far is kept in {checkpoints}"
    return "nothing was kept; rerun the same command to start over"


@dataclass(frozen=True)
class StagedOutput:
    """Where a command writes: ``path`` (staging), ``out`` (final), ``checkpoints`` (kept on failure)."""

    out: Path
    path: Path
    checkpoints: Path


def checkpoint_dir(out: Path) -> Path:
    """The resume checkpoints of a run writing ``out``: ``.<name>.checkpoints`` beside it."""
    out = Path(out)
    return out.parent / f".{out.name}.checkpoints"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_staging(out: Path) -> None:
    for p in out.parent.glob(f".{out.name}.staging-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)


def _commit(stage: Path, out: Path) -> None:
    """Move the staged outputs into ``out``; ``summary.json`` and the manifest last."""
    written = sorted(p.name for p in stage.iterdir())
    (stage / MANIFEST).write_text(json.dumps({"entries": written}))
    if not out.exists():
        os.replace(stage, out)
        return
    old_manifest = out / MANIFEST
    previous: list[str] = []
    if old_manifest.exists():
        try:
            previous = list(json.loads(old_manifest.read_text()).get("entries", []))
        except (ValueError, AttributeError):
            previous = []
    (out / SUMMARY).unlink(missing_ok=True)  # the folder is "unfinished" until the new summary lands
    last = [n for n in (SUMMARY, MANIFEST) if (stage / n).exists()]
    for name in [n for n in sorted(p.name for p in stage.iterdir()) if n not in last] + last:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.replace(stage / name, target)
    for name in previous:  # outputs of the replaced run that this run did not write
        stale = out / name
        if name in written or name == MANIFEST or "/" in name or name in ("", ".", ".."):
            continue
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.exists():
            stale.unlink()
    shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def staged_output(out: Path, overwrite: bool = False, keep_checkpoints: bool = False) -> Iterator[StagedOutput]:
    """Check ``--out``, stage the outputs, and move them into place only on success.

    Args:
        out: The ``--out`` folder.
        overwrite: Allow replacing a finished run in ``out``.
        keep_checkpoints: On success, move ``stage.checkpoints`` into ``out/checkpoints``
            instead of deleting it.

    Yields:
        A :class:`StagedOutput`; write every output under ``stage.path``.

    Raises:
        OutputPathError, OutputExistsError: from :func:`check_output`, before any work.
    """
    out = check_output(out, overwrite)
    created = [p for p in reversed(out.parents) if not p.exists()]  # parents this run creates
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out)
    path = out.parent / f".{out.name}.staging-{os.getpid()}"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir()
    stage = StagedOutput(out=out, path=path, checkpoints=checkpoint_dir(out))
    done = False
    try:
        try:
            yield stage
            if keep_checkpoints and stage.checkpoints.exists():
                os.replace(stage.checkpoints, path / "checkpoints")
            _commit(path, out)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted; --out {out} is unchanged; {resume_hint(stage.checkpoints)}") from None
        except OSError as exc:
            if not is_storage_error(exc):
                raise
            raise storage_error(exc, then=f"--out {out} is unchanged; {resume_hint(stage.checkpoints)}") from None
        done = True
        if stage.checkpoints.exists():
            shutil.rmtree(stage.checkpoints, ignore_errors=True)
    finally:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        if not done:
            for p in reversed(created):  # deepest first; only folders left empty
                try:
                    p.rmdir()
                except OSError:
                    break


def write_outputs(
    out: Path,
    result: Result,
    figures: Mapping[str, Any] | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
    extra: Mapping[str, Any] | None = None,
    result_dir: str = "result",
) -> dict[str, Any]:
    """Write a command's outputs into ``out`` (normally ``stage.path``); returns the summary.

    Writes ``out/<result_dir>/`` (``result.save``) first, each table as ``<stem>.csv``, each figure
    as ``<stem>.html`` + ``.png`` (:func:`tlcap.viz.export.save_figures`: one export bounded in time
    and memory; HTML only when no PNG exporter is available or it fails), and ``summary.json`` =
    ``result.summary()`` + ``extra`` + the lists of figure and table files + ``provenance`` (the
    result's, as a dict). Every file is written whole or not at all (:mod:`tlcap.atomic`).

    Args:
        out: Folder to write into.
        result: The command's result.
        figures: Stem → plotly figure.
        tables: Stem → DataFrame.
        extra: More summary entries (e.g. the command's own settings).
        result_dir: Sub-folder of the saved result.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / result_dir)  # the result first: figures come last and are bounded (tlcap.viz.export)
    csvs: list[str] = []
    for stem, table in (tables or {}).items():
        write_text_atomic(out / f"{stem}.csv", table.to_csv(index=False))
        csvs.append(f"{stem}.csv")
    written = [p.name for paths in save_figures(dict(figures or {}), out).values() for p in paths]
    summary = {**result.summary(), **(extra or {}), "figures": written, "tables": csvs,
               "provenance": result.provenance.to_dict() if result.provenance is not None else None}
    write_text_atomic(out / SUMMARY, json.dumps(_clean(summary), indent=1))
    return summary


def split_devices(device: str | None) -> tuple[str | None, int | None]:
    """``--device cuda*N`` → ``("cuda", N)`` (the model split over N GPUs); any other value → ``(device, None)``.

    Raises:
        InvalidConfigError: ``cuda*N`` with N not an integer >= 1.
    """
    text = (device or "").strip().lower()
    if not text.startswith("cuda*"):
        return device, None
    n = text[len("cuda*"):]
    if not n.isdigit() or int(n) < 1:
        raise InvalidConfigError(f"device (--device) {device!r}: write cuda*N with N >= 1 GPUs, e.g. cuda*4")
    return "cuda", int(n)


def check_device_dtype(device: str | None, dtype: str | None) -> None:
    """``--device`` and ``--dtype`` checked before any other option that needs the model's config."""
    resolve_device(split_devices(device)[0]), resolve_dtype(dtype)


def load(model: str, device: str | None = None, dtype: str | None = None) -> Model:
    """Load ``model`` on ``device`` in ``dtype`` (both checked first: a bad one is a one-line error).

    ``device="cuda*N"`` splits the model's layers over N GPUs (:mod:`tlcap.models.placement`); under
    ``torchrun``, ``cuda`` (or ``auto`` on a GPU machine) is ``cuda:LOCAL_RANK``.
    """
    device, n_devices = split_devices(device)
    rank = os.environ.get("LOCAL_RANK")
    if rank is not None and not n_devices and (device or "auto").strip().lower() in ("cuda", "auto") \
            and torch.cuda.is_available():
        device = f"cuda:{int(rank)}"  # under torchrun each process takes its own GPU
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    where = f"{dev} x{n_devices}" if n_devices else str(dev)
    typer.echo(f"loading {model} ({where}, {dtype_name(dt)}) ...", err=True)
    return load_model(model, device=dev, dtype=dt, **({"n_devices": n_devices} if n_devices else {}))
