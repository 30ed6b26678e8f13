"""Per-fact localization: every neighbor query attributed, and its knowledge-neuron set N_i.

Example:
    >>> from tlcap.data import load_pararel
    >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
    >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
    >>> [len(s) for s in locs[0].sets()], round(locs[0].summary()["cs2"], 3)   # KN-set size per query, CS2
    ([51, 70, 48], 0.466)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.methods import localize_prompts
from tlcap.config import check_choice, check_int
from tlcap.data.pararel import Fact
from tlcap.errors import InvalidConfigError
from tlcap.experiments.ql.config import KN_THRESHOLD, QLConfig
from tlcap.locate.selection import AMIG_TAU, method_select, threshold_select
from tlcap.metrics.sets import NeuronSet
from tlcap.metrics.stats import consistency_aware_scores, cs1, cs2, refined_set
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import RowFields, frame
from tlcap.viz.heatmaps import neuron_heatmap

METHODS: tuple[str, ...] = ("ig", "sig", "amig")


def union_of(sets: Sequence[NeuronSet], shape: tuple[int, int]) -> NeuronSet:
    """∪ of neuron sets (empty set of ``shape`` for none).

    Args:
        sets: The neuron sets.
        shape: ``(n_layers, d_mlp)`` of the result.

    Returns:
        The neurons in any set.
    """
    out = NeuronSet((), shape)
    for s in sets:
        out = out | s
    return out


def intersection_of(sets: Sequence[NeuronSet], shape: tuple[int, int]) -> NeuronSet:
    """∩ of neuron sets (empty set of ``shape`` for none).

    Args:
        sets: The neuron sets.
        shape: ``(n_layers, d_mlp)`` of the empty result.

    Returns:
        The neurons in every set.
    """
    if not sets:
        return NeuronSet((), shape)
    out = sets[0]
    for s in sets[1:]:
        out = out & s
    return out


@dataclass(frozen=True)
class QueryRow:
    """One row of :meth:`FactKNs.to_frame`: a neighbor query and its KN set size."""

    query_index: int
    query: str
    prob: float
    n_kns: int


@dataclass(frozen=True)
class FactKNs(RowFields, Result):
    """One fact's per-query attribution scores and knowledge-neuron sets.

    Attributes:
        scores: ``[k, n_layers, d_mlp]`` scores of the k neighbor queries.
        probs: Clean target probability per query.
        fact: The :class:`~tlcap.data.pararel.Fact` (relation, subject, object, queries, uuid); its
            ``queries`` are the ones attributed, in the order of ``scores``.
        method: ``ig``, ``sig`` or ``amig``.
        threshold: ``t`` of the relative rule ``score > t · max``.
        seconds: Wall time of the attribution.
        selection: ``"own"`` (the method's published rule) or ``"relative"`` (``score > t · max``);
            :func:`tlcap.locate.selection.method_select`.
        tau: τ of AMIG's eq. 19 (``score > τ`` on normalised scores).
    """

    _row_types: ClassVar[dict[str, type]] = {"fact": Fact}

    scores: Float[Tensor, "query layer d_mlp"]
    probs: tuple[float, ...] = ()
    fact: Fact = field(default_factory=lambda: Fact("", "", "", ()))
    method: str = "ig"
    threshold: float = KN_THRESHOLD
    seconds: float = 0.0
    selection: str = "own"
    tau: float = AMIG_TAU

    @property
    def queries(self) -> list[str]:
        return list(self.fact.queries)

    @property
    def target(self) -> str:
        return self.fact.target

    @property
    def k(self) -> int:
        return int(self.scores.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.scores.shape[1]), int(self.scores.shape[2]))

    def take(self, queries: Sequence[int]) -> FactKNs:
        """The same fact restricted to the queries ``queries`` (indices, in the given order), no new attribution.

        For split-half consistency (K_I/K_II from one half of the queries, CS2 measured on the other)
        and for comparing methods that attributed different numbers of queries.

        Args:
            queries: Query indices, each in ``[0, k)``, no repeats.

        Returns:
            A :class:`FactKNs` whose scores, probabilities and ``fact.queries`` are those queries'.

        Example:
            >>> from tlcap.data import load_pararel
            >>> from tlcap.experiments.ql import localize_facts
            >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3,
            ...                      progress=False)
            >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
            >>> fk = locs[0]
            >>> a, b = fk.take([0, 1]), fk.take([1, 2])
            >>> a.k, a.fact.queries == tuple(fk.queries[:2]), round(cs2(a.sets()), 3), round(cs2(b.sets()), 3)
            (2, True, 0.186, 0.18)
        """
        idx = [int(i) for i in queries]
        if len(set(idx)) != len(idx) or any(not 0 <= i < self.k for i in idx):
            raise InvalidConfigError(f"queries must be distinct indices in [0, {self.k}), got {list(queries)}")
        fact = dataclasses.replace(self.fact, queries=tuple(self.queries[i] for i in idx))
        probs = tuple(self.probs[i] for i in idx) if self.probs else ()
        return dataclasses.replace(self, scores=self.scores[idx], probs=probs, fact=fact)

    def sets(self) -> list[NeuronSet]:
        """The KN set N_i of every query (the method's own rule, or ``score > t · max``).

        Returns:
            One :class:`NeuronSet` per query, in query order.
        """
        return [method_select(self.scores[i], self.method, self.selection, self.threshold, self.tau) for i in range(self.k)]

    def global_set(self) -> NeuronSet:
        """N_g = ∪_j N_j.

        Returns:
            The union of :meth:`sets`.
        """
        return union_of(self.sets(), self.shape)

    def neighbor_sets(self, i: int) -> dict[str, NeuronSet]:
        """QL eq. 3: union, intersection and refine (count > 1) over the neighbors j ≠ i.

        Args:
            i: The query left out.

        Returns:
            ``{"union", "intersection", "refine"}`` of the other queries' KN sets (empty sets when there are none).
        """
        others = [s for j, s in enumerate(self.sets()) if j != i]
        ref = refined_set(others, 2) if others else NeuronSet((), self.shape)
        return {"union": union_of(others, self.shape), "intersection": intersection_of(others, self.shape), "refine": ref}

    def cas_set(self, beta1: float = 0.7, beta2: float = 0.3, t: float = 0.3) -> NeuronSet:
        """Consistency-Aware KNs: CAS > t · max(CAS) (QL eq. 7).

        Args:
            beta1: Weight of the mean score over the queries.
            beta2: Weight of the score's standard deviation over the queries (subtracted).
            t: Threshold as a share of the largest CAS.

        Returns:
            The neurons above the threshold.
        """
        return threshold_select(consistency_aware_scores(self.scores, beta1, beta2), t)

    def summary(self) -> dict[str, Any]:
        """The fact, its KN set sizes, union/intersection sizes and CS1/CS2 (``None`` for one query).

        Returns:
            A JSON-safe dict: the fact, queries and settings, probabilities, KN set sizes, union / intersection
            sizes, ``cs1`` / ``cs2`` and seconds.
        """
        sets = self.sets()
        return {
            **{k: getattr(self.fact, k) for k in ("relation", "subject", "object", "uuid")},
            "queries": self.queries, "method": self.method, "threshold": self.threshold, "selection": self.selection,
            "tau": self.tau if self.method == "amig" else None, "n_queries": self.k,
            "probs": list(self.probs), "kn_sizes": [len(s) for s in sets],
            "union": len(union_of(sets, self.shape)), "intersection": len(intersection_of(sets, self.shape)),
            "cs1": cs1(sets) if self.k >= 2 else None, "cs2": cs2(sets) if self.k >= 2 else None,
            "seconds": self.seconds,
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`QueryRow` per neighbor query.

        Returns:
            A DataFrame of :class:`QueryRow` (index, query, P(target), KN set size).
        """
        rows = [QueryRow(i, q, float(self.probs[i]) if self.probs else float("nan"), len(s))
                for i, (q, s) in enumerate(zip(self.queries, self.sets()))]
        return frame(rows, QueryRow)

    def figure(self) -> go.Figure:
        """Mean score over the queries, the union of their KN sets ringed.

        Returns:
            The Plotly layer × neuron heatmap.
        """
        return neuron_heatmap(self.scores.mean(0), highlight=self.global_set(), score_name=f"{self.method} score",
                              title=f"KNs of {self.fact.subject!r} → {self.target!r} ({self.k} queries, {self.method})")


def localize_facts(
    model: Model,
    facts: Sequence[Fact],
    method: str = "ig",
    *,
    config: QLConfig | None = None,
    progress: bool = True,
    fact_batch: int = 8,
    **overrides: Any,
) -> list[FactKNs]:
    """Attribute every neighbor query of every fact with ``method`` and select its KNs.

    Args:
        model: The model.
        facts: Facts with their neighbor queries (:func:`tlcap.data.load_pararel`).
        method: ``"ig"`` (Dai et al.), ``"sig"`` (Enguehard) or ``"amig"`` (Chen et al.).
        config: A :class:`QLConfig` (attribution settings, KN selection rule and thresholds, AMIG's words).
        progress: Show a progress bar.
        fact_batch: Facts whose queries' rows share batches (:func:`tlcap.attribution.methods.localize_prompts`;
            exact, results do not depend on it). ``seconds`` of a fact is its share of its batch's time.
        **overrides: :class:`QLConfig` or :class:`~tlcap.attribution.config.IGConfig` fields
            (``steps=10``, ``kn_threshold=0.3``, ``selection="relative"``).

    Returns:
        One :class:`FactKNs` per fact, with provenance.

    Raises:
        UnknownNameError: unknown method.
        InvalidConfigError: an invalid setting (before any forward pass).

    Example:
        >>> from tlcap.data import load_pararel
        >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
        >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
        >>> len(locs), locs[0].k, locs[0].sets()[0].shape
        (2, 3, (2, 256))
    """
    cfg = QLConfig.resolve(config, **overrides)
    check_choice("method", method, METHODS)
    check_int("fact_batch", fact_batch, min=1, cli=None)
    prov = Provenance.collect(model, config={**cfg.to_dict(), "method": method})
    out = []
    bar = tqdm(total=sum(len(f.queries) for f in facts), desc=f"{method} attribution", disable=not progress)
    for s in range(0, len(facts), fact_batch):  # the queries of several facts share batches
        chunk = list(facts[s:s + fact_batch])
        t0 = time.perf_counter()
        attrs = localize_prompts(model, [(q, f.target) for f in chunk for q in f.queries], method,
                                 config=cfg.ig, amig_words=cfg.amig_words)
        per_fact = (time.perf_counter() - t0) / len(chunk)
        k = 0
        for f in chunk:
            a = attrs[k:k + len(f.queries)]
            k += len(f.queries)
            res = FactKNs(torch.stack([x.scores for x in a]), tuple(x.target_prob for x in a), f, method,
                          cfg.kn_threshold, per_fact, cfg.selection, cfg.amig_tau)
            out.append(res.with_provenance(prov))
            bar.update(len(f.queries))
    bar.close()
    return out


__all__ = ["METHODS", "FactKNs", "QueryRow", "intersection_of", "localize_facts", "union_of"]
