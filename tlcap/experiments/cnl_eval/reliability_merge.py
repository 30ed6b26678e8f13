"""Joining reliability runs that computed different parts, ROME fact ranges or ROME layers (:func:`merge_reliability`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tlcap.errors import InvalidConfigError
from tlcap.experiments.cnl_eval.reliability_result import ReliabilityResult

_SHARD_FIELDS = ("parts", "rome_from", "rome_facts", "rome_layers", "rome_add_traced")
# settings that do not change any number (batch sizes and memory budgets: exact)
_EXACT_FIELDS = ("batch_rows", "max_memory", "batch_size", "sample_batch", "eval_batch", "layer_chunks")


def _settings(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The settings that change numbers, nested configs flattened to dotted names (``trace.samples``)."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k in _EXACT_FIELDS:
            continue
        if isinstance(v, dict):
            out.update(_settings(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def merge_reliability(results: Sequence[ReliabilityResult]) -> ReliabilityResult:
    """Join reliability runs over one fact file that computed different parts, ROME fact ranges or layers.

    E.g. ``--parts kn,rome,kc --rome-facts 20`` in one process and ``--parts rome --rome-from 20
    --rome-facts 50`` in another: the merged result has every part, ROME on facts 0–49, and is
    what one run with ``--rome-facts 50`` computes (the ROME rows of a fact do not depend on the
    other facts' rows: its neighbourhood is drawn from the whole fact file by seed). Runs that
    edited other layers (``--rome-layers``) join the same way: a ROME edit is one (fact, layer),
    computed from that fact and layer alone, so the merged table holds each layer's facts; an edit
    two runs both made (a traced layer one run added and another listed) is kept once, from the
    first run that has it. The merged ``rome_layers`` is the union of the runs' lists (``None``
    when it covers every layer or a run edited every layer).

    Args:
        results: The runs; their settings must be equal except ``parts``, ``rome_from``,
            ``rome_facts``, ``rome_layers``, ``rome_add_traced`` and those that change no number
            (batch sizes, memory budgets), and each (part, fact) of KN and KC may come from one run
            only.

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
    rows: dict[str, tuple[tuple[Any, ...], ...]] = {"rome": _rome_rows(results)}
    for part in ("kn", "kc"):
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
                  rome_facts=None if not ends or None in ends else max(ends),
                  rome_layers=_layer_union(rome_runs, first.n_layers),
                  rome_add_traced=any(bool(c.get("rome_add_traced", True)) for c in rome_runs) if rome_runs else
                  first.config.get("rome_add_traced"))
    seconds: dict[str, float] = {}
    for r in results:
        for k, v in r.method_seconds.items():
            seconds[k] = seconds.get(k, 0.0) + float(v)
    return replace(first, kn_rows=rows["kn"], rome_rows=rows["rome"], kc_rows=rows["kc"], parts=parts, config=config,
                   method_seconds=seconds, wall_seconds=sum(r.wall_seconds for r in results))


def _rome_rows(results: Sequence[ReliabilityResult]) -> tuple[tuple[Any, ...], ...]:
    """Every run's ROME rows, one per (fact, layer) (the first run's where two have it), by fact."""
    seen: set[tuple[int, int]] = set()
    out: list[tuple[Any, ...]] = []
    for r in results:
        for row in r.rome_rows:
            k = (int(row[0]), int(row[2]))
            if k not in seen:
                seen.add(k)
                out.append(row)
    return tuple(sorted(out, key=lambda row: int(row[0])))  # stable: a fact's rows keep their runs' order


def _layer_union(configs: Sequence[dict[str, Any]], n_layers: int) -> list[int] | None:
    if not configs or any(c.get("rome_layers") is None for c in configs):
        return None
    layers = sorted({int(l) for c in configs for l in c["rome_layers"]})
    return None if layers == list(range(n_layers)) else layers


__all__ = ["merge_reliability"]
