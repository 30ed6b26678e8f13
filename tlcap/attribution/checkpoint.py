"""Resume checkpoints written atomically as one file.

A checkpoint is one ``checkpoint.safetensors`` file: the tensors, with the run's state (counters,
settings, fingerprint) as JSON in the safetensors metadata, the format version and a sha256 over
the state and every tensor's bytes. It is written to a temporary file beside it and renamed into
place (one ``os.replace``, :mod:`tlcap.atomic`), so an interrupt — even ``SIGKILL`` — leaves
either the old or the new checkpoint, never sums of one with counters of the other (which would
count samples twice on resume). A file that cannot be read or does not match its checksum raises
:class:`~tlcap.errors.CheckpointError` naming the file and the way out (one of a newer format
says so). Checkpoints of format 2 (no checksum) are still resumed.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> sums = torch.arange(6.0).reshape(2, 3)
    >>> save_checkpoint(folder, {"sums": sums}, {"n_seen": 25}).name
    'checkpoint.safetensors'
    >>> tensors, state = load_checkpoint(folder)
    >>> torch.equal(tensors["sums"], sums), state
    (True, {'n_seen': 25})
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from torch import Tensor

from tlcap.atomic import storage_error, write_bytes_atomic
from tlcap.errors import CheckpointError

CHECKPOINT_FILE = "checkpoint.safetensors"
CHECKPOINT_VERSION = 3  # 3: sha256 over the state and the tensors; 2: no checksum (still resumed)
LEGACY_FILES = ("state.json", "sums.safetensors")
WAY_OUT = "rerun with --no-resume (resume=False) to start this part over, or delete the file"


def checkpoint_file(folder: str | Path) -> Path:
    """The checkpoint file of ``folder``.

    Args:
        folder: The checkpoint folder.

    Returns:
        ``folder / CHECKPOINT_FILE`` (it may not exist).
    """
    return Path(folder) / CHECKPOINT_FILE


def checkpoint_digest(tensors: dict[str, Tensor], state_json: str) -> str:
    """sha256 over the state's JSON text and every tensor's name, dtype, shape and bytes.

    Args:
        tensors: Named tensors (hashed in name order, on the CPU).
        state_json: The state as JSON text.

    Returns:
        The hex sha256 digest.
    """
    h = hashlib.sha256(state_json.encode("utf-8"))
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"\x00{name}\x01{t.dtype}\x02{tuple(t.shape)}\x03".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(folder: str | Path, tensors: dict[str, Tensor], state: dict[str, Any]) -> Path:
    """Write ``tensors`` and ``state`` (JSON-safe) as one file, atomically, with their checksum.

    Args:
        folder: The checkpoint folder (created).
        tensors: Named tensors.
        state: Everything else, JSON-serialisable.

    Returns:
        The checkpoint file.

    Raises:
        StorageError: the disk is full, a file-size limit is reached, the folder is read-only
            (the previous checkpoint is then still in place).
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, folder) from None
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    state_json = json.dumps(state)
    meta = {"tlcap_checkpoint": str(CHECKPOINT_VERSION), "state": state_json,
            "sha256": checkpoint_digest(tensors, state_json)}
    return write_bytes_atomic(folder / CHECKPOINT_FILE, save_bytes(tensors, metadata=meta))


def load_checkpoint(folder: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """The ``(tensors, state)`` saved in ``folder``, or None when it holds no checkpoint.

    Args:
        folder: The checkpoint folder.

    Returns:
        ``(tensors, state)``: the named tensors and the JSON state; ``None`` when ``folder`` holds no checkpoint file.

    Raises:
        CheckpointError: the file is truncated, corrupt or does not match its checksum, it is of
            a newer format, or the folder holds a checkpoint of the old two-file format (which
            could not be resumed safely).
    """
    folder = Path(folder)
    target = folder / CHECKPOINT_FILE
    if not target.exists():
        legacy = [folder / n for n in LEGACY_FILES if (folder / n).exists()]
        if legacy:
            raise CheckpointError(f"{legacy[0]} is a checkpoint of an older tlcap (two files, not resumable safely); {WAY_OUT}")
        return None
    try:
        data = target.read_bytes()
        tensors = load_bytes(data)
        meta = _metadata(data)
        version = meta.get("tlcap_checkpoint")
        if version not in ("2", str(CHECKPOINT_VERSION)):
            if str(version).isdigit() and int(version) > CHECKPOINT_VERSION:
                raise CheckpointError(f"the checkpoint {target} is of format {version}, made by a newer tlcap (this one "
                                      f"reads formats 2 to {CHECKPOINT_VERSION}); resume with that tlcap, or {WAY_OUT}")
            raise ValueError(f"not a tlcap checkpoint (format {version!r})")
        state = json.loads(meta["state"])
        if not isinstance(state, dict):
            raise ValueError("its state is not a JSON object")
        if version != "2" and meta.get("sha256") != checkpoint_digest(tensors, meta["state"]):
            raise ValueError("its content does not match the sha256 recorded in it")
    except (SafetensorError, OSError, ValueError, KeyError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"the checkpoint {target} is damaged ({exc}); {WAY_OUT}") from None
    return tensors, state


def _metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header."""
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError("the header is cut")
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return dict(meta) if isinstance(meta, dict) else {}


__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_digest", "checkpoint_file", "CHECKPOINT_FILE",
           "CHECKPOINT_VERSION"]
