"""Results are values: frozen dataclasses saved as safetensors (tensors) + JSON (the rest).

Subclass :class:`Result` with ``@dataclass(frozen=True)``. Tensor fields go to
``tensors.safetensors``; every other field must be JSON-serialisable (tuples become lists and
are turned back into tuples on load when the field default/annotation says so). Never pickle.

Example:
    >>> res.save("runs/paris")            # writes result.json + tensors.safetensors
    >>> again = tlcap.load_result("runs/paris")
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors.torch import load_file, save_file

from tlcap.errors import MissingFileError

R = TypeVar("R", bound="Result")
_RESULT_TYPES: dict[str, type["Result"]] = {}


def _to_json(value: Any) -> Any:
    if isinstance(value, Result):
        return {"__result__": type(value).__name__, "fields": value._json_fields()}
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return None
    if hasattr(value, "item") and not isinstance(value, torch.Tensor):  # numpy scalar
        return value.item()
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and "__result__" in value:
        cls = _RESULT_TYPES[value["__result__"]]
        return cls._from_fields(value["fields"], {})
    return value


def _tuplify(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value


class Result:
    """Mixin giving frozen result dataclasses ``save``/``load``/``to_dict``."""

    _registry_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RESULT_TYPES[cls.__name__] = cls

    def _json_fields(self) -> dict[str, Any]:
        return {
            f.name: _to_json(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if not isinstance(getattr(self, f.name), torch.Tensor)
        }

    def _tensor_fields(self) -> dict[str, torch.Tensor]:
        return {
            f.name: getattr(self, f.name).detach().cpu().contiguous()
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if isinstance(getattr(self, f.name), torch.Tensor)
        }

    @classmethod
    def _from_fields(cls: type[R], fields: dict[str, Any], tensors: dict[str, torch.Tensor]) -> R:
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in tensors:
                kwargs[f.name] = tensors[f.name]
            elif f.name in fields:
                v = _from_json(fields[f.name])
                if isinstance(v, list) and "tuple" in str(f.type):
                    v = _tuplify(v)
                kwargs[f.name] = v
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the non-tensor fields."""
        return self._json_fields()

    def save(self, path: str | Path) -> Path:
        """Write ``path/result.json`` and ``path/tensors.safetensors``; returns ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors = self._tensor_fields()
        if tensors:
            save_file(tensors, str(path / "tensors.safetensors"))
        meta = {"type": type(self).__name__, "fields": self._json_fields(), "tensors": sorted(tensors)}
        (path / "result.json").write_text(json.dumps(meta, indent=1))
        return path

    @classmethod
    def load(cls: type[R], path: str | Path) -> R:
        """Load a result saved by :meth:`save` (type-checked against ``cls``)."""
        obj = load_result(path)
        if not isinstance(obj, cls):
            raise TypeError(f"{path} holds a {type(obj).__name__}, not a {cls.__name__}")
        return obj


def load_result(path: str | Path) -> Result:
    """Load any saved result, whatever its type."""
    path = Path(path)
    meta_path = path / "result.json"
    if not meta_path.exists():
        raise MissingFileError(f"No saved result at {path} (expected {meta_path}); save one with result.save(path).")
    meta = json.loads(meta_path.read_text())
    cls = _RESULT_TYPES.get(meta["type"])
    if cls is None:
        raise TypeError(f"Unknown result type {meta['type']!r}; import the module that defines it first.")
    tensors = load_file(str(path / "tensors.safetensors")) if meta.get("tensors") else {}
    return cls._from_fields(meta["fields"], tensors)
