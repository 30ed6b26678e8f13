"""Writing plotly figures as HTML (always) and PNG/SVG (static export via kaleido, optional).

Static export is the ``tlcap[png]`` extra. :func:`static_exporter` picks, in order:

- kaleido >= 1 when a Chrome/Chromium is present (it drives the browser);
- kaleido 0.2.x (bundles its own Chromium) under plotly < 7 (plotly 7 dropped it);
- nothing: figures are written as HTML only, with a one-line warning saying what to install.

The tested pins (plotly 5.24.1, kaleido 0.2.1) are in ``constraints.txt``.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import plotly
import plotly.graph_objects as go

from tlcap.errors import TlcapWarning

CHROME_NAMES = ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser", "chrome")
_WARNED: set[str] = set()


class StaticExportWarning(TlcapWarning):
    """A figure was written as HTML only (no working static exporter)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def kaleido_version() -> tuple[int, ...] | None:
    """Installed kaleido version, or ``None``."""
    try:
        return _version_tuple(metadata.version("kaleido"))
    except metadata.PackageNotFoundError:
        return None


def plotly_version() -> tuple[int, ...]:
    return _version_tuple(plotly.__version__)


def find_chrome() -> str | None:
    """Path of a Chrome/Chromium kaleido >= 1 can drive (``BROWSER_PATH`` first), or ``None``."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).exists():
        return env
    for name in CHROME_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def static_exporter() -> tuple[str | None, str]:
    """``(exporter, reason)``: ``"kaleido"``, ``"kaleido-legacy"`` or ``None`` with why not."""
    kv = kaleido_version()
    if kv is None:
        return None, "kaleido is not installed (pip install 'tlcap[png]')"
    if kv >= (1,):
        if find_chrome() is None:
            return None, (f"kaleido {'.'.join(map(str, kv))} needs Chrome/Chromium and none was found "
                          "(install one, set BROWSER_PATH, or run plotly_get_chrome)")
        return "kaleido", ""
    if plotly_version() >= (7,):
        return None, (f"kaleido {'.'.join(map(str, kv))} does not work with plotly {plotly.__version__} "
                      "(pip install 'kaleido>=1' and a Chrome, or 'plotly<7')")
    return "kaleido-legacy", ""


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, StaticExportWarning, stacklevel=3)


def save_figure(fig: go.Figure, out_dir: str | Path, stem: str, formats: Sequence[str] = ("html", "png"),
                scale: float = 2.0) -> list[Path]:
    """Write ``fig`` as ``out_dir/stem.{fmt}`` for each format; returns the written paths.

    HTML always works. Static formats (png, svg, pdf) need an exporter (:func:`static_exporter`);
    without one, or if the export fails, they are skipped with a one-line warning naming the
    fix, so a long run never dies at the figure step.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    exporter, reason = (None, "") if set(formats) <= {"html"} else static_exporter()
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        if fmt == "html":
            fig.write_html(str(path), include_plotlyjs="cdn")
        elif exporter is None:
            _warn_once(f"static figures ({fmt}) not written: {reason}; HTML only")
            continue
        else:
            try:
                fig.write_image(str(path), scale=scale)
            except Exception as exc:  # noqa: BLE001 - a broken exporter must not end a long run
                _warn_once(f"could not write {path.name} with {exporter} ({' '.join(str(exc).split())[:200]}); HTML only")
                continue
        paths.append(path)
    return paths
