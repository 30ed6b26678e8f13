"""The result of tracing one fact: restored probabilities for every (kind, token, layer) cell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import InvalidConfigError, UnknownNameError
from tlcap.locate.causal_trace.config import KINDS
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.trace import trace_heatmap


@dataclass(frozen=True)
class TraceCellRow:
    """One row of :meth:`CausalTrace.to_frame`: one restored cell."""

    kind: str
    token_idx: int
    token: str
    layer: int
    score: float
    effect: float


@dataclass(frozen=True)
class CausalTrace(Result):
    """Scores of one causal trace: probability of the target with each cell restored.

    Attributes:
        scores: ``[kind, token, layer]`` restored probabilities (mean over noise samples).
        clean_prob / corrupted_prob: Target probability in the clean / corrupted run.
        prompt, subject, target: The fact; ``target_id`` is the scored token.
        tokens: The prompt's tokens as strings; ``subject_range`` is ``[start, end)``.
        kinds, layers: The axes of ``scores`` (``layers`` may be a subset of the model's).
        window, samples, noise_std, seed: The settings that made the noise and restorations.
        bos: Whether a BOS token was prepended (``tokens[0]`` is then the BOS).
        subject_at_start: The subject's first token is at position 0 (the attention sink).
        top_k: Located layers reported by :meth:`summary`.
        seconds: Wall time.
        model_name: ``Model.name``.
    """

    scores: Float[Tensor, "kind token layer"]
    clean_prob: float
    corrupted_prob: float
    prompt: str = ""
    subject: str = ""
    target: str = ""
    target_id: int = -1
    tokens: tuple[str, ...] = ()
    subject_range: tuple[int, int] = (0, 0)
    kinds: tuple[str, ...] = KINDS
    layers: tuple[int, ...] = ()
    window: int = 10
    samples: int = 10
    noise_std: float = 0.0
    seed: int = 0
    bos: bool = False
    subject_at_start: bool = False
    top_k: int = 3
    seconds: float = 0.0
    model_name: str = ""

    @property
    def indirect_effect(self) -> Float[Tensor, "kind token layer"]:
        """Restored − corrupted probability for every cell."""
        return self.scores - self.corrupted_prob

    def _kind(self, kind: str) -> int:
        if kind not in self.kinds:
            raise UnknownNameError.of("traced kind", kind, self.kinds)
        return self.kinds.index(kind)

    def score(self, kind: str) -> Float[Tensor, "token layer"]:
        """Restored probabilities of one kind, ``[token, layer]``.

        Args:
            kind: A traced kind (``"resid"``, ``"mlp"`` or ``"attn"``).

        Returns:
            The ``[token, layer]`` probabilities of the target with that kind's state restored (NaN: cell not traced).

        Raises:
            UnknownNameError: ``kind`` was not traced.
        """
        return self.scores[self._kind(kind)]

    def effect(self, kind: str) -> Float[Tensor, "token layer"]:
        """Indirect effects of one kind, ``[token, layer]``.

        Args:
            kind: A traced kind (``"resid"``, ``"mlp"`` or ``"attn"``).

        Returns:
            The ``[token, layer]`` restored probability minus the corrupted probability.

        Raises:
            UnknownNameError: ``kind`` was not traced.
        """
        return self.indirect_effect[self._kind(kind)]

    def top_layers(self, k: int = 3, kind: str = "mlp", token: str | int = "last_subject") -> list[int]:
        """The ``k`` layers with the largest indirect effect (the "located layers").

        Args:
            k: How many.
            kind: Which state (``"mlp"`` by default: ROME edits the MLP with the largest effect;
                falls back to the first traced kind when ``mlp`` was not traced).
            token: ``"last_subject"`` (ROME's choice), ``"max"`` (max over tokens) or an index.

        Returns:
            Layers, largest effect first.
        """
        if kind not in self.kinds:
            kind = self.kinds[0]
        eff = self.effect(kind)
        if token == "max":
            row = eff.nan_to_num(nan=float("-inf")).max(0).values  # untraced rows are NaN
        elif token == "last_subject":
            row = eff[self.subject_range[1] - 1]
        elif isinstance(token, int) and -len(self.tokens) <= token < len(self.tokens):
            row = eff[token]
        else:
            raise InvalidConfigError(
                f"token must be 'last_subject', 'max' or a token index in {-len(self.tokens)}..{len(self.tokens) - 1}, "
                f"got {token!r}"
            )
        if torch.isnan(row).all():
            raise InvalidConfigError(f"token {token!r} was not traced (TraceConfig.tokens); trace it or pick a traced row")
        order = torch.argsort(row, descending=True, stable=True)[: min(k, len(self.layers))]
        return [int(self.layers[i]) for i in order]

    def to_frame(self) -> pd.DataFrame:
        """One :class:`TraceCellRow` per (kind, token, layer): score and indirect effect.

        Returns:
            A DataFrame of :class:`TraceCellRow` (kinds, then tokens, then layers).
        """
        eff = self.indirect_effect
        rows = [
            TraceCellRow(kind, t, tok, int(layer), float(self.scores[ki, t, li]), float(eff[ki, t, li]))
            for ki, kind in enumerate(self.kinds)
            for t, tok in enumerate(self.tokens)
            for li, layer in enumerate(self.layers)
        ]
        return frame(rows, TraceCellRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """ROME-style heatmaps (residual, MLP, attention) of the restored probability.

        Args:
            title: Figure title (default: prompt, target and the clean / corrupted probabilities).

        Returns:
            A plotly figure, one heatmap per traced kind, the subject tokens marked.
        """
        return trace_heatmap(
            {k: self.score(k).float().numpy() for k in self.kinds},
            {k: self.effect(k).float().numpy() for k in self.kinds},
            tokens=self.tokens, layers=self.layers, subject_range=self.subject_range,
            corrupted_prob=self.corrupted_prob,
            title=title or (f"Causal trace: {self.prompt!r} → {self.target!r}  "
                            f"(clean p={self.clean_prob:.3f}, corrupted p={self.corrupted_prob:.3f})"),
        )

    def summary(self, top_k: int | None = None) -> dict[str, Any]:
        """The ``tlcap trace`` summary: probabilities, scores and effects per kind, located layers.

        Args:
            top_k: Located layers reported (default: the trace's ``top_k``).

        Returns:
            A JSON-ready dict; ``top_layers`` are read at the last subject token (``"max"`` when it was not traced).
        """
        k = self.top_k if top_k is None else top_k
        last = self.subject_range[1] - 1
        row: str = "last_subject" if not torch.isnan(self.scores[:, last]).all() else "max"
        all_kinds = {kind: self.score(kind).tolist() if kind in self.kinds else None for kind in KINDS}
        return {
            "model": self.model_name, "mode": "single",
            "prompt": self.prompt, "subject": self.subject, "target": self.target,
            "tokens": list(self.tokens), "subject_range": list(self.subject_range),
            "clean_prob": self.clean_prob, "corrupted_prob": self.corrupted_prob,
            "layers": list(self.layers), "kinds": list(self.kinds),
            "scores": all_kinds,
            "indirect_effects": {kind: self.effect(kind).tolist() for kind in self.kinds},
            "top_layers": self.top_layers(k, token=row), "top_layers_token": row,
            "top_layers_by_kind": {kind: self.top_layers(k, kind=kind, token=row) for kind in self.kinds},
            "window": self.window, "samples": self.samples, "noise_std": self.noise_std,
            "seed": self.seed, "bos": self.bos, "subject_at_start": self.subject_at_start, "seconds": self.seconds,
        }


__all__ = ["CausalTrace", "TraceCellRow"]
