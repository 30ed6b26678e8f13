"""Structure rules of issue 9: no import cycle, small modules, no function-level imports that hide one.

The import graph is read from the source with ``ast`` (no import side effects): an edge ``a -> b``
for every ``import``/``from ... import`` of a tlcap module in ``a``, at module level *and* inside
functions, so a function-level import cannot hide a cycle. ``if TYPE_CHECKING:`` blocks are ignored.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tlcap"
MAX_LINES = 400  # of code and comments: docstrings do not count (every public function documents Args/Returns)
# Function-level imports of tlcap modules are allowed only where they keep `tlcap --help` and the
# CLI start fast (the CLI imports a method family when its command runs).
LAZY_IMPORT_PREFIXES = ("tlcap.cli",)


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str:
    while name and name not in MODULES:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return [r for r in (_resolve(n) for n in names if n.startswith("tlcap")) if r and r != module]


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    function_level: list[str] = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for n in ast.walk(node)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)) and _targets(inner, module, is_package):
                        function_level.append(f"{module}:{inner.lineno}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                edges[module].update(_targets(node, module, is_package))
    return edges, function_level


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_hand_made_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_tlcap() -> None:
    edges, _ = _graph()
    assert _cycles(edges) == []


def test_function_level_imports_only_for_lazy_cli() -> None:
    _, function_level = _graph()
    assert [site for site in function_level if not site.startswith(LAZY_IMPORT_PREFIXES)] == []


def code_lines(source: str) -> int:
    """Lines of ``source`` outside module, class and function docstrings."""
    doc: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return len(source.splitlines()) - len(doc)


def test_code_lines_skip_docstrings_only() -> None:
    src = 'x = 1\n\n\ndef f():\n    """A\n\n    Args: none.\n    """\n    # a comment\n    return 2\n'
    assert code_lines(src) == 10 - 4  # the four docstring lines; the comment and blank lines count


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_is_small(module: str) -> None:
    lines = code_lines(MODULES[module].read_text())
    assert lines <= MAX_LINES, f"{module} has {lines} lines of code; split it into modules named for what they hold"


def test_ruff_is_clean() -> None:
    """The linter config in pyproject.toml holds for the package, the tests and the benchmarks."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "ruff", "check", "tlcap", "tests", "benchmarks"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
