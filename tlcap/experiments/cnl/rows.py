"""Typed rows stored in CNL results: saved as JSON objects, loaded back as their dataclass.

A result that stores rows (a tuple of small frozen dataclasses) lists them in ``_row_types``
and puts :class:`RowFields` before :class:`~tlcap.results.Result` in its bases::

    @dataclass(frozen=True)
    class EnhanceResult(RowFields, Result):
        _row_types: ClassVar[dict[str, type]] = {"rows": EnhanceRow}
        rows: tuple[EnhanceRow, ...] = ()
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar


def row_dict(row: Any) -> dict[str, Any]:
    """A row dataclass as a JSON-safe dict (NaN → None)."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in dataclasses.asdict(row).items()}


def row_from_dict(row_type: type, data: dict[str, Any]) -> Any:
    """Inverse of :func:`row_dict` (None → NaN in float fields)."""
    kwargs = {}
    for f in dataclasses.fields(row_type):
        if f.name not in data:
            continue
        v = data[f.name]
        if v is None and str(f.type) == "float":
            v = float("nan")
        kwargs[f.name] = v
    return row_type(**kwargs)


class RowFields:
    """Mixin for results whose fields hold tuples of typed rows (see the module docstring)."""

    _row_types: ClassVar[dict[str, type]] = {}

    def _json_fields(self) -> dict[str, Any]:
        out = super()._json_fields()  # type: ignore[misc]
        for name in self._row_types:
            out[name] = [row_dict(r) for r in getattr(self, name)]
        return out

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], tensors: dict[str, Any], where: str = "") -> Any:
        fields = dict(fields)
        for name, row_type in cls._row_types.items():
            if isinstance(fields.get(name), list):
                fields[name] = tuple(row_from_dict(row_type, r) for r in fields[name])
        return super()._from_fields(fields, tensors, where=where)  # type: ignore[misc]


__all__ = ["RowFields", "row_dict", "row_from_dict"]
