"""Typed rows: results hold their tables as tuples of frozen dataclasses (one per row).

:func:`frame` turns rows into a DataFrame whose columns are the row type's fields; :func:`typed_row`
rebuilds a row from its saved JSON (NaN, saved as null, restored in float fields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass  # noqa: F401 - used by the doctest of frame
from typing import Any

import pandas as pd


def _nan_for_null(value: Any, annotation: str) -> Any:
    """NaN is saved as JSON null: turn it back into NaN where the field holds floats."""
    if value is None and annotation == "float":
        return float("nan")
    if isinstance(value, list) and annotation.replace(" ", "") in ("tuple[float,...]", "list[float]"):
        return [float("nan") if v is None else v for v in value]
    return value


def _tuplify(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value


def typed_row(row_type: type, values: dict[str, Any]) -> Any:
    """``row_type(**values)`` with the NaNs a saved result holds as ``None`` (JSON null) restored in float fields."""
    ann = {f.name: str(f.type) for f in dataclasses.fields(row_type)}
    return row_type(**{k: _nan_for_null(v, ann.get(k, "")) for k, v in values.items()})


def frame(rows: Sequence[Any], row_type: type) -> pd.DataFrame:
    """A DataFrame from typed rows (frozen dataclasses); the columns are ``row_type``'s fields.

    An empty ``rows`` still gives the columns, so code reading the frame never meets a
    column-less table.

    Example:
        >>> @dataclass(frozen=True)
        ... class NeuronRow:
        ...     layer: int
        ...     neuron: int
        >>> frame([NeuronRow(3, 10)], NeuronRow)
           layer  neuron
        0      3      10
        >>> list(frame([], NeuronRow).columns)
        ['layer', 'neuron']
    """
    cols = [f.name for f in dataclasses.fields(row_type)]
    return pd.DataFrame([dataclasses.astuple(r) for r in rows], columns=cols)


__all__ = ["frame", "typed_row"]
