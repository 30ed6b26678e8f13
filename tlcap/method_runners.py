"""Runners of the built-in methods of :mod:`tlcap.method_registry`: each adapts one method's function
to the registry's call ``run(model, *, config, progress, **data)``.

The registry names them as ``"tlcap.method_runners:run_kn"`` and imports this module only when a
method runs, so listing the registry (``tlcap methods``) imports none of the methods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tlcap.attribution.methods import localize as attribute
from tlcap.data.tasks import load_task
from tlcap.errors import InvalidConfigError
from tlcap.experiments.cnl import cnl_locate
from tlcap.experiments.knowledge_neurons import locate_knowledge_neurons
from tlcap.locate.causal_trace import causal_trace
from tlcap.locate.circuits import knowledge_circuit
from tlcap.runtime.run_control import RunControl


def run_kn(model: Any, *, config: Any, progress: bool, prompt: str, target: str,
           paraphrases: Sequence[str] = ()) -> Any:
    """Run method ``kn``: :func:`~tlcap.experiments.knowledge_neurons.locate_knowledge_neurons` of one fact.

    Args:
        model: The model.
        config: A :class:`~tlcap.experiments.knowledge_neurons.KNConfig`.
        progress: Show progress bars.
        prompt: The fact's prompt.
        target: The answer with its leading space, e.g. ``" Paris"``.
        paraphrases: Other prompts of the same fact (empty: the main prompt only).

    Returns:
        The fact's :class:`~tlcap.experiments.knowledge_neurons.KnowledgeNeurons`.
    """
    return locate_knowledge_neurons(model, prompt, target, list(paraphrases), config=config, progress=progress)


def _attribution(kind: str) -> Callable[..., Any]:
    def run(model: Any, *, config: Any, progress: bool, prompt: str, target: str) -> Any:
        """Run one attribution method (``ig``, ``sig`` or ``amig``): :func:`~tlcap.attribution.methods.localize`.

        Args:
            model: The model.
            config: An :class:`~tlcap.attribution.config.IGConfig`.
            progress: Show progress bars.
            prompt: The query.
            target: The answer, e.g. ``" Paris"``.

        Returns:
            The :class:`~tlcap.attribution.NeuronAttribution` of every MLP neuron for ``prompt → target``.
        """
        return attribute(model, prompt, target, kind, config=config, progress=progress)
    return run


run_ig, run_sig, run_amig = _attribution("ig"), _attribution("sig"), _attribution("amig")


def run_trace(model: Any, *, config: Any, progress: bool, prompt: str, subject: str, target: str | None = None) -> Any:
    """Run method ``trace``: :func:`~tlcap.locate.causal_trace.causal_trace` of one fact.

    Args:
        model: The model.
        config: A :class:`~tlcap.locate.causal_trace.TraceConfig`.
        progress: Show progress bars.
        prompt: The fact's prompt, e.g. ``"The capital of France is"``.
        subject: The subject inside ``prompt`` whose tokens are corrupted, e.g. ``"France"``.
        target: The answer; ``None`` = the model's own top prediction.

    Returns:
        The fact's :class:`~tlcap.locate.causal_trace.CausalTrace`.
    """
    return causal_trace(model, prompt, subject, target, config=config, progress=progress)


def run_circuit(model: Any, *, config: Any, progress: bool, prompt: str, target: str,
                corrupt_prompt: str | None = None, corrupt_target: str | None = None) -> Any:
    return knowledge_circuit(model, prompt, target, corrupt_prompt, corrupt_target=corrupt_target, config=config)


def run_eap(model: Any, *, config: Any, progress: bool, **data: Any) -> Any:
    """Run method ``eap``: :func:`~tlcap.locate.circuits.knowledge_circuit` scored with one gradient.

    Args:
        model: The model.
        config: An :class:`~tlcap.locate.circuits.EAPConfig` with ``steps == 1``.
        progress: Unused by the circuit search (kept for the registry's call).
        **data: ``prompt``, ``target`` and optionally ``corrupt_prompt`` / ``corrupt_target``.

    Returns:
        The fact's :class:`~tlcap.locate.circuits.KnowledgeCircuit`.

    Raises:
        InvalidConfigError: ``config.steps != 1`` (that is method ``eap-ig``).
    """
    if config.steps != 1:
        raise InvalidConfigError(f"eap scores edges with one gradient (steps=1); steps={config.steps} is method 'eap-ig'")
    return run_circuit(model, config=config, progress=progress, **data)


def run_eap_ig(model: Any, *, config: Any, progress: bool, **data: Any) -> Any:
    """Run method ``eap-ig``: :func:`~tlcap.locate.circuits.knowledge_circuit` with integrated-gradient edge scores.

    Args:
        model: The model.
        config: An :class:`~tlcap.locate.circuits.EAPConfig` with ``steps >= 2``.
        progress: Unused by the circuit search (kept for the registry's call).
        **data: ``prompt``, ``target`` and optionally ``corrupt_prompt`` / ``corrupt_target``.

    Returns:
        The fact's :class:`~tlcap.locate.circuits.KnowledgeCircuit`.

    Raises:
        InvalidConfigError: ``config.steps < 2`` (``steps=1`` is method ``eap``).
    """
    if config.steps < 2:
        raise InvalidConfigError(f"eap-ig integrates over >= 2 steps (steps=1 is method 'eap'), got steps={config.steps}")
    return run_circuit(model, config=config, progress=progress, **data)


def run_cnl(model: Any, *, config: Any, progress: bool, task: str, samples: Sequence[Any] | None = None,
            n: int = 50) -> Any:
    """Run method ``cnl``: :func:`~tlcap.experiments.cnl.cnl_locate` of one task.

    Args:
        model: The model.
        config: A :class:`~tlcap.experiments.cnl.CNLConfig` (its ``seed`` also draws the samples).
        progress: Show progress bars.
        task: The task name, e.g. ``"emotion"``.
        samples: The dataset; ``None`` = ``n`` train samples of ``task`` from :func:`~tlcap.data.tasks.load_task`.
        n: How many samples to load when ``samples`` is ``None``.

    Returns:
        The task's :class:`~tlcap.experiments.cnl.CNLLocation`.
    """
    if samples is None:
        samples = load_task(task, split="train", n=int(n), seed=config.seed)
    return cnl_locate(model, task, samples, config=config, run=RunControl(progress=progress))


__all__ = ["run_kn", "run_ig", "run_sig", "run_amig", "run_trace", "run_eap", "run_eap_ig", "run_cnl"]
