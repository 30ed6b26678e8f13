"""Where tlcap keeps what it converts or caches on disk (weights, tokenizers, covariances, scans)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tlcap.models.adapter import Model


def cache_dir() -> Path:
    """Where tlcap keeps converted weights (``$TLCAP_CACHE`` or ``~/.cache/tlcap``).

    Returns:
        The cache root (it may not exist yet).
    """
    root = os.environ.get("TLCAP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "tlcap"


def model_fingerprint(model: Model) -> str:
    """Short hash of the model's shape and a slice of its weights (tells random seeds apart).

    Args:
        model: The model.

    Returns:
        12 hex digits.
    """
    h = hashlib.sha1(f"{model.name}|{model.n_layers}|{model.d_model}|{model.d_mlp}".encode())
    h.update(model.W_E.detach().float().flatten()[:4096].cpu().numpy().tobytes())
    h.update(model.mlp_down_matrix(0).detach().float().flatten()[:4096].cpu().numpy().tobytes())
    return h.hexdigest()[:12]


def model_cache_dir(model: Model, kind: str, root: str | Path | None = None) -> Path:
    """The cache folder of one model for one kind of cached result: ``<root>/<kind>/<name>-<fingerprint>``.

    Args:
        model: The model (its name, made file-safe, and :func:`model_fingerprint`).
        kind: The kind of result (``"rome_cov"``, ``"rewrite_scans"``).
        root: The cache root (default :func:`cache_dir`).

    Returns:
        The folder (not created).
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.name)
    return (Path(root) if root is not None else cache_dir()) / kind / f"{safe}-{model_fingerprint(model)}"
