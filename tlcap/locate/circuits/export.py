"""Circuits as graph files other tools read: Graphviz DOT and a JSON of nodes and edges with scores.

Both list the circuit's nodes (name, kind, layer, importance = sum of ``|score|`` of its edges)
and one edge per (upstream node, reader, fed node): a reader feeds one node, except a GQA kv
reader (``a{l}.kv{g}<k>``), which feeds every head of its group and so appears once per head,
with the same ``reader`` and ``score``. :func:`read_circuit_json` and :func:`read_circuit_dot`
read them back as ``(upstream, reader, score)`` edges.

Example:
    >>> import os, tempfile
    >>> from tlcap.locate.circuits import edge_attribution
    >>> sc = edge_attribution(model, "The capital of France is", " Paris", "The capital of Italy is")
    >>> circuit = sc.select(top_n=20)
    >>> folder = tempfile.mkdtemp()
    >>> dot = export_circuit(circuit, os.path.join(folder, "circuit.dot"))
    >>> js = export_circuit(circuit, os.path.join(folder, "circuit.json"))
    >>> # dot -Tsvg circuit.dot > circuit.svg
    >>> edges = read_circuit_json(js)
    >>> len(edges), edges[0][:2], sorted(read_circuit_dot(dot)) == sorted(edges)
    (20, ('a1.h0', 'logits'), True)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tlcap.errors import DataFormatError, InvalidConfigError
from tlcap.locate.circuits.circuit import Circuit
from tlcap.viz.circuit import node_kind

_COLORS = {"input": "gray", "head": "#1f77b4", "MLP": "#2ca02c", "logits": "black"}
_DOT_EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[reader="([^"]+)", score=([-+0-9.eE]+|nan)')


def circuit_to_json(circuit: Circuit) -> dict[str, Any]:
    """The circuit as a JSON-ready dict: ``model``, ``selection``, ``nodes``, ``edges`` (module docstring).

    Args:
        circuit: The circuit.

    Returns:
        The dict (nodes with kind, layer, importance; edges with source, target, reader, score).
    """
    g = circuit.graph
    imp = circuit.node_importance()
    nodes = [{"name": n, "kind": node_kind(n), "layer": g.layer_of(n), "importance": imp.get(n, 0.0)} for n in circuit.nodes]
    edges = [{"source": u, "target": t, "reader": v, "score": s}
             for u, v, s in circuit.edges for t in g.reader_node_names(v)]
    return {"model": circuit.model_name, "selection": circuit.selection, "ablation": circuit.ablation,
            "metric": circuit.metric, "prompt": circuit.prompt, "target": circuit.target, "n_edges": circuit.n_edges,
            "nodes": nodes, "edges": edges}


def circuit_to_dot(circuit: Circuit) -> str:
    """The circuit in Graphviz DOT (layers left to right; edge width grows with ``|score|``).

    Args:
        circuit: The circuit.

    Returns:
        The DOT text: nodes with kind, layer and importance; one edge per reader and node it feeds (score kept).
    """
    g = circuit.graph
    data = circuit_to_json(circuit)
    top = max((abs(e["score"]) for e in data["edges"]), default=1.0) or 1.0
    lines = ["digraph circuit {", "  rankdir=LR;", '  node [shape=box, style=filled, fontcolor=white];',
             f'  label="{circuit.selection} {circuit.n_edges} edges ({circuit.model_name})";']
    for n in data["nodes"]:
        lines.append(f'  "{n["name"]}" [kind="{n["kind"]}", layer={n["layer"]}, importance={n["importance"]:.6g}, '
                     f'fillcolor="{_COLORS[n["kind"]]}"];')
    for e in data["edges"]:
        width = 0.5 + 3 * abs(e["score"]) / top
        color = "#d62728" if e["score"] >= 0 else "#1f77b4"
        lines.append(f'  "{e["source"]}" -> "{e["target"]}" [reader="{e["reader"]}", score={e["score"]!r}, '
                     f'penwidth={width:.3f}, color="{color}"];')
    for layer in range(-1, g.n_layers + 1):
        same = [n["name"] for n in data["nodes"] if n["layer"] == layer]
        if same:
            lines.append("  { rank=same; " + " ".join(f'"{s}";' for s in same) + " }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def export_circuit(circuit: Circuit, path: str | Path) -> Path:
    """Write the circuit as ``.dot`` (Graphviz) or ``.json``, by the file's suffix.

    Args:
        circuit: The circuit.
        path: A ``.dot``, ``.gv`` or ``.json`` file (parent folders are created).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        InvalidConfigError: another suffix.
    """
    path = Path(path)
    if path.suffix not in (".dot", ".json", ".gv"):
        raise InvalidConfigError(f"export a circuit to a .dot (Graphviz) or .json file, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(circuit_to_json(circuit), indent=1) if path.suffix == ".json" else circuit_to_dot(circuit)
    path.write_text(text)
    return path


def _dedupe(edges: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    seen: dict[tuple[str, str], float] = {}
    for u, v, s in edges:
        seen.setdefault((u, v), s)
    return [(u, v, s) for (u, v), s in seen.items()]


def read_circuit_json(path: str | Path) -> list[tuple[str, str, float]]:
    """The ``(upstream, reader, score)`` edges of a circuit JSON file (one per reader, kv fan-out undone).

    Args:
        path: The JSON file written by :func:`export_circuit`.

    Returns:
        The edges, one per reader.
    """
    data = json.loads(Path(path).read_text())
    return _dedupe([(e["source"], e["reader"], float(e["score"])) for e in data["edges"]])


def read_circuit_dot(path: str | Path) -> list[tuple[str, str, float]]:
    """The ``(upstream, reader, score)`` edges of a circuit DOT file written by :func:`export_circuit`.

    Args:
        path: The DOT file.

    Returns:
        The edges, one per reader (kv fan-out undone).

    Raises:
        DataFormatError: a file with no ``digraph``.
    """
    text = Path(path).read_text()
    if not text.lstrip().startswith("digraph"):
        raise DataFormatError(f"{path} is not a Graphviz digraph")
    edges = [(m.group(1), m.group(3), float(m.group(4))) for m in map(_DOT_EDGE.match, text.splitlines()) if m]
    return _dedupe(edges)


__all__ = ["circuit_to_dot", "circuit_to_json", "export_circuit", "read_circuit_dot", "read_circuit_json"]
