"""Helpers shared by CLI commands: output folders, JSON summaries, model loading, seeding."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import typer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def out_dir(path: Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, torch.Tensor):
        return _clean(o.tolist())
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    return o


def write_summary(out: Path, summary: dict[str, Any]) -> Path:
    """Write ``out/summary.json`` (NaN/inf become null) and echo where it went."""
    path = Path(out) / "summary.json"
    path.write_text(json.dumps(_clean(summary), indent=1))
    typer.echo(f"wrote {path}")
    return path


def load(model: str, device: str | None = None):  # noqa: ANN201
    from tlcap.models import load_model

    typer.echo(f"loading {model} ...", err=True)
    return load_model(model, device=device)
