"""Where dataset files are found and how they are read.

Every loader resolves its files the same way (see ``docs/data.md``):

1. an explicit ``data_dir`` / ``path`` argument (a folder with one sub-folder per dataset:
   ``pararel/``, ``gsm8k/``, ``emotion/``, ...);
2. ``$TLCAP_DATA``, when it holds the dataset's folder;
3. the copy bundled with the package (:func:`bundled_dir`): whole files, except a seeded subset
   of Emotion and IMDB;
4. the full files in :func:`data_home`, downloaded there when online (:mod:`tlcap.data.fetch`),
   for a request the bundled subset cannot serve.

Files may be stored gzipped (``train.jsonl.gz``); :func:`find_file` and :func:`read_text` take
the plain name and read either.

Example:
    >>> read_text(bundled_dir() / "svamp" / "SVAMP.json")[:1]
    '['
"""

from __future__ import annotations

import gzip
import io
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from tlcap.atomic import write_text_atomic
from tlcap.errors import DataFormatError, MissingFileError

HF = "hf:"
"""Pass as ``data_dir`` to read a task from the Hugging Face hub with ``datasets`` (online)."""

_BUNDLED = Path(__file__).resolve().parent / "bundled"


def bundled_dir() -> Path:
    """The folder of the data bundled with tlcap (installed with the package).

    Returns:
        The ``tlcap/data/bundled`` folder.
    """
    return _BUNDLED


def env_data_dir() -> Path | None:
    """``$TLCAP_DATA`` as a path, or None when unset or empty.

    Returns:
        The expanded ``$TLCAP_DATA`` path, or None.
    """
    env = os.environ.get("TLCAP_DATA", "").strip()
    return Path(env).expanduser() if env else None


def data_home() -> Path:
    """Where full datasets are downloaded: ``$TLCAP_DATA``, else ``<cache>/data``.

    ``<cache>`` is the root of :func:`tlcap.models.cache_dir` (``$TLCAP_CACHE`` or
    ``~/.cache/tlcap``), so ``make clean-cache`` removes downloaded data too.

    Returns:
        The download root (it may not exist yet).
    """
    env = env_data_dir()
    if env is not None:
        return env
    root = os.environ.get("TLCAP_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "tlcap") / "data"


def is_hf(data_dir: Any) -> bool:
    """Does ``data_dir`` ask for the Hugging Face hub (``"hf:"``, also as a ``Path`` from the CLI)?

    Args:
        data_dir: A ``data_dir`` / ``--data-dir`` value (any type).

    Returns:
        True for ``"hf:"`` (any case, surrounding spaces ignored).
    """
    return isinstance(data_dir, (str, Path)) and str(data_dir).strip().lower() == HF


def local_root(data_dir: str | Path | None, folder: str) -> Path | None:
    """The data folder to read ``folder`` from: explicit ``data_dir``, else ``$TLCAP_DATA``
    when it holds ``folder``, else None (the caller falls back to the bundled copy).

    Args:
        data_dir: The folder given by the user, or None.
        folder: The dataset folder looked for in ``$TLCAP_DATA``, e.g. ``"pararel"``.

    Returns:
        The folder to read from, or None for the bundled copy.

    Raises:
        MissingFileError: ``data_dir`` is given but is not a folder.
    """
    if data_dir is not None:
        d = Path(data_dir).expanduser()
        if not d.is_dir():
            raise MissingFileError(f"data folder {d} does not exist; pass the folder holding {folder}/ "
                                   "(or omit it to use $TLCAP_DATA or the data bundled with tlcap)")
        return d
    env = env_data_dir()
    if env is not None and (env / folder).is_dir():
        return env
    return None


def find_file(path: str | Path) -> Path | None:
    """``path`` if it exists, else ``path + ".gz"`` if that exists, else None.

    Args:
        path: The file wanted.

    Returns:
        The existing file (plain or gzipped), or None when neither exists.
    """
    p = Path(path)
    if p.is_file():
        return p
    gz = p.with_name(p.name + ".gz")
    return gz if gz.is_file() else None


def resolve_file(path: str | Path | None, relative: str | Path) -> Path:
    """A single-file dataset (``relative``, e.g. ``rome/known_1000.json``): ``path`` (the file, or a
    folder holding ``relative`` or its file name), else ``$TLCAP_DATA/relative`` when it exists,
    else the bundled copy.

    Args:
        path: The file, a folder holding it, or None.
        relative: The file's path under a data folder.

    Returns:
        The existing file (possibly ``.gz``).

    Raises:
        MissingFileError: ``path`` is given but names no such file.
    """
    rel = Path(relative)
    if path is not None:
        p = Path(path).expanduser()
        cands = [p / rel, p / rel.name] if p.is_dir() else [p]
        found = next((f for f in map(find_file, cands) if f is not None), None)
        if found is None:
            raise MissingFileError(f"{rel.name} not found at {path}; pass the file (or a data folder holding {rel.as_posix()}), "
                                   "or omit it to use the copy bundled with tlcap.")
        return found
    env = env_data_dir()
    found = find_file(env / rel) if env is not None else None
    return found or need_file(_BUNDLED / rel)


def need_file(path: str | Path, hint: str = "") -> Path:
    """:func:`find_file`, raising a :class:`MissingFileError` that says what to do.

    Args:
        path: The file wanted.
        hint: What to do when it is missing (default: point ``data_dir`` at the dataset folders).

    Returns:
        The existing file (``path`` or ``path.gz``).

    Raises:
        MissingFileError: neither ``path`` nor ``path.gz`` exists.
    """
    found = find_file(path)
    if found is None:
        raise MissingFileError(f"expected {path} (or {Path(path).name}.gz)" + (f"; {hint}" if hint else
                               "; point data_dir / --data-dir at the folder holding the dataset folders"))
    return found


def read_bytes(path: str | Path) -> bytes:
    """Bytes of ``path`` (or ``path.gz``, decompressed).

    Args:
        path: The file (``path.gz`` is read when only it exists).

    Returns:
        The file's (decompressed) contents.
    """
    p = need_file(path)
    data = p.read_bytes()
    return gzip.decompress(data) if p.name.endswith(".gz") else data


def read_text(path: str | Path) -> str:
    """UTF-8 text of ``path`` (or ``path.gz``), line endings as stored (``splitlines`` handles CRLF).

    Args:
        path: The file (``path.gz`` is read when only it exists).

    Returns:
        The decoded text.
    """
    return read_bytes(path).decode("utf-8")


def text_stream(path: str | Path) -> io.StringIO:
    """A text stream over ``path`` (or ``path.gz``) that keeps line endings (for ``csv``).

    Args:
        path: The file (``path.gz`` is read when only it exists).

    Returns:
        An in-memory stream opened with ``newline=""``.
    """
    return io.StringIO(read_text(path), newline="")


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSON Lines file (or ``.jsonl.gz``), blank lines skipped.

    Records are split at ``\n`` only: ``str.splitlines`` would also split at characters such as
    U+2028 that JSON strings may hold unescaped.

    Args:
        path: The ``.jsonl`` file (``path.gz`` is read when only it exists).

    Returns:
        One decoded object per non-blank line, in file order.
    """
    return [json.loads(line) for line in read_text(path).split("\n") if line.strip()]


def read_json_rows(path: str | Path, key: str, *, missing: str, bad_json_hint: str = "") -> Any:
    """What a user's JSON dataset file holds under ``key`` (or its top-level value when that is not an object).

    The caller checks the shape (a non-empty list of its rows); this reads the file and reports the
    two failures every such loader shares.

    Args:
        path: The JSON file.
        key: The key of the rows in a top-level object (``{"facts": [...]}``).
        missing: The message when the file is not there.
        bad_json_hint: Appended to the message when the file is not JSON (e.g. where the format is documented).

    Returns:
        ``data[key]`` for an object (``None`` when absent), else the parsed value itself.

    Raises:
        MissingFileError: No such file.
        DataFormatError: Not valid JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(missing)
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path} is not valid JSON ({exc}){bad_json_hint}") from None
    return data.get(key) if isinstance(data, dict) else data


def write_json_rows(path: str | Path, key: str, rows: list[dict]) -> Path:
    """Write ``{key: rows}`` as JSON (parent folders created), readable by :func:`read_json_rows`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps({key: rows}, indent=1))  # whole or not at all (tlcap.atomic)


@lru_cache(maxsize=1)
def bundled_manifest() -> dict:
    """``bundled/MANIFEST.json``: per dataset, whether it is a subset, its counts and checksums."""
    return json.loads((_BUNDLED / "MANIFEST.json").read_text(encoding="utf-8"))


def bundled_info(name: str) -> dict | None:
    """The manifest entry of bundled dataset ``name`` (None if nothing of it is bundled).

    Args:
        name: Dataset name, e.g. ``"emotion"``.

    Returns:
        The manifest entry (a dict), or None.
    """
    return bundled_manifest()["datasets"].get(name)


__all__ = [
    "HF", "bundled_dir", "bundled_info", "bundled_manifest", "data_home", "env_data_dir", "find_file", "is_hf",
    "local_root", "need_file", "resolve_file", "read_bytes", "read_jsonl", "read_text", "text_stream",
]
