"""Joining reliability runs that computed different parts or ROME fact ranges (:func:`merge_reliability`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tlcap.errors import InvalidConfigError
from tlcap.experiments.cnl_eval.reliability_result import ReliabilityResult

_SHARD_FIELDS = ("parts", "rome_from", "rome_facts")
# settings that do not change any number (batch sizes and memory budgets: exact)
_EXACT_FIELDS = ("batch_rows", "max_memory", "batch_size", "sample_batch", "eval_batch", "layer_chunks")


def _settings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _settings(v) for k, v in value.items() if k not in _EXACT_FIELDS}
    return value


def merge_reliability(results: Sequence[ReliabilityResult]) -> ReliabilityResult:
    """Join reliability runs over one fact file that computed different parts or ROME fact ranges.

    E.g. ``--parts kn,rome,kc --rome-facts 20`` in one process and ``--parts rome --rome-from 20
    --rome-facts 50`` in another: the merged result has every part, ROME on facts 0–49, and is
    what one run with ``--rome-facts 50`` computes (the ROME rows of a fact do not depend on the
    other facts' rows: its neighbourhood is drawn from the whole fact file by seed).

    Args:
        results: The runs; their settings must be equal except ``parts``, ``rome_from``,
            ``rome_facts`` and those that change no number (batch sizes, memory budgets), and each
            (part, fact) may come from one run only.

    Returns:
        The merged :class:`ReliabilityResult` (rows sorted by fact; seconds summed).

    Raises:
        InvalidConfigError: no runs, runs of other facts / models / settings, or a fact whose
            rows of one part come from two runs.
    """
    if not results:
        raise InvalidConfigError("merge_reliability needs at least one reliability result")
    first = results[0]

    def key(r: ReliabilityResult) -> dict[str, Any]:
        return _settings({k: v for k, v in r.config.items() if k not in _SHARD_FIELDS})

    base = key(first)
    for r in results[1:]:
        if (r.n_facts, r.n_layers, r.model_name) != (first.n_facts, first.n_layers, first.model_name):
            raise InvalidConfigError(f"reliability runs of other facts or models cannot be merged: {r.n_facts} facts of "
                                     f"{r.model_name} vs {first.n_facts} of {first.model_name}")
        other = key(r)
        diff = sorted(k for k in set(other) | set(base) if other.get(k) != base.get(k))
        if diff:
            raise InvalidConfigError(f"reliability runs with different settings cannot be merged ({', '.join(diff)}); "
                                     "rerun with the same options")
    rows: dict[str, tuple[tuple[Any, ...], ...]] = {}
    for part in ("kn", "rome", "kc"):
        owner: dict[int, int] = {}
        out: list[tuple[Any, ...]] = []
        for j, r in enumerate(results):
            facts = {int(row[0]) for row in getattr(r, f"{part}_rows")}
            dup = sorted(facts & set(owner))
            if dup:
                raise InvalidConfigError(f"fact {dup[0]} has {part} rows in runs {owner[dup[0]]} and {j}; merge runs of "
                                         "different parts or disjoint --rome-from/--rome-facts ranges")
            owner.update(dict.fromkeys(facts, j))
            out += list(getattr(r, f"{part}_rows"))
        rows[part] = tuple(sorted(out, key=lambda row: int(row[0])))  # stable: a fact's rows keep their order
    parts = tuple(p for p in ("kn", "rome", "kc") if any(p in r.parts for r in results))
    rome_runs = [r.config for r in results if "rome" in r.parts]
    ends = [c.get("rome_facts") for c in rome_runs]
    config = dict(first.config, parts=list(parts), merged_runs=len(results),
                  rome_from=min((int(c.get("rome_from", 0)) for c in rome_runs), default=0),
                  rome_facts=None if not ends or None in ends else max(ends))
    seconds: dict[str, float] = {}
    for r in results:
        for k, v in r.method_seconds.items():
            seconds[k] = seconds.get(k, 0.0) + float(v)
    return replace(first, kn_rows=rows["kn"], rome_rows=rows["rome"], kc_rows=rows["kc"], parts=parts, config=config,
                   method_seconds=seconds, wall_seconds=sum(r.wall_seconds for r in results))


__all__ = ["merge_reliability"]
