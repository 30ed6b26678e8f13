"""Assertions for mechanistic unit tests, with failure messages a researcher can act on.

Each ``assert_*`` raises :class:`MechanismAssertionError` (an ``AssertionError``, so pytest
reports it as a test failure) whose message says what was measured, against what threshold,
and how the random controls behaved; on success it returns the measured values.

Example (on a planted model, whose answer is carried by known neurons):

    >>> from tlcap.testing.planted import planted_fact_model
    >>> planted, truth = planted_fact_model(seed=0)
    >>> check = assert_causal(planted, truth.prompt, truth.target, truth.neurons, min_drop=0.5)
    >>> round(check.drop, 3), len(check.random_drops), round(check.p_value, 3)
    (1.0, 200, 0.005)
    >>> prompt, target = "The capital of France is", " Paris"
    >>> with assert_weights_unchanged(model):
    ...     attr = tlcap.integrated_gradients(model, prompt, target)
    >>> assert_hooks_clean(model)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tlcap.errors import InvalidConfigError, MechanismAssertionError
from tlcap.locate.circuits.circuit import Circuit
from tlcap.locate.circuits.evaluate import CircuitEvaluation, evaluate_circuit
from tlcap.metrics.permutation import located_vs_random
from tlcap.metrics.set_probs import scaled_target_probs
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.models.introspect import active_hooks, named_weights


def _fmt(neurons: Sequence[tuple[int, int]], limit: int = 8) -> str:
    items = [f"L{l}/N{j}" for l, j in list(neurons)[:limit]]
    return ", ".join(items) + (f", ... ({len(neurons)} in all)" if len(neurons) > limit else "")


@dataclass(frozen=True)
class CausalCheck:
    """What :func:`assert_causal` measured.

    Attributes:
        prob: P(target) of the unchanged model.
        prob_suppressed: P(target) with the neurons' activations set to 0.
        drop: Relative drop ``(prob - prob_suppressed) / prob``.
        random_drops: The same drop for each matched random set (same count per layer).
        p_value: Monte-Carlo p-value of the located drop against the random drops
            (:func:`tlcap.metrics.permutation.located_vs_random`).
    """

    prob: float
    prob_suppressed: float
    drop: float
    random_drops: tuple[float, ...]
    p_value: float


def assert_causal(
    model: Model,
    prompt: str,
    target: str,
    neurons: NeuronSet,
    *,
    min_drop: float = 0.5,
    vs_random: int = 200,
    alpha: float = 0.05,
    seed: int = 0,
) -> CausalCheck:
    """Suppressing ``neurons`` lowers P(target) by at least ``min_drop`` and more than random sets do.

    Args:
        model: The model.
        prompt: The prompt.
        target: The answer (``" Paris"``).
        neurons: The neurons claimed to carry the answer.
        min_drop: Smallest relative drop of P(target) accepted (0.5 = halved).
        vs_random: Matched random sets drawn (``NeuronSet.random_like(seed + i)``), scored in batched
            passes (:func:`tlcap.metrics.set_probs.scaled_target_probs`); at least 20, or 0 to skip the
            comparison. The default 200 resolves p to 1/201 ≈ 0.005, well below ``alpha``; 20 sets
            can at best reach 1/21 = 0.048, at the 0.05 level itself.
        alpha: The located drop must beat the random drops at this level. The test is one-sided
            (``"greater"``): the claim is directional — the located set drops P(target) *more* than
            random sets; a located set that drops it less fails whatever its p.
        seed: First seed of the random sets.

    Returns:
        A :class:`CausalCheck`.

    Raises:
        MechanismAssertionError: the drop is below ``min_drop`` or not significant.
    """
    if not len(neurons):
        raise MechanismAssertionError(f"assert_causal: the neuron set for {prompt!r} -> {target!r} is empty")
    sets = [neurons, *(neurons.random_like(seed=seed + i) for i in range(vs_random))]
    p0, probs = scaled_target_probs(model, prompt, target, sets, (0.0,))  # zeroed at the target positions (suppress)
    p1 = float(probs[0, 0])
    drop = (p0 - p1) / p0 if p0 > 0 else 0.0
    rnd = tuple(float((p0 - q) / p0) if p0 > 0 else 0.0 for q in probs[0, 1:].tolist())
    test = (located_vs_random(drop, rnd, min_draws=20, alternative="greater", statistic="relative drop of P(target)")
            if vs_random else None)
    p = test.p_value if test is not None else float("nan")
    head = (f"suppressing {len(neurons)} neurons ({_fmt(neurons.neurons)}) changed P({target!r} | {prompt!r}) "
            f"from {p0:.4g} to {p1:.4g} (drop {drop:.1%})")
    if drop < min_drop:
        raise MechanismAssertionError(f"{head}; expected a drop of at least {min_drop:.0%}")
    if test is not None and p > alpha:
        raise MechanismAssertionError(
            f"{head}, but {test.n_as_extreme} of {vs_random} matched random sets dropped it as much "
            f"(random drops: mean {test.null_mean:.1%}, max {max(rnd):.1%}; p = {p:.3f} > {alpha})")
    return CausalCheck(p0, p1, drop, rnd, p)


def _scores(attribution: Any) -> Tensor:
    scores = attribution if isinstance(attribution, Tensor) else getattr(attribution, "scores", None)
    if not isinstance(scores, Tensor) or scores.ndim != 2:
        raise InvalidConfigError("assert_localized needs [layer, d_mlp] scores or an object with .scores, got "
                                 f"{type(attribution).__name__}")
    return scores.detach().float()


def assert_localized(
    attribution: Any,
    *,
    layers: Sequence[int] | None = None,
    top_k: int = 10,
    neurons: NeuronSet | None = None,
    min_share: float = 1.0,
    min_recall: float = 1.0,
) -> NeuronSet:
    """The ``top_k`` highest-scoring neurons sit in ``layers`` (and/or cover ``neurons``).

    Args:
        attribution: A :class:`~tlcap.attribution.ig.NeuronAttribution`, CNL location or dataset
            scores (anything with ``.scores`` of shape ``[layer, d_mlp]``), or that tensor.
        layers: Layers the top neurons must lie in (``None``: no layer condition).
        top_k: How many top neurons are examined.
        neurons: Expected neurons (e.g. ``truth.neurons`` of a planted model).
        min_share: Smallest share of the top neurons that must lie in ``layers``.
        min_recall: Smallest share of ``neurons`` that must be among the top ``top_k``.

    Returns:
        The top ``top_k`` neurons as a :class:`NeuronSet`.

    Raises:
        MechanismAssertionError: a condition fails (the message lists the top neurons).
    """
    scores = _scores(attribution)
    k = min(int(top_k), scores.numel())
    flat = scores.flatten().topk(k).indices
    d = scores.shape[1]
    top = NeuronSet.from_list([(int(i) // d, int(i) % d) for i in flat], (scores.shape[0], d))
    ranked = [(int(i) // d, int(i) % d) for i in flat]
    if layers is not None:
        inside = [n for n in ranked if n[0] in set(layers)]
        share = len(inside) / max(k, 1)
        if share < min_share:
            outside = [n for n in ranked if n[0] not in set(layers)]
            raise MechanismAssertionError(
                f"{len(inside)} of the top {k} neurons lie in layers {sorted(set(layers))} ({share:.0%} < {min_share:.0%}); "
                f"outside: {_fmt(outside)}; top neurons by score: {_fmt(ranked)}")
    if neurons is not None:
        found = [n for n in neurons if n in top]
        recall = len(found) / max(len(neurons), 1)
        if recall < min_recall:
            missing = [n for n in neurons if n not in top]
            rank = {n: r for r, n in enumerate(scores.flatten().argsort(descending=True).tolist())}
            where = ", ".join(f"L{l}/N{j} at rank {rank[l * d + j] + 1}" for l, j in missing[:8])
            raise MechanismAssertionError(
                f"the top {k} neurons hold {len(found)} of the {len(neurons)} expected ({recall:.0%} < {min_recall:.0%}); "
                f"missing: {where}; top neurons: {_fmt(ranked)}")
    return top


def assert_circuit_faithful(model: Model, circuit: Circuit, *, min_recovery: float = 0.8,
                            min_gap: float = 0.1) -> CircuitEvaluation:
    """Running the model with only ``circuit`` recovers at least ``min_recovery`` of the full model.

    Recovery is :attr:`CircuitEvaluation.recovered` = (ablated NLL − circuit NLL) / (ablated NLL −
    full NLL) of the target: 1 = the circuit alone does what the model does, 0 = no better than
    ablating every edge. A ratio of two near-zero differences says nothing, so the full model must
    also beat the ablated run by ``min_gap`` nats.

    Args:
        model: The model.
        circuit: The circuit (a :class:`~tlcap.locate.circuits.Circuit`), evaluated by ``evaluate_circuit``.
        min_recovery: Least recovered share of the full model's NLL gain, in ``[0, 1]``.
        min_gap: Least gap in nats between the ablated and the full model's NLL.

    Returns:
        The :class:`~tlcap.locate.circuits.evaluate.CircuitEvaluation`.

    Raises:
        MechanismAssertionError: a gap below ``min_gap``, or recovery below ``min_recovery``.
    """
    ev = evaluate_circuit(model, circuit)
    gap = ev.ablated_nll - ev.full_nll
    if not gap >= min_gap:
        raise MechanismAssertionError(
            f"the full model is barely better than the run with every edge ablated (target NLL {ev.full_nll:.3f} vs "
            f"{ev.ablated_nll:.3f}, gap {gap:.3g} < {min_gap} nats): there is nothing for a circuit to recover")
    if not ev.recovered >= min_recovery:
        raise MechanismAssertionError(
            f"the circuit of {ev.n_edges} edges ({ev.n_nodes} nodes) recovers {ev.recovered:.1%} of the full model "
            f"(expected >= {min_recovery:.0%}): target NLL {ev.full_nll:.3f} full, {ev.circuit_nll:.3f} circuit alone, "
            f"{ev.ablated_nll:.3f} all edges ablated ({ev.ablation}); target rank {ev.circuit_target_rank} alone")
    return ev


def assert_hooks_clean(model: Model) -> None:
    """No hook is left attached to the model's hook points (a method cleaned up after itself).

    Args:
        model: The model.

    Raises:
        MechanismAssertionError: naming the hook points that still hold hooks.
    """
    left = active_hooks(model)
    if left:
        raise MechanismAssertionError(f"{len(left)} hook points still hold hooks: {', '.join(left[:10])}"
                                      f"{' ...' if len(left) > 10 else ''}; use `with model.hooks(...)` so they are removed")


@contextlib.contextmanager
def assert_weights_unchanged(model: Model) -> Iterator[None]:
    """A ``with`` block after which every weight must be bit for bit what it was before.

    Args:
        model: The model whose weights are snapshotted on entering the block.

    Yields:
        Nothing (``None``); the weights are compared when the block ends.

    Raises:
        MechanismAssertionError: on leaving the block, naming each changed parameter with its
            largest absolute change.
    """
    before = {k: v.detach().clone() for k, v in named_weights(model).items()}
    yield
    after = named_weights(model)
    changed = []
    for k, v in before.items():
        now = after[k].detach()
        if now.shape != v.shape or not torch.equal(now, v):
            diff = (now.float() - v.float()).abs().max().item() if now.shape == v.shape else float("nan")
            changed.append(f"{k} (max |change| {diff:.3g})")
    if changed:
        raise MechanismAssertionError(f"{len(changed)} parameters changed inside the block: {'; '.join(changed[:10])}"
                                      f"{' ...' if len(changed) > 10 else ''}")


__all__ = [
    "MechanismAssertionError", "CausalCheck", "assert_causal", "assert_localized", "assert_circuit_faithful",
    "assert_hooks_clean", "assert_weights_unchanged",
]
