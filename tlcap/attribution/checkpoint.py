"""Resume checkpoints written atomically as one file.

A checkpoint is one ``checkpoint.safetensors`` file: the tensors, with the run's state (counters,
settings, fingerprint) as JSON in the safetensors metadata. It is written to a temporary file
beside it and renamed into place (one ``os.replace``), so an interrupt leaves either the old or
the new checkpoint, never sums of one with counters of the other (which would count samples
twice on resume). A file that cannot be read raises :class:`~tlcap.errors.CheckpointError`
naming the file and the way out.

Example:
    >>> save_checkpoint(folder, {"sums": sums}, {"n_seen": 25})
    >>> tensors, state = load_checkpoint(folder)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from tlcap.errors import CheckpointError

CHECKPOINT_FILE = "checkpoint.safetensors"
CHECKPOINT_VERSION = 2
LEGACY_FILES = ("state.json", "sums.safetensors")
WAY_OUT = "rerun with --no-resume (resume=False) to start this part over, or delete the file"


def checkpoint_file(folder: str | Path) -> Path:
    """The checkpoint file of ``folder``."""
    return Path(folder) / CHECKPOINT_FILE


def save_checkpoint(folder: str | Path, tensors: dict[str, Tensor], state: dict[str, Any]) -> Path:
    """Write ``tensors`` and ``state`` (JSON-safe) as one file, atomically.

    Args:
        folder: The checkpoint folder (created).
        tensors: Named tensors.
        state: Everything else, JSON-serialisable.

    Returns:
        The checkpoint file.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / CHECKPOINT_FILE
    tmp = folder / f".{CHECKPOINT_FILE}.tmp-{os.getpid()}"
    meta = {"tlcap_checkpoint": str(CHECKPOINT_VERSION), "state": json.dumps(state)}
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def load_checkpoint(folder: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """The ``(tensors, state)`` saved in ``folder``, or None when it holds no checkpoint.

    Raises:
        CheckpointError: the file is truncated or corrupt, or the folder holds a checkpoint of
            the old two-file format (which could not be resumed safely).
    """
    folder = Path(folder)
    target = folder / CHECKPOINT_FILE
    if not target.exists():
        legacy = [folder / n for n in LEGACY_FILES if (folder / n).exists()]
        if legacy:
            raise CheckpointError(f"{legacy[0]} is a checkpoint of an older tlcap (two files, not resumable safely); {WAY_OUT}")
        return None
    try:
        with safe_open(str(target), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
        if meta.get("tlcap_checkpoint") != str(CHECKPOINT_VERSION):
            raise ValueError(f"not a tlcap checkpoint of version {CHECKPOINT_VERSION}")
        state = json.loads(meta["state"])
        if not isinstance(state, dict):
            raise ValueError("its state is not a JSON object")
    except (SafetensorError, OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"the checkpoint {target} is damaged ({exc}); {WAY_OUT}") from None
    return tensors, state


__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_file", "CHECKPOINT_FILE", "CHECKPOINT_VERSION"]
