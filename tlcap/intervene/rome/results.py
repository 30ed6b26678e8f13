"""Results of ROME edits: one edit's metrics, and the same edit at each layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.trace import edit_result_figure, edit_sweep_figure


@dataclass(frozen=True)
class RomeMetricsRow:
    """One row of :meth:`RomeEditResult.to_frame` / :meth:`RomeSweep.to_frame`: one edit's metrics."""

    layer: int
    efficacy: bool
    paraphrase: float
    specificity: float
    new_prob_before: float
    new_prob_after: float
    old_prob_before: float
    old_prob_after: float
    delta_norm: float
    seconds: float


@dataclass(frozen=True)
class RomeEditResult(Result):
    """Metrics of one ROME edit (the model is restored afterwards).

    Attributes:
        layer: The edited layer.
        efficacy: The new object beats the old one on the prompt (mean token log-prob).
        paraphrase: Share of paraphrases where the new object beats the old one.
        specificity: Share of unrelated prompts whose top next token is unchanged.
        new_prob_before / new_prob_after: P(new object) on the prompt (geometric mean over
            its tokens) before / after the edit; likewise ``old_prob_*``.
        prompt, subject, target_new, target_old: The request.
        paraphrases, paraphrase_success: The paraphrases and whether the edit won on each.
        neighbourhood, neighbourhood_kept: The unrelated prompts and whether each kept its answer.
        losses: The loss minimised at each optimisation step.
        delta_norm, update_norm: ‖δ‖ and ‖ΔW‖.
        seconds: Wall time of the edit; ``seconds_total`` with the measurements.
        model_name: ``Model.name``.
    """

    layer: int
    efficacy: bool
    paraphrase: float
    specificity: float
    new_prob_before: float
    new_prob_after: float
    old_prob_before: float
    old_prob_after: float
    prompt: str = ""
    subject: str = ""
    target_new: str = ""
    target_old: str = ""
    paraphrases: tuple[str, ...] = ()
    paraphrase_success: tuple[bool, ...] = ()
    neighbourhood: tuple[str, ...] = ()
    neighbourhood_kept: tuple[bool, ...] = ()
    losses: tuple[float, ...] = ()
    delta_norm: float = 0.0
    update_norm: float = 0.0
    seconds: float = 0.0
    seconds_total: float = 0.0
    model_name: str = ""

    def row(self) -> RomeMetricsRow:
        """This edit's metrics as a :class:`RomeMetricsRow`.

        Returns:
            The layer, efficacy, paraphrase and specificity scores, P(new) / P(old) before and after, ``‖δ‖`` and seconds.
        """
        return RomeMetricsRow(
            self.layer, self.efficacy, self.paraphrase, self.specificity, self.new_prob_before, self.new_prob_after,
            self.old_prob_before, self.old_prob_after, self.delta_norm, self.seconds,
        )

    def to_frame(self) -> pd.DataFrame:
        """One :class:`RomeMetricsRow`.

        Returns:
            A one-row DataFrame of :meth:`row`.
        """
        return frame([self.row()], RomeMetricsRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """P(new) and P(old) before / after the edit, and the optimisation's loss by step.

        Args:
            title: The figure title (default: layer, request, efficacy, paraphrase and specificity).

        Returns:
            The Plotly figure.
        """
        return edit_result_figure(
            {f"P(new {self.target_new!r})": (self.new_prob_before, self.new_prob_after),
             f"P(old {self.target_old!r})": (self.old_prob_before, self.old_prob_after)},
            self.losses,
            title=title or (f"ROME at layer {self.layer}: {self.prompt!r} → {self.target_new!r}  (efficacy "
                            f"{'yes' if self.efficacy else 'no'}, paraphrase {self.paraphrase:.2f}, "
                            f"specificity {self.specificity:.2f})"),
        )

    def summary(self) -> dict[str, Any]:
        """The ``tlcap edit`` summary: every field (metrics, request, per-prompt outcomes, losses).

        Returns:
            ``{"model", "mode": "single"}`` and every field of :meth:`to_dict`.
        """
        return {"model": self.model_name, "mode": "single", **self.to_dict()}


@dataclass(frozen=True)
class RomeSweep(Result):
    """The same edit at each layer separately (the CNL reliability test's efficacy-by-layer).

    Attributes:
        results: One :class:`RomeEditResult` per edited layer.
        prompt, subject, target_new: The request.
        seconds_total: Wall time of the sweep (covariances included).
        model_name: ``Model.name``.
    """

    results: tuple = ()
    prompt: str = ""
    subject: str = ""
    target_new: str = ""
    seconds_total: float = 0.0
    model_name: str = ""

    def __post_init__(self) -> None:
        # Loading from JSON gives the nested results as tagged dicts; revive them.
        revived = tuple(
            RomeEditResult._from_fields(r["fields"], {}) if isinstance(r, dict) and "__result__" in r else r
            for r in self.results
        )
        object.__setattr__(self, "results", revived)

    @property
    def layers(self) -> list[int]:
        """The edited layers."""
        return [r.layer for r in self.results]

    def column(self, name: str) -> list[Any]:
        """One field of every layer's result.

        Args:
            name: A :class:`RomeEditResult` field, e.g. ``"efficacy"``.

        Returns:
            Its value in each result, in layer order.
        """
        return [getattr(r, name) for r in self.results]

    def to_frame(self) -> pd.DataFrame:
        """One :class:`RomeMetricsRow` per edited layer.

        Returns:
            A DataFrame of :class:`RomeMetricsRow`, one row per edited layer.
        """
        return frame([r.row() for r in self.results], RomeMetricsRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """Efficacy, paraphrase, specificity and P(new) by edited layer.

        Args:
            title: The figure title (default: the request).

        Returns:
            The Plotly figure.
        """
        return edit_sweep_figure(
            self.layers, self.column("efficacy"), self.column("paraphrase"), self.column("specificity"),
            self.column("new_prob_before"), self.column("new_prob_after"),
            title=title or f"ROME edit at each layer: {self.prompt!r} → {self.target_new!r}",
        )

    def summary(self) -> dict[str, Any]:
        """The ``tlcap edit --all-layers`` summary: per-layer lists of the metrics, efficacy rate.

        Returns:
            A JSON-safe dict: the request and layers, a list per metric (one entry per layer), ``target_old``,
            ``efficacy_rate`` (share of layers whose edit succeeded) and ``seconds_total``.
        """
        cols = ["efficacy", "paraphrase", "specificity", "new_prob_before", "new_prob_after", "old_prob_after", "seconds"]
        out: dict[str, Any] = {"model": self.model_name, "mode": "all_layers", "prompt": self.prompt,
                               "subject": self.subject, "target_new": self.target_new, "layers": self.layers}
        out.update({c: self.column(c) for c in cols})
        out["target_old"] = self.results[0].target_old if self.results else ""
        out["efficacy_rate"] = sum(map(bool, self.column("efficacy"))) / max(len(self.results), 1)
        out["seconds_total"] = self.seconds_total
        return out


__all__ = ["RomeEditResult", "RomeMetricsRow", "RomeSweep"]
