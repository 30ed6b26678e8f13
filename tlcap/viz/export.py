"""Writing plotly figures as HTML (always) and PNG/SVG (static export via kaleido)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go


def save_figure(fig: go.Figure, out_dir: str | Path, stem: str, formats: Sequence[str] = ("html", "png"), scale: float = 2.0) -> list[Path]:
    """Write ``fig`` as ``out_dir/stem.{fmt}`` for each format; returns the written paths.

    HTML always works. A static format that cannot be exported (no kaleido) is skipped with a
    warning naming the fix, so a long run never dies at the figure step.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        if fmt == "html":
            fig.write_html(str(path), include_plotlyjs="cdn")
        else:
            try:
                fig.write_image(str(path), scale=scale)
            except Exception as exc:  # noqa: BLE001 - kaleido missing/broken
                warnings.warn(f"could not write {path} ({exc}); `pip install kaleido==0.2.1` for static export")
                continue
        paths.append(path)
    return paths
