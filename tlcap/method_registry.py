"""The method registry: one entry per localization method, one call to run any of them.

:func:`localize` runs a registered method by name on a model and its data, with the method's own
config (:meth:`tlcap.config.Config.resolve`: flat or dotted overrides, routed to the nested config
that owns them), and returns the method's result type. ``tlcap methods`` lists the registry and
``tlcap localize METHOD ...`` runs any entry from the command line.

Adding a method is one module (the computation, returning a :class:`~tlcap.results.Result`) and one
:func:`register` call naming its inputs, config type, paper and cost; see ``docs/design.md``
("Add a method"). Entries refer to their runner as ``"module:function"`` so that listing the
registry imports none of the methods.

Example:
    >>> from tlcap.method_registry import get_method, method_names
    >>> method_names()[:3]
    ('kn', 'ig', 'sig')
    >>> get_method("trace").inputs
    ('prompt', 'subject')
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tlcap.config import Config
from tlcap.errors import InvalidConfigError, UnknownNameError


@dataclass(frozen=True)
class Method:
    """One registered localization method.

    Attributes:
        name: Registry key (``"kn"``, ``"trace"``, ...), lower case.
        title: What it locates, one line.
        paper: The paper that defines it.
        result: Name of the result type it returns.
        cost: Its compute in model passes (the symbols are defined in ``cost``).
        inputs: Required data fields, in positional order (``("prompt", "target")``).
        optional: Optional data fields, after ``inputs`` in positional order.
        config: The config class as ``"module:Class"`` (``None``: the method takes no config).
        runner: ``"module:function"`` or a callable ``run(model, *, config, progress, **data)``.
    """

    name: str
    title: str
    paper: str
    result: str
    cost: str
    inputs: tuple[str, ...]
    optional: tuple[str, ...] = ()
    config: str | None = None
    runner: str | Callable[..., Any] = field(default="", repr=False)
    defaults: tuple[tuple[str, Any], ...] = ()
    """Config overrides the method applies to the config's defaults (``eap-ig``: ``steps=5``)."""

    def config_type(self) -> type[Config] | None:
        """The method's config class (imported on first use).

        Returns:
            The class, or ``None`` for a method without a config.
        """
        return None if self.config is None else _load(self.config)

    def resolve(self, config: Config | None = None, **overrides: Any) -> Config | None:
        """The config the method runs with (``config`` or the defaults, with ``overrides``).

        Args:
            config: A config of the method's type (default: its defaults).
            **overrides: Fields to change; dotted (``ig.steps``) or flat (``steps``, routed to the
                nested config that owns it).

        Returns:
            The validated config (``None`` for a method without one).

        Raises:
            InvalidConfigError: a config of another type, a bad value, or overrides for a method
                without a config.
            UnknownNameError: an override no config field owns.
        """
        cls = self.config_type()
        if cls is None:
            if config is not None or overrides:
                raise InvalidConfigError(f"method {self.name!r} takes no config")
            return None
        if config is None:
            overrides = {**dict(self.defaults), **overrides}
        return cls.resolve(config, **overrides)

    def data(self, data: Any) -> dict[str, Any]:
        """``data`` as the runner's keyword arguments.

        Args:
            data: A mapping of field names; a tuple or list in the order ``inputs + optional``; an
                object with the fields as attributes (a :class:`~tlcap.data.pararel.Fact`); or a
                string, the first input.

        Returns:
            ``{field: value}`` with every required input.

        Raises:
            InvalidConfigError: a missing required input, an unknown field or too many values.
        """
        fields = self.inputs + self.optional
        if isinstance(data, str):
            data = (data,)
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(fields))
            if unknown:
                raise InvalidConfigError(f"method {self.name!r} takes the data fields {', '.join(fields)}; "
                                         f"got {unknown[0]!r}")
            got = {k: v for k, v in data.items() if v is not None}
        elif isinstance(data, (tuple, list)):
            if len(data) > len(fields):
                raise InvalidConfigError(f"method {self.name!r} takes at most {len(fields)} data values "
                                         f"({', '.join(fields)}), got {len(data)}")
            got = {k: v for k, v in zip(fields, data) if v is not None}
        else:
            got = {k: getattr(data, k) for k in fields if getattr(data, k, None) is not None}
        missing = [k for k in self.inputs if k not in got]
        if missing:
            raise InvalidConfigError(f"method {self.name!r} needs {', '.join(missing)} in its data "
                                     f"(fields: {', '.join(fields)})")
        return got

    def run(self, model: Any, data: Any, *, config: Config | None = None, progress: bool = False,
            **overrides: Any) -> Any:
        """Run the method (see :func:`localize`).

        Args:
            model: The :class:`~tlcap.models.Model`.
            data: The method's data (:meth:`data`).
            config: Its config (default: the defaults).
            progress: Progress bars.
            **overrides: Config fields to change.

        Returns:
            The method's result.
        """
        kwargs = self.data(data)
        cfg = self.resolve(config, **overrides)
        fn = _load(self.runner) if isinstance(self.runner, str) else self.runner
        return fn(model, config=cfg, progress=progress, **kwargs)


_REGISTRY: dict[str, Method] = {}


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def register(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to the registry (``tlcap.localize`` and ``tlcap localize`` then run it).

    Args:
        method: The entry.
        replace: Replace an entry of the same name (else that is an error).

    Returns:
        ``method``.

    Raises:
        InvalidConfigError: a name already registered (without ``replace``), not lower case, or a
            method without inputs or runner.

    Example:
        >>> from tlcap.method_registry import Method, register, unregister
        >>> m = register(Method("toy", "a toy", "none", "NeuronAttribution", "1 forward", ("prompt",),
        ...                     runner=lambda model, *, config, progress, prompt: prompt))
        >>> unregister("toy")
    """
    if not method.name or method.name != method.name.lower() or " " in method.name:
        raise InvalidConfigError(f"a method name is one lower-case word, got {method.name!r}")
    if method.name in _REGISTRY and not replace:
        raise InvalidConfigError(f"method {method.name!r} is already registered (pass replace=True)")
    if not method.inputs or not method.runner:
        raise InvalidConfigError(f"method {method.name!r} needs inputs and a runner")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove the entry ``name`` (a method a test or a notebook registered).

    Args:
        name: The method's name.

    Raises:
        UnknownNameError: no such method.
    """
    get_method(name)
    del _REGISTRY[name]


def method_names() -> tuple[str, ...]:
    """The registered methods' names, in registration order.

    Returns:
        The names.
    """
    return tuple(_REGISTRY)


def methods() -> tuple[Method, ...]:
    """The registered methods, in registration order.

    Returns:
        The entries.
    """
    return tuple(_REGISTRY.values())


def get_method(name: str) -> Method:
    """The entry ``name``.

    Args:
        name: A registered name.

    Returns:
        The :class:`Method`.

    Raises:
        UnknownNameError: no such method (the message lists the registered ones).
    """
    if name not in _REGISTRY:
        raise UnknownNameError.of("method", name, list(_REGISTRY), option=None)
    return _REGISTRY[name]


def localize(model: Any, data: Any, method: str = "kn", *, config: Config | None = None, progress: bool = False,
             **overrides: Any) -> Any:
    """Run the registered localization ``method`` on ``model`` and ``data``.

    Args:
        model: The :class:`~tlcap.models.Model`.
        data: The method's data: a mapping, a tuple in the order of the method's fields, an
            object with them as attributes, or a string (the first field). ``tlcap methods``
            lists each method's fields: ``kn`` ``(prompt, target[, paraphrases])``, ``trace``
            ``(prompt, subject[, target])``, ``eap``/``eap-ig`` ``(prompt, target[, corrupt_prompt,
            corrupt_target])``, ``cnl`` ``(task[, samples, n])``, ``ig``/``sig``/``amig``
            ``(prompt, target)``.
        method: A registered name (:func:`method_names`).
        config: The method's config (default: its defaults).
        progress: Progress bars.
        **overrides: Config fields, flat (``steps=10``) or dotted (``ig.steps=10``).

    Returns:
        The method's result (``kn``: :class:`~tlcap.experiments.knowledge_neurons.KnowledgeNeurons`,
        ``trace``: :class:`~tlcap.locate.causal_trace.CausalTrace`, ``eap``/``eap-ig``:
        :class:`~tlcap.locate.circuits.KnowledgeCircuit`, ``cnl``:
        :class:`~tlcap.experiments.cnl.CNLLocation`, ``ig``/``sig``/``amig``:
        :class:`~tlcap.attribution.NeuronAttribution`).

    Raises:
        UnknownNameError: an unknown method or config field.
        InvalidConfigError: missing data or a bad setting (before any forward pass).

    Example:
        >>> res = tlcap.localize(model, ("The capital of France is", " Paris"), method="kn", steps=2, n_random=0)
        >>> type(res).__name__
        'KnowledgeNeurons'
    """
    return get_method(method).run(model, data, config=config, progress=progress, **overrides)


_HERE = "tlcap.method_runners"  # the built-in methods' runners (imported when one runs)
for _m in (
    Method("kn", "knowledge neurons of a fact: IG, threshold, paraphrase refinement, suppress/enhance vs random sets",
           "Dai et al. 2022, Knowledge Neurons in Pretrained Transformers", "KnowledgeNeurons",
           "(1+P)·L·S forward+backward rows (P paraphrases, L layers, S steps) + 2·(1+R) forwards (R random sets)",
           ("prompt", "target"), ("paraphrases",), "tlcap.experiments.knowledge_neurons:KNConfig", f"{_HERE}:run_kn"),
    Method("ig", "integrated-gradients score of every MLP neuron for one prompt and target",
           "Dai et al. 2022 (QL paper's IG baseline)", "NeuronAttribution", "L·S forward+backward rows",
           ("prompt", "target"), (), "tlcap.attribution.config:IGConfig", f"{_HERE}:run_ig"),
    Method("sig", "sequential IG: each word masked in turn, neuron scores summed over words",
           "Enguehard 2023, Sequential Integrated Gradients (QL paper A.4)", "NeuronAttribution",
           "W·L·S forward+backward rows (W words)", ("prompt", "target"), (), "tlcap.attribution.config:IGConfig",
           f"{_HERE}:run_sig"),
    Method("amig", "architecture-adapted IG: all-<eos> baseline, normalised scores (QL eqs. 18-19)",
           "Chen et al. 2024, QL paper A.4", "NeuronAttribution", "W·L·S forward+backward rows (W words)",
           ("prompt", "target"), (), "tlcap.attribution.config:IGConfig", f"{_HERE}:run_amig"),
    Method("trace", "causal tracing: restored probability of every (state, token, layer) after noising the subject",
           "Meng et al. 2022, Locating and Editing Factual Associations in GPT (ROME)", "CausalTrace",
           "1 + N·K·T·L forward rows (N noise samples, K kinds, T tokens, L layers)",
           ("prompt", "subject"), ("target",), "tlcap.locate.causal_trace:TraceConfig", f"{_HERE}:run_trace"),
    Method("eap", "knowledge circuit by edge attribution patching, evaluated alone and against a random circuit",
           "Syed et al. 2023 (EAP); Yao et al. 2024, Knowledge Circuits", "KnowledgeCircuit",
           "2 forwards + 1 backward to score every edge, then 2 forwards per evaluated circuit",
           ("prompt", "target"), ("corrupt_prompt", "corrupt_target"), "tlcap.locate.circuits:EAPConfig",
           f"{_HERE}:run_eap"),
    Method("eap-ig", "knowledge circuit by EAP with integrated gradients over the corrupted-to-clean path",
           "Hanna et al. 2024, Have Faith in Faithfulness (EAP-IG)", "KnowledgeCircuit",
           "S forward+backward rows to score every edge (S steps), then 2 forwards per evaluated circuit",
           ("prompt", "target"), ("corrupt_prompt", "corrupt_target"), "tlcap.locate.circuits:EAPConfig",
           f"{_HERE}:run_eap_ig", (("steps", 5),)),
    Method("cnl", "commonality neurons of a task (CNL eq. 7 + σ-mask) with split-half stability",
           "capability localization paper (CNL), eq. 7", "CNLLocation",
           "N·A·(S+1) forward+backward rows over all layers (N samples, A answer tokens, S steps)",
           ("task",), ("samples", "n"), "tlcap.experiments.cnl.config:CNLConfig", f"{_HERE}:run_cnl"),
):
    register(_m)
del _m


__all__ = ["Method", "register", "unregister", "method_names", "methods", "get_method", "localize"]
