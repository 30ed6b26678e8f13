"""Where tlcap keeps what it converts or caches on disk (weights, tokenizers, covariances)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where tlcap keeps converted weights (``$TLCAP_CACHE`` or ``~/.cache/tlcap``)."""
    root = os.environ.get("TLCAP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "tlcap"
