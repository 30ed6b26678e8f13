"""Dataset-level neuron scores as a value: :class:`DatasetScores` and exact, duplicate-safe merges.

:func:`~tlcap.attribution.dataset.score_dataset` produces them; :func:`merge_scores` adds shard or
chunk sums exactly (integer fixed point) and refuses parts that share samples, so no sample is
ever counted twice.

Example:
    >>> from tlcap.attribution.dataset import score_dataset
    >>> from tlcap.data.tasks import load_task
    >>> samples = load_task("emotion", split="train", n=4)
    >>> from tlcap import RunControl
    >>> part0, part1 = (score_dataset(model, samples, steps=2, run=RunControl(shard=(i, 2), progress=False)) for i in range(2))
    >>> merged = merge_scores([part0, part1], names=["runs/s0", "runs/s1"])
    >>> merged.n_samples, len(merged.select(sigma=3))
    (4, 12)
    >>> merge_scores([part0, part0], names=["runs/s0", "runs/s0-again"])
    Traceback (most recent call last):
    ...
    tlcap.errors.OverlappingShardsError: runs/s0 and runs/s0-again share 2 samples (the same part given twice?); ...
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float, Int64
from torch import Tensor

from tlcap.attribution.fixed_point import from_fixed
from tlcap.config import check_choice, check_float
from tlcap.data.sample import Sample
from tlcap.errors import CheckpointMismatchError, EmptyDatasetError, OverlappingShardsError
from tlcap.locate.selection import sigma_mask
from tlcap.metrics.sets import NeuronSet
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.heatmaps import neuron_heatmap

SKIP_KINDS = ("too_long", "empty_answer")
SPREADS = ("std", "var")


def check_sigma(sigma: float, spread: str = "std", option: str = "--sigma") -> float:
    """Validate a σ-mask threshold (``> 0``: σ ≤ 0 would select every neuron) and its spread.

    Args:
        sigma: The threshold σ, ``> 0``.
        spread: ``"std"`` or ``"var"`` (:data:`SPREADS`).
        option: The CLI option named in the error message.

    Returns:
        ``sigma`` as a float.
    """
    check_choice("spread", spread, SPREADS)
    return check_float("sigma", sigma, gt=0, cli=option)


def sample_id(sample: Sample) -> str:
    """A short hash of a sample's uid, prompt and answer (what merges check for duplicates).

    Args:
        sample: The sample.

    Returns:
        The first 16 hex characters of the sha256 of its uid, prompt and answer.
    """
    h = hashlib.sha256(b"\x00".join(x.encode() for x in (sample.uid, sample.prompt, sample.answer)))
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ScoreRow:
    """One row of :meth:`DatasetScores.to_frame`: a neuron and its dataset score."""

    layer: int
    neuron: int
    score: float


@dataclass(frozen=True)
class DatasetScores(Result):
    """Summed neuron scores over a dataset (or one shard or chunk of it).

    Attributes:
        sums: ``[2, n_layers, d_mlp]`` int64 two-word fixed-point sums of per-sample scores
            (:func:`to_fixed`); :attr:`scores` is their mean as float64.
        n_samples: Samples summed (scored samples; skipped ones are counted apart).
        n_tokens: Answer tokens scored.
        n_skipped: Samples skipped (every kind).
        skipped: Skips by kind: ``too_long`` (beyond the context window), ``empty_answer``.
        n_seen: Samples of this shard processed (scored + skipped): the resume position.
        prob_sum: Sum over samples of the mean clean probability of their answer tokens.
        shard: ``(i, n)`` or ``(0, 1)`` for a whole run; a merge has ``(-1, n)``.
        fingerprint: Hash of the samples (and settings) the sums belong to.
        sample_ids: :func:`sample_id` of every sample seen, in order.
        config: The attribution settings (:class:`IGConfig` as a dict).
    """

    sums: Int64[Tensor, "2 layer d_mlp"]
    n_samples: int = 0
    n_tokens: int = 0
    n_skipped: int = 0
    n_seen: int = 0
    prob_sum: float = 0.0
    model_name: str = ""
    task: str = ""
    method: str = "ig"
    steps: int | str = 20
    rule: str = "midpoint"
    layers: tuple[int, ...] = ()
    max_answer_tokens: int = 8
    shard: tuple[int, int] = (0, 1)
    fingerprint: str = ""
    seconds: float = 0.0
    skipped: dict = field(default_factory=dict)
    sample_ids: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.sums.shape[1]), int(self.sums.shape[2]))

    @property
    def scores(self) -> Float[Tensor, "layer d_mlp"]:
        """score(w): mean over samples of the per-sample mean-over-answer-tokens IG (float64)."""
        if self.n_samples == 0:
            kinds = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.skipped.items()) or "no reason recorded"
            raise EmptyDatasetError(f"no samples were scored: every one of the {self.n_seen} was skipped ({kinds}); "
                                    "use shorter samples, a smaller --max-answer-tokens, or a model with a longer context")
        return from_fixed(self.sums) / self.n_samples

    @property
    def completeness_rel_error(self) -> float:
        """Σ |Σ_j Attr − ΔP| / Σ |ΔP| over samples, answer tokens and scored layers (NaN if not recorded).

        Kept as running sums in :attr:`meta` by :func:`~tlcap.attribution.dataset.score_dataset`
        (merges do not carry them).
        """
        if "completeness_delta" not in self.meta:
            return float("nan")
        return float(self.meta["completeness_abs_error"]) / max(float(self.meta["completeness_delta"]), 1e-12)

    @property
    def mean_prob(self) -> float:
        return self.prob_sum / max(self.n_samples, 1)

    def select(self, sigma: float = 3.0, spread: str = "std") -> NeuronSet:
        """CNL σ-mask ``|score − mean| > σ · spread`` (:func:`tlcap.locate.selection.sigma_mask`).

        Args:
            sigma: The threshold σ, ``> 0``.
            spread: ``"std"`` or ``"var"`` of the scores.

        Returns:
            The selected neurons of :attr:`scores`.

        Raises:
            InvalidConfigError: ``sigma <= 0`` (it would select every neuron) or an unknown spread.
        """
        check_sigma(sigma, spread)
        return sigma_mask(self.scores, sigma, spread)  # type: ignore[arg-type]

    def summary(self) -> dict[str, Any]:
        """Counts, settings and skips of the scoring run.

        Returns:
            A JSON-safe dict: task, model, method, steps, rule, layers, sample/token/skip counts, shard, mean
            probability, fingerprint and seconds.
        """
        return {
            "task": self.task, "model": self.model_name, "method": self.method, "steps": self.steps, "rule": self.rule,
            "layers": list(self.layers), "max_answer_tokens": self.max_answer_tokens, "n_samples": self.n_samples,
            "n_tokens": self.n_tokens, "n_skipped": self.n_skipped, "skipped": dict(self.skipped), "n_seen": self.n_seen,
            "shard": list(self.shard), "mean_prob": self.mean_prob, "fingerprint": self.fingerprint,
            "seconds": self.seconds,
        }

    def to_frame(self, top: int | None = 50) -> pd.DataFrame:
        """:class:`ScoreRow` per neuron, sorted by |score| (the σ-mask is two-sided); ``top`` first.

        Args:
            top: How many neurons to keep, by decreasing |score|; ``None`` = every neuron.

        Returns:
            A DataFrame of :class:`ScoreRow` (``layer``, ``neuron``, ``score``).
        """
        s = self.scores.float()
        flat = s.flatten()
        order = flat.abs().argsort(descending=True)
        if top is not None:
            order = order[:top]
        d = s.shape[1]
        return frame([ScoreRow(int(i) // d, int(i) % d, float(flat[i])) for i in order], ScoreRow)

    def figure(self) -> go.Figure:
        """The score heatmap (:meth:`heatmap`).

        Returns:
            The Plotly figure of :meth:`heatmap` with no highlight.
        """
        return self.heatmap()

    def heatmap(self, highlight: NeuronSet | None = None, **kwargs: Any) -> go.Figure:
        """Layer × neuron heatmap of the scores, ``highlight`` ringed.

        Args:
            highlight: Neurons to ring (e.g. :meth:`select`); ``None`` = none.
            **kwargs: Passed to :func:`~tlcap.viz.neuron_heatmap` (default title: task, samples, method).

        Returns:
            The Plotly figure.
        """
        kwargs.setdefault("title", f"CNL scores: {self.task} ({self.n_samples} samples, {self.method})")
        return neuron_heatmap(self.scores.float(), highlight=highlight, **kwargs)


def check_disjoint(parts: Sequence[DatasetScores], names: Sequence[str] | None = None) -> None:
    """Refuse partial scores that share samples (the same shard twice, overlapping shard layouts).

    Args:
        parts: The partial scores to be merged.
        names: A name per part for the error message (default ``"part 0"``, ``"part 1"``...).

    Raises:
        OverlappingShardsError: naming the two parts and how many samples they share.
    """
    names = list(names) if names is not None else [f"part {k}" for k in range(len(parts))]
    owner: dict[str, int] = {}
    for k, p in enumerate(parts):
        shared: dict[int, int] = {}
        for sid in p.sample_ids:
            if sid in owner:
                shared[owner[sid]] = shared.get(owner[sid], 0) + 1
            else:
                owner[sid] = k
        for j, count in shared.items():
            same = " (the same part given twice?)" if count == len(p.sample_ids) == len(parts[j].sample_ids) else ""
            raise OverlappingShardsError(
                f"{names[j]} and {names[k]} share {count} sample{'s' if count != 1 else ''}{same}; merging them would "
                "count those samples twice: give each shard of one run once"
            )


def merge_scores(parts: Sequence[DatasetScores], names: Sequence[str] | None = None) -> DatasetScores:
    """Add shard (or chunk) partial sums; exact (integer sums), independent of order.

    Args:
        parts: The partial scores.
        names: How to call them in error messages (e.g. their folders).

    Returns:
        The merged :class:`DatasetScores`.

    Raises:
        CheckpointMismatchError: parts computed with other settings.
        OverlappingShardsError: parts that share samples.
    """
    if not parts:
        raise EmptyDatasetError("no partial scores to merge")
    first = parts[0]
    for p in parts[1:]:
        for attr in ("shape", "method", "steps", "rule", "layers", "max_answer_tokens", "model_name"):
            if getattr(p, attr) != getattr(first, attr):
                raise CheckpointMismatchError(
                    f"cannot merge partial scores with different {attr}: {getattr(first, attr)!r} vs {getattr(p, attr)!r}"
                )
    check_disjoint(parts, names)
    sums = torch.zeros_like(first.sums)
    for p in parts:
        sums += p.sums
    ns = sorted({p.shard[1] for p in parts})
    return DatasetScores(
        sums=sums, n_samples=sum(p.n_samples for p in parts), n_tokens=sum(p.n_tokens for p in parts),
        n_skipped=sum(p.n_skipped for p in parts), n_seen=sum(p.n_seen for p in parts),
        prob_sum=sum(p.prob_sum for p in parts), model_name=first.model_name, task=first.task, method=first.method,
        steps=first.steps, rule=first.rule, layers=first.layers, max_answer_tokens=first.max_answer_tokens,
        shard=(-1, ns[0] if len(ns) == 1 else 0),
        fingerprint=hashlib.sha256("".join(sorted(p.fingerprint for p in parts)).encode()).hexdigest()[:16],
        seconds=sum(p.seconds for p in parts),
        skipped={k: sum(int(p.skipped.get(k, 0)) for p in parts) for k in SKIP_KINDS},
        sample_ids=tuple(s for p in parts for s in p.sample_ids), config=dict(first.config),
        meta={"merged_from": len(parts)},
    )



__all__ = ["DatasetScores", "ScoreRow", "merge_scores", "check_disjoint", "check_sigma", "sample_id", "SKIP_KINDS", "SPREADS"]
