"""ParaRel (Elazar et al. 2021): facts with their neighbor queries, filtered for a model.

Reading the files (relations, patterns cut before ``[Y]``, facts) is :mod:`tlcap.data.pararel_files`
(re-exported here). This module picks facts: single-token objects (the QL analyses edit with the
object's embedding and score its first token), facts the model knows (its answer in the model's
top-k), round-robin over the requested relations.

The known-fact filter runs in batches (:meth:`Model.encode_batch` + :meth:`Model.last_logits`),
shows its progress (facts tested / kept per relation) and stops a relation after ``max_scan``
tested facts: :func:`scan_pararel` returns the facts with a per-relation report (hit rate, why
the scan stopped), and warns when a requested relation yields no fact, when fewer facts than
requested could be found, and when a relation has fewer than 3 queries per fact (then CS1 ≡ CS2).

Example (``model`` is a tiny random GPT-2, which answers few facts: hence the wide top-5000; with a
trained model such as SmolLM2-135M a small ``known_top_k`` such as 10 is the usual filter):

    >>> sample = scan_pararel(None, ["P17", "P103"], n_facts=4, model=model, known_top_k=5000)
    >>> sample.facts[0].queries                                   # a kept fact's neighbor queries
    ("Santo Stefano d'Aveto is located in", "Santo Stefano d'Aveto, which is located in", ...)
    >>> sample.to_frame()[["relation", "tested", "kept", "hit_rate"]]   # the scan report
      relation  tested  kept  hit_rate
    0      P17      32     2    0.0625
    1     P103     160     2    0.0125
    >>> facts = load_pararel(None, ["P17", "P103"], n_facts=4, model=model, known_top_k=5000)
    >>> len(facts), facts[0].subject, facts[0].object
    (4, "Santo Stefano d'Aveto", 'Italy')
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from tlcap.config import Config, check_bool, check_choice, check_int, check_sequence, check_str
from tlcap.data.pararel_files import (
    Fact,
    causal_patterns,
    facts_of_other_relations,
    iter_facts,
    list_relations,
    pararel_root,
    query_pattern,
    relation_objects,
)
from tlcap.data.sample import DataWarning
from tlcap.errors import EmptyDatasetError, InvalidConfigError, MissingFileError, PromptTooLongError, TargetTokenizationError

if TYPE_CHECKING:  # pragma: no cover
    from tlcap.models.adapter import Model

KNOWN_POLICIES: tuple[str, ...] = ("all", "any", "first")
MIN_CONSISTENCY_QUERIES = 3
CHUNK = 32
KNOWN_BATCH = 128
"""Queries per pass of the known-fact test (the queries of :data:`CHUNK` facts at a time)."""


@dataclass(frozen=True)
class ParaRelConfig(Config):
    """Which ParaRel facts to load and how to filter them (the data options of ``tlcap ql``).

    Attributes:
        relations: Relation ids (``None``: every relation).
        n_facts: Total number of facts, taken round-robin over the relations (``None``: all), ``>= 1``.
        single_token: Keep only facts whose target is one token after every query.
        known_top_k: Keep only facts the model answers within its top-k (first answer token),
            ``>= 1`` (``None``: no filter).
        known_policy: ``"all"`` queries, ``"any"`` query or the ``"first"`` query must be known
            (with ``"any"`` the unknown queries are dropped).
        min_queries: Fewest neighbor queries a fact needs, ``>= 2``.
        max_queries: Keep at most this many queries per fact, ``>= 1`` (``None``: all, the paper).
        max_scan: Test at most this many facts of each relation against the model (the known
            filter), ``>= 1``; a relation that yields too few facts by then is reported with its
            hit rate instead of being scanned on.
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
    max_scan: int = 1000
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
        check_int("max_scan", self.max_scan, min=1)
        check_bool("shuffle", self.shuffle, cli=None)
        check_int("seed", self.seed, min=0)

    def check_relations(self, data_dir: str | Path | None = None) -> tuple[str, ...]:
        """The relations to load, checked against the data (before any model is loaded).

        Args:
            data_dir: Folder holding ``pararel/`` (default ``$TLCAP_DATA`` or the bundled copy).

        Returns:
            ``relations`` (all relations of the data when empty), in order.

        Raises:
            MissingFileError: an unknown relation (the message lists the available ones).
        """
        known = list_relations(data_dir)
        rels = tuple(self.relations) if self.relations else tuple(known)
        bad = [r for r in rels if r not in known]
        if bad:
            raise MissingFileError(f"Unknown ParaRel relation(s) {bad} (--relations); available: {', '.join(known)}")
        return rels


@dataclass
class RelationScan:
    """What loading found for one relation.

    Attributes:
        relation: The relation id.
        n_patterns: Its queries per fact (patterns usable by a causal LM).
        candidates: Facts with enough queries in the file.
        multi_token: Facts skipped because the object is not one token after every query.
        tested: Facts tested against the model (the known filter; 0 without it).
        kept: Facts that passed every filter.
        used: Facts of this relation in the returned sample.
        stopped: Why the relation stopped: ``"enough"`` (the sample was full), ``"exhausted"``
            (every fact seen) or ``"max_scan"`` (the scan bound).
    """

    relation: str
    n_patterns: int = 0
    candidates: int = 0
    multi_token: int = 0
    tested: int = 0
    kept: int = 0
    used: int = 0
    stopped: str = "enough"

    @property
    def hit_rate(self) -> float:
        """Share of tested facts the model knows (``kept / tested``; NaN when none was tested)."""
        return self.kept / self.tested if self.tested else float("nan")


@dataclass(frozen=True)
class ParaRelSample:
    """Facts picked by :func:`scan_pararel`, with the per-relation report.

    Attributes:
        facts: The facts, round-robin over the relations.
        relations: One :class:`RelationScan` per requested relation (in request order).
        requested: The requested number of facts (``None``: all).
        config: The :class:`ParaRelConfig` as a dict.
    """

    facts: tuple[Fact, ...]
    relations: tuple[RelationScan, ...] = ()
    requested: int | None = None
    config: dict = field(default_factory=dict)

    @property
    def used(self) -> int:
        return len(self.facts)

    def to_frame(self) -> pd.DataFrame:
        """One row per relation: patterns, candidates, tested, kept, used, hit rate, why it stopped.

        Returns:
            A DataFrame with the fields of each :class:`RelationScan` plus a ``hit_rate`` column.
        """
        return pd.DataFrame([{**vars(r), "hit_rate": r.hit_rate} for r in self.relations])

    def summary(self) -> dict[str, Any]:
        """Requested vs used facts and the per-relation report (JSON-ready).

        Returns:
            A dict of ``requested_facts``, ``used_facts`` and ``relations`` (one dict per relation, with ``hit_rate``).
        """
        return {"requested_facts": self.requested, "used_facts": self.used,
                "relations": [{**vars(r), "hit_rate": r.hit_rate} for r in self.relations]}


def _queries(model: Model | None, f: Fact, cfg: ParaRelConfig) -> list[str] | None:
    """The fact's queries after the tokenizer-only filters, or ``None`` if the fact is skipped."""
    qs = list(f.queries)
    if model is not None:
        try:
            qs = [q for q in qs if model.encode(q)]
        except PromptTooLongError:
            return None
    if cfg.max_queries and cfg.known_policy != "any":
        qs = qs[: cfg.max_queries]
    if cfg.single_token:
        try:
            for q in qs:
                model.target_ids(q, f.target, single_token=True)  # type: ignore[union-attr]
        except TargetTokenizationError:
            return None
    return qs


def known_test_calls(asked: Sequence[int]) -> int:
    """Forward passes of the known-fact test of facts asking ``asked[i]`` queries each, in scan order.

    The scan tests the queries of :data:`CHUNK` facts at a time in passes of at most :data:`KNOWN_BATCH`
    (``_known_hits``).

    Args:
        asked: Queries each tested fact asks (1 under ``known_policy="first"``).

    Returns:
        The passes.

    Example:
        >>> known_test_calls([5] * 32 + [5] * 8)       # 160 queries in the first chunk, 40 in the second
        3
    """
    return sum(math.ceil(sum(asked[s:s + CHUNK]) / KNOWN_BATCH) for s in range(0, len(asked), CHUNK))


@torch.no_grad()
def _known_hits(model: Model, batch: list[tuple[Fact, list[str]]], top_k: int, policy: str) -> list[list[bool]]:
    """For each (fact, queries): is the target's first token in the model's top-k after each query?"""
    asked = [(bi, q) for bi, (f, qs) in enumerate(batch) for q in (qs[:1] if policy == "first" else qs)]
    hits: list[list[bool]] = [[] for _ in batch]
    for start in range(0, len(asked), KNOWN_BATCH):
        part = asked[start:start + KNOWN_BATCH]
        logits = model.last_logits(model.encode_batch([q for _, q in part])).float()
        tids = torch.tensor([model.target_ids(q, batch[bi][0].target)[0] for bi, q in part], device=logits.device)
        above = (logits > logits.gather(1, tids[:, None])).sum(-1)  # tokens ranked above the target, one read
        for (bi, _), n in zip(part, above.tolist()):
            hits[bi].append(n < top_k)
    return hits


def _stream(model: Model | None, rel: str, cfg: ParaRelConfig, scan: RelationScan, bar: Any,
            data_dir: str | Path | None) -> Iterator[Fact]:
    """The relation's facts that pass every filter, tested against the model in chunks."""
    facts = list(iter_facts(data_dir, rel, cfg.min_queries))
    scan.candidates = len(facts)
    if cfg.shuffle:
        random.Random(cfg.seed).shuffle(facts)
    pending: list[tuple[Fact, list[str]]] = []

    def flush() -> Iterator[Fact]:
        if cfg.known_top_k and pending:
            scan.tested += len(pending)
            hit_lists = _known_hits(model, pending, cfg.known_top_k, cfg.known_policy)  # type: ignore[arg-type]
            bar.update(len(pending))
        else:
            hit_lists = [[True] * len(qs) for _, qs in pending]
        for (f, qs), hits in zip(pending, hit_lists):
            if cfg.known_policy == "all" and not all(hits) or cfg.known_policy == "first" and not hits[0]:
                continue
            if cfg.known_policy == "any":
                qs = [q for q, h in zip(qs, hits) if h]
            qs = qs[: cfg.max_queries] if cfg.max_queries else qs
            if len(qs) < cfg.min_queries:
                continue
            scan.kept += 1
            yield Fact(f.relation, f.subject, f.object, tuple(qs), f.uuid)
        bar.set_postfix_str(f"{rel}: kept {scan.kept} of {scan.tested} tested")
        pending.clear()

    for f in facts:
        if cfg.known_top_k and scan.tested + len(pending) >= cfg.max_scan:
            scan.stopped = "max_scan"
            break
        qs = _queries(model, f, cfg)
        if qs is None:
            scan.multi_token += 1
            continue
        pending.append((f, qs))
        if len(pending) >= CHUNK or not cfg.known_top_k:
            yield from flush()
    else:
        scan.stopped = "exhausted"
    yield from flush()
    if scan.stopped == "enough":
        scan.stopped = "exhausted"


def _warn(sample: ParaRelSample, cfg: ParaRelConfig) -> None:
    for r in sample.relations:
        if r.used == 0 and r.n_patterns < cfg.min_queries:
            warnings.warn(f"ParaRel relation {r.relation} gave no fact: it has {r.n_patterns} queries per fact, fewer "
                          f"than min_queries={cfg.min_queries}", DataWarning, stacklevel=3)
        elif r.used == 0:
            why = (f"{r.kept} of {r.tested} tested facts known (top-{cfg.known_top_k}), scan stopped: {r.stopped}"
                   if cfg.known_top_k else f"{r.candidates} facts with ≥ {cfg.min_queries} queries, {r.multi_token} multi-token")
            warnings.warn(f"ParaRel relation {r.relation} gave no fact ({why}); raise --max-scan or --known-top-k, "
                          "or pick another relation", DataWarning, stacklevel=3)
        elif 0 < r.n_patterns < MIN_CONSISTENCY_QUERIES:
            warnings.warn(f"ParaRel relation {r.relation} has {r.n_patterns} queries per fact: CS1 ≡ CS2 for its facts "
                          "(consistency reports them separately)", DataWarning, stacklevel=3)
    if sample.requested is not None and sample.used < sample.requested:
        rates = ", ".join(f"{r.relation} {r.used} ({r.kept}/{r.tested} known)" if r.tested else f"{r.relation} {r.used}"
                          for r in sample.relations)
        warnings.warn(f"{sample.requested} ParaRel facts requested (--n-facts), {sample.used} found: {rates}",
                      DataWarning, stacklevel=3)


def scan_pararel(
    data_dir: str | Path | None = None,
    relations: Sequence[str] | None = None,
    n_facts: int | None = None,
    model: Model | None = None,
    *,
    config: ParaRelConfig | None = None,
    progress: bool = True,
    **overrides: Any,
) -> ParaRelSample:
    """Facts with neighbor queries, round-robin over relations, with a per-relation report.

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder itself); default
            ``$TLCAP_DATA/pararel`` when it exists, else the copy bundled with tlcap (31 relations).
        relations: Relation ids (default all).
        n_facts: Total number of facts, taken round-robin over the relations (default all).
        model: Needed for ``single_token`` and ``known_top_k`` filtering.
        config: A :class:`ParaRelConfig` (the filters); ``relations``/``n_facts`` override it.
        progress: Show the known-fact scan's progress (facts tested / kept per relation).
        **overrides: :class:`ParaRelConfig` fields (``known_top_k=10``, ``max_scan=200``, ...).

    Returns:
        A :class:`ParaRelSample` (warnings as in the module docstring).

    Raises:
        EmptyDatasetError: nothing survives the filters (the message gives each relation's hit rate).
        MissingFileError: an unknown relation.
        InvalidConfigError: an invalid filter, or a filter that needs ``model`` without one.

    Example:
        >>> sample = scan_pararel(None, ["P17", "P103"], n_facts=4, model=model, known_top_k=5000)
        >>> sample.to_frame()[["relation", "tested", "kept", "hit_rate"]]
          relation  tested  kept  hit_rate
        0      P17      32     2    0.0625
        1     P103     160     2    0.0125
    """
    if relations is not None:
        overrides["relations"] = tuple(relations)
    if n_facts is not None:
        overrides["n_facts"] = n_facts
    cfg = ParaRelConfig.resolve(config, **overrides)
    if (cfg.single_token or cfg.known_top_k) and model is None:
        raise InvalidConfigError("load_pararel needs `model` to filter by single-token targets or known facts")
    rels = cfg.check_relations(data_dir)
    scans = {r: RelationScan(r, n_patterns=len(causal_patterns(data_dir, r))) for r in rels}
    bar = tqdm(desc="ParaRel known-fact scan (facts tested)", unit="fact",
               disable=not (progress and cfg.known_top_k), leave=False)
    gens = {r: _stream(model, r, cfg, scans[r], bar, data_dir) for r in rels}
    out: list[Fact] = []
    while gens and (cfg.n_facts is None or len(out) < cfg.n_facts):
        for r in list(gens):
            if cfg.n_facts is not None and len(out) >= cfg.n_facts:
                break
            try:
                out.append(next(gens[r]))
                scans[r].used += 1
            except StopIteration:
                del gens[r]
    bar.close()
    sample = ParaRelSample(tuple(out), tuple(scans[r] for r in rels), cfg.n_facts, cfg.to_dict())
    if not out:
        rates = "; ".join(f"{s.relation}: {s.kept} kept of {s.tested} tested, {s.multi_token} multi-token"
                          for s in sample.relations)
        raise EmptyDatasetError(
            f"No ParaRel facts in {list(rels)} survive the filters (single_token={cfg.single_token}, "
            f"known_top_k={cfg.known_top_k}, min_queries={cfg.min_queries}): {rates}; relax them or pick other relations."
        )
    _warn(sample, cfg)
    return sample


def load_pararel(
    data_dir: str | Path | None = None,
    relations: Sequence[str] | None = None,
    n_facts: int | None = None,
    model: Model | None = None,
    *,
    config: ParaRelConfig | None = None,
    progress: bool = True,
    **overrides: Any,
) -> list[Fact]:
    """The facts of :func:`scan_pararel` (same arguments; same warnings and errors).

    Args:
        data_dir: Folder holding ``pararel/`` (or the ParaRel folder itself); default ``$TLCAP_DATA/pararel``
            when it exists, else the copy bundled with tlcap.
        relations: Relation ids (default all).
        n_facts: Total number of facts, taken round-robin over the relations (default all).
        model: Needed for ``single_token`` and ``known_top_k`` filtering.
        config: A :class:`ParaRelConfig` (the filters); ``relations``/``n_facts`` override it.
        progress: Show the known-fact scan's progress.
        **overrides: :class:`ParaRelConfig` fields (``known_top_k=10``, ``max_scan=200``, ...).

    Returns:
        A list of :class:`Fact`.

    Example:
        >>> facts = load_pararel(None, ["P17", "P103"], n_facts=4, model=model, known_top_k=5000)
        >>> [f.relation for f in facts]                     # round-robin over the relations
        ['P17', 'P103', 'P17', 'P103']
        >>> facts[0].queries, facts[0].target
        (("Santo Stefano d'Aveto is located in", ...), ' Italy')
    """
    return list(scan_pararel(data_dir, relations, n_facts, model, config=config, progress=progress, **overrides).facts)


__all__ = [
    "CHUNK", "KNOWN_BATCH", "KNOWN_POLICIES", "Fact", "ParaRelConfig", "ParaRelSample", "RelationScan",
    "causal_patterns", "facts_of_other_relations", "iter_facts", "known_test_calls", "list_relations", "load_pararel",
    "pararel_root", "query_pattern", "relation_objects", "scan_pararel",
]
