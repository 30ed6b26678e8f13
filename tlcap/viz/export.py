"""Writing plotly figures as HTML (always) and PNG/SVG (static export via kaleido, optional).

Static export is the ``tlcap[png]`` extra. :func:`static_exporter` picks, in order:

- kaleido >= 1 when a Chrome/Chromium is present (it drives the browser; ``make setup`` installs
  Debian's ``chromium`` with ``scripts/ensure_chromium.sh``);
- kaleido 0.2.x (bundles its own Chromium) under plotly < 7 (plotly 7 dropped it);
- nothing: figures are written as HTML only, with a one-line warning saying what to install.

The export runs in a child process under a time and a memory bound
(:mod:`tlcap.viz.export_bounds`: ``TLCAP_FIGURE_TIMEOUT``, ``TLCAP_FIGURE_MEMORY``;
``TLCAP_FIGURES=html`` skips it): a browser that hangs or grows falls back to HTML with one
warning instead of hanging a run whose results are already saved. HTML files are written whole or
not at all (:mod:`tlcap.atomic`). The tested pins (plotly 6.9.0, kaleido 1.5.0) are in
``constraints.txt``.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

import plotly
import plotly.graph_objects as go

from tlcap.atomic import storage_error, write_text_atomic
from tlcap.errors import StaticExportWarning
from tlcap.viz.export_bounds import run_bounded

CHROME_NAMES = ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser", "chrome")
_WARNED: set[str] = set()


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
    without one, or if the export fails or passes its time or memory bound, they are skipped with
    a one-line warning naming the fix, so a long run never dies or hangs at the figure step.

    Args:
        fig: The plotly figure.
        out_dir: The folder (created when missing).
        stem: The file name without extension.
        formats: Extensions to write, among ``html``, ``png``, ``svg`` and ``pdf``.
        scale: Resolution multiplier of static images.

    Returns:
        The paths written, in ``formats`` order (skipped static formats are left out).
    """
    return save_figures({stem: fig}, out_dir, formats, scale)[stem]


def save_figures(figs: Mapping[str, go.Figure], out_dir: str | Path, formats: Sequence[str] = ("html", "png"),
                 scale: float = 2.0) -> dict[str, list[Path]]:
    """Write every figure of ``figs`` (stem → figure) like :func:`save_figure`, all static ones in one bounded export.

    Returns:
        Stem → the paths written, in ``formats`` order.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stem, fig in figs.items():
            if "html" in formats:
                write_text_atomic(out / f"{stem}.html", fig.to_html(include_plotlyjs="cdn"))
    except OSError as exc:
        raise storage_error(exc, out) from None
    static = [f for f in formats if f != "html"]
    written: set[str] = set()
    if static and figs:
        written = _export_static(figs, out, static, scale)
    return {stem: [out / f"{stem}.{fmt}" for fmt in formats if fmt == "html" or str(out / f"{stem}.{fmt}") in written]
            for stem in figs}


def _export_static(figs: Mapping[str, go.Figure], out: Path, static: Sequence[str], scale: float) -> set[str]:
    if os.environ.get("TLCAP_FIGURES", "").strip().lower() == "html":
        return set()
    exporter, reason = static_exporter()
    if exporter is None:
        _warn_once(f"static figures ({', '.join(static)}) not written: {reason}; HTML only")
        return set()
    job = {"exporter": exporter, "chrome": find_chrome() if exporter == "kaleido" else None,
           "figures": [{"fig": fig.to_json(), "path": str(out / f"{stem}.{fmt}"), "format": fmt, "scale": scale}
                       for stem, fig in figs.items() for fmt in static]}
    written, why = run_bounded(job, len(job["figures"]))
    if why is not None:
        missing = [Path(it["path"]).name for it in job["figures"] if it["path"] not in written]
        _warn_once(f"could not write {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} with {exporter} "
                   f"({' '.join(why.split())[:200]}); HTML only")
    return written
