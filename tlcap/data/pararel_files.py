"""ParaRel files (Elazar et al. 2021): relations, their paraphrase patterns and facts, as a causal LM reads them.

Files (bundled with tlcap, 31 relations; see ``docs/data.md``): ``graphs_json/PXX.jsonl`` holds the
relation's paraphrase patterns (``[X]`` = subject, ``[Y]`` = object), ``trex_lms_vocab/PXX.jsonl``
its facts. A causal LM answers a query that ends where the object starts, so every pattern is cut
before ``[Y]`` (QL paper, as for the GPT models of Dai et al. and Chen et al.): ``"The capital of
[X] is [Y] ."`` → ``"The capital of [X] is"``, and a pattern with ``[Y]`` mid-sentence such as
``"The official language of [X] is the [Y] language."`` → ``"The official language of [X] is the"``.
Only patterns where ``[Y]`` comes before ``[X]`` (``"[Y] is the capital of [X]."``) cannot be
asked and are dropped. The target is ``" " + obj_label``.

Loading with filters (single-token objects, known facts, round-robin over relations) is
:func:`tlcap.data.pararel.load_pararel`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tlcap.data.files import bundled_dir, find_file, local_root, read_jsonl
from tlcap.errors import MissingFileError


@dataclass(frozen=True)
class Fact:
    """One fact ⟨subject, relation, object⟩ with its neighbor queries.

    Attributes:
        relation: ParaRel relation id, e.g. ``"P36"``.
        subject: ``sub_label``.
        object: ``obj_label`` (without the leading space).
        queries: Neighbor queries (prompts that the object completes), at least two.
        uuid: The T-REx fact id.
    """

    relation: str
    subject: str
    object: str
    queries: tuple[str, ...]
    uuid: str = ""

    @property
    def target(self) -> str:
        """The answer as the model should produce it: ``" " + object``."""
        return " " + self.object

    def to_dict(self) -> dict:
        """The fact as a JSON-ready dict.

        Returns:
            ``{"relation", "subject", "object", "queries", "uuid"}`` (``queries`` as a list).
        """
        return {"relation": self.relation, "subject": self.subject, "object": self.object,
                "queries": list(self.queries), "uuid": self.uuid}


def pararel_root(data_dir: str | Path | None = None) -> Path:
    """The ParaRel folder: ``data_dir/pararel`` or ``data_dir`` itself; default ``$TLCAP_DATA/pararel``
    when it exists, else the copy bundled with tlcap.

    Args:
        data_dir: Folder holding ``pararel/`` or the ParaRel folder itself, None for the default.

    Returns:
        The folder holding ``graphs_json`` and ``trex_lms_vocab``.

    Raises:
        MissingFileError: the folder holds no ParaRel data.
    """
    d = local_root(data_dir, "pararel") or bundled_dir()
    for cand in (d / "pararel", d):
        if (cand / "graphs_json").is_dir() and (cand / "trex_lms_vocab").is_dir():
            return cand
    raise MissingFileError(
        f"{d} holds no ParaRel data: expected {d}/pararel/graphs_json and trex_lms_vocab (or those two folders in {d})."
    )


def list_relations(data_dir: str | Path | None = None) -> list[str]:
    """Relation ids that have both patterns and facts, sorted by number.

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder), None for the default.

    Returns:
        The relation ids, e.g. ``["P17", "P19", ...]``.
    """
    root = pararel_root(data_dir)
    pats = {_relation(p) for p in (root / "graphs_json").glob("P*.jsonl*")}
    facts = {_relation(p) for p in (root / "trex_lms_vocab").glob("P*.jsonl*")}
    return sorted(pats & facts, key=lambda r: int(r[1:]))


def _relation(path: Path) -> str:
    """``P17.jsonl`` or ``P17.jsonl.gz`` → ``P17``."""
    return path.name.split(".", 1)[0]


def query_pattern(pattern: str) -> str | None:
    """A ParaRel pattern as a causal-LM query: cut before ``[Y]``; ``None`` if ``[Y]`` precedes ``[X]``.

    Args:
        pattern: A ParaRel pattern with ``[X]`` (subject) and ``[Y]`` (object).

    Returns:
        The query (whitespace normalized), or None.

    Examples:
        ``"The capital of [X] is [Y] ."`` → ``"The capital of [X] is"``;
        ``"[X] is a [Y] by profession."`` → ``"[X] is a"``; ``"[Y] is the capital of [X]."`` → ``None``.
    """
    x, y = pattern.find("[X]"), pattern.find("[Y]")
    if x < 0 or y < 0 or y < x:
        return None
    prompt = " ".join(pattern[:y].split())
    return prompt or None


def causal_patterns(data_dir: str | Path | None, relation: str) -> list[str]:
    """The relation's patterns as causal-LM queries (:func:`query_pattern`), deduplicated, file order.

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder), None for the default.
        relation: Relation id, e.g. ``"P36"``.

    Returns:
        The queries, still holding ``[X]`` for the subject.

    Raises:
        MissingFileError: no pattern file for ``relation``.
    """
    root = pararel_root(data_dir)
    path = root / "graphs_json" / f"{relation}.jsonl"
    if find_file(path) is None:
        raise MissingFileError(f"No patterns for relation {relation!r} at {path}; known: {', '.join(list_relations(data_dir))}")
    out: list[str] = []
    for row in read_jsonl(path):
        prompt = query_pattern(row["pattern"])
        if prompt and prompt not in out:
            out.append(prompt)
    return out


def _fact_rows(data_dir: str | Path | None, relation: str) -> list[dict]:
    path = pararel_root(data_dir) / "trex_lms_vocab" / f"{relation}.jsonl"
    if find_file(path) is None:
        raise MissingFileError(f"No facts for relation {relation!r} at {path}")
    return list(read_jsonl(path))


def iter_facts(data_dir: str | Path | None, relation: str, min_queries: int = 2) -> Iterator[Fact]:
    """All facts of ``relation`` with at least ``min_queries`` distinct queries (file order).

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder), None for the default.
        relation: Relation id, e.g. ``"P36"``.
        min_queries: Fewest distinct queries a fact needs.

    Yields:
        Each :class:`Fact` with its queries (subject filled in); nothing when the relation has too few patterns.
    """
    pats = causal_patterns(data_dir, relation)
    if len(pats) < min_queries:
        return
    for row in _fact_rows(data_dir, relation):
        s, o = row["sub_label"], row["obj_label"]
        qs: list[str] = []
        for p in pats:
            q = p.replace("[X]", s)
            if q not in qs:
                qs.append(q)
        if len(qs) >= min_queries:
            yield Fact(relation, s, o, tuple(qs), row.get("uuid", ""))


def relation_objects(data_dir: str | Path | None, relation: str) -> list[str]:
    """The distinct objects of ``relation``'s facts (file order): the candidates for a new object o'.

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder), None for the default.
        relation: Relation id, e.g. ``"P36"``.

    Returns:
        The ``obj_label`` values, each once.
    """
    return list(dict.fromkeys(row["obj_label"] for row in _fact_rows(data_dir, relation)))


@functools.lru_cache(maxsize=4)
def _all_facts(data_dir: str | None) -> tuple[Fact, ...]:
    out: list[Fact] = []
    for rel in list_relations(data_dir):
        out.extend(iter_facts(data_dir, rel, min_queries=1))
    return tuple(out)


def facts_of_other_relations(data_dir: str | Path | None, relation: str) -> list[Fact]:
    """Every ParaRel fact (with ≥ 1 query) of a relation other than ``relation`` (cached per folder).

    The pool from which unrelated prompts are drawn: locality prompts of the modification
    experiments and the irrelevant facts of the synapse experiments.

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder), None for the default.
        relation: The relation left out.

    Returns:
        The facts of every other relation, relation by relation in file order.
    """
    return [f for f in _all_facts(None if data_dir is None else str(data_dir)) if f.relation != relation]


__all__ = [
    "Fact", "causal_patterns", "facts_of_other_relations", "iter_facts", "list_relations", "pararel_root",
    "query_pattern", "relation_objects",
]
