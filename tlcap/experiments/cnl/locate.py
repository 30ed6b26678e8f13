"""CNL locate (CNL paper §5.1, §5.3): dataset scores, σ-mask, split-half stability, convergence.

The dataset is split into two random halves A and B, and each half into chunks whose cumulative
sizes form the convergence ladder. Every chunk is scored as a separate streamed run
(:func:`tlcap.attribution.dataset.score_dataset`, exact integer sums); since sums add exactly,
the whole-data scores are the merge of all chunks — the split-half and convergence analyses cost
nothing beyond scoring the data once. Sharding (``shard="i/n"``) applies inside every chunk, so
``n`` partial runs merged with :func:`merge_parts` give bit-identical results to one run.

- split overlap / IoU: located(A) vs located(B) at full halves (CNL: 96.4 % / 93.1 %).
- convergence: the same at each ladder point, plus the overlap of located(A_k ∪ B_k) with the
  final set.
- the scores are kept, so another σ is a re-threshold (:meth:`CNLLocation.reselect`), never a
  re-score.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.attribution.config import IGConfig
from tlcap.attribution.dataset import DatasetScores, all_skipped, check_sigma, merge_scores, score_dataset
from tlcap.data.sample import DataReport, Sample
from tlcap.errors import CheckpointMismatchError, EmptyDatasetError, MissingFileError
from tlcap.experiments.cnl.config import CNLConfig
from tlcap.locate.selection import sigma_mask
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import RowFields, frame
from tlcap.runtime.run_control import RunControl
from tlcap.viz.cnl import convergence_figure, located_sets_figure
from tlcap.viz.heatmaps import neuron_heatmap

Parts = dict[str, DatasetScores]


def split_halves(samples: Sequence[Sample], seed: int = 0) -> tuple[list[Sample], list[Sample]]:
    """Two random halves (seeded); with an odd count the first half has one more.

    Args:
        samples: The dataset.
        seed: Seed of the shuffle.

    Returns:
        ``(half A, half B)``, each in the samples' original order.
    """
    idx = list(range(len(samples)))
    random.Random(seed).shuffle(idx)
    h = (len(idx) + 1) // 2
    return [samples[i] for i in sorted(idx[:h])], [samples[i] for i in sorted(idx[h:])]


def ladder(n_half: int, points: int = 4) -> list[int]:
    """Cumulative half sizes for the convergence curve: geometric, ending at ``n_half``.

    Args:
        n_half: Samples in a half.
        points: Most points (``n_half / 2**j`` for ``j < points``; equal sizes merge).

    Returns:
        The half sizes, ascending, each ``>= 1``; ``[]`` when ``n_half < 1``.
    """
    if n_half < 1:
        return []
    return sorted({max(1, round(n_half / 2**j)) for j in range(points)})


def score_parts(
    model: Model,
    samples: Sequence[Sample],
    *,
    config: CNLConfig | None = None,
    task: str = "",
    run: RunControl | None = None,
    on_sample: Callable[[int, Sample], None] | None = None,
    **overrides: Any,
) -> Parts:
    """Score every chunk of both halves (keys ``A0, A1, …, B0, …``); see the module docstring.

    Args:
        model: The model.
        samples: The dataset (at least 2 samples).
        config: A :class:`CNLConfig` (its ``ig``, ``max_answer_tokens``, ``seed``, ``convergence_points``).
        task: Name recorded in the results.
        run: Checkpoints (one sub-folder per chunk), resuming, ``shard`` (score only shard i of every
            chunk), ``distributed`` and progress bars (:class:`~tlcap.runtime.run_control.RunControl`).
        on_sample: Passed to :func:`score_dataset` (called before each sample).
        **overrides: :class:`CNLConfig` (or :class:`IGConfig`) fields.

    Returns:
        Chunk name → :class:`DatasetScores`.
    """
    cfg = CNLConfig.resolve(config, **overrides)
    rc = RunControl.resolve(run)
    if len(samples) < 2:
        raise EmptyDatasetError(f"CNL split-half needs at least 2 samples, got {len(samples)}; use a larger --n")
    if why := all_skipped(model, samples, cfg.max_answer_tokens):  # before any work or checkpoint
        raise EmptyDatasetError(f"every one of the {len(samples)} samples would be skipped ({why}): nothing to score; "
                                "use shorter samples, a smaller --max-answer-tokens, or a model with a longer context")
    parts: Parts = {}
    for name, half in zip("AB", split_halves(samples, cfg.seed)):
        ks = ladder(len(half), cfg.convergence_points)
        lo = 0
        for j, hi in enumerate(ks):
            key = f"{name}{j}"
            parts[key] = score_dataset(
                model, half[lo:hi], config=cfg.ig, max_answer_tokens=cfg.max_answer_tokens, task=task,
                run=rc.in_folder(key), on_sample=on_sample, desc=f"CNL {task} half {name} chunk {j + 1}/{len(ks)}",
            )
            lo = hi
    return parts


def merge_parts(runs: Sequence[Parts], names: Sequence[str] | None = None) -> Parts:
    """Merge the parts of several shard runs key by key (exact); refuses runs that share samples.

    Args:
        runs: The shard runs' parts.
        names: How to call the runs in error messages (their folders).

    Returns:
        The merged parts: one :class:`DatasetScores` per key (chunk) over all runs.

    Raises:
        CheckpointMismatchError: runs with other chunk layouts or settings.
        OverlappingShardsError: runs that share samples (a shard given twice).
    """
    names = list(names) if names is not None else [f"run {k}" for k in range(len(runs))]
    keys = sorted(runs[0])
    for r, nm in zip(runs[1:], names[1:]):
        if sorted(r) != keys:
            raise CheckpointMismatchError(f"{nm} has other chunks ({', '.join(sorted(r))}) than {names[0]} "
                                          f"({', '.join(keys)}); run every shard with the same --n, --seed and ladder")
    return {k: merge_scores([r[k] for r in runs], [f"{nm} (chunk {k})" for nm in names]) for k in keys}


def save_parts(parts: Parts, path: str | Path) -> Path:
    """Save every chunk under ``path/<key>``.

    Args:
        parts: The chunks by key (:func:`score_parts`).
        path: The folder (each chunk in its own subfolder).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    for k, v in parts.items():
        v.save(path / k)
    return path


def load_parts(path: str | Path) -> Parts:
    """Chunks saved by :func:`save_parts` (the ``parts`` folder of a ``tlcap cnl locate`` run).

    Args:
        path: The ``parts`` folder.

    Returns:
        The chunks by key (every subfolder holding a ``result.json``), keys sorted.

    Raises:
        MissingFileError: ``path`` holds no saved chunk.
    """
    path = Path(path)
    keys = sorted(p.name for p in path.iterdir() if (p / "result.json").exists()) if path.is_dir() else []
    if not keys:
        raise MissingFileError(f"no partial CNL scores under {path}; pass the --out folder of `tlcap cnl locate --shard i/n`")
    return {k: DatasetScores.load(path / k) for k in keys}


@dataclass(frozen=True)
class ConvergenceRow:
    """One point of the convergence ladder (:attr:`CNLLocation.convergence`)."""

    n_half: int
    n_b: int
    overlap: float
    iou: float
    n_a: int
    n_b_neurons: int
    overlap_with_final: float


@dataclass(frozen=True)
class CNLLocation(RowFields, Result):
    """Neurons located on a dataset by CNL, with split-half stability and convergence.

    Attributes:
        scores: ``[n_layers, d_mlp]`` score(w) on the whole dataset (float64).
        half_scores: ``[2, n_layers, d_mlp]`` scores on the halves A and B.
        neurons: Located neurons ``(layer, index)`` (σ-mask on ``scores``).
        convergence: One :class:`ConvergenceRow` per ladder point.
        skipped: Samples not scored, by kind (``too_long``, ``empty_answer``).
        config: The :class:`CNLConfig` as a dict.
        data: The :class:`~tlcap.data.sample.DataReport` summary (requested vs used, skipped rows).
    """

    _row_types: ClassVar[dict[str, type]] = {"convergence": ConvergenceRow}

    scores: Float[Tensor, "layer d_mlp"]
    half_scores: Float[Tensor, "2 layer d_mlp"]
    neurons: tuple[tuple[int, int], ...]
    sigma: float = 3.0
    spread: str = "std"
    split_overlap: float = 0.0
    split_iou: float = 0.0
    convergence: tuple[ConvergenceRow, ...] = ()
    n_samples: int = 0
    n_tokens: int = 0
    n_skipped: int = 0
    task: str = ""
    model_name: str = ""
    method: str = "ig"
    steps: int | str = 20
    max_answer_tokens: int = 8
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.scores.shape[0]), int(self.scores.shape[1]))

    def neuron_set(self) -> NeuronSet:
        """The located neurons as a set.

        Returns:
            A :class:`NeuronSet` of :attr:`neurons` over the ``(n_layers, d_mlp)`` grid.
        """
        return NeuronSet(self.neurons, self.shape)

    @property
    def n_neurons(self) -> int:
        return len(self.neurons)

    @property
    def neuron_ratio(self) -> float:
        return self.neuron_set().ratio()

    def reselect(self, sigma: float, spread: str | None = None) -> NeuronSet:
        """The located set at another σ from the saved scores (no scoring).

        Args:
            sigma: The threshold σ, ``> 0``.
            spread: ``"std"`` or ``"var"`` (default: this location's).

        Returns:
            The σ-mask of :attr:`scores`.

        Raises:
            InvalidConfigError: ``sigma <= 0`` or an unknown spread.
        """
        spread = spread or self.spread
        check_sigma(sigma, spread)
        return sigma_mask(self.scores, sigma, spread)  # type: ignore[arg-type]

    def halves(self, sigma: float | None = None, spread: str | None = None) -> tuple[NeuronSet, NeuronSet]:
        """Neurons located on half A and on half B (at this location's σ, or another).

        Args:
            sigma: The threshold σ (default: this location's).
            spread: ``"std"`` or ``"var"`` (default: this location's).

        Returns:
            ``(set A, set B)``: the σ-masks of the two halves' scores.

        Raises:
            InvalidConfigError: ``sigma <= 0`` or an unknown spread.
        """
        sigma, spread = sigma or self.sigma, spread or self.spread
        check_sigma(sigma, spread)
        return (sigma_mask(self.half_scores[0], sigma, spread),  # type: ignore[arg-type]
                sigma_mask(self.half_scores[1], sigma, spread))  # type: ignore[arg-type]

    def to_frame(self) -> pd.DataFrame:
        """The convergence ladder, one :class:`ConvergenceRow` per point.

        Returns:
            A DataFrame of :class:`ConvergenceRow` (half size, split-half overlap / IoU, set sizes, overlap with the final set).
        """
        return frame(self.convergence, ConvergenceRow)

    def summary(self) -> dict[str, Any]:
        """The ``tlcap cnl locate`` summary: located set, split-half stability, convergence, counts.

        Returns:
            A JSON-safe dict: task, model and settings, sample / token / skip counts, the data report, the located
            set's size and ratio, split-half overlap and IoU, and the convergence ladder.
        """
        return {
            "task": self.task, "model": self.model_name, "method": self.method, "steps": self.steps,
            "max_answer_tokens": self.max_answer_tokens, "sigma": self.sigma, "spread": self.spread,
            "n_samples": self.n_samples, "n_tokens": self.n_tokens, "n_skipped": self.n_skipped,
            "skipped": {**{k: int(v) for k, v in self.skipped.items()},
                        "bad_rows": self.data.get("skipped_bad_rows", 0),
                        "unknown_labels": self.data.get("skipped_unknown_labels", 0)},
            "data": dict(self.data),
            "n_neurons": self.n_neurons, "neuron_ratio": self.neuron_ratio, "split_overlap": self.split_overlap,
            "split_iou": self.split_iou, "convergence": [dataclasses.asdict(r) for r in self.convergence],
            "neurons_per_layer": {str(l): len(j) for l, j in sorted(self.neuron_set().by_layer().items())},
            "neurons": self.neuron_set().to_list(), "seconds": self.seconds, "config": dict(self.config),
        }

    def figure(self) -> go.Figure:
        """The located neurons (:meth:`located_figure`).

        Returns:
            The Plotly figure of :meth:`located_figure`.
        """
        return self.located_figure()

    def located_figure(self) -> go.Figure:
        """Located neurons on a layer × neuron canvas (CNL Fig. 3 style).

        Returns:
            The Plotly figure, titled with σ, samples and the located share.
        """
        return located_sets_figure(
            {self.task or "located": self.neuron_set()},
            title=f"CNL located neurons: {self.task} (σ={self.sigma:g} {self.spread}, {self.n_samples} samples, "
            f"{self.n_neurons} neurons = {100 * self.neuron_ratio:.3f} %)",
        )

    def convergence_figure(self) -> go.Figure:
        """Split-half overlap / IoU and overlap with the final set vs samples per half.

        Returns:
            The Plotly figure of :meth:`to_frame`'s ladder.
        """
        return convergence_figure(self.to_frame(), title=f"CNL convergence: {self.task}")

    def heatmap(self) -> go.Figure:
        """The scores, located neurons ringed.

        Returns:
            The Plotly layer × neuron heatmap of :attr:`scores`.
        """
        return neuron_heatmap(self.scores.float(), highlight=self.neuron_set(), title=f"CNL scores: {self.task}")


def finalize(
    parts: Parts,
    sigma: float = 3.0,
    spread: str = "std",
    *,
    config: CNLConfig | None = None,
    data: DataReport | None = None,
) -> CNLLocation:
    """Turn merged chunk sums into a :class:`CNLLocation` (selection, split-half, convergence).

    Args:
        parts: Chunk name → scores (:func:`score_parts` or :func:`merge_parts`).
        sigma: σ of the mask, ``> 0``.
        spread: ``std`` or ``var``.
        config: The run's :class:`CNLConfig` (recorded; default rebuilt from the parts).
        data: The data report of the samples (recorded in the result).

    Returns:
        The location (no provenance attached; :func:`cnl_locate` adds it).
    """
    check_sigma(sigma, spread)
    a_keys = sorted((k for k in parts if k.startswith("A")), key=lambda k: int(k[1:]))
    b_keys = sorted((k for k in parts if k.startswith("B")), key=lambda k: int(k[1:]))
    full = merge_scores([parts[k] for k in a_keys + b_keys])
    final = full.select(sigma, spread)
    rows = []
    for j in range(max(len(a_keys), len(b_keys))):
        a = merge_scores([parts[k] for k in a_keys[: j + 1]])
        b = merge_scores([parts[k] for k in b_keys[: j + 1]]) if b_keys else None
        sa = a.select(sigma, spread)
        sb = b.select(sigma, spread) if b is not None and b.n_samples else NeuronSet((), sa.shape)
        both = merge_scores([a] + ([b] if b is not None else [])).select(sigma, spread)
        rows.append(ConvergenceRow(n_half=a.n_samples, n_b=b.n_samples if b else 0, overlap=sa.overlap(sb),
                                   iou=sa.iou(sb), n_a=len(sa), n_b_neurons=len(sb),
                                   overlap_with_final=both.overlap(final)))
    ha = merge_scores([parts[k] for k in a_keys])
    hb = merge_scores([parts[k] for k in b_keys]) if b_keys else None
    half_scores = torch.stack([ha.scores, hb.scores if hb is not None and hb.n_samples else torch.zeros_like(ha.scores)])
    if config is None:
        ig = IGConfig.from_dict(full.config) if full.config else IGConfig(method=full.method, steps=full.steps)
        config = CNLConfig(ig=ig, sigma=sigma, spread=spread, max_answer_tokens=full.max_answer_tokens)
    else:
        config = config.replace(sigma=sigma, spread=spread)
    report = data.summary() if data is not None else {"used": full.n_seen, "requested": None}
    return CNLLocation(
        scores=full.scores, half_scores=half_scores, neurons=final.neurons, sigma=sigma, spread=spread,
        split_overlap=rows[-1].overlap if rows else 0.0, split_iou=rows[-1].iou if rows else 0.0,
        convergence=tuple(rows), n_samples=full.n_samples, n_tokens=full.n_tokens, n_skipped=full.n_skipped,
        task=full.task, model_name=full.model_name, method=full.method, steps=full.steps,
        max_answer_tokens=full.max_answer_tokens, seconds=full.seconds, skipped=dict(full.skipped),
        config=config.to_dict(), data=report,
    )


def cnl_locate(
    model: Model,
    task: str,
    samples: Sequence[Sample],
    *,
    config: CNLConfig | None = None,
    run: RunControl | None = None,
    on_sample: Callable[[int, Sample], None] | None = None,
    **overrides: Any,
) -> CNLLocation:
    """Locate a task's commonality neurons (CNL eq. 7 + σ-mask) with split-half stability.

    Args:
        model: The model.
        task: Task name (recorded).
        samples: The dataset (:func:`tlcap.data.tasks.load_task`; its ``.report`` is recorded).
        config: A :class:`CNLConfig`.
        run: Checkpoints (resumable), ``shard`` / ``distributed`` and progress bars
            (:class:`~tlcap.runtime.run_control.RunControl`), passed to :func:`score_parts`.
        on_sample: Called before each sample is scored (:func:`score_dataset`).
        **overrides: :class:`CNLConfig` fields (``sigma=6``) or :class:`IGConfig` fields
            (``method="joint"``, ``steps=10``).

    Returns:
        A :class:`CNLLocation` with provenance.

    Example:
        >>> from tlcap.data import load_task
        >>> loc = cnl_locate(model, "emotion", load_task("emotion", split="train", n=4), sigma=3, method="joint",
        ...                  steps=2, run=RunControl(progress=False))
        >>> round(loc.split_overlap, 3), round(loc.neuron_ratio, 4), len(loc.reselect(6))
        (0.095, 0.0215, 1)
    """
    cfg = CNLConfig.resolve(config, **overrides)
    t0 = time.perf_counter()
    parts = score_parts(model, samples, config=cfg, task=task, run=run, on_sample=on_sample)
    loc = finalize(parts, cfg.sigma, cfg.spread, config=cfg, data=DataReport.of(samples, task))
    loc = dataclasses.replace(loc, meta={"wall_seconds": time.perf_counter() - t0, "seed": cfg.seed})
    return loc.with_provenance(Provenance.collect(model, cfg, cfg.seed))


__all__ = [
    "CNLLocation", "ConvergenceRow", "Parts", "cnl_locate", "score_parts", "merge_parts", "finalize", "save_parts",
    "load_parts", "split_halves", "ladder",
]
