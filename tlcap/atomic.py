"""Files written whole or not at all, checksummed, readable by the group; disk errors in one line.

Every file tlcap reads back (results, checkpoints, stage records, cached draws and calibrations)
is written through these helpers:

- **Atomic**: the bytes go to a hidden temporary file beside the target (``.<name>.tmp-<pid>-<r>``),
  which one ``os.replace`` puts in place. A process killed at any point (even ``SIGKILL``) leaves
  the old file or the new one, never a mix; the temporary file it may leave is never read (a
  later write of the same file removes those of dead processes).
- **Readable by the group**: files get the mode ``0666 & ~umask`` (``0644`` under the usual
  umask ``022``) like any file a program creates, not the ``0600`` of temporary files.
- **Checksummed**: :func:`json_digest` is the sha256 of a canonical JSON rendering; results and
  checkpoints record it beside their content and refuse a file whose content does not match.
- **Disk errors**: :func:`storage_error` turns ``ENOSPC`` (disk full), ``EFBIG`` (``ulimit -f``),
  ``EDQUOT``, ``EROFS`` and ``EACCES`` into a :class:`~tlcap.errors.StorageError` whose one-line
  message names the file and what to do.

Example:
    >>> import tempfile
    >>> import safetensors.torch
    >>> folder = Path(tempfile.mkdtemp())
    >>> facts = [{"prompt": "The capital of France is", "target": " Paris"}]
    >>> write_text_atomic(folder / "facts.json", json.dumps(facts)).name
    'facts.json'
    >>> tensors = {"scores": torch.zeros(2, 3)}
    >>> path = write_bytes_atomic(folder / "tensors.safetensors", safetensors.torch.save(tensors))
    >>> sorted(p.name for p in folder.iterdir())      # no temporary file left behind
    ['facts.json', 'tensors.safetensors']
    >>> json.loads((folder / "facts.json").read_text()) == facts
    True
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from tlcap.errors import StorageError

# errno values that mean "this place cannot take the file" (not a bug of tlcap's).
STORAGE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EFBIG: "it would pass the file-size limit (ulimit -f)",
                  errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                  errno.EPERM: "the operation is not permitted"}
if hasattr(errno, "EDQUOT"):
    STORAGE_ERRNOS[errno.EDQUOT] = "the disk quota is exhausted"


def file_mode() -> int:
    """The mode a new file gets under the process's umask: ``0666 & ~umask`` (``0644`` for umask 022).

    Returns:
        The permission bits (an ``int`` such as ``0o644``); reading the umask leaves it unchanged.
    """
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def json_digest(obj: Any) -> str:
    """sha256 hex digest of ``obj`` as canonical JSON (sorted keys, no spaces, ASCII escapes, NaN kept as NaN).

    Args:
        obj: Any JSON-serialisable value (dicts, lists, strings, numbers, NaN).

    Returns:
        The 64-character lowercase sha256 hex digest.
    """
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_leftovers(folder: str | Path, prefix: str) -> None:
    """Remove ``folder/<prefix><pid>-...`` files and folders whose process no longer runs.

    A process killed while writing leaves its temporary file (or staging folder) behind; it is
    never read, and the next write of the same target removes it here.

    Args:
        folder: The folder to clean (a missing or unreadable folder is ignored).
        prefix: The name prefix followed by the writer's pid, e.g. ``".results.json.tmp-"``.
    """
    try:
        leftovers = list(Path(folder).glob(f"{prefix}*"))
    except OSError:
        return
    for tmp in leftovers:
        try:
            pid = int(tmp.name[len(prefix):].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (module docstring), mode ``0666 & ~umask``.

    Args:
        path: The target file (its folder must exist).
        data: The whole content.

    Returns:
        ``path``.

    Raises:
        StorageError: the disk is full, a file-size limit is reached, the place is read-only.
    """
    path = Path(path)
    remove_leftovers(path.parent, f".{path.name}.tmp-")
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except OSError as exc:
        raise storage_error(exc, path) from None
    finally:
        if tmp.exists():
            tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`write_bytes_atomic`.

    Args:
        path: The target file (its folder must exist).
        text: The whole content, encoded as UTF-8.

    Returns:
        ``path`` (as a :class:`~pathlib.Path`).
    """
    return write_bytes_atomic(path, text.encode("utf-8"))


def make_readable(path: str | Path) -> None:
    """Give a file another library created (e.g. with mode ``0600``) the usual mode ``0666 & ~umask``.

    Args:
        path: The existing file to chmod.
    """
    os.chmod(path, file_mode())


def storage_error(exc: OSError, path: str | Path | None = None, then: str = "") -> OSError:
    """``exc`` as a one-line :class:`StorageError` when it is a disk / permission error, else ``exc``.

    Args:
        exc: The error raised by a write.
        path: The file or folder being written (default: the error's own file name).
        then: What the user can do besides freeing space (e.g. "rerun the same command to resume").

    Returns:
        A :class:`StorageError` (or ``exc`` unchanged when it is another kind of error).
    """
    if isinstance(exc, StorageError):
        if not then or then in str(exc):
            return exc
        more = StorageError(f"{exc}; {then}")
        more.errno = exc.errno
        return more
    if exc.errno not in STORAGE_ERRNOS:
        return exc
    where = path if path is not None else (exc.filename or "a file")
    way = {errno.ENOSPC: "free some space", errno.EFBIG: "raise the limit (ulimit -f unlimited)",
           errno.EROFS: "choose a writable folder", errno.EACCES: "choose a folder you can write",
           errno.EPERM: "choose a folder you can write"}.get(exc.errno, "free some space")
    err = StorageError(f"cannot write {where}: {STORAGE_ERRNOS[exc.errno]} ({exc.strerror}); {way}"
                       + (f"; {then}" if then else ""))
    err.errno = exc.errno
    return err


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a disk-full / file-size / read-only / permission error (or a :class:`StorageError`).

    Args:
        exc: Any exception.

    Returns:
        ``True`` for a :class:`StorageError` or an ``OSError`` whose errno is in :data:`STORAGE_ERRNOS`.
    """
    return isinstance(exc, StorageError) or (isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS)


__all__ = ["write_bytes_atomic", "write_text_atomic", "remove_leftovers", "make_readable", "file_mode", "json_digest",
           "storage_error", "is_storage_error", "STORAGE_ERRNOS"]
