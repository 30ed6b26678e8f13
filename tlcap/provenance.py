"""Provenance: what made a result (code, model, library versions, config, seed, time).

Every saved result carries a :class:`Provenance` in ``result.json`` (and the CLI's
``summary.json``), so a number can be traced back to the exact model and settings that gave it.

Example (for SmolLM2 loaded from its GGUF, ``model_identity`` reads like
``'gguf:SmolLM2-135M-Instruct.Q4_1.gguf sha256=5f6e... size=...'``):
    >>> from tlcap.attribution import IGConfig
    >>> cfg = IGConfig(steps=2)
    >>> prov = Provenance.collect(model, config=cfg, seed=0)
    >>> prov.model_identity
    'random init, seed 0 (gpt2-tiny-random-seed0)'
    >>> prov.seed, prov.config["steps"], sorted(prov.versions)[:2]
    (0, 2, ['numpy', 'python'])
    >>> res = tlcap.integrated_gradients(model, "The capital of France is", " Paris", config=cfg)
    >>> res = res.with_provenance(prov)
    >>> res.provenance.model_name
    'gpt2-tiny-random-seed0'
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import platform
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("torch", "transformer-lens", "transformers", "numpy", "safetensors")


@functools.cache
def _version(dist: str) -> str | None:
    """A distribution's installed version, looked up once per process (a metadata scan costs milliseconds)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def tlcap_version() -> str:
    """The installed tlcap version (the source tree's when it is not installed).

    Returns:
        The version string, ``"0+unknown"`` when no distribution metadata is found.
    """
    return _version("tlcap") or "0+unknown"


@functools.lru_cache(maxsize=16)
def _sha256_file(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, cached per (path, size, mtime): a model file is hashed once per process."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file (cached while the file's size and mtime do not change).

    Args:
        path: The file to hash.

    Returns:
        The 64-character lowercase sha256 hex digest of the file's bytes.
    """
    st = Path(path).stat()
    return _sha256_file(str(path), st.st_size, st.st_mtime_ns)


def model_identity(model: Any) -> str | None:
    """The most precise identity of a model's weights that can be known cheaply.

    In order: ``model.identity`` when the adapter provides one; ``random init, seed N`` for the
    random test models; ``gguf:<file> sha256=<hex> size=<bytes>`` for a model converted from a
    GGUF (tlcap's cache folder records the source); ``hf:<repo>@<commit>`` for a hub model;
    ``local:<dir>`` with the weight files' sizes for a local folder; else ``None``.

    Args:
        model: A :class:`tlcap.models.Model` or any object with the same attributes (``identity``, ``name``,
            ``hf_model``).

    Returns:
        The identity string, or ``None`` when nothing identifies the weights.
    """
    ident = getattr(model, "identity", None)
    if isinstance(ident, str) and ident:
        return ident
    name = str(getattr(model, "name", "") or "")
    m = re.search(r"random-seed(\d+)$", name)
    if m:
        return f"random init, seed {m.group(1)} ({name})"
    hf = getattr(model, "hf_model", None)
    cfg = getattr(hf, "config", None)
    if cfg is None:
        return None
    commit = getattr(cfg, "_commit_hash", None)
    src = str(getattr(cfg, "_name_or_path", "") or "")
    folder = Path(src) if src else None
    if folder is not None and folder.is_dir():
        marker = folder / "tlcap.json"
        if marker.exists():
            try:
                gguf = Path(json.loads(marker.read_text())["source"])
                return f"gguf:{gguf.name} sha256={file_sha256(gguf)} size={gguf.stat().st_size}"
            except (OSError, ValueError, KeyError):
                pass
        weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
        sizes = ",".join(f"{w.name}:{w.stat().st_size}" for w in weights)
        return f"local:{folder.name}" + (f" ({sizes})" if sizes else "")
    if src:
        return f"hf:{src}@{commit}" if commit else f"hf:{src}"
    return None


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if isinstance(config, dict):
        return dict(config)
    raise TypeError(f"config must be a tlcap Config or a dict, got {type(config).__name__}")


@dataclass(frozen=True)
class Provenance:
    """Where a result comes from.

    Attributes:
        tlcap_version: Version of tlcap that computed it.
        model_name: ``Model.name`` (``None`` for results that involve no model).
        model_identity: Weights identity (see :func:`model_identity`).
        versions: Library versions (torch, transformer-lens, transformers, numpy, safetensors, python).
        seed: The seed the caller ran with (``None`` if none was given).
        config: The family config as a JSON-safe dict (``Config.to_dict()``).
        created: Creation time, ISO 8601 in UTC.
    """

    tlcap_version: str
    model_name: str | None = None
    model_identity: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    seed: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    created: str = ""

    @classmethod
    def collect(cls, model: Any = None, config: Any = None, seed: int | None = None) -> Provenance:
        """Provenance of a result computed now with ``model`` and ``config``.

        Args:
            model: A :class:`tlcap.models.Model` (or ``None``).
            config: A :class:`tlcap.config.Config`, a plain dict, or ``None``.
            seed: The seed used, if any.

        Returns:
            A :class:`Provenance` with the installed library versions and the current UTC time.
        """
        versions: dict[str, str | None] = {p: _version(p) for p in _PACKAGES}
        versions["python"] = platform.python_version()
        return cls(
            tlcap_version=tlcap_version(),
            model_name=None if model is None else str(getattr(model, "name", type(model).__name__)),
            model_identity=None if model is None else model_identity(model),
            versions=versions,
            seed=None if seed is None else int(seed),
            config=_config_dict(config),
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )

    def with_config(self, config: Any) -> Provenance:
        """The same provenance recording ``config`` (a :class:`tlcap.config.Config`, a dict or ``None``).

        Args:
            config: The config to record (a :class:`tlcap.config.Config`, a dict or ``None`` for none).

        Returns:
            A copy of this provenance whose ``config`` is ``config`` as a plain dict.
        """
        return dataclasses.replace(self, config=_config_dict(config))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the ``provenance`` entry of result.json and summary.json).

        Returns:
            A dict with one key per attribute; ``versions`` and ``config`` are copies.
        """
        return {
            "tlcap_version": self.tlcap_version, "model_name": self.model_name, "model_identity": self.model_identity,
            "versions": dict(self.versions), "seed": self.seed, "config": dict(self.config), "created": self.created,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Provenance:
        """Inverse of :meth:`to_dict` (unknown keys from newer versions are ignored).

        Args:
            data: A dict as :meth:`to_dict` writes it (a missing ``tlcap_version`` reads ``"0+unknown"``).

        Returns:
            The :class:`Provenance` it describes.
        """
        known = {k: data[k] for k in ("tlcap_version", "model_name", "model_identity", "versions", "seed", "config", "created")
                 if k in data}
        known.setdefault("tlcap_version", "0+unknown")
        return cls(**known)


__all__ = ["Provenance", "model_identity", "file_sha256", "tlcap_version"]
