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
    return locate_knowledge_neurons(model, prompt, target, list(paraphrases), config=config, progress=progress)


def _attribution(kind: str) -> Callable[..., Any]:
    def run(model: Any, *, config: Any, progress: bool, prompt: str, target: str) -> Any:
        return attribute(model, prompt, target, kind, config=config, progress=progress)
    return run


run_ig, run_sig, run_amig = _attribution("ig"), _attribution("sig"), _attribution("amig")


def run_trace(model: Any, *, config: Any, progress: bool, prompt: str, subject: str, target: str | None = None) -> Any:
    return causal_trace(model, prompt, subject, target, config=config, progress=progress)


def run_circuit(model: Any, *, config: Any, progress: bool, prompt: str, target: str,
                corrupt_prompt: str | None = None, corrupt_target: str | None = None) -> Any:
    return knowledge_circuit(model, prompt, target, corrupt_prompt, corrupt_target=corrupt_target, config=config)


def run_eap(model: Any, *, config: Any, progress: bool, **data: Any) -> Any:
    if config.steps != 1:
        raise InvalidConfigError(f"eap scores edges with one gradient (steps=1); steps={config.steps} is method 'eap-ig'")
    return run_circuit(model, config=config, progress=progress, **data)


def run_eap_ig(model: Any, *, config: Any, progress: bool, **data: Any) -> Any:
    if config.steps < 2:
        raise InvalidConfigError(f"eap-ig integrates over >= 2 steps (steps=1 is method 'eap'), got steps={config.steps}")
    return run_circuit(model, config=config, progress=progress, **data)


def run_cnl(model: Any, *, config: Any, progress: bool, task: str, samples: Sequence[Any] | None = None,
            n: int = 50) -> Any:
    if samples is None:
        samples = load_task(task, split="train", n=int(n), seed=config.seed)
    return cnl_locate(model, task, samples, config=config, run=RunControl(progress=progress))


__all__ = ["run_kn", "run_ig", "run_sig", "run_amig", "run_trace", "run_eap", "run_eap_ig", "run_cnl"]
