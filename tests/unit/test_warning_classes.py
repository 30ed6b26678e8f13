"""Every warning class tlcap defines derives from ``TlcapWarning``, so users can filter them all at once."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import tlcap
from tlcap.errors import TlcapWarning


def _warning_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(tlcap.__path__, prefix="tlcap."):
        if info.name.startswith("tlcap.cli") or info.name == "tlcap.__main__":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, Warning) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_tlcap_warning_is_a_tlcap_warning() -> None:
    classes = _warning_classes()
    # The known ones must be found (guards against the walk silently finding nothing).
    assert {"tlcap.errors.SubjectWarning", "tlcap.errors.DataWarning",
            "tlcap.errors.CNLWarning", "tlcap.errors.StaticExportWarning"} <= set(classes)
    stray = sorted(name for name, cls in classes.items() if not issubclass(cls, TlcapWarning))
    assert stray == []


def _warn_calls() -> list[tuple[str, int, ast.Call]]:
    root = Path(tlcap.__file__).parent
    calls = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings"):
                calls.append((str(path.relative_to(root)), node.lineno, node))
    return calls


def _category(call: ast.Call) -> str | None:
    """The warning category named by a ``warnings.warn`` call (``None``: the implicit UserWarning)."""
    for kw in call.keywords:
        if kw.arg == "category":
            return ast.unparse(kw.value)
    if len(call.args) >= 2:
        return ast.unparse(call.args[1])
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Call) and ast.unparse(first.func).endswith("Warning"):
        return ast.unparse(first.func)
    return None


def test_every_warn_call_names_a_tlcap_category() -> None:
    calls = _warn_calls()
    assert len(calls) > 10  # the walk found tlcap's warnings
    implicit = [f"{p}:{line}" for p, line, c in calls if _category(c) in (None, "UserWarning")]
    assert implicit == []
