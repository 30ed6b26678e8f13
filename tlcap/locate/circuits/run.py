"""What a circuit was scored on and how: one value shared by every circuit result.

:class:`~tlcap.locate.circuits.eap.EdgeScores`, :class:`~tlcap.locate.circuits.circuit.Circuit`,
:class:`~tlcap.locate.circuits.knowledge_circuit.KnowledgeCircuit` and
:class:`~tlcap.locate.circuits.dataset_circuit.DatasetCircuit` each hold one :class:`CircuitRun`
(``result.run``) instead of their own copies of its fields; a circuit selected from scores
carries the scores' run. :class:`CircuitRunFields` reads the run's fields on the result
(``scores.prompt`` is ``scores.run.prompt``), saves the run as one JSON object, and loads results
saved before the run was one value (its fields flat in the result).

Example:
    >>> from tlcap.locate.circuits import edge_attribution
    >>> sc = edge_attribution(model, "The capital of France is", " Paris", steps=2)
    >>> sc.run.method, sc.run.steps, sc.prompt == sc.run.prompt
    ('eap-ig', 2, True)
    >>> sc.select(top_n=10).run == sc.run
    True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tlcap.rows import RowFields


@dataclass(frozen=True)
class CircuitRun:
    """The task and the method a circuit's edge scores come from.

    Attributes:
        model_name: The model.
        prompt: The clean prompt (``""`` for a dataset).
        target: Its answer.
        corrupt_prompt: The corrupted prompt (``None``: another ablation).
        corrupt_target: The corrupted prompt's answer (``metric="logit_diff"``).
        metric: ``"nll"`` or ``"logit_diff"``.
        method: ``"eap"`` or ``"eap-ig"``.
        steps: Interpolation steps (1 for EAP).
        direction: ``"noising"`` (gradient on the clean run) or ``"denoising"``.
        clean_metric: The metric on the clean run (dataset: the mean over items).
        corrupt_metric: The metric on the fully ablated run.
        ablation: ``"corrupt"``, ``"zero"``, ``"mean"`` or ``"mean-positional"``.
        dataset: The dataset's name (``"pararel:P36"``; ``""`` for a prompt pair).
        n_items: Items the scores are the mean over (1 for a prompt pair).
        config: The :class:`~tlcap.locate.circuits.config.EAPConfig` of the run, as a dict.
    """

    model_name: str = ""
    prompt: str = ""
    target: str = ""
    corrupt_prompt: str | None = None
    corrupt_target: str | None = None
    metric: str = "nll"
    method: str = "eap"
    steps: int = 1
    direction: str = "noising"
    clean_metric: float = math.nan
    corrupt_metric: float = math.nan
    ablation: str = ""
    dataset: str = ""
    n_items: int = 1
    config: dict = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        """Field by field, NaN metrics equal to NaN (a run compares equal to its saved copy)."""
        if not isinstance(other, CircuitRun):
            return NotImplemented
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
                return False
        return True



RUN_FIELDS = tuple(f.name for f in dataclasses.fields(CircuitRun))


class CircuitRunFields(RowFields):
    """Mixin of the circuit results: their ``run`` saved as one object, its fields read on the result."""

    _row_types: ClassVar[dict[str, type]] = {"run": CircuitRun}

    @classmethod
    def _from_fields(cls, fields: dict[str, Any], tensors: dict[str, Any], where: str = "") -> Any:
        if "run" not in fields and any(k in fields for k in RUN_FIELDS):  # saved before the run was one value
            fields = dict(fields)
            fields["run"] = {k: fields.pop(k) for k in RUN_FIELDS if k in fields}
        return super()._from_fields(fields, tensors, where=where)

    @property
    def model_name(self) -> str:
        """The run's model (:class:`CircuitRun`)."""
        return self.run.model_name  # type: ignore[attr-defined]

    @property
    def prompt(self) -> str:
        """The run's clean prompt."""
        return self.run.prompt  # type: ignore[attr-defined]

    @property
    def target(self) -> str:
        """The run's answer."""
        return self.run.target  # type: ignore[attr-defined]

    @property
    def corrupt_prompt(self) -> str | None:
        """The run's corrupted prompt."""
        return self.run.corrupt_prompt  # type: ignore[attr-defined]

    @property
    def corrupt_target(self) -> str | None:
        """The run's corrupted answer."""
        return self.run.corrupt_target  # type: ignore[attr-defined]

    @property
    def metric(self) -> str:
        """The run's metric."""
        return self.run.metric  # type: ignore[attr-defined]

    @property
    def method(self) -> str:
        """``"eap"`` or ``"eap-ig"``."""
        return self.run.method  # type: ignore[attr-defined]

    @property
    def steps(self) -> int:
        """The run's interpolation steps."""
        return self.run.steps  # type: ignore[attr-defined]

    @property
    def direction(self) -> str:
        """The run's gradient direction."""
        return self.run.direction  # type: ignore[attr-defined]

    @property
    def clean_metric(self) -> float:
        """The metric on the clean run."""
        return self.run.clean_metric  # type: ignore[attr-defined]

    @property
    def corrupt_metric(self) -> float:
        """The metric on the fully ablated run."""
        return self.run.corrupt_metric  # type: ignore[attr-defined]

    @property
    def ablation(self) -> str:
        """The run's ablation."""
        return self.run.ablation  # type: ignore[attr-defined]

    @property
    def dataset(self) -> str:
        """The run's dataset (``""`` for a prompt pair)."""
        return self.run.dataset  # type: ignore[attr-defined]

    @property
    def n_items(self) -> int:
        """Items the run's scores are the mean over."""
        return self.run.n_items  # type: ignore[attr-defined]

    @property
    def config(self) -> dict:
        """The run's :class:`~tlcap.locate.circuits.config.EAPConfig`, as a dict."""
        return self.run.config  # type: ignore[attr-defined]


__all__ = ["CircuitRun", "CircuitRunFields", "RUN_FIELDS"]
