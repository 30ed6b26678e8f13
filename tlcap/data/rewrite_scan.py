"""The fact scan behind :func:`tlcap.data.rewrites.rewrite_facts`: which ParaRel facts the model
answers on enough rewrites, found in batches and cached on disk.

Each relation's facts are visited in a seeded order (shuffled with ``f"{seed}:{relation}"``). A
fact's **outcome** is the tuple of its first ``n_rewrites`` queries (ParaRel's pattern order)
that pass the filters — the answer is one token after the query (``single_token``) and its first
token is within the model's top-``known_top_k`` — or ``()`` when fewer pass.

Outcomes are computed for a chunk of facts at once. Their queries share padded forwards of
``chunk`` rows, and each fact's queries are asked in stages, only as many as could still
complete it (``n_rewrites − passed``): a fact stops as soon as it has ``n_rewrites`` passing
queries or can no longer reach them. The outcome is the one that asking every query alone gives
(the same ranks, up to the float noise of a padded batch).

Outcomes are cached under ``<cache>/rewrite_scans/<model>-<fingerprint>/`` (:func:`scan_cache_path`)
per (filters, seed), each relation's entry tied to a hash of its facts, and saved after every
chunk: a rerun — or a draw of another size — reads them instead of scanning again, and an
interrupted scan continues where it stopped.

Example (``model`` is a tiny random GPT-2, hence 2 rewrites within its top-5000; rewrite_facts
asks SmolLM2-135M for 5 rewrites it answers top-1):

    >>> import tempfile
    >>> scan = RewriteScan(model, ["P17", "P20"], n_rewrites=2, known_top_k=5000, single_token=True,
    ...                    cache=tempfile.mkdtemp())
    >>> scan.outcome("P17", 0)                     # () : fewer than 2 of the fact's queries pass
    ()
    >>> scan.outcome("P17", 35)                    # the fact's first 2 passing queries
    ('Panagarh is located in', 'Panagarh, located in')
    >>> scan.to_frame()                            # facts scanned / kept per relation
      relation  facts  known  from_cache  scanned_now  kept
    0      P17    912     48           0           48     3
    1      P20    817      0           0            0     0
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from tlcap.data.pararel_files import Fact, iter_facts
from tlcap.errors import TargetTokenizationError
from tlcap.models.paths import model_cache_dir

if TYPE_CHECKING:  # pragma: no cover
    from tlcap.models.adapter import Model

SCAN_VERSION = 1
CHUNK = 32

Outcome = tuple[str, ...]


def scan_cache_path(model: Model, n_rewrites: int, known_top_k: int | None, single_token: bool, seed: int,
                    root: str | Path | None = None) -> Path:
    """The JSON file caching a model's scan outcomes for one set of filters and seed.

    Args:
        model: The model (its name and weight fingerprint name the folder).
        n_rewrites, known_top_k, single_token, seed: As in :class:`RewriteScan`.
        root: Cache root (default :func:`tlcap.models.cache_dir`).

    Returns:
        ``<root>/rewrite_scans/<model>-<fingerprint>/r{n_rewrites}_k{known_top_k}_st{0|1}_s{seed}.json``.
    """
    name = f"r{n_rewrites}_k{known_top_k}_st{int(single_token)}_s{seed}.json"
    return model_cache_dir(model, "rewrite_scans", root) / name


def _pool_hash(pool: Sequence[Fact]) -> str:
    rows = [[f.uuid, f.subject, f.object, list(f.queries)] for f in pool]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


@torch.no_grad()
def _top_k_hits(model: Model, asked: Sequence[tuple[str, int]], top_k: int, chunk: int) -> list[bool]:
    """Is the token id within the model's top-``top_k`` after each prompt? (``chunk`` rows per forward)."""
    hits: list[bool] = []
    for start in range(0, len(asked), chunk):
        part = asked[start:start + chunk]
        logits = model.last_logits(model.encode_batch([q for q, _ in part])).float()
        rows = torch.arange(len(part), device=logits.device)
        tids = torch.tensor([t for _, t in part], device=logits.device)
        ranks = (logits > logits[rows, tids][:, None]).sum(-1)
        hits += [r < top_k for r in ranks.tolist()]
    return hits


def fact_outcomes(model: Model | None, facts: Sequence[Fact], n_rewrites: int, known_top_k: int | None,
                  single_token: bool, chunk: int = CHUNK) -> list[Outcome]:
    """The outcome of each fact (module docstring), with staged, batched queries.

    Args:
        model: The model (``None``: no filter, each fact's first ``n_rewrites`` queries).
        facts: The facts.
        n_rewrites: Passing queries a fact needs.
        known_top_k: Top-k of the known filter (``None``: no forward pass).
        single_token: Keep only queries after which the answer is one token.
        chunk: Rows per padded forward.

    Returns:
        One outcome per fact: its first ``n_rewrites`` passing queries, or ``()``.
    """
    if model is None:
        return [tuple(f.queries[:n_rewrites]) if len(f.queries) >= n_rewrites else () for f in facts]
    cands: list[list[tuple[str, int]]] = []
    for f in facts:
        c = []
        for q in f.queries:
            try:
                ids = model.target_ids(q, f.target, single_token=single_token)
            except TargetTokenizationError:
                continue
            c.append((q, ids[0]))
        cands.append(c)
    if known_top_k is None:
        return [tuple(q for q, _ in c[:n_rewrites]) if len(c) >= n_rewrites else () for c in cands]
    kept: list[list[str]] = [[] for _ in facts]
    nxt = [0] * len(facts)
    while True:
        asked: list[tuple[int, str, int]] = []
        for i, c in enumerate(cands):
            need = n_rewrites - len(kept[i])
            if need <= 0 or len(kept[i]) + len(c) - nxt[i] < n_rewrites:
                continue  # decided: complete, or it can no longer reach n_rewrites
            asked += [(i, q, t) for q, t in c[nxt[i]:nxt[i] + need]]
            nxt[i] += need
        if not asked:
            break
        for (i, q, _), hit in zip(asked, _top_k_hits(model, [(q, t) for _, q, t in asked], known_top_k, chunk)):
            if hit:
                kept[i].append(q)
    return [tuple(k) if len(k) >= n_rewrites else () for k in kept]


class RewriteScan:
    """Outcomes of each relation's facts in their seeded order, computed on demand and cached.

    Args:
        model: The model (``None``: no filters; then ``known_top_k`` must be ``None``).
        relations: The relations scanned.
        n_rewrites: Passing queries a fact needs.
        known_top_k: Top-k of the known filter (``None``: none; nothing is cached then).
        single_token: Keep only single-token answers.
        seed: Seed of each relation's fact order.
        chunk: Rows per padded forward (facts per chunk: about ``chunk / n_rewrites``).
        cache: ``True``: cache under :func:`tlcap.models.cache_dir`; a folder: cache there;
            ``False``: no cache.
        data_dir: Folder holding ``pararel/`` (default: ``$TLCAP_DATA`` or the bundled copy).
        bar: A tqdm bar advanced by every fact scanned with the model (optional).
    """

    def __init__(self, model: Model | None, relations: Sequence[str], *, n_rewrites: int, known_top_k: int | None,
                 single_token: bool, seed: int = 0, chunk: int = CHUNK, cache: bool | str | Path = True,
                 data_dir: str | Path | None = None, bar: Any = None) -> None:
        self.model, self.n_rewrites, self.known_top_k = model, n_rewrites, known_top_k
        self.single_token, self.chunk, self.bar = single_token, max(1, int(chunk)), bar
        self.pools: dict[str, list[Fact]] = {}
        for r in relations:
            pool = list(iter_facts(data_dir, r, min_queries=n_rewrites))
            random.Random(f"{seed}:{r}").shuffle(pool)
            self.pools[r] = pool
        self.hashes = {r: _pool_hash(p) for r, p in self.pools.items()}
        self.outcomes: dict[str, list[Outcome]] = {r: [] for r in relations}
        self.cached = dict.fromkeys(relations, 0)
        self.scanned = dict.fromkeys(relations, 0)
        self.path: Path | None = None
        if model is not None and known_top_k is not None and cache is not False:
            root = None if cache is True else Path(cache)
            self.path = scan_cache_path(model, n_rewrites, known_top_k, single_token, seed, root)
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text())
            rels = data["relations"] if data.get("version") == SCAN_VERSION else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return  # no cache yet, or an unreadable one: scan again (the next save replaces it)
        for r in self.pools:
            entry = rels.get(r) if isinstance(rels, dict) else None
            if isinstance(entry, dict) and entry.get("facts") == self.hashes[r]:
                self.outcomes[r] = [tuple(o) for o in entry.get("outcomes", [])][:len(self.pools[r])]
                self.cached[r] = len(self.outcomes[r])

    def save(self) -> None:
        """Write every relation's outcomes so far (atomic rename; merges relations saved by another draw)."""
        if self.path is None:
            return
        rels: dict[str, Any] = {}
        try:
            old = json.loads(self.path.read_text())
            if old.get("version") == SCAN_VERSION and isinstance(old.get("relations"), dict):
                rels = old["relations"]
        except (OSError, ValueError, AttributeError):
            pass
        for r, outs in self.outcomes.items():
            prev = rels.get(r)
            if isinstance(prev, dict) and prev.get("facts") == self.hashes[r] and len(prev.get("outcomes", [])) > len(outs):
                continue  # another draw scanned further
            rels[r] = {"facts": self.hashes[r], "outcomes": [list(o) for o in outs]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": SCAN_VERSION, "relations": rels}))
        os.replace(tmp, self.path)

    def fact(self, relation: str, i: int) -> Fact:
        """The ``i``-th fact of the relation's seeded order.

        Args:
            relation: Relation id.
            i: Index in the relation's pool.

        Returns:
            The :class:`Fact`.
        """
        return self.pools[relation][i]

    def size(self, relation: str) -> int:
        """Facts of the relation with at least ``n_rewrites`` queries.

        Args:
            relation: Relation id.

        Returns:
            The size of the relation's pool.
        """
        return len(self.pools[relation])

    def outcome(self, relation: str, i: int, limit: int | None = None) -> Outcome:
        """The outcome of the relation's ``i``-th fact, scanning a chunk ahead (not past ``limit``) if needed.

        Args:
            relation: Relation id.
            i: Index in the relation's pool.
            limit: Never scan facts at or past this index (None: the whole pool).

        Returns:
            The fact's first ``n_rewrites`` passing queries, or ``()`` when it fails the filters.

        Raises:
            IndexError: ``i`` is outside ``[0, min(pool size, limit))``.
        """
        outs, pool = self.outcomes[relation], self.pools[relation]
        end = min(len(pool), limit) if limit is not None else len(pool)
        if not 0 <= i < end:
            raise IndexError(f"fact {i} of {relation}: the scan covers facts 0..{end - 1}")
        while len(outs) <= i:
            start, rows, stop = len(outs), 0, len(outs)
            while stop < end and (stop == start or rows < self.chunk):
                rows += min(self.n_rewrites, len(pool[stop].queries))
                stop += 1
            outs += fact_outcomes(self.model, pool[start:stop], self.n_rewrites, self.known_top_k, self.single_token,
                                  self.chunk)
            self.scanned[relation] += stop - start
            if self.bar is not None:
                self.bar.update(stop - start)
            self.save()
        return outs[i]

    def to_frame(self) -> pd.DataFrame:
        """One row per relation: facts available, outcomes known (from the cache / scanned now), facts kept.

        Returns:
            A DataFrame with columns relation, facts, known, from_cache, scanned_now and kept.
        """
        return pd.DataFrame([{"relation": r, "facts": len(self.pools[r]), "known": len(o), "from_cache": self.cached[r],
                              "scanned_now": self.scanned[r], "kept": sum(bool(x) for x in o)}
                             for r, o in self.outcomes.items()])


__all__ = ["CHUNK", "RewriteScan", "fact_outcomes", "scan_cache_path"]
