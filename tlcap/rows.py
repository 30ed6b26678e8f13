"""Typed rows: results hold their tables as tuples of frozen dataclasses (one per row).

:func:`frame` turns rows into a DataFrame whose columns are the row type's fields; :func:`row_dict`
writes a row as JSON (NaN → null) and :func:`typed_row` rebuilds it (null → NaN in float fields,
lists → tuples in tuple fields). A result that stores rows lists them in ``_row_types`` and puts
:class:`RowFields` before :class:`~tlcap.results.Result` in its bases, so they are saved as JSON
objects and load back as their dataclass::

    @dataclass(frozen=True)
    class EnhanceResult(RowFields, Result):
        _row_types: ClassVar[dict[str, type]] = {"rows": EnhanceRow}
        rows: tuple[EnhanceRow, ...] = ()

``_row_types`` may also name a field holding one dataclass value (not a tuple of them), such as
a QL result's fact.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass  # noqa: F401 - used by the doctest of frame
from typing import Any, ClassVar

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
    """``row_type(**values)`` with the NaNs a saved result holds as ``None`` (JSON null) restored in float
    fields and JSON lists turned back into tuples in tuple fields.

    Args:
        row_type: The row dataclass.
        values: Its fields as :func:`row_dict` wrote them (a JSON object).

    Returns:
        The row.

    Example:
        >>> @dataclass(frozen=True)
        ... class Row:
        ...     name: str
        ...     value: float
        ...     sizes: tuple[int, ...]
        >>> typed_row(Row, {"name": "a", "value": None, "sizes": [1, 2]})
        Row(name='a', value=nan, sizes=(1, 2))
    """
    ann = {f.name: str(f.type) for f in dataclasses.fields(row_type)}
    out = {}
    for k, v in values.items():
        v = _nan_for_null(v, ann.get(k, ""))
        out[k] = _tuplify(v) if isinstance(v, list) and ann.get(k, "").startswith("tuple") else v
    return row_type(**out)


def row_dict(row: Any) -> dict[str, Any]:
    """A row dataclass as a JSON-safe dict (NaN → None, tuples → lists).

    Args:
        row: A row (a dataclass instance).

    Returns:
        Field name → value.
    """
    def safe(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return None
        return [safe(x) for x in v] if isinstance(v, (tuple, list)) else v
    return {f.name: safe(getattr(row, f.name)) for f in dataclasses.fields(row)}


class RowFields:
    """Mixin for results whose fields hold typed rows (see the module docstring)."""

    _row_types: ClassVar[dict[str, type]] = {}

    def _json_fields(self) -> dict[str, Any]:
        out = super()._json_fields()  # type: ignore[misc]
        for name in self._row_types:
            value = getattr(self, name)
            out[name] = [row_dict(r) for r in value] if isinstance(value, tuple) else row_dict(value)
        return out

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], tensors: dict[str, Any], where: str = "") -> Any:
        fields = dict(fields)
        for name, row_type in cls._row_types.items():
            if isinstance(fields.get(name), list):
                fields[name] = tuple(typed_row(row_type, r) for r in fields[name])
            elif isinstance(fields.get(name), dict):
                fields[name] = typed_row(row_type, fields[name])
        return super()._from_fields(fields, tensors, where=where)  # type: ignore[misc]


def frame(rows: Sequence[Any], row_type: type) -> pd.DataFrame:
    """A DataFrame from typed rows (frozen dataclasses); the columns are ``row_type``'s fields.

    An empty ``rows`` still gives the columns, so code reading the frame never meets a
    column-less table.

    Args:
        rows: The typed rows, all of class ``row_type``.
        row_type: The frozen dataclass the rows are; its fields name the columns, in order.

    Returns:
        A :class:`pandas.DataFrame` with one row per element of ``rows``.

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


__all__ = ["RowFields", "frame", "row_dict", "typed_row"]
