"""Every function and public method of the top-level API (``tlcap.__all__``) documents its arguments
and what it returns (Google style: ``Args:`` when it takes any, ``Returns:`` or ``Yields:`` unless it
returns ``None``), so ``help(tlcap.X)`` in a notebook answers how to call it (issue 27 item 5)."""

from __future__ import annotations

import inspect

import tlcap


def _api() -> list[tuple[str, object]]:
    out = []
    for name in tlcap.__all__:
        obj = getattr(tlcap, name)
        if inspect.isfunction(obj):
            out.append((name, obj))
        elif inspect.isclass(obj):
            for attr, value in vars(obj).items():
                fn = getattr(value, "__func__", value)
                if inspect.isfunction(fn) and not attr.startswith("_"):
                    out.append((f"{name}.{attr}", fn))
    return out


def _missing(fn: object) -> list[str]:
    doc = inspect.getdoc(fn) or ""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters if p not in ("self", "cls")]
    gaps = []
    if params and "Args:" not in doc:
        gaps.append("Args")
    if sig.return_annotation not in (None, "None") and "Returns:" not in doc and "Yields:" not in doc:
        gaps.append("Returns")
    return gaps


def test_the_api_is_found():
    names = {n for n, _ in _api()}
    assert {"load_model", "localize", "NeuronSet.random_like",
            "Model.hooks", "Result.save"} <= names


def test_every_api_function_has_args_and_returns():
    gaps = {name: _missing(fn) for name, fn in _api()}
    assert {k: v for k, v in gaps.items() if v} == {}
