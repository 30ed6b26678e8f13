"""ParaRel (Elazar et al. 2021): facts with their neighbor queries for a causal LM.

Files (bundled with tlcap, 31 relations; see ``docs/data.md``): ``graphs_json/PXX.jsonl`` holds the relation's
paraphrase patterns (``[X]`` = subject, ``[Y]`` = object), ``trex_lms_vocab/PXX.jsonl`` its
facts. A causal LM can only answer patterns whose object slot comes last, so only patterns
ending in ``[Y]`` (optionally followed by ``.`` / `` .``) are used; the prompt is the pattern
up to ``[Y]`` with the trailing space removed and the target is ``" " + obj_label``.

Facts whose object is more than one token are skipped by default (``single_token=True``): the
QL analyses edit with the object's embedding ``E(o)`` and score the first-token probability.
The attribution methods themselves support multi-token targets by teacher forcing; pass
``single_token=False`` to keep them.

Example:
    >>> facts = load_pararel(None, relations=["P36", "P103"], n_facts=4, model=model,
    ...                      known_top_k=10)
    >>> facts[0].queries, facts[0].target
    (('The capital of Cook County is', "Cook County's capital is", ...), ' Chicago')
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tlcap.config import Config, check_bool, check_choice, check_int, check_sequence, check_str
from tlcap.data.files import bundled_dir, find_file, local_root, read_jsonl
from tlcap.errors import (
    EmptyDatasetError,
    InvalidConfigError,
    MissingFileError,
    PromptTooLongError,
    TargetTokenizationError,
)

if TYPE_CHECKING:  # pragma: no cover
    from tlcap.models.adapter import Model

_END_Y = re.compile(r"\[Y\]\s*\.?\s*$")


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
        return {"relation": self.relation, "subject": self.subject, "object": self.object,
                "queries": list(self.queries), "uuid": self.uuid}


def pararel_root(data_dir: str | Path | None = None) -> Path:
    """The ParaRel folder: ``data_dir/pararel`` or ``data_dir`` itself; default ``$TLCAP_DATA/pararel``
    when it exists, else the copy bundled with tlcap."""
    d = local_root(data_dir, "pararel") or bundled_dir()
    for cand in (d / "pararel", d):
        if (cand / "graphs_json").is_dir() and (cand / "trex_lms_vocab").is_dir():
            return cand
    raise MissingFileError(
        f"{d} holds no ParaRel data: expected {d}/pararel/graphs_json and trex_lms_vocab (or those two folders in {d})."
    )


def list_relations(data_dir: str | Path | None = None) -> list[str]:
    """Relation ids that have both patterns and facts, sorted by number."""
    root = pararel_root(data_dir)
    pats = {_relation(p) for p in (root / "graphs_json").glob("P*.jsonl*")}
    facts = {_relation(p) for p in (root / "trex_lms_vocab").glob("P*.jsonl*")}
    return sorted(pats & facts, key=lambda r: int(r[1:]))


def _relation(path: Path) -> str:
    """``P17.jsonl`` or ``P17.jsonl.gz`` → ``P17``."""
    return path.name.split(".", 1)[0]


def causal_patterns(data_dir: str | Path | None, relation: str) -> list[str]:
    """The relation's patterns that end in the object slot, cut before ``[Y]`` (deduplicated).

    ``"The capital of [X] is [Y] ."`` → ``"The capital of [X] is"``.
    """
    root = pararel_root(data_dir)
    path = root / "graphs_json" / f"{relation}.jsonl"
    if find_file(path) is None:
        raise MissingFileError(f"No patterns for relation {relation!r} at {path}; known: {', '.join(list_relations(data_dir))}")
    out: list[str] = []
    for row in read_jsonl(path):
        pat = row["pattern"]
        if "[X]" not in pat or not _END_Y.search(pat):
            continue
        prompt = " ".join(_END_Y.sub("", pat).split())
        if prompt and prompt not in out:
            out.append(prompt)
    return out


def _single_token_ok(model: "Model", queries: Sequence[str], target: str) -> bool:
    try:
        for q in queries:
            model.target_ids(q, target, single_token=True)
    except TargetTokenizationError:
        return False
    return True


def _known(model: "Model", queries: Sequence[str], target: str, top_k: int, policy: str) -> list[bool]:
    """Is the target's first token in the model's top-k for each query (one padded batch)?"""
    import torch

    hits = []
    with torch.no_grad():
        for q in queries:
            ids = model.encode(q)
            tid = model.target_ids(q, target)[0]
            logits = model.logits(torch.tensor([ids], device=model.device))[0, -1]
            hits.append(bool((logits > logits[tid]).sum().item() < top_k))
            if not hits[-1] and policy in ("all", "first"):
                break  # the fact is rejected: skip the remaining forward passes
            if policy == "first":
                break
    return hits + [False] * (len(queries) - len(hits)) if policy == "all" else hits + [True] * (len(queries) - len(hits))


def iter_facts(data_dir: str | Path | None, relation: str, min_queries: int = 2) -> Iterator[Fact]:
    """All facts of ``relation`` with at least ``min_queries`` causal queries (file order)."""
    root = pararel_root(data_dir)
    pats = causal_patterns(data_dir, relation)
    if len(pats) < min_queries:
        return
    path = root / "trex_lms_vocab" / f"{relation}.jsonl"
    if find_file(path) is None:
        raise MissingFileError(f"No facts for relation {relation!r} at {path}")
    for row in read_jsonl(path):
        s, o = row["sub_label"], row["obj_label"]
        qs: list[str] = []
        for p in pats:
            q = p.replace("[X]", s)
            if q not in qs:
                qs.append(q)
        if len(qs) >= min_queries:
            yield Fact(relation, s, o, tuple(qs), row.get("uuid", ""))


KNOWN_POLICIES: tuple[str, ...] = ("all", "any", "first")


@dataclass(frozen=True)
class ParaRelConfig(Config):
    """Which ParaRel facts to load and how to filter them (the data options of ``tlcap ql``).

    Attributes:
        relations: Relation ids (``None``: every relation with enough causal patterns).
        n_facts: Total number of facts, taken round-robin over the relations (``None``: all), ``>= 1``.
        single_token: Keep only facts whose target is one token after every query.
        known_top_k: Keep only facts the model answers within its top-k (first answer token),
            ``>= 1`` (``None``: no filter).
        known_policy: ``"all"`` queries, ``"any"`` query or the ``"first"`` query must be known.
        min_queries: Fewest neighbor queries a fact needs, ``>= 2``.
        max_queries: Keep at most this many queries per fact, ``>= 1`` (``None``: all).
        shuffle: Shuffle each relation's facts with ``seed`` before taking them.
        seed: Seed of ``shuffle``, ``>= 0``.
    """

    relations: tuple[str, ...] | None = None
    n_facts: int | None = None
    single_token: bool = True
    known_top_k: int | None = None
    known_policy: str = "all"
    min_queries: int = 2
    max_queries: int | None = None
    shuffle: bool = False
    seed: int = 0

    def validate(self) -> None:
        if self.relations is not None:
            self._set("relations", check_sequence("relations", list(self.relations), min_len=1, unique=True,
                                                  item=lambda n, x: check_str(n, x, cli="--relations").strip()))
        if self.n_facts is not None:
            check_int("n_facts", self.n_facts, min=1)
        check_bool("single_token", self.single_token, cli=None)
        if self.known_top_k is not None:
            check_int("known_top_k", self.known_top_k, min=1)
        check_choice("known_policy", self.known_policy, KNOWN_POLICIES, cli=None)
        check_int("min_queries", self.min_queries, min=2, cli=None)
        if self.max_queries is not None:
            check_int("max_queries", self.max_queries, min=1)
        check_bool("shuffle", self.shuffle, cli=None)
        check_int("seed", self.seed, min=0)

    def check_relations(self, data_dir: str | Path | None = None) -> tuple[str, ...]:
        """The relations to load, checked against the data (before any model is loaded).

        Raises:
            MissingFileError: an unknown relation (the message lists the available ones).
        """
        known = list_relations(data_dir)
        rels = tuple(self.relations) if self.relations else tuple(known)
        bad = [r for r in rels if r not in known]
        if bad:
            raise MissingFileError(f"Unknown ParaRel relation(s) {bad} (--relations); available: {', '.join(known)}")
        if not rels:
            raise EmptyDatasetError("No ParaRel relations selected.")
        return rels


def load_pararel(
    data_dir: str | Path | None = None,
    relations: Sequence[str] | None = None,
    n_facts: int | None = None,
    model: "Model | None" = None,
    *,
    config: ParaRelConfig | None = None,
    **overrides: Any,
) -> list[Fact]:
    """Facts with neighbor queries, balanced over relations.

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder itself); default
            ``$TLCAP_DATA/pararel`` when it exists, else the copy bundled with tlcap (all 31 relations).
        relations: Relation ids (default all that have ≥ ``min_queries`` causal patterns).
        n_facts: Total number of facts, taken round-robin over the relations (default all).
        model: Needed for ``single_token`` and ``known_top_k`` filtering.
        config: A :class:`ParaRelConfig` (the filters); ``relations``/``n_facts`` override it.
        **overrides: :class:`ParaRelConfig` fields (``known_top_k=10``, ``max_queries=3``, ...).
            With ``known_policy="any"``, the unknown queries are dropped (the fact keeps
            ≥ ``min_queries``).

    Returns:
        A list of :class:`Fact`.

    Raises:
        EmptyDatasetError: nothing survives the filters.
        MissingFileError: an unknown relation.
        InvalidConfigError: an invalid filter, or a filter that needs ``model`` without one.

    Example:
        >>> facts = load_pararel(None, ["P36", "P103"], n_facts=4, model=model, known_top_k=10)
    """
    if relations is not None:
        overrides["relations"] = tuple(relations)
    if n_facts is not None:
        overrides["n_facts"] = n_facts
    cfg = ParaRelConfig.resolve(config, **overrides)
    if (cfg.single_token or cfg.known_top_k) and model is None:
        raise InvalidConfigError("load_pararel needs `model` to filter by single-token targets or known facts")
    rels = cfg.check_relations(data_dir)
    single_token, known_top_k, known_policy = cfg.single_token, cfg.known_top_k, cfg.known_policy
    min_queries, max_queries, n_facts = cfg.min_queries, cfg.max_queries, cfg.n_facts
    shuffle, seed = cfg.shuffle, cfg.seed

    def gen(rel: str) -> Iterator[Fact]:
        facts = list(iter_facts(data_dir, rel, min_queries))
        if shuffle:
            random.Random(seed).shuffle(facts)
        for f in facts:
            qs = list(f.queries)
            if model is not None:
                try:
                    ok = [q for q in qs if len(model.encode(q)) > 0]
                except PromptTooLongError:
                    continue
                qs = ok
            if max_queries and known_policy != "any":
                qs = qs[:max_queries]
            if single_token and not _single_token_ok(model, qs, f.target):
                continue
            if known_top_k:
                try:
                    hits = _known(model, qs, f.target, known_top_k, known_policy)
                except TargetTokenizationError:
                    continue
                if known_policy == "all" and not all(hits):
                    continue
                if known_policy == "first" and not hits[0]:
                    continue
                if known_policy == "any":
                    qs = [q for q, h in zip(qs, hits) if h]
            if max_queries:
                qs = qs[:max_queries]
            if len(qs) < min_queries:
                continue
            yield Fact(f.relation, f.subject, f.object, tuple(qs), f.uuid)

    gens = {r: gen(r) for r in rels}
    out: list[Fact] = []
    while gens and (n_facts is None or len(out) < n_facts):
        for r in list(gens):
            if n_facts is not None and len(out) >= n_facts:
                break
            try:
                out.append(next(gens[r]))
            except StopIteration:
                del gens[r]
    if not out:
        raise EmptyDatasetError(
            f"No ParaRel facts in {rels} survive the filters (single_token={single_token}, known_top_k={known_top_k}, "
            f"min_queries={min_queries}); relax them or pick other relations."
        )
    return out
