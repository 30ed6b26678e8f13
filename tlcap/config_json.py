"""How a :class:`~tlcap.config.Config` becomes JSON and back (private helpers of :mod:`tlcap.config`)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any


def _is_config(hint: Any) -> bool:
    """Whether a type hint is a config class (a dataclass with ``from_dict``)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint) and hasattr(hint, "from_dict")


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a field's value (tuples → lists, nested configs → dicts, inf → "inf", NaN → null)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


def default_of(cls: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``cls`` (``dataclasses.MISSING`` when it has none)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def from_json(hint: Any, value: Any) -> Any:
    """Undo :func:`jsonable` for one field given its type hint (tuples, nested configs)."""
    if hint is None or value is None:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(hint):
            if arm is type(None):
                continue
            if _is_config(arm) and isinstance(value, dict):
                return arm.from_dict(value)
            if typing.get_origin(arm) is tuple and isinstance(value, list):
                return from_json(arm, value)
            if arm is float:
                return from_json(arm, value)
        return value
    if hint is float and value in ("inf", "-inf"):
        return float(value)
    if _is_config(hint) and isinstance(value, dict):
        return hint.from_dict(value)
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(hint)
        inner = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        return tuple(from_json(inner, v) for v in value)
    return value


