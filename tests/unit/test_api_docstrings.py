"""Every function and public method of the API (``tlcap.__all__`` and every module's ``__all__``) documents its arguments
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


def _package_api() -> list[tuple[str, object]]:
    """Every function and public method listed in the ``__all__`` of a tlcap module (the CLI aside)."""
    import importlib
    import pkgutil

    out, seen = [], set()
    for info in pkgutil.walk_packages(tlcap.__path__, "tlcap."):
        if info.name.endswith("__main__") or ".cli" in info.name:
            continue
        mod = importlib.import_module(info.name)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            fns = [(name, obj)] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                fns = [(f"{obj.__qualname__}.{a}", getattr(v, "__func__", v)) for a, v in vars(obj).items()
                       if not a.startswith("_") and inspect.isfunction(getattr(v, "__func__", v))]
            for q, fn in fns:
                if id(fn) not in seen and fn.__module__.startswith("tlcap"):
                    seen.add(id(fn))
                    out.append((f"{fn.__module__}.{q}", fn))
    return out


def test_every_function_exported_by_a_module_has_args_and_returns():
    api = _package_api()
    assert len(api) > 1000  # functions and methods of every module's __all__
    gaps = {name: _missing(fn) for name, fn in api}
    assert {k: v for k, v in gaps.items() if v} == {}
