"""The package's floors, as a test (issue 27 item 3).

Tiers, lowest first: ``models`` / ``runtime`` / ``data`` (with the top-level value modules) import
nothing above them; ``attribution`` / ``locate`` / ``intervene`` / ``metrics`` do not import
``experiments``, ``reproduce``, ``cli``, ``testing`` or ``explore``; ``experiments`` does not import
``reproduce`` or ``cli``. Among the four middle packages, an import from a sibling goes through
:data:`SIBLINGS`, a written allow-list with the reason for each; every error and warning class is
defined once, in ``tlcap/errors.py``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import tlcap
import tlcap.errors

ROOT = Path(tlcap.__file__).parent
LOW = {"models", "runtime", "data"}
VALUES = {"errors", "config", "results", "rows", "provenance", "atomic", "viz"}  # leaf modules any tier may use
MID = {"attribution", "locate", "intervene", "metrics"}
ABOVE_MID = {"experiments", "reproduce", "cli", "testing", "explore"}
SIBLINGS = {
    # NeuronSet is the value every method passes around
    "tlcap.metrics.sets": "NeuronSet, the located-set value type",
    # threshold / top-k selection of scores, shared by attribution results and locating
    "tlcap.locate.selection": "selection rules (t·max, top-k) applied to attribution scores",
    # subject spans: ROME edits and evaluates at the subject's last token
    "tlcap.locate.subjects": "subject positions in a prompt (ROME's edit position)",
    # the synapse hooks are an intervention; locating synapses runs them
    "tlcap.intervene.synapses": "QL knowledge-synapse suppression hooks, used to locate synapses",
    # many-set scoring evaluates each batch row with its own neuron set
    "tlcap.intervene.set_rows": "per-row neuron-set factors (scale_rows) for batched many-set metrics",
}


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return [m for m in out if m.startswith("tlcap.")]


def _modules() -> list[tuple[str, Path]]:
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).with_suffix("").parts
        out.append((rel[0] if len(rel) > 1 else "", p))
    return out


def test_lower_tiers_import_nothing_above_them():
    bad = []
    for pkg, path in _modules():
        for mod in _imports(path):
            dst = mod.split(".")[1]
            if dst == pkg or dst in VALUES:
                continue
            if (pkg in LOW and dst not in LOW) or (pkg in MID and dst in ABOVE_MID) or \
                    (pkg == "experiments" and dst in ("reproduce", "cli")):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {mod}")
    assert bad == []


def test_middle_packages_use_siblings_only_through_the_allow_list():
    bad = []
    for pkg, path in _modules():
        if pkg not in MID:
            continue
        for mod in _imports(path):
            dst = mod.split(".")[1]
            if dst in MID and dst != pkg and mod not in SIBLINGS:
                bad.append(f"{path.relative_to(ROOT.parent)} imports {mod}")
    assert bad == [], "add the module to SIBLINGS with its reason, or move the code a tier down"


def test_every_error_and_warning_class_is_defined_once_in_errors_py():
    bad = []
    for _, path in _modules():
        if path.name == "errors.py" and path.parent == ROOT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if any(b.endswith(("Error", "Warning", "Exception")) for b in bases) and node.name != "StopForward":
                    bad.append(f"{path.relative_to(ROOT.parent)}: {node.name}")
    assert bad == []
    defined = {n for n, c in inspect.getmembers(tlcap.errors, inspect.isclass) if c.__module__ == "tlcap.errors"}
    assert {"UnsupportedModelError", "StageError", "SubjectWarning", "StaticExportWarning"} <= defined
