"""Results are values: frozen dataclasses saved as safetensors (tensors) + JSON (the rest).

The contract every result type meets (checked by ``tests/unit/test_result_contract.py``):

- ``@dataclass(frozen=True)`` subclass of :class:`Result`; tensor fields carry jaxtyping shapes.
- ``summary() -> dict``: JSON-ready headline numbers (what the CLI writes as ``summary.json``,
  with the provenance added beside them).
- ``to_frame() -> pandas.DataFrame``: the result as a table, built from typed rows (a small
  frozen dataclass per row, see :func:`frame`).
- ``figure() -> plotly Figure``: the result's main figure.
- ``provenance``: a keyword-only field (default ``None``, not part of ``==``) holding a
  :class:`~tlcap.provenance.Provenance`; attach one with :meth:`Result.with_provenance`.

``save(path)`` writes ``path/result.json`` + ``path/tensors.safetensors`` atomically (a staging
folder renamed into place) with the tensors' sha256, the sha256 of the JSON content itself
(``json_sha256``), the format version and the defining module in the JSON; files are readable by
the group (mode ``0666 & ~umask``). :func:`load_result` works in a fresh process (it imports that
module) and verifies both checksums: a changed, cut or hand-edited file (a field removed) is a
:class:`~tlcap.errors.ResultIntegrityError` naming the file, a file of a newer format a
:class:`~tlcap.errors.ResultFormatError`. Files of formats 1–2 (no JSON checksum) still load.
Never pickle. Non-tensor fields must be JSON-serialisable (tuples become lists and come back as
tuples where the field's annotation says ``tuple``; nested results are saved inline).

Example:
    >>> import tempfile
    >>> res = tlcap.integrated_gradients(model, "The capital of France is", " Paris", steps=2)
    >>> path = res.save(os.path.join(tempfile.mkdtemp(), "result"))
    >>> sorted(os.listdir(path))
    ['result.json', 'tensors.safetensors']
    >>> again = tlcap.load_result(path)
    >>> type(again).__name__, torch.equal(again.scores, res.scores)
    ('NeuronAttribution', True)
    >>> again.summary()["n_located"], list(again.to_frame().columns)
    (34, ['layer', 'neuron', 'score', 'activation'])
    >>> fig = again.figure()
    >>> again.provenance.model_name
    'gpt2-tiny-random-seed0'
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import pkgutil
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from tlcap.atomic import json_digest, remove_leftovers, storage_error, write_bytes_atomic, write_text_atomic
from tlcap.errors import (
    MissingFileError,
    OutputPathError,
    ResultFormatError,
    ResultIntegrityError,
    ResultTypeError,
    UnknownNameError,
)
from tlcap.provenance import Provenance, tlcap_version
from tlcap.rows import _nan_for_null, _tuplify
from tlcap.viz.html import esc, summary_html

R = TypeVar("R", bound="Result")
_RESULT_TYPES: dict[str, type[Result]] = {}
FORMAT_VERSION = 3  # 3: sha256 of the JSON content (json_sha256); 2: tensors' sha256; 1: neither
RESULT_FILES = ("result.json", "tensors.safetensors")


def _to_json(value: Any) -> Any:
    if isinstance(value, Result):
        return {"__result__": type(value).__name__, "module": type(value).__module__, "fields": value._json_fields()}
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, np.generic):  # numpy scalar
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a typed row
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and "__result__" in value:
        cls = _result_type(value["__result__"], value.get("module"))
        return cls._from_fields(value["fields"], {})
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    """Value equality that tensors, NaN, nested containers and dataclass rows take part in (:meth:`Result.__eq__`)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        b = b.to(a.device)  # a result computed on a GPU equals its copy loaded on the CPU
        return bool(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f")))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if (dataclasses.is_dataclass(a) and not isinstance(a, (type, Result)) and type(a) is type(b)):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a) if f.compare)
    return bool(a == b)


@dataclass(frozen=True)
class Result:
    """Base of frozen result dataclasses: ``save``/``load``, provenance, and the contract.

    Subclasses override :meth:`summary`, :meth:`to_frame` and :meth:`figure`; the base
    versions raise ``NotImplementedError`` so a missing one fails loudly.
    """

    provenance: Provenance | None = field(default=None, kw_only=True, compare=False, repr=False)

    _registry_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RESULT_TYPES[cls.__name__] = cls
        if "__eq__" not in cls.__dict__:  # before @dataclass runs: it then keeps the inherited value equality
            cls.__eq__ = cls.__eq__  # type: ignore[method-assign]  # Result's, or a parent result's own

    def __eq__(self, other: object) -> bool:
        """Field by field (``provenance`` and ``compare=False`` fields left out): tensors equal in dtype, shape and
        every value (NaN equal to NaN), floats NaN-equal, lists, tuples and dicts element by element.

        Dataclass equality would compare tensor fields with ``==`` and raise; a result equals its saved
        and loaded copy (``Result.load(path) == result``).

        Args:
            other: Another object.

        Returns:
            Whether ``other`` is a result of the same type with equal fields (``NotImplemented`` for other types).
        """
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name))
                   for f in dataclasses.fields(self) if f.compare and f.name != "provenance")

    # ------------------------------------------------------------------ contract
    def summary(self) -> dict[str, Any]:
        """JSON-ready headline numbers (the CLI's ``summary.json``, without the provenance).

        Returns:
            A JSON-ready dict.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement summary()")

    def to_frame(self) -> pd.DataFrame:
        """The result as a table of typed rows.

        Returns:
            A DataFrame, one row per typed row of the result.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement to_frame()")

    def figure(self) -> Any:
        """The result's main plotly figure.

        Returns:
            A plotly ``Figure``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement figure()")

    def _repr_html_(self) -> str:
        """Jupyter's view of a result: its ``summary()`` as a table (result types may show more)."""
        try:
            return summary_html(type(self).__name__, self.summary(), note=".summary(), .to_frame(), .figure()")
        except NotImplementedError:
            return f"<pre>{esc(repr(self))}</pre>"

    def with_provenance(self: R, provenance: Provenance | None) -> R:
        """A copy carrying ``provenance``.

        Args:
            provenance: The provenance to attach (``None``: none).

        Returns:
            A copy of the result.
        """
        return dataclasses.replace(self, provenance=provenance)

    # ------------------------------------------------------------------ fields
    def _data_fields(self) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(self) if f.name != "provenance"]

    def _json_fields(self) -> dict[str, Any]:
        return {
            f.name: _to_json(getattr(self, f.name))
            for f in self._data_fields()
            if not isinstance(getattr(self, f.name), torch.Tensor)
        }

    def _tensor_fields(self) -> dict[str, torch.Tensor]:
        return {
            f.name: getattr(self, f.name).detach().cpu().contiguous()
            for f in self._data_fields()
            if isinstance(getattr(self, f.name), torch.Tensor)
        }

    @classmethod
    def _from_fields(cls: type[R], fields: dict[str, Any], tensors: dict[str, torch.Tensor], where: str = "") -> R:
        missing = [f.name for f in dataclasses.fields(cls) if f.name != "provenance" and f.name not in tensors
                   and f.name not in fields and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ResultIntegrityError(
                f"{where or 'the saved result'} lacks the field{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"of {cls.__name__} (edited or damaged?); re-run the command that wrote it (or restore it from a copy)")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "provenance":
                continue
            if f.name in tensors:
                kwargs[f.name] = tensors[f.name]
            elif f.name in fields:
                v = _nan_for_null(_from_json(fields[f.name]), str(f.type))
                if isinstance(v, list) and "tuple" in str(f.type):
                    v = _tuplify(v)
                kwargs[f.name] = v
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the non-tensor fields.

        Returns:
            Field name → JSON-ready value (tensors left out; :meth:`save` writes them).
        """
        return self._json_fields()

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write ``path/result.json`` and ``path/tensors.safetensors`` atomically; returns ``path``.

        Both files are written into a hidden staging folder beside ``path`` that is then renamed
        into place, so ``path`` never holds a half-written result. A previous result at ``path``
        is replaced. If ``path`` is a folder holding other files too, the two files are replaced
        one by one instead (tensors first, ``result.json`` — which holds their checksum — last).

        Args:
            path: The folder to write (created; an existing result there is replaced whole).

        Returns:
            ``path`` as a ``Path``.
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise OutputPathError(f"cannot save a result to {path}: it is a file; give a folder path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for kind in ("saving", "old"):  # left by processes killed while saving here
                remove_leftovers(path.parent, f".{path.name}.{kind}-")
            stage = path.parent / f".{path.name}.saving-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            stage.mkdir()
        except OSError as exc:
            raise storage_error(exc, path) from None
        try:
            self._write_files(stage)
            foreign = path.is_dir() and any(p.name not in RESULT_FILES for p in path.iterdir())
            if foreign:
                for name in RESULT_FILES:
                    if (stage / name).exists():
                        os.replace(stage / name, path / name)
                    elif (path / name).exists():
                        (path / name).unlink()
            else:
                old = None
                if path.exists():
                    old = path.parent / f".{path.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                    os.replace(path, old)
                os.replace(stage, path)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            raise storage_error(exc, path) from None
        finally:
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)
        return path

    def _write_files(self, folder: Path) -> None:
        tensors = self._tensor_fields()
        meta: dict[str, Any] = {
            "type": type(self).__name__,
            "module": type(self).__module__,
            "format": FORMAT_VERSION,
            "tlcap_version": tlcap_version(),
            "fields": self._json_fields(),
            "tensors": sorted(tensors),
        }
        if tensors:
            data = save_bytes(tensors)
            write_bytes_atomic(folder / "tensors.safetensors", data)
            meta["tensors_sha256"] = hashlib.sha256(data).hexdigest()
            meta["tensors_bytes"] = len(data)
        if self.provenance is not None:
            meta["provenance"] = self.provenance.to_dict()
        meta = json.loads(json.dumps(meta))  # the digest is taken over what a reader will parse
        meta["json_sha256"] = json_digest(meta)
        write_text_atomic(folder / "result.json", json.dumps(meta, indent=1))

    @classmethod
    def load(cls: type[R], path: str | Path) -> R:
        """Load a result saved by :meth:`save` (type-checked against ``cls``).

        Args:
            path: A folder written by :meth:`save`.

        Returns:
            The result, of type ``cls``.
        """
        obj = load_result(path)
        if not isinstance(obj, cls):
            raise ResultTypeError(
                f"{path} holds a {type(obj).__name__}, not a {cls.__name__}; load it with tlcap.load_result(path)"
            )
        return obj


def _import_all_tlcap() -> None:
    """Import every tlcap module (old result files name no module: find the type anyway)."""
    for info in pkgutil.walk_packages([str(Path(__file__).resolve().parent)], "tlcap."):
        if info.name.startswith("tlcap.cli") or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue


def _result_type(name: str, module: str | None) -> type[Result]:
    cls = _RESULT_TYPES.get(name)
    if cls is None and module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UnknownNameError(
                f"result type {name!r} is defined in module {module!r}, which cannot be imported ({exc}); "
                "install the code that wrote it"
            ) from None
        cls = _RESULT_TYPES.get(name)
    if cls is None:
        _import_all_tlcap()
        cls = _RESULT_TYPES.get(name)
    if cls is None:
        raise UnknownNameError(
            f"unknown result type {name!r}; import the module that defines it before loading"
        )
    return cls


def load_result(path: str | Path) -> Result:
    """Load any saved result, whatever its type, in any process.

    Args:
        path: A folder written by :meth:`Result.save` (a command's ``--out/result``).

    Returns:
        The result, as the type it was saved from.

    Raises:
        MissingFileError: no ``result.json`` at ``path``.
        ResultIntegrityError: ``result.json`` is not valid JSON, the tensor file is missing,
            truncated, corrupt, or does not match the sha256 recorded when it was saved.
    """
    path = Path(path)
    meta_path = path / "result.json"
    if not meta_path.exists():
        raise MissingFileError(f"No saved result at {path} (expected {meta_path}); save one with result.save(path).")
    redo = "re-run the command that wrote it (or restore the folder from a copy)"
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict) or "type" not in meta or "fields" not in meta:
            raise ValueError("missing 'type' or 'fields'")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResultIntegrityError(f"{meta_path} is corrupt or truncated ({exc}); {redo}") from None
    fmt = meta.get("format", 1)
    if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
        raise ResultFormatError(
            f"{meta_path} is in result format {fmt} (written by tlcap {meta.get('tlcap_version', '?')}); this tlcap "
            f"({tlcap_version()}) reads formats 1 to {FORMAT_VERSION}: load it with that tlcap or a newer one")
    if fmt >= 3 or "json_sha256" in meta:  # formats 1-2 carry no checksum of the JSON: they load as they are
        want = meta.pop("json_sha256", None)
        if want != json_digest(meta):
            raise ResultIntegrityError(f"{meta_path} does not match its own sha256 (json_sha256: edited or damaged); {redo}")
    cls = _result_type(meta["type"], meta.get("module"))
    tensors: dict[str, torch.Tensor] = {}
    if meta.get("tensors"):
        tpath = path / "tensors.safetensors"
        if not tpath.exists():
            raise ResultIntegrityError(f"{tpath} is missing (listed in {meta_path}); {redo}")
        if "tensors_bytes" in meta and tpath.stat().st_size != meta["tensors_bytes"]:
            raise ResultIntegrityError(
                f"{tpath} has {tpath.stat().st_size} bytes, {meta['tensors_bytes']} were saved (truncated?); {redo}"
            )
        data = tpath.read_bytes()
        if "tensors_sha256" in meta and hashlib.sha256(data).hexdigest() != meta["tensors_sha256"]:
            raise ResultIntegrityError(f"{tpath} does not match the sha256 recorded in {meta_path}; {redo}")
        try:
            tensors = load_bytes(data)
        except (SafetensorError, OSError, ValueError) as exc:
            raise ResultIntegrityError(f"{tpath} is corrupt ({exc}); {redo}") from None
    if not isinstance(meta["fields"], dict):
        raise ResultIntegrityError(f"{meta_path}: 'fields' is not a JSON object; {redo}")
    obj = cls._from_fields(meta["fields"], tensors, where=str(meta_path))
    if meta.get("provenance"):
        obj = obj.with_provenance(Provenance.from_dict(meta["provenance"]))
    return obj


__all__ = ["Result", "load_result", "Provenance"]
