"""CNL experiments (CNL paper §5): locate with split-half stability and convergence, erase,
enhance, cross-dataset.

Locate. The dataset is split into two random halves A and B, and each half into chunks whose
cumulative sizes form the convergence ladder. Every chunk is scored as a separate streamed run
(:func:`tlcap.attribution.dataset.score_dataset`, exact integer sums); since sums add exactly,
the whole-data scores are the merge of all chunks — the split-half and convergence analyses cost
nothing beyond scoring the data once. Sharding (``shard="i/n"``) applies inside every chunk, so
``n`` partial runs merged with :func:`merge_parts` give bit-identical results to one run.

- split overlap / IoU: located(A) vs located(B) at full halves (CNL: 96.4 % / 93.1 %).
- convergence: the same at each ladder point, plus the overlap of located(A_k ∪ B_k) with the
  final set.

Example:
    >>> loc = cnl_locate(model, "emotion", load_task("emotion", d, "train", n=200), sigma=3)
    >>> loc.split_overlap, loc.neuron_ratio
    >>> er = erase_effect(model, "emotion", load_task("emotion", d, "test", n=200), loc.neuron_set())
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd
import plotly.graph_objects as go
import torch
from torch import Tensor

from tlcap.attribution.dataset import DatasetScores, merge_scores, score_dataset
from tlcap.data.tasks import Sample
from tlcap.errors import EmptyDatasetError, TlcapError
from tlcap.intervene.finetune import masked_finetune
from tlcap.intervene.weights import erase_neurons
from tlcap.locate.selection import sigma_mask
from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.results import Result
from tlcap.viz.heatmaps import located_heatmap

Parts = dict[str, DatasetScores]


# --------------------------------------------------------------------------- locate
def split_halves(samples: Sequence[Sample], seed: int = 0) -> tuple[list[Sample], list[Sample]]:
    """Two random halves (seeded); with an odd count the first half has one more."""
    idx = list(range(len(samples)))
    random.Random(seed).shuffle(idx)
    h = (len(idx) + 1) // 2
    return [samples[i] for i in sorted(idx[:h])], [samples[i] for i in sorted(idx[h:])]


def ladder(n_half: int, points: int = 4) -> list[int]:
    """Cumulative half sizes for the convergence curve: geometric, ending at ``n_half``."""
    if n_half < 1:
        return []
    ks = sorted({max(1, round(n_half / 2**j)) for j in range(points)})
    return ks


def score_parts(
    model: Model,
    samples: Sequence[Sample],
    *,
    task: str = "",
    seed: int = 0,
    convergence_points: int = 4,
    checkpoint_dir: str | Path | None = None,
    shard: str | tuple[int, int] | None = None,
    distributed: bool = False,
    progress: bool = True,
    **score_kw,
) -> Parts:
    """Score every chunk of both halves (keys ``A0, A1, …, B0, …``); see module docstring."""
    if len(samples) < 2:
        raise EmptyDatasetError("CNL split-half needs at least 2 samples")
    halves = split_halves(samples, seed)
    parts: Parts = {}
    for name, half in zip("AB", halves):
        ks = ladder(len(half), convergence_points)
        lo = 0
        for j, hi in enumerate(ks):
            key = f"{name}{j}"
            ck = Path(checkpoint_dir) / key if checkpoint_dir is not None else None
            parts[key] = score_dataset(
                model, half[lo:hi], task=task, checkpoint_dir=ck, shard=shard, distributed=distributed,
                progress=progress, desc=f"CNL {task} half {name} chunk {j + 1}/{len(ks)}", **score_kw,
            )
            lo = hi
    return parts


def merge_parts(runs: Sequence[Parts]) -> Parts:
    """Merge the parts of several shard runs key by key (exact)."""
    keys = sorted(runs[0])
    for r in runs[1:]:
        if sorted(r) != keys:
            raise TlcapError("the shard runs have different chunk layouts; run them with the same --n, --seed and ladder")
    return {k: merge_scores([r[k] for r in runs]) for k in keys}


def save_parts(parts: Parts, path: str | Path) -> Path:
    path = Path(path)
    for k, v in parts.items():
        v.save(path / k)
    return path


def load_parts(path: str | Path) -> Parts:
    path = Path(path)
    keys = sorted(p.name for p in path.iterdir() if (p / "result.json").exists()) if path.is_dir() else []
    if not keys:
        raise TlcapError(f"no partial CNL scores under {path}; run `tlcap cnl locate --shard i/n` first")
    return {k: DatasetScores.load(path / k) for k in keys}


@dataclass(frozen=True)
class CNLLocation(Result):
    """Neurons located on a dataset by CNL, with split-half stability and convergence.

    Attributes:
        scores: ``[n_layers, d_mlp]`` score(w) on the whole dataset (float64).
        half_scores: ``[2, n_layers, d_mlp]`` scores on the halves A and B.
        neurons: Located neurons ``(layer, index)`` (σ-mask on ``scores``).
        convergence: Rows ``{n_half, overlap, iou, n_a, n_b, overlap_with_final}``.
    """

    scores: Tensor
    half_scores: Tensor
    neurons: tuple[tuple[int, int], ...]
    sigma: float = 3.0
    spread: str = "std"
    split_overlap: float = 0.0
    split_iou: float = 0.0
    convergence: tuple[dict, ...] = ()
    n_samples: int = 0
    n_tokens: int = 0
    n_skipped: int = 0
    task: str = ""
    model_name: str = ""
    method: str = "ig"
    steps: int = 20
    max_answer_tokens: int = 8
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.scores.shape[0]), int(self.scores.shape[1]))

    def neuron_set(self) -> NeuronSet:
        return NeuronSet(self.neurons, self.shape)

    @property
    def n_neurons(self) -> int:
        return len(self.neurons)

    @property
    def neuron_ratio(self) -> float:
        return self.neuron_set().ratio()

    def reselect(self, sigma: float, spread: Literal["std", "var"] = "std") -> NeuronSet:
        return sigma_mask(self.scores, sigma, spread)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.convergence))

    def summary(self) -> dict:
        return {
            "task": self.task, "model": self.model_name, "method": self.method, "steps": self.steps,
            "max_answer_tokens": self.max_answer_tokens, "sigma": self.sigma, "spread": self.spread,
            "n_samples": self.n_samples, "n_tokens": self.n_tokens, "n_skipped": self.n_skipped,
            "n_neurons": self.n_neurons, "neuron_ratio": self.neuron_ratio, "split_overlap": self.split_overlap,
            "split_iou": self.split_iou, "convergence": list(self.convergence),
            "neurons_per_layer": {str(l): len(j) for l, j in sorted(self.neuron_set().by_layer().items())},
            "neurons": self.neuron_set().to_list(), "seconds": self.seconds,
        }

    def located_figure(self) -> go.Figure:
        """Located neurons on a layer × neuron canvas (CNL Fig. 3 style)."""
        return located_heatmap(
            {self.task or "located": self.neuron_set()},
            title=f"CNL located neurons: {self.task} (σ={self.sigma:g} {self.spread}, {self.n_samples} samples, "
            f"{self.n_neurons} neurons = {100 * self.neuron_ratio:.3f} %)",
        )

    def halves(self) -> tuple[NeuronSet, NeuronSet]:
        """Neurons located on half A and on half B."""
        return (sigma_mask(self.half_scores[0], self.sigma, self.spread),  # type: ignore[arg-type]
                sigma_mask(self.half_scores[1], self.sigma, self.spread))  # type: ignore[arg-type]

    def convergence_figure(self) -> go.Figure:
        df = self.to_frame()
        fig = go.Figure()
        if len(df):
            fig.add_trace(go.Scatter(x=df["n_half"], y=df["overlap"], mode="lines+markers", name="split-half overlap"))
            fig.add_trace(go.Scatter(x=df["n_half"], y=df["iou"], mode="lines+markers", name="split-half IoU"))
            fig.add_trace(go.Scatter(x=df["n_half"], y=df["overlap_with_final"], mode="lines+markers", name="overlap with final set"))
        fig.update_layout(title=f"CNL convergence: {self.task}", xaxis_title="samples per half", yaxis_title="overlap",
                          yaxis=dict(range=[0, 1.02]), template="plotly_white", width=800, height=480)
        return fig

    def heatmap(self):  # noqa: ANN201
        from tlcap.viz.heatmaps import neuron_heatmap

        return neuron_heatmap(self.scores.float(), highlight=self.neuron_set(), title=f"CNL scores: {self.task}")


def finalize(parts: Parts, sigma: float = 3.0, spread: Literal["std", "var"] = "std") -> CNLLocation:
    """Turn merged chunk sums into a :class:`CNLLocation` (selection, split-half, convergence)."""
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
        rows.append({"n_half": a.n_samples, "n_b": b.n_samples if b else 0, "overlap": sa.overlap(sb), "iou": sa.iou(sb),
                     "n_a": len(sa), "n_b_neurons": len(sb), "overlap_with_final": both.overlap(final)})
    ha = merge_scores([parts[k] for k in a_keys])
    hb = merge_scores([parts[k] for k in b_keys]) if b_keys else None
    half_scores = torch.stack([ha.scores, hb.scores if hb is not None and hb.n_samples else torch.zeros_like(ha.scores)])
    last = rows[-1] if rows else {"overlap": 0.0, "iou": 0.0}
    return CNLLocation(
        scores=full.scores, half_scores=half_scores, neurons=final.neurons, sigma=sigma, spread=spread,
        split_overlap=last["overlap"], split_iou=last["iou"], convergence=tuple(rows), n_samples=full.n_samples,
        n_tokens=full.n_tokens, n_skipped=full.n_skipped, task=full.task, model_name=full.model_name, method=full.method,
        steps=full.steps, max_answer_tokens=full.max_answer_tokens, seconds=full.seconds,
    )


def cnl_locate(
    model: Model,
    task: str,
    samples: Sequence[Sample],
    *,
    sigma: float = 3.0,
    spread: Literal["std", "var"] = "std",
    seed: int = 0,
    convergence_points: int = 4,
    checkpoint_dir: str | Path | None = None,
    progress: bool = True,
    **score_kw,
) -> CNLLocation:
    """Locate a task's commonality neurons (CNL eq. 7 + σ-mask) with split-half stability.

    ``score_kw`` go to :func:`score_dataset` (``method``, ``steps``, ``layers``,
    ``max_answer_tokens``, ``checkpoint_every``, ``batch_rows``, ``distributed``...).
    """
    t0 = time.perf_counter()
    parts = score_parts(model, samples, task=task, seed=seed, convergence_points=convergence_points,
                        checkpoint_dir=checkpoint_dir, progress=progress, **score_kw)
    loc = finalize(parts, sigma, spread)
    return CNLLocation(**{**loc.__dict__, "meta": {"wall_seconds": time.perf_counter() - t0, "seed": seed}})


# --------------------------------------------------------------------------- erase
@dataclass(frozen=True)
class EraseResult(Result):
    """Accuracy with located neurons erased vs as many random neurons (several draws)."""

    task: str
    base_accuracy: float
    located_accuracy: float
    random_accuracy: float
    random_accuracies: tuple[float, ...] = ()
    n_neurons: int = 0
    n_eval: int = 0
    metric: str = ""
    source: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def located_delta(self) -> float:
        return self.located_accuracy - self.base_accuracy

    @property
    def random_delta(self) -> float:
        return self.random_accuracy - self.base_accuracy

    def summary(self) -> dict:
        return {
            "task": self.task, "source": self.source, "metric": self.metric, "n_eval": self.n_eval, "n_neurons": self.n_neurons,
            "base_accuracy": self.base_accuracy, "located_accuracy": self.located_accuracy,
            "random_accuracy": self.random_accuracy, "random_accuracies": list(self.random_accuracies),
            "located_delta": self.located_delta, "random_delta": self.random_delta,
        }

    def to_frame(self) -> pd.DataFrame:
        rows = [("base", self.base_accuracy), ("located erased", self.located_accuracy)]
        rows += [(f"random erased #{i}", a) for i, a in enumerate(self.random_accuracies)]
        return pd.DataFrame(rows, columns=["condition", "accuracy"])

    def figure(self) -> go.Figure:
        sd = pd.Series(self.random_accuracies).std() if len(self.random_accuracies) > 1 else 0.0
        fig = go.Figure(go.Bar(
            x=["base", "located erased", "random erased (mean)"],
            y=[self.base_accuracy, self.located_accuracy, self.random_accuracy],
            error_y=dict(type="data", array=[0, 0, float(sd)]),
        ))
        fig.update_layout(title=f"CNL erase: {self.source or self.task} neurons ({self.n_neurons}) → {self.task} ({self.metric})",
                          yaxis_title="accuracy", template="plotly_white", width=700, height=450)
        return fig


def erase_effect(
    model: Model,
    task: str,
    samples: Sequence[Sample],
    neurons: NeuronSet,
    *,
    n_random: int = 3,
    seed: int = 0,
    base_accuracy: float | None = None,
    source: str = "",
    progress: bool = False,
) -> EraseResult:
    """Zero the neurons' down-projection rows; compare accuracy with ``n_random`` random draws
    of the same count per layer (:meth:`NeuronSet.random_like`). Weights are restored exactly."""
    base = task_accuracy(model, task, samples, progress=progress)
    with erase_neurons(model, neurons):
        loc = task_accuracy(model, task, samples, progress=progress)
    rnd = []
    for k in range(n_random):
        with erase_neurons(model, neurons.random_like(seed=seed + k)):
            rnd.append(task_accuracy(model, task, samples, progress=progress).accuracy)
    return EraseResult(
        task=task, base_accuracy=base.accuracy if base_accuracy is None else base_accuracy, located_accuracy=loc.accuracy,
        random_accuracy=sum(rnd) / len(rnd) if rnd else float("nan"), random_accuracies=tuple(rnd),
        n_neurons=len(neurons), n_eval=len(samples), metric=base.metric, source=source or task,
    )


# --------------------------------------------------------------------------- enhance
@dataclass(frozen=True)
class EnhanceResult(Result):
    """Held-out accuracy after masked fine-tuning epochs, per mode (located / random / except)."""

    task: str
    base_accuracy: float
    rows: tuple[dict, ...] = ()
    n_neurons: int = 0
    n_train: int = 0
    n_eval: int = 0
    lr: float = 1e-5
    metric: str = ""
    source: str = ""
    meta: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def table(self) -> pd.DataFrame:
        df = self.to_frame()
        return df.pivot(index="mode", columns="epoch", values="accuracy") if len(df) else df

    def summary(self) -> dict:
        return {"task": self.task, "source": self.source, "metric": self.metric, "base_accuracy": self.base_accuracy,
                "n_neurons": self.n_neurons, "n_train": self.n_train, "n_eval": self.n_eval, "lr": self.lr,
                "rows": list(self.rows),
                "accuracy": {m: {str(r["epoch"]): r["accuracy"] for r in self.rows if r["mode"] == m} for m in
                             dict.fromkeys(r["mode"] for r in self.rows)}}

    def figure(self) -> go.Figure:
        df = self.to_frame()
        fig = go.Figure()
        for mode in dict.fromkeys(df["mode"]) if len(df) else []:
            d = df[df["mode"] == mode]
            fig.add_trace(go.Scatter(x=[0, *d["epoch"]], y=[self.base_accuracy, *d["accuracy"]], mode="lines+markers", name=mode))
        fig.update_layout(title=f"CNL enhance: fine-tune {self.source or self.task} neurons → {self.task} (lr {self.lr:g})",
                          xaxis_title="epoch", yaxis_title=f"accuracy ({self.metric})", template="plotly_white", width=800, height=480)
        return fig


def enhance_effect(
    model: Model,
    task: str,
    train: Sequence[Sample],
    test: Sequence[Sample],
    neurons: NeuronSet,
    *,
    epochs: int = 10,
    eval_epochs: Sequence[int] = (1, 5, 10),
    lr: float = 1e-5,
    modes: Sequence[str] = ("located", "random", "except"),
    seed: int = 0,
    max_answer_tokens: int | None = 16,
    source: str = "",
    progress: bool = True,
) -> EnhanceResult:
    """Fine-tune located vs random (same count per layer) vs all-but-located neurons; held-out
    accuracy after the ``eval_epochs``. The model is restored exactly after each mode."""
    base = task_accuracy(model, task, test)
    rows: list[dict] = []
    for mode in modes:
        if mode == "located":
            ns, m = neurons, "located"
        elif mode == "random":
            ns, m = neurons.random_like(seed=seed), "located"
        elif mode == "except":
            ns, m = neurons, "except"
        else:
            raise TlcapError(f"unknown enhance mode {mode!r}; use located, random or except")

        def evaluate(epoch: int, mode: str = mode) -> None:
            if epoch in eval_epochs:
                rows.append({"mode": mode, "epoch": epoch, "accuracy": task_accuracy(model, task, test).accuracy})

        edit = masked_finetune(model, train, ns, mode=m, epochs=epochs, lr=lr, seed=seed, on_epoch=evaluate,
                               max_answer_tokens=max_answer_tokens, progress=progress)
        edit.undo()
    return EnhanceResult(task=task, base_accuracy=base.accuracy, rows=tuple(rows), n_neurons=len(neurons), n_train=len(train),
                         n_eval=len(test), lr=lr, metric=base.metric, source=source or task)


# --------------------------------------------------------------------------- cross-dataset
@dataclass(frozen=True)
class CrossResult(Result):
    """Cross-dataset matrices: rows = neurons of dataset A, columns = evaluated dataset B.

    Attributes:
        overlap / iou: ``[k, k]`` between the datasets' neuron sets.
        erase_delta: ``[k, k]`` accuracy change on B after erasing A's neurons.
        random_delta: ``[k, k]`` the same for random neurons of A's count (mean of draws).
        enhance_delta: ``[k, k]`` accuracy change on B after fine-tuning A's neurons on B's
            training data (empty if not run).
    """

    names: tuple[str, ...]
    overlap: Tensor
    iou: Tensor
    erase_delta: Tensor
    random_delta: Tensor
    enhance_delta: Tensor
    base_accuracy: tuple[float, ...] = ()
    n_neurons: tuple[int, ...] = ()
    meta: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for i, a in enumerate(self.names):
            for j, b in enumerate(self.names):
                r = {"neurons_of": a, "evaluated_on": b, "overlap": float(self.overlap[i, j]), "iou": float(self.iou[i, j]),
                     "erase_delta": float(self.erase_delta[i, j]), "random_delta": float(self.random_delta[i, j])}
                if self.enhance_delta.numel():
                    r["enhance_delta"] = float(self.enhance_delta[i, j])
                rows.append(r)
        return pd.DataFrame(rows)

    def matrix_figure(self, which: str = "overlap") -> go.Figure:
        z = getattr(self, which).float().numpy()
        fig = go.Figure(go.Heatmap(z=z, x=list(self.names), y=list(self.names), colorscale="RdBu_r" if "delta" in which else "Blues",
                                   zmid=0 if "delta" in which else None, text=[[f"{v:.3f}" for v in row] for row in z],
                                   texttemplate="%{text}", colorbar=dict(title=which)))
        ylab = "neurons of" if which != "overlap" and which != "iou" else "dataset"
        fig.update_layout(title=f"CNL cross-dataset: {which}", xaxis_title="evaluated on" if ylab == "neurons of" else "dataset",
                          yaxis_title=ylab, template="plotly_white", width=620, height=540, yaxis=dict(autorange="reversed"))
        return fig


def cross_dataset(
    model: Model,
    located: dict[str, NeuronSet],
    eval_sets: dict[str, Sequence[Sample]],
    *,
    n_random: int = 3,
    seed: int = 0,
    train_sets: dict[str, Sequence[Sample]] | None = None,
    epochs: int = 1,
    lr: float = 1e-5,
    progress: bool = False,
) -> CrossResult:
    """Overlap matrix, and erase (and, with ``train_sets``, enhance) effects of every dataset's
    neurons on every dataset (tasks named by the keys)."""
    names = tuple(located)
    k = len(names)
    ov, io = torch.zeros(k, k), torch.zeros(k, k)
    ed, rd = torch.zeros(k, k), torch.zeros(k, k)
    en = torch.zeros(k, k) if train_sets else torch.zeros(0)
    base = {b: task_accuracy(model, b, eval_sets[b]).accuracy for b in names}
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            ov[i, j] = located[a].overlap(located[b])
            io[i, j] = located[a].iou(located[b])
            er = erase_effect(model, b, eval_sets[b], located[a], n_random=n_random, seed=seed, base_accuracy=base[b],
                              source=a, progress=progress)
            ed[i, j], rd[i, j] = er.located_delta, er.random_delta
            if train_sets:
                edit = masked_finetune(model, train_sets[b], located[a], epochs=epochs, lr=lr, seed=seed, progress=progress)
                en[i, j] = task_accuracy(model, b, eval_sets[b]).accuracy - base[b]
                edit.undo()
    return CrossResult(names=names, overlap=ov, iou=io, erase_delta=ed, random_delta=rd, enhance_delta=en,
                       base_accuracy=tuple(base[b] for b in names), n_neurons=tuple(len(located[a]) for a in names))


def located_sets_figure(located: dict[str, NeuronSet], title: str = "CNL located neurons per dataset") -> go.Figure:
    """CNL Fig. 3: the located neurons of every dataset on one layer × neuron canvas."""
    return located_heatmap(located, title=title)


__all__ = [
    "CNLLocation", "EraseResult", "EnhanceResult", "CrossResult", "cnl_locate", "score_parts", "merge_parts", "finalize",
    "save_parts", "load_parts", "split_halves", "ladder", "erase_effect", "enhance_effect", "cross_dataset",
    "located_sets_figure",
]
