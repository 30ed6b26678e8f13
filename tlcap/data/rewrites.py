"""Rewriting dataset for the CNL fidelity test: facts with ``k`` rewrites of their prompt.

The CNL paper (§3.1) rewrites each fact's prompt 5 times and asks whether a localization method
finds the same parameters for all 5. Here a rewrite is another ParaRel template of the same
relation filled with the same subject (``"The capital of France is"``, ``"France's capital
city is"``, ...), so the fact and its answer are the same by construction. Only facts the model
answers are kept: the object's first token must be the model's top-1 next token
(``known_top_k=1``) after each kept rewrite; a fact needs ``n_rewrites`` such rewrites (the
first ones in ParaRel's pattern order).

Relations are visited round-robin; a relation stops after ``max_scan`` facts tried or
``max_misses`` failing facts in a row. The facts are tested in batches and each fact's result is
cached on disk (:mod:`tlcap.data.rewrite_scan`), so a rerun does not test them again.

Each fact also carries a *new object* for ROME edits (the reliability test): another object of
the same relation, drawn with the seed from the relation's ParaRel objects.

A user's own facts load from JSON (:func:`load_rewrites`)::

    {"facts": [{"subject": "France", "target": " Paris",
                "rewrites": ["The capital of France is", "France's capital city is", ...],
                "relation": "P36", "target_new": " Rome"}]}

(a bare list of facts works too; ``"object": "Paris"`` may replace ``"target"``; ``relation``,
``uid`` and ``target_new`` are optional). Every rewrite must contain the subject (causal tracing
noises it, ROME edits at its last token).

Example (``model`` is a tiny random GPT-2, which answers few facts: 2 rewrites each within its
top-5000; the default, ``rewrite_facts(model, n=50)``, gives the facts SmolLM2-135M answers top-1
on 5 rewrites each):

    >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)
    >>> facts[0].rewrites, facts[0].target, facts[0].target_new
    (('Panagarh is located in', 'Panagarh, located in'), ' India', ' Latvia')
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "facts.json")
    >>> save_rewrites(facts, path); load_rewrites(path) == facts
    PosixPath('.../facts.json')
    True
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from tlcap.data.files import read_json_rows, write_json_rows
from tlcap.data.pararel import causal_patterns, iter_facts, list_relations
from tlcap.data.rewrite_scan import CHUNK, RewriteScan
from tlcap.data.sample import DataWarning
from tlcap.errors import DataFormatError, EmptyDatasetError, InvalidConfigError

if TYPE_CHECKING:  # pragma: no cover
    from tlcap.models.adapter import Model

N_REWRITES = 5
MAX_MISSES = 50


@dataclass(frozen=True)
class RewriteFact:
    """One fact and the rewrites of its prompt.

    Attributes:
        subject: The subject as written in every rewrite.
        target: The answer scored, with its leading space (``" Paris"``).
        rewrites: The prompts (at least two), each ending where the answer starts.
        relation: ParaRel relation id (``""`` for a user's fact without one).
        uid: A stable identifier (ParaRel's T-REx id, or the position in the user's file).
        target_new: A new object for ROME edits (another object of the relation), or ``None``.
    """

    subject: str
    target: str
    rewrites: tuple[str, ...]
    relation: str = ""
    uid: str = ""
    target_new: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fact as a JSON-ready dict (a row of :func:`save_rewrites`).

        Returns:
            The fields, ``rewrites`` as a list.
        """
        return {"subject": self.subject, "target": self.target, "rewrites": list(self.rewrites),
                "relation": self.relation, "uid": self.uid, "target_new": self.target_new}

    @classmethod
    def from_dict(cls, row: Any, where: str = "fact") -> RewriteFact:
        """Build and check a fact from a JSON row (see the module docstring for the fields).

        Args:
            row: A decoded JSON row (``object`` is accepted for ``target``, with a leading space added).
            where: What the row is called in error messages, e.g. ``"facts.json fact #3"``.

        Returns:
            The checked :class:`RewriteFact`.

        Raises:
            DataFormatError: a missing or malformed field, fewer than two rewrites, or a rewrite
                without the subject.
        """
        if not isinstance(row, dict):
            raise DataFormatError(f"{where} must be a JSON object with subject, target and rewrites, got {row!r}")
        subject = row.get("subject")
        target = row.get("target")
        if target is None and isinstance(row.get("object"), str):
            target = " " + row["object"]
        rewrites = row.get("rewrites")
        if not isinstance(subject, str) or not subject.strip():
            raise DataFormatError(f"{where} has no 'subject' string; give the subject as written in the rewrites")
        if not isinstance(target, str) or not target.strip():
            raise DataFormatError(f"{where} has no 'target' (or 'object') string; give the answer, e.g. \" Paris\"")
        if not isinstance(rewrites, list) or not all(isinstance(r, str) and r.strip() for r in rewrites):
            raise DataFormatError(f"{where} needs 'rewrites': a list of non-empty prompt strings")
        if len(rewrites) < 2:
            raise DataFormatError(f"{where} has {len(rewrites)} rewrite(s); a fidelity test needs at least 2")
        missing = [r for r in rewrites if subject not in r]
        if missing:
            raise DataFormatError(f"{where}: the subject {subject!r} is not in the rewrite {missing[0]!r}; every rewrite "
                                  "must contain the subject as written")
        new = row.get("target_new")
        if new is not None and (not isinstance(new, str) or not new.strip()):
            raise DataFormatError(f"{where} has an empty or non-string 'target_new'; give a new object or leave it out")
        return cls(subject, target, tuple(rewrites), str(row.get("relation", "")), str(row.get("uid", "")), new)


def check_rewrite_options(n: int | None, n_rewrites: int, known_top_k: int | None, max_scan: int = 300,
                          max_misses: int | None = MAX_MISSES, chunk: int = CHUNK) -> None:
    """Validate the options of :func:`rewrite_facts` (before any forward pass)."""
    def bad(x: object, optional: bool = False) -> bool:
        return not (optional and x is None) and (isinstance(x, bool) or not isinstance(x, int) or x < 1)

    for name, value, least, optional in (("n (--n)", n, 1, True), ("n_rewrites (--n-rewrites)", n_rewrites, 2, False),
                                         ("known_top_k (--known-top-k)", known_top_k, 1, True),
                                         ("max_scan (--max-scan)", max_scan, 1, False),
                                         ("max_misses (--max-misses)", max_misses, 1, True), ("chunk", chunk, 1, False)):
        if bad(value, optional) or (value is not None and value < least):
            raise InvalidConfigError(f"{name} must be >= {least}, got {value!r}")


def _new_object(data_dir: str | Path | None, relation: str, obj: str, rng: random.Random,
                cache: dict[str, list[str]]) -> str | None:
    if relation not in cache:
        objs = sorted({f.object for f in iter_facts(data_dir, relation, min_queries=1)})
        cache[relation] = objs
    others = [o for o in cache[relation] if o != obj]
    return " " + rng.choice(others) if others else None


def rewrite_facts(
    model: Model | None = None,
    n: int | None = 50,
    *,
    n_rewrites: int = N_REWRITES,
    relations: Sequence[str] | None = None,
    known_top_k: int | None = 1,
    single_token: bool = True,
    seed: int = 0,
    max_scan: int = 300,
    max_misses: int | None = MAX_MISSES,
    chunk: int = CHUNK,
    scan_cache: bool | str | Path = True,
    progress: bool = True,
    data_dir: str | Path | None = None,
) -> list[RewriteFact]:
    """ParaRel facts with ``n_rewrites`` rewrites each that the model answers (module docstring).

    Relations are visited round-robin, one kept fact per relation and round; each relation's
    facts are shuffled with ``seed`` and tried in that order until one passes. A relation stops
    after ``max_scan`` facts tried, or after ``max_misses`` facts in a row that fail (a relation
    the model does not answer stops early instead of stalling the draw). A fact is kept when at
    least ``n_rewrites`` of its templates pass the filters; its rewrites are the first
    ``n_rewrites`` that pass, in ParaRel's pattern order.

    The facts are tested in batches and the test's outcome per fact is cached on disk
    (:mod:`tlcap.data.rewrite_scan`); the draw is the same as testing one fact at a time.

    Args:
        model: The model that must answer each rewrite (needed for ``known_top_k`` and
            ``single_token``).
        n: Number of facts (``None`` = all that pass).
        n_rewrites: Rewrites per fact (the paper: 5).
        relations: ParaRel relation ids (default: every relation with ``n_rewrites`` templates).
        known_top_k: Keep a rewrite only if the answer's first token is in the model's top-k
            (1 = the model answers it); ``None`` keeps every rewrite.
        single_token: Keep only rewrites after which the answer is one token.
        seed: Seed of the fact order and of the new objects.
        max_scan: Facts tried per relation at most.
        max_misses: Stop a relation after this many failing facts in a row (``None``: only
            ``max_scan``).
        chunk: Queries per padded forward of the known filter.
        scan_cache: Cache the per-fact test results (``True``: under the tlcap cache dir; a
            folder: there; ``False``: no cache).
        progress: Show the facts tested with the model and the facts kept.
        data_dir: Folder holding ``pararel/`` (default: ``$TLCAP_DATA`` or the bundled copy).

    Returns:
        ``RewriteFact`` s with ``target_new`` set (``None`` if the relation has no other object).

    Raises:
        InvalidConfigError: an invalid option, or filters that need a model without one.
        EmptyDatasetError: no fact survives the filters.

    Warns:
        DataWarning: fewer facts than ``n`` (the message gives each relation's facts kept / tried).

    Example:
        >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
        >>> [(f.relation, f.subject, f.target) for f in facts]               # round-robin over relations
        [('P17', 'Panagarh', ' India'), ('P20', 'Anthony Veiller', ' Hollywood')]
    """
    check_rewrite_options(n, n_rewrites, known_top_k, max_scan, max_misses, chunk)
    if model is None and (known_top_k is not None or single_token):
        raise InvalidConfigError("rewrite_facts needs the model to keep only the facts it answers (known_top_k) or "
                                 "single-token answers; pass model=..., or known_top_k=None and single_token=False")
    rels = list(relations) if relations else [r for r in list_relations(data_dir)
                                              if len(causal_patterns(data_dir, r)) >= n_rewrites]
    bar = tqdm(desc="rewrite draw (facts tested)", unit="fact", leave=False,
               disable=not progress or model is None or known_top_k is None)
    scan = RewriteScan(model, rels, n_rewrites=n_rewrites, known_top_k=known_top_k, single_token=single_token,
                       seed=seed, chunk=chunk, cache=scan_cache, data_dir=data_dir, bar=bar)
    cursor = dict.fromkeys(rels, 0)
    active = [r for r in rels if scan.size(r)]
    rng = random.Random(seed)
    cache: dict[str, list[str]] = {}
    out: list[RewriteFact] = []
    while active and (n is None or len(out) < n):
        for r in list(active):
            if n is not None and len(out) >= n:
                break
            end, misses = min(scan.size(r), max_scan), 0
            while cursor[r] < end:
                i = cursor[r]
                cursor[r] += 1
                qs = scan.outcome(r, i, limit=end)
                if qs:
                    f = scan.fact(r, i)
                    out.append(RewriteFact(f.subject, f.target, qs, f.relation, f.uuid,
                                           _new_object(data_dir, f.relation, f.object, rng, cache)))
                    bar.set_postfix_str(f"kept {len(out)}" + (f"/{n}" if n else "") + f", last from {r}")
                    break
                misses += 1
                if max_misses is not None and misses >= max_misses:
                    cursor[r] = end
            if cursor[r] >= end:
                active.remove(r)
    bar.close()
    if not out:
        raise EmptyDatasetError(f"no ParaRel fact of {rels if relations else 'any relation'} has {n_rewrites} rewrites "
                                f"the model answers (known_top_k={known_top_k}); relax the filters or raise max_scan / "
                                f"max_misses ({_rates(scan, cursor)})")
    if n is not None and len(out) < n:
        warnings.warn(f"{n} rewrite facts requested, {len(out)} found (kept / tried per relation: {_rates(scan, cursor)}); "
                      "raise max_scan / max_misses, or relax known_top_k", DataWarning, stacklevel=2)
    return out


def _rates(scan: RewriteScan, cursor: dict[str, int]) -> str:
    return ", ".join(f"{r} {sum(bool(o) for o in scan.outcomes[r][:c])}/{c}" for r, c in cursor.items())


def load_rewrites(path: str | Path) -> list[RewriteFact]:
    """A user's rewriting dataset from JSON (format in the module docstring).

    Args:
        path: The JSON file (a list of facts, or ``{"facts": [...]}``).

    Returns:
        The facts in file order (``uid`` defaults to the row index).

    Raises:
        MissingFileError: no such file.
        DataFormatError: not JSON, or a malformed fact (the message names which).
        EmptyDatasetError: no facts in the file.
    """
    path = Path(path)
    rows = read_json_rows(path, "facts", missing=f"rewrites file {path} not found; give a JSON file of facts with rewrites",
                          bad_json_hint="; see docs/cnl_eval.md for the format")
    if not isinstance(rows, list):
        raise DataFormatError(f"{path} must hold a list of facts (or {{\"facts\": [...]}})")
    if not rows:
        raise EmptyDatasetError(f"{path} holds no facts")
    facts = []
    for i, row in enumerate(rows):
        f = RewriteFact.from_dict(row, where=f"{path.name} fact #{i}")
        facts.append(f if f.uid else RewriteFact(f.subject, f.target, f.rewrites, f.relation, str(i), f.target_new))
    return facts


def save_rewrites(facts: Sequence[RewriteFact], path: str | Path) -> Path:
    """Write facts as JSON readable by :func:`load_rewrites`; returns the path.

    Args:
        facts: The facts to write.
        path: The JSON file (parent folders are created).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    return write_json_rows(path, "facts", [f.to_dict() for f in facts])


__all__ = ["N_REWRITES", "RewriteFact", "load_rewrites", "rewrite_facts", "save_rewrites"]
