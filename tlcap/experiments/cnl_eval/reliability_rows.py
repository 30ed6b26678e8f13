"""Typed rows of the reliability experiment (one per fact × operation / layer / circuit, and its statistics)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KCRow", "KNRow", "RomeRow", "StatRow"]


@dataclass(frozen=True)
class KNRow:
    """KN on one fact: the located set (``set == "located"``) or random draw ``draw``.

    Attributes:
        fact, uid: The fact.
        set: ``"located"`` or ``"random"``.
        draw: Random draw index (-1 for the located set).
        n_neurons: Neurons in the set.
        param_share: Their share of block parameters.
        base_prob: P(target) unmodified.
        enhanced_prob: P(target) with the set's activations multiplied by ``enhance_factor``.
        suppressed_prob: P(target) with them multiplied by ``suppress_factor``.
    """

    fact: int
    uid: str
    set: str
    draw: int
    n_neurons: int
    param_share: float
    base_prob: float
    enhanced_prob: float
    suppressed_prob: float


@dataclass(frozen=True)
class RomeRow:
    """ROME on one fact edited at one layer.

    Attributes:
        fact, uid: The fact.
        layer: The edited layer.
        traced_layer: The fact's top MLP layer by causal tracing (last subject token).
        located: ``layer == traced_layer``.
        in_top3: The layer is among the traced top-3.
        efficacy: The new object beats the old one on the prompt after the edit.
        paraphrase: Share of the other rewrites where it does.
        specificity: Share of other facts' prompts whose top token is unchanged.
        new_prob_before, new_prob_after, old_prob_after: Probabilities on the prompt.
    """

    fact: int
    uid: str
    layer: int
    traced_layer: int
    located: bool
    in_top3: bool
    efficacy: bool
    paraphrase: float
    specificity: float
    new_prob_before: float
    new_prob_after: float
    old_prob_after: float


@dataclass(frozen=True)
class KCRow:
    """A circuit of one fact run alone (every other edge zero-ablated).

    Attributes:
        fact, uid: The fact.
        set: ``"located"`` (the top-n circuit) or ``"random"`` (as many random edges).
        draw: Random draw index (-1 for the located circuit).
        n_edges, n_nodes: Size of the circuit.
        param_share: Share of block parameters its nodes hold.
        rank: 1-based rank of the target's first token with the circuit alone.
        hit_at_1: ``rank == 1`` (the paper's recall).
        hit_at_10: ``rank <= 10``.
        nll: NLL of the target with the circuit alone.
    """

    fact: int
    uid: str
    set: str
    draw: int
    n_edges: int
    n_nodes: int
    param_share: float
    rank: int
    hit_at_1: bool
    hit_at_10: bool
    nll: float


@dataclass(frozen=True)
class StatRow:
    """One statistic of the reliability summary (:meth:`ReliabilityResult.to_frame`)."""

    part: str
    statistic: str
    value: float
    low: float
    high: float
    n: int
    paper: float
