"""Streamed dataset-level neuron scores (CNL eq. 7): running sums, checkpoints, shards, torchrun.

``score(w) = mean over samples of the mean over answer tokens of IG_w`` (teacher forcing: the
m-th answer token is predicted from ``x ⊕ y_{<m}``; each token's IG scales only the neuron at
the position that predicts it, so :func:`integrated_gradients` reuses the prefix's keys/values
per answer token).

Design:
- **Memory is flat.** Only running sums (one ``[n_layers, d_mlp]`` tensor) and counters are
  kept, whatever the number of samples; per-sample activations are dropped at once.
- **Exact merges.** Each sample's score tensor (float32) is added to the running sum as
  two-word fixed-point integers (:func:`to_fixed`: quantum 2^-62 ≈ 2e-19, int64 words).
  Integer addition is associative, so shard sums, torchrun ``all_reduce`` sums and resumed
  sums are *bit-identical* to one single-process run, whatever the order; against a plain
  float64 mean the difference is ~1e-19 per sample (far below float32 resolution of the scores).
- **Checkpoints** (``checkpoint_dir``): every ``checkpoint_every`` samples the sums and
  counters are written as safetensors + JSON (never pickle), atomically. A rerun with the same
  arguments resumes after the last finished sample; a checkpoint made from other samples or
  other settings is refused with a clear message.
- **Shards** (``shard=(i, n)``): shard i takes the samples with position ``% n == i``;
  :func:`merge_scores` adds the parts. **torch.distributed** (``distributed=True`` under
  ``torchrun``, gloo on CPU): each rank takes its shard and the sums are ``all_reduce``-d, so
  every rank returns the merged result.
- **Answer truncation**: answers are cut to ``max_answer_tokens`` (default 8) tokens. GSM8K
  solutions run to ~100 tokens; IG over all of them is what the GPU path is for. The first
  tokens of the solution already carry the math (the first calculation step).
- **Cost**: ``method="ig"`` (exact per-layer IG, S = 20) costs ~(S+1)·n_layers rows per answer
  token (~2.5 s per token for all 30 SmolLM2 layers on a laptop CPU). ``method="joint"``
  (all layers scaled together, S+1 rows) and ``method="grad_x_act"`` (one backward) are
  cheaper estimators, labelled as such in the result; ``layers=`` restricts the layers.

Example:
    >>> samples = load_task("emotion", data_dir, "train", n=200)
    >>> ds = score_dataset(model, samples, checkpoint_dir="runs/emo_ckpt", checkpoint_every=25)
    >>> neurons = ds.select(sigma=3)
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd
import torch
from jaxtyping import Float, Int64
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.ig import Method, Rule, integrated_gradients
from tlcap.data.tasks import Sample, encode_sample
from tlcap.errors import (
    CheckpointMismatchError,
    EmptyDatasetError,
    PromptTooLongError,
    TargetTokenizationError,
    TlcapError,
)
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.results import Result

HI_BITS = 20
LO_BITS = 42
FIXED_POINT_BITS = HI_BITS + LO_BITS
CHECKPOINT_VERSION = 1


def to_fixed(x: Float[Tensor, "layer d_mlp"]) -> Int64[Tensor, "2 layer d_mlp"]:
    """Two-word fixed point of ``x`` (quantum 2^-62), exactly summable as integers.

    ``hi = floor(x · 2^20)`` and ``lo = round(frac · 2^42)``, so ``x ≈ hi/2^20 + lo/2^62``.
    Integer sums of ``hi`` and ``lo`` do not overflow for ~2 million samples of |x| < 2^40.
    """
    y = x.double() * float(2**HI_BITS)
    if not torch.isfinite(y).all() or y.abs().max() > 2**52:
        raise TlcapError("an attribution score is not finite or too large for fixed-point accumulation")
    hi = torch.floor(y)
    lo = ((y - hi) * float(2**LO_BITS)).round()
    return torch.stack([hi, lo]).to(torch.int64)


def from_fixed(s: Int64[Tensor, "2 layer d_mlp"]) -> Float[Tensor, "layer d_mlp"]:
    """The float64 value of summed :func:`to_fixed` words."""
    return s[0].double() / float(2**HI_BITS) + s[1].double() / float(2**FIXED_POINT_BITS)


def parse_shard(shard: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"i/n"`` → ``(i, n)`` with 0 ≤ i < n."""
    if shard is None:
        return None
    if isinstance(shard, str):
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise TlcapError(f"--shard must look like i/n (e.g. 0/4), got {shard!r}") from None
    else:
        i, n = shard
    if not (n >= 1 and 0 <= i < n):
        raise TlcapError(f"shard {i}/{n} is invalid: need 0 <= i < n")
    return (int(i), int(n))


@dataclass(frozen=True)
class DatasetScores(Result):
    """Summed neuron scores over a dataset (or one shard of it).

    Attributes:
        sums: ``[2, n_layers, d_mlp]`` int64 two-word fixed-point sums of per-sample scores
            (:func:`to_fixed`); :attr:`scores` is their mean as float64.
        n_samples: Samples summed (scored samples; skipped ones are counted apart).
        n_tokens: Answer tokens scored.
        n_skipped: Samples skipped (prompt too long, empty answer).
        n_seen: Samples of this shard processed (scored + skipped): the resume position.
        prob_sum: Sum over samples of the mean clean probability of their answer tokens.
        shard: ``(i, n)`` or ``(0, 1)`` for a whole run; a merge has ``(-1, n)``.
        fingerprint: Hash of the samples (and settings) the sums belong to.
    """

    sums: Tensor
    n_samples: int = 0
    n_tokens: int = 0
    n_skipped: int = 0
    n_seen: int = 0
    prob_sum: float = 0.0
    model_name: str = ""
    task: str = ""
    method: str = "ig"
    steps: int = 20
    rule: str = "midpoint"
    layers: tuple[int, ...] = ()
    max_answer_tokens: int = 8
    shard: tuple[int, int] = (0, 1)
    fingerprint: str = ""
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.sums.shape[1]), int(self.sums.shape[2]))

    @property
    def scores(self) -> Float[Tensor, "layer d_mlp"]:
        """score(w): mean over samples of the per-sample mean-over-answer-tokens IG (float64)."""
        if self.n_samples == 0:
            raise EmptyDatasetError("no samples were scored; nothing to average")
        return from_fixed(self.sums) / self.n_samples

    @property
    def mean_prob(self) -> float:
        return self.prob_sum / max(self.n_samples, 1)

    def select(self, sigma: float = 3.0, spread: Literal["std", "var"] = "std") -> NeuronSet:
        """CNL σ-mask ``|score − mean| > σ · spread`` (:func:`tlcap.locate.selection.sigma_mask`)."""
        from tlcap.locate.selection import sigma_mask

        return sigma_mask(self.scores, sigma, spread)

    def to_frame(self, top: int | None = 50) -> pd.DataFrame:
        """Neurons sorted by |score| (the σ-mask is two-sided)."""
        s = self.scores.float()
        flat = s.flatten()
        order = flat.abs().argsort(descending=True)
        if top is not None:
            order = order[:top]
        d = s.shape[1]
        return pd.DataFrame({"layer": (order // d).numpy(), "neuron": (order % d).numpy(), "score": flat[order].numpy()})

    def heatmap(self, highlight: NeuronSet | None = None, **kwargs):  # noqa: ANN201 - plotly figure
        from tlcap.viz.heatmaps import neuron_heatmap

        kwargs.setdefault("title", f"CNL scores: {self.task} ({self.n_samples} samples, {self.method})")
        return neuron_heatmap(self.scores.float(), highlight=highlight, **kwargs)


def merge_scores(parts: Sequence[DatasetScores]) -> DatasetScores:
    """Add shard (or chunk) partial sums; exact (integer sums), independent of order."""
    if not parts:
        raise EmptyDatasetError("no partial scores to merge")
    first = parts[0]
    for p in parts[1:]:
        for attr in ("shape", "method", "steps", "rule", "layers", "max_answer_tokens", "model_name"):
            if getattr(p, attr) != getattr(first, attr):
                raise CheckpointMismatchError(
                    f"cannot merge partial scores with different {attr}: {getattr(first, attr)!r} vs {getattr(p, attr)!r}"
                )
    sums = torch.zeros_like(first.sums)
    for p in parts:
        sums += p.sums
    ns = sorted({p.shard[1] for p in parts})
    return DatasetScores(
        sums=sums,
        n_samples=sum(p.n_samples for p in parts),
        n_tokens=sum(p.n_tokens for p in parts),
        n_skipped=sum(p.n_skipped for p in parts),
        n_seen=sum(p.n_seen for p in parts),
        prob_sum=sum(p.prob_sum for p in parts),
        model_name=first.model_name,
        task=first.task,
        method=first.method,
        steps=first.steps,
        rule=first.rule,
        layers=first.layers,
        max_answer_tokens=first.max_answer_tokens,
        shard=(-1, ns[0] if len(ns) == 1 else 0),
        fingerprint=hashlib.sha256("".join(sorted(p.fingerprint for p in parts)).encode()).hexdigest()[:16],
        seconds=sum(p.seconds for p in parts),
        meta={"merged_from": len(parts)},
    )


def _fingerprint(samples: Sequence[Sample], settings: dict) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for s in samples:
        h.update(b"\x00" + s.uid.encode() + b"\x01" + s.prompt.encode() + b"\x02" + s.answer.encode())
    return h.hexdigest()[:16]


def _save_checkpoint(path: Path, state: DatasetScores) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tmp_t, tmp_j = path / "sums.safetensors.tmp", path / "state.json.tmp"
    save_file({"sums": state.sums.contiguous()}, str(tmp_t))
    meta = {k: v for k, v in state.to_dict().items()}
    meta["version"] = CHECKPOINT_VERSION
    tmp_j.write_text(json.dumps(meta, indent=1))
    os.replace(tmp_t, path / "sums.safetensors")
    os.replace(tmp_j, path / "state.json")


def _load_checkpoint(path: Path) -> DatasetScores | None:
    if not (path / "state.json").exists() or not (path / "sums.safetensors").exists():
        return None
    meta = json.loads((path / "state.json").read_text())
    meta.pop("version", None)
    sums = load_file(str(path / "sums.safetensors"))["sums"]
    return DatasetScores._from_fields(meta, {"sums": sums})


def score_dataset(
    model: Model,
    samples: Sequence[Sample],
    *,
    task: str = "",
    layers: Sequence[int] | None = None,
    steps: int = 20,
    rule: Rule = "midpoint",
    method: Method = "ig",
    max_answer_tokens: int = 8,
    batch_rows: int = 128,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 25,
    resume: bool = True,
    shard: str | tuple[int, int] | None = None,
    distributed: bool = False,
    progress: bool = True,
    on_sample: Callable[[int, Sample], None] | None = None,
    desc: str | None = None,
) -> DatasetScores:
    """CNL dataset scores of every MLP neuron, streamed (module docstring).

    Args:
        model: The model.
        samples: The dataset (e.g. :func:`tlcap.data.tasks.load_task`).
        task: Name recorded in the result.
        layers: Layers to attribute (default all); others score 0.
        steps: IG steps S (20, as in the paper).
        rule: Quadrature rule of :func:`integrated_gradients`.
        method: ``"ig"`` (exact) or the cheaper estimators ``"joint"`` / ``"grad_x_act"``.
        max_answer_tokens: Answer tokens scored per sample (the first ones).
        batch_rows: Rows per forward pass in IG (memory knob; results do not depend on it).
        checkpoint_dir: Where to checkpoint (None = no checkpoints).
        checkpoint_every: Samples between checkpoints.
        resume: Continue from a checkpoint in ``checkpoint_dir`` if there is one.
        shard: ``"i/n"`` or ``(i, n)``: score only the samples at positions ``≡ i (mod n)``.
        distributed: Under ``torchrun``: shard by rank and all-reduce the sums (gloo on CPU);
            every rank returns the merged result.
        progress: Show a progress bar.
        on_sample: Called as ``on_sample(position, sample)`` before each sample is scored
            (hook for logging; tests use it to simulate an interruption).
        desc: Progress-bar label (default ``"CNL {task}"``).

    Returns:
        A :class:`DatasetScores`; ``.scores`` is score(w), ``.select(sigma)`` the located set.
    """
    if not samples:
        raise EmptyDatasetError("score_dataset got no samples")
    if checkpoint_every < 1:
        raise TlcapError("checkpoint_every must be >= 1")
    dist = None
    if distributed:
        import torch.distributed as dist  # noqa: PLC0415

        if not dist.is_initialized():
            backend = "gloo" if model.device.type == "cpu" else "nccl"
            dist.init_process_group(backend)
        shard = (dist.get_rank(), dist.get_world_size())
    sh = parse_shard(shard) or (0, 1)
    layer_list = tuple(range(model.n_layers)) if layers is None else tuple(int(l) for l in layers)
    settings = {
        "model": model.name, "method": method, "steps": steps, "rule": rule, "layers": list(layer_list),
        "max_answer_tokens": max_answer_tokens, "shard": list(sh),
    }
    mine = [s for k, s in enumerate(samples) if k % sh[1] == sh[0]]
    fp = _fingerprint(mine, settings)
    state = DatasetScores(
        sums=torch.zeros(2, model.n_layers, model.d_mlp, dtype=torch.int64), model_name=model.name, task=task,
        method=method, steps=steps, rule=rule, layers=layer_list, max_answer_tokens=max_answer_tokens,
        shard=sh, fingerprint=fp,
    )
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt is not None and dist is not None:
        ckpt = ckpt / f"rank{sh[0]}of{sh[1]}"
    if ckpt is not None and resume:
        old = _load_checkpoint(ckpt)
        if old is not None:
            if old.fingerprint != fp:
                raise CheckpointMismatchError(
                    f"the checkpoint in {ckpt} was made with other samples or settings (fingerprint {old.fingerprint} "
                    f"vs {fp}); use another --checkpoint-dir, delete it, or pass resume=False"
                )
            state = old
    sums = state.sums.clone()
    n_samples, n_tokens, n_skipped, n_seen, prob_sum = state.n_samples, state.n_tokens, state.n_skipped, state.n_seen, state.prob_sum
    seconds = state.seconds
    t0 = time.perf_counter()

    def snapshot() -> DatasetScores:
        return DatasetScores(
            sums=sums.clone(), n_samples=n_samples, n_tokens=n_tokens, n_skipped=n_skipped, n_seen=n_seen,
            prob_sum=prob_sum, model_name=model.name, task=task, method=method, steps=steps, rule=rule,
            layers=layer_list, max_answer_tokens=max_answer_tokens, shard=sh, fingerprint=fp,
            seconds=seconds + time.perf_counter() - t0,
        )

    bar = tqdm(total=len(mine), initial=n_seen, desc=(desc or f"CNL {task or 'scores'}") + (f" [{sh[0]}/{sh[1]}]" if sh[1] > 1 else ""),
               disable=not progress, unit="sample")
    for pos in range(n_seen, len(mine)):
        s = mine[pos]
        if on_sample is not None:
            on_sample(pos, s)
        try:
            p_ids, t_ids = encode_sample(model, s, max_answer_tokens)
            if not t_ids:
                raise TargetTokenizationError("empty answer")
            attr = integrated_gradients(
                model, s.prompt, t_ids, layers=layer_list, steps=steps, rule=rule, method=method, batch_rows=batch_rows,
            )
        except (PromptTooLongError, TargetTokenizationError):
            n_skipped += 1
        else:
            sums += to_fixed(attr.scores)
            n_samples += 1
            n_tokens += len(t_ids)
            prob_sum += float(attr.prob_full[:, layer_list[0]].double().mean())
            del attr
        n_seen += 1
        bar.update(1)
        if ckpt is not None and (n_seen % checkpoint_every == 0 or n_seen == len(mine)):
            _save_checkpoint(ckpt, snapshot())
    bar.close()
    result = snapshot()
    if dist is not None:
        packed = torch.tensor([result.n_samples, result.n_tokens, result.n_skipped, result.n_seen], dtype=torch.int64)
        total = result.sums.clone()
        dist.all_reduce(total)
        dist.all_reduce(packed)
        fl = torch.tensor([result.prob_sum, result.seconds], dtype=torch.float64)
        dist.all_reduce(fl)
        result = DatasetScores(
            sums=total, n_samples=int(packed[0]), n_tokens=int(packed[1]), n_skipped=int(packed[2]), n_seen=int(packed[3]),
            prob_sum=float(fl[0]), model_name=model.name, task=task, method=method, steps=steps, rule=rule,
            layers=layer_list, max_answer_tokens=max_answer_tokens, shard=(-1, sh[1]),
            fingerprint=_fingerprint(samples, {**settings, "shard": [0, 1]}), seconds=float(fl[1]),
            meta={"world_size": sh[1]},
        )
    return result


def score_in_memory(model: Model, samples: Sequence[Sample], max_answer_tokens: int = 8, **ig_kwargs) -> Float[Tensor, "layer d_mlp"]:
    """The plain (non-streamed) reference: stack every sample's IG scores and average (float64)."""
    per = []
    for s in samples:
        _, t_ids = encode_sample(model, s, max_answer_tokens)
        per.append(integrated_gradients(model, s.prompt, t_ids, **ig_kwargs).scores.double())
    return torch.stack(per).mean(0)


__all__ = [
    "DatasetScores", "score_dataset", "merge_scores", "score_in_memory", "parse_shard", "CheckpointMismatchError",
    "FIXED_POINT_BITS", "to_fixed", "from_fixed",
]
