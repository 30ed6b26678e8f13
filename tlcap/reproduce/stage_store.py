"""The stage cache on disk: complete stage folders, checksummed records, one computing process per stage.

- **Folders.** A stage's results are saved into ``CACHE/.<key>.tmp-<pid>/`` with a ``stage.json``
  written last and the folder renamed to ``CACHE/<key>/``: a folder that exists is complete. A
  process killed while saving leaves its ``.tmp-`` folder, never read and removed by the next
  save of that stage.
- **Records.** ``stage.json`` carries its format version and the sha256 of its own content
  (:func:`tlcap.atomic.json_digest`); a record that does not match, or is of a newer format, is a
  :class:`~tlcap.errors.CheckpointError` naming the folder to delete.
- **Locks.** A process computes a stage only while it holds ``CACHE/.locks/<key>.lock``
  (``flock``, released by the kernel when the process ends, even by ``SIGKILL``). Another process
  that wants the same stage waits, then loads what the first one saved, so two runs sharing a
  cache (or the workers of ``--jobs N``) compute each stage once; if the holder is killed, the
  waiter takes over and resumes from the stage's checkpoint. Where ``fcntl`` is missing
  (Windows) there is no lock: a stage may be computed twice, with the same result.

Example:
    >>> import tempfile
    >>> from tlcap.metrics.sets import NeuronSet
    >>> cache, key = Path(tempfile.mkdtemp()), "demo-0123456789abcdef"
    >>> outputs, meta = {"located": NeuronSet.from_list([(0, 1)], shape=(2, 256))}, {"stage": "demo"}
    >>> with stage_lock(cache, key, on_wait=lambda: print("waiting")):
    ...     if not (cache / key / STAGE_FILE).exists():
    ...         save_stage(cache, key, outputs, meta)
    True
    >>> load_stage(cache / key)
    {'located': NeuronSet(neurons=((0, 1),), shape=(2, 256))}
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tlcap.atomic import file_mode, json_digest, remove_leftovers, storage_error, write_text_atomic
from tlcap.errors import CheckpointError
from tlcap.results import Result, load_result

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

STAGE_FILE = "stage.json"
STAGE_FORMAT = 2  # 2: format and json_sha256 in stage.json; 1: neither (still loaded)
LOCKS = ".locks"


@contextmanager
def stage_lock(cache_dir: Path, key: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the lock of stage ``key`` in ``cache_dir`` (blocking; ``on_wait()`` once if another process holds it).

    Args:
        cache_dir: The stage cache (the lock file is ``cache_dir/.locks/<key>.lock``).
        key: The stage's cache key.
        on_wait: Called once, before blocking, when another process holds the lock.

    Yields:
        ``None``, while the lock is held; it is released when the block exits.

    Raises:
        StorageError: the cache cannot be written (read-only, full).
    """
    folder = Path(cache_dir) / LOCKS
    path = folder / f"{key}.lock"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, file_mode())
    except OSError as exc:
        raise storage_error(exc, path, "the stages already in the cache are intact") from None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def save_stage(cache_dir: Path, key: str, outputs: Mapping[str, Result], meta: dict[str, Any]) -> bool:
    """Save ``outputs`` and ``stage.json`` (``meta`` + results, format, checksum) as ``cache_dir/key``.

    Returns:
        Whether this call put the folder in place (False: another process had saved it already;
        its results are the same by construction).

    Args:
        cache_dir: The stage cache (created when missing).
        key: The stage's cache key (the folder's name).
        outputs: ``{result name: result}``, each saved into its own subfolder.
        meta: Fields of ``stage.json`` besides ``results``, ``format`` and ``json_sha256`` (JSON-serialisable).

    Raises:
        StorageError: the cache cannot be written; nothing of this stage is left in it.
    """
    cache_dir = Path(cache_dir)
    folder = cache_dir / key
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        remove_leftovers(cache_dir, f".{key}.tmp-")
        tmp = cache_dir / f".{key}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise storage_error(exc, folder, "the stages already in the cache are intact") from None
    try:
        for r, res in outputs.items():
            res.save(tmp / r)
        record = json.loads(json.dumps({**meta, "results": list(outputs), "format": STAGE_FORMAT}))
        record["json_sha256"] = json_digest(record)
        write_text_atomic(tmp / STAGE_FILE, json.dumps(record, indent=1))
        if folder.exists():
            return False
        os.replace(tmp, folder)
        return True
    except OSError as exc:
        raise storage_error(exc, folder, "the stages already in the cache are intact") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_record(folder: Path) -> dict[str, Any]:
    """The checked ``stage.json`` of a cached stage folder.

    Args:
        folder: The stage folder, ``cache_dir/<key>``.

    Returns:
        The record's fields (without ``json_sha256``); ``results`` lists the result names.

    Raises:
        CheckpointError: not JSON, not matching its sha256, or of a newer format.
    """
    path = Path(folder) / STAGE_FILE
    way = f"delete {folder} to recompute that stage"
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("results"), list):
            raise ValueError("no list of results")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc}); {way}") from None
    fmt = record.get("format", 1)
    if not isinstance(fmt, int) or fmt > STAGE_FORMAT:
        raise CheckpointError(f"{path} is of stage format {fmt}, written by a newer tlcap (this one reads 1 to "
                              f"{STAGE_FORMAT}); use that tlcap or another --cache-dir")
    if fmt >= 2:
        want = record.pop("json_sha256", None)
        if want != json_digest(record):
            raise CheckpointError(f"{path} does not match its own sha256 (edited or damaged); {way}")
    return record


def load_stage(folder: Path) -> dict[str, Result]:
    """The results of a cached stage folder (each checked by :func:`tlcap.load_result`).

    Args:
        folder: The stage folder, ``cache_dir/<key>``.

    Returns:
        ``{result name: result}`` in the record's order.

    Raises:
        CheckpointError: the record or a result is corrupt (see :func:`read_record`).
    """
    return {r: load_result(Path(folder) / r) for r in read_record(folder)["results"]}


__all__ = ["STAGE_FILE", "STAGE_FORMAT", "stage_lock", "save_stage", "read_record", "load_stage"]
