"""What the CNL evaluation experiments share: one located set per method, parameter shares,
timing per method, and the streamed checkpoint of per-item rows.

Every locator here is a composition of the method's public API, nothing re-implemented:

- **KN**: :func:`tlcap.integrated_gradients` then a selection rule of
  :mod:`tlcap.locate.selection` (``Attr > threshold · max``, Dai's 0.2; or the top-k);
- **causal tracing**: :func:`tlcap.locate.causal_trace.causal_trace` of the MLP kind only,
  then :meth:`CausalTrace.top_layers` at the last subject token (ROME's located layers);
- **knowledge circuits**: :func:`tlcap.locate.circuits.edge_attribution` (zero ablation, as the
  CNL paper's App. D) then :meth:`EdgeScores.select` at a fixed top-n (dead nodes pruned).

Each locator has a fact-list form (``kn_neurons_facts``, ``traced_layers_facts``, ``knowledge_circuits``) whose
prompts share batches; the experiments locate a window of facts at once with them.

Located sets are stored as sorted tuples of integers: a neuron ``(l, j)`` as ``l·d_mlp + j``, a
layer as itself, an edge ``u → v`` as ``u·n_readers + v`` (indices into the circuit graph).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tlcap.atomic import json_digest, storage_error, write_text_atomic
from tlcap.attribution import integrated_gradients, integrated_gradients_facts
from tlcap.errors import CheckpointError, CheckpointMismatchError
from tlcap.experiments.knowledge_neurons import KNConfig
from tlcap.locate.causal_trace import TraceConfig, causal_trace, causal_trace_facts
from tlcap.locate.circuits import Circuit, EAPConfig, EdgeScores, edge_attribution
from tlcap.locate.circuits.items import edge_attribution_items
from tlcap.locate.selection import threshold_select, top_k_select
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model

CHECKPOINT_VERSION = 2  # 2: sha256 of the fingerprint and items; 1: none (still resumed)


# ---------------------------------------------------------------------------- locators
def _select(scores: torch.Tensor, kn: KNConfig) -> NeuronSet:
    return top_k_select(scores, kn.top_k) if kn.top_k is not None else threshold_select(scores, kn.threshold)


def kn_neurons(model: Model, prompt: str, target: str, kn: KNConfig) -> tuple[NeuronSet, float]:
    """KN located set of one prompt and the clean target probability.

    Args:
        model: The model.
        prompt: The prompt.
        target: The answer (multi-token answers: teacher forcing, IG averaged over tokens).
        kn: Attribution (``kn.ig``) and selection (``Attr > kn.threshold · max``, Dai's 0.2, or the
            ``kn.top_k`` best) settings.

    Returns:
        ``(neurons, P(target))``.
    """
    attr = integrated_gradients(model, prompt, target, config=kn.ig)
    return _select(attr.scores, kn), attr.target_prob


def traced_layers(model: Model, prompt: str, subject: str, target: str,
                  trace: TraceConfig) -> tuple[list[int], float, float]:
    """The ``trace.top_k`` MLP layers with the largest indirect effect at the last subject token.

    With ``trace.tokens="last_subject"`` (the experiments' default) only that token's row is traced:
    the same cells, and so the same layers, as a full trace's row, at the cost of one row. With
    ``trace.bos`` the model's BOS token is prepended, so a subject that starts the prompt is not the
    attention sink at position 0.

    Args:
        model: The model.
        prompt: The prompt.
        subject: The subject in it.
        target: The answer.
        trace: Causal-tracing settings (its ``kinds`` include ``mlp``).

    Returns:
        ``(layers in decreasing effect, clean probability, corrupted probability)``.
    """
    tr = causal_trace(model, prompt, subject, target, config=trace)
    return tr.top_layers(trace.top_k, kind="mlp", token="last_subject"), tr.clean_prob, tr.corrupted_prob


def knowledge_circuit(model: Model, prompt: str, target: str, kc: EAPConfig) -> Circuit:
    """The circuit of one prompt: EAP-IG with ``kc.steps`` (zero ablation), then ``kc``'s selection
    (top-n or threshold; dead nodes pruned when ``kc.prune``).

    Args:
        model: The model.
        prompt: The prompt.
        target: The answer.
        kc: EAP-IG settings and the selection (:func:`cnl_circuit`).

    Returns:
        The selected :class:`~tlcap.locate.circuits.Circuit`.
    """
    scores = edge_attribution(model, prompt, target, None, config=kc)
    return _circuit(scores, kc)


def _circuit(scores: EdgeScores, kc: EAPConfig) -> Circuit:
    rule, value = kc.selection
    return scores.select(top_n=int(value), prune=kc.prune) if rule == "top_n" else \
        scores.select(threshold=value, prune=kc.prune)


def kn_neurons_facts(model: Model, facts: Sequence[tuple[str, str]], kn: KNConfig) -> list[tuple[NeuronSet, float]]:
    """:func:`kn_neurons` of every ``(prompt, target)``, the IG rows of all prompts in shared batches.

    Args:
        model: The model.
        facts: ``(prompt, target)`` per fact.
        kn: Attribution (``kn.ig``) and selection settings, as :func:`kn_neurons`.

    Returns:
        ``(neurons, P(target))`` per fact, in order.
    """
    return [(_select(a.scores, kn), a.target_prob) for a in integrated_gradients_facts(model, facts, config=kn.ig)]


def traced_layers_facts(model: Model, facts: Sequence[tuple[str, str, str]],
                        trace: TraceConfig) -> list[tuple[list[int], float, float]]:
    """:func:`traced_layers` of every ``(prompt, subject, target)``, the cells of several facts in one batch.

    Args:
        model: The model.
        facts: ``(prompt, subject, target)`` per fact.
        trace: Causal-tracing settings (its ``kinds`` include ``mlp``).

    Returns:
        ``(layers, P(target) clean, P(target) corrupted)`` per fact, in order, as :func:`traced_layers`.
    """
    trs = causal_trace_facts(model, facts, config=trace)
    return [(tr.top_layers(trace.top_k, kind="mlp", token="last_subject"), tr.clean_prob, tr.corrupted_prob)
            for tr in trs]


def knowledge_circuits(model: Model, facts: Sequence[tuple[str, str]], kc: EAPConfig) -> list[Circuit]:
    """:func:`knowledge_circuit` of every ``(prompt, target)``, the prompts sharing the scoring passes.

    Args:
        model: The model.
        facts: ``(prompt, target)`` per fact.
        kc: EAP-IG settings and the selection (:func:`cnl_circuit`).

    Returns:
        One :class:`~tlcap.locate.circuits.Circuit` per fact, in order.
    """
    return [_circuit(sc, kc) for sc in edge_attribution_items(model, facts, config=kc)]


def cnl_trace() -> TraceConfig:
    """The causal trace the CNL experiments locate layers with: MLP cells of the last subject token, top 3.

    Returns:
        ``TraceConfig(kinds=("mlp",), tokens="last_subject", top_k=3)``.
    """
    return TraceConfig(kinds=("mlp",), tokens="last_subject", top_k=3)


def cnl_circuit() -> EAPConfig:
    """The knowledge circuit the CNL experiments locate: EAP-IG with 5 steps, the top 300 edges.

    Returns:
        ``EAPConfig(steps=5, top_n=300)``.
    """
    return EAPConfig(steps=5, top_n=300)


def neuron_ids(ns: NeuronSet) -> tuple[int, ...]:
    """A neuron set as sorted flat ids ``l·d_mlp + j``.

    Args:
        ns: The neuron set.

    Returns:
        The flat ids of its neurons, ascending.
    """
    d = ns.shape[1]
    return tuple(sorted(l * d + j for l, j in ns))


def neurons_from_ids(ids: Sequence[int], shape: tuple[int, int]) -> NeuronSet:
    """Inverse of :func:`neuron_ids`.

    Args:
        ids: Flat neuron ids ``l·d_mlp + j``.
        shape: ``(n_layers, d_mlp)``.

    Returns:
        The :class:`NeuronSet` of those neurons.
    """
    return NeuronSet(tuple((int(i) // shape[1], int(i) % shape[1]) for i in ids), shape)


def edge_ids(circuit: Circuit) -> tuple[int, ...]:
    """A circuit's edges as sorted flat ids ``u·n_readers + v``.

    Args:
        circuit: The circuit (its ``[n_upstream, n_readers]`` edge mask).

    Returns:
        The flat ids of its edges, ascending.
    """
    return tuple(int(i) for i in torch.nonzero(circuit.mask.flatten()).flatten().tolist())


# ---------------------------------------------------------------------------- parameter shares
@dataclass(frozen=True)
class ParamCounts:
    """Exact parameter counts the "Neuron (% of parameters)" column needs.

    Attributes:
        block_total: Parameters of the transformer blocks (embeddings excluded).
        per_neuron: Parameters one MLP neuron owns (its input / gate rows and bias, its
            down-projection column).
        per_mlp: Parameters of one layer's MLP group (``m{l}``: weights, biases and its norm).
    """

    block_total: int
    per_neuron: int
    per_mlp: tuple[int, ...]

    def neurons_share(self, n_neurons: int) -> float:
        """Share of block parameters held by ``n_neurons`` MLP neurons.

        Args:
            n_neurons: Number of MLP neurons.

        Returns:
            ``n_neurons · per_neuron / block_total``.
        """
        return n_neurons * self.per_neuron / self.block_total

    def layers_share(self, layers: Sequence[int]) -> float:
        """Share of block parameters held by the MLPs of ``layers``.

        Args:
            layers: Layer indices (repeats counted once).

        Returns:
            Their MLP groups' parameters over ``block_total``.
        """
        return sum(self.per_mlp[l] for l in set(layers)) / self.block_total


def param_counts(model: Model) -> ParamCounts:
    """Count the parameters (:meth:`Model.parameter_groups`, the MLP weight handles).

    Args:
        model: The model.

    Returns:
        The model's :class:`ParamCounts` (block total, per neuron, per layer's MLP).
    """
    pg = model.parameter_groups()
    slices = [model.mlp_out_weight(0), *model.mlp_in_weights(0)]
    per_neuron = sum(int(ws.param.numel() // ws.param.shape[ws.neuron_dim]) for ws in slices)
    per_mlp = tuple(pg.count([f"m{l}"]) for l in range(model.n_layers))
    return ParamCounts(pg.block_total, per_neuron, per_mlp)


# ---------------------------------------------------------------------------- timing
@dataclass
class Stopwatch:
    """Seconds spent per method (for results and the benchmark's cost shares)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def add(self, other: dict[str, float]) -> None:
        """Add seconds per method (e.g. another run's :attr:`seconds`) to :attr:`seconds`.

        Args:
            other: Method name -> seconds to add.
        """
        for k, v in other.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + float(v)


# ---------------------------------------------------------------------------- checkpoints
def fingerprint(*parts: Any) -> str:
    """A short sha256 of JSON-serialisable parts (config, model name, inputs).

    Args:
        *parts: JSON-serialisable values (others are written with ``str``).

    Returns:
        The first 16 hex characters of the sha256 of their sorted-key JSON.
    """
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ItemCheckpoint:
    """Per-item results of a streamed experiment, saved atomically every few items.

    The folder holds ``items.json`` (``{"version", "fingerprint", "items": [...], "sha256"}``),
    replaced by a rename each time (:mod:`tlcap.atomic`), so an interrupt — even ``SIGKILL`` —
    leaves the last complete save; a file that does not match its sha256 is refused as damaged. A run with other inputs or
    settings (another fingerprint) refuses to resume from it.

    Args:
        directory: The checkpoint folder (``None``: keep nothing).
        fp: Fingerprint of the run's inputs and settings.
        every: Items between saves.
        resume: Start from the items already saved there.
    """

    def __init__(self, directory: str | Path | None, fp: str, every: int = 5, resume: bool = True) -> None:
        self.path = Path(directory) / "items.json" if directory is not None else None
        self.fp, self.every = fp, max(1, int(every))
        self.items: list[Any] = []
        if self.path is not None and resume and self.path.exists():
            way = "rerun with --overwrite into a new --out, or delete the file to start over"
            try:
                data = json.loads(self.path.read_text())
                version = data.get("version", 1)
                if isinstance(version, int) and version > CHECKPOINT_VERSION:
                    raise CheckpointError(f"the checkpoint {self.path} is of format {version}, made by a newer tlcap "
                                          f"(this one reads formats 1 to {CHECKPOINT_VERSION}); resume with that tlcap, "
                                          "or delete the file to start over")
                old_fp, items = data["fingerprint"], data["items"]
                if version >= 2 and data.get("sha256") != json_digest([old_fp, items]):
                    raise ValueError("its content does not match the sha256 recorded in it")
            except CheckpointError:
                raise
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise CheckpointError(f"the checkpoint {self.path} is damaged ({exc}); {way}") from None
            if old_fp != fp:
                raise CheckpointMismatchError(
                    f"the checkpoint in {self.path.parent} was made with other inputs or settings (fingerprint {old_fp} "
                    f"vs {fp}); delete it, or use another --out"
                )
            self.items = list(items)

    @property
    def done(self) -> int:
        return len(self.items)

    def add(self, item: Any) -> None:
        """Record one item; saves every ``every`` items.

        Args:
            item: One item's result (JSON-serialisable).
        """
        self.items.append(item)
        if len(self.items) % self.every == 0:
            self.save()

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Save the items done so far when the block exits, however it exits.

        Yields:
            Nothing (``None``); :meth:`save` runs when the block exits.
        """
        try:
            yield
        finally:
            self.save()

    def save(self) -> None:
        """Write the items now (atomic rename); nothing without a folder."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, self.path.parent) from None
        items = json.loads(json.dumps(self.items))  # the checksum covers what a reader parses
        write_text_atomic(self.path, json.dumps({"version": CHECKPOINT_VERSION, "fingerprint": self.fp, "items": items,
                                                 "sha256": json_digest([self.fp, items])}))


OnItem = Callable[[int], None]
"""Called with the item's position before each item is computed (tests simulate interrupts)."""


__all__ = ["ItemCheckpoint", "ParamCounts", "Stopwatch", "cnl_circuit", "cnl_trace", "edge_ids", "fingerprint",
           "kn_neurons", "kn_neurons_facts", "knowledge_circuit", "knowledge_circuits", "neuron_ids", "neurons_from_ids",
           "param_counts", "traced_layers", "traced_layers_facts"]
