"""Streamed dataset-level neuron scores (CNL eq. 7): running sums, checkpoints, shards, torchrun.

``score(w) = mean over samples of the mean over answer tokens of IG_w`` (teacher forcing: the
m-th answer token is predicted from ``x ⊕ y_{<m}``; each token's IG scales only the neuron at
the position that predicts it, so :func:`integrated_gradients` reuses the prefix's keys/values
per answer token).

Design:
- **Memory is flat.** Only running sums (one ``[n_layers, d_mlp]`` tensor) and counters are
  kept, whatever the number of samples; per-sample activations are dropped at once.
- **Exact merges.** Each sample's score tensor (float32) is added to the running sum as
  two-word fixed-point integers (:mod:`tlcap.attribution.fixed_point`, quantum 2^-62). Integer
  addition is associative, so shard sums, torchrun ``all_reduce`` sums and resumed sums are
  *bit-identical* to one single-process run, whatever the order.
- **Every sample is counted once.** Each result carries the ids of the samples it has seen
  (a hash of uid, prompt and answer); :func:`merge_scores` refuses parts that share samples (the
  same shard given twice, overlapping shard layouts).
- **Checkpoints** (``checkpoint_dir``): every ``checkpoint_every`` samples the sums and
  counters are written as one safetensors file, atomically (:mod:`tlcap.attribution.checkpoint`).
  A rerun with the same arguments resumes after the last finished sample; a checkpoint made from
  other samples or settings is refused, a damaged one names the file and ``--no-resume``.
- **Shards** (``shard=(i, n)``): shard i takes the samples with position ``% n == i``;
  **torch.distributed** (``distributed=True`` under ``torchrun``, gloo on CPU): each rank takes
  its shard and the sums are ``all_reduce``-d, so every rank returns the merged result.
- **Skips** are counted by kind: ``too_long`` (prompt + answer beyond the context window) and
  ``empty_answer`` (no answer token).
- **Cost**: ``method="ig"`` (exact per-layer IG, S = 20) costs ~(S+1)·n_layers rows per answer
  token. ``method="joint"`` and ``method="grad_x_act"`` are cheaper estimators, labelled as such.

Example (the paper's run: ``n=200`` samples, ``steps=20``):
    >>> import tempfile
    >>> from tlcap.data.tasks import load_task
    >>> samples = load_task("emotion", split="train", n=4)
    >>> ck = tempfile.mkdtemp()
    >>> ds = score_dataset(model, samples, steps=2, run=RunControl(checkpoint_dir=ck, checkpoint_every=2, progress=False))
    >>> ds.n_samples, ds.n_skipped, tuple(ds.scores.shape)
    (4, 0, (2, 256))
    >>> neurons = ds.select(sigma=3)
    >>> len(neurons)
    12
    >>> parts = [score_dataset(model, samples, steps=2, run=RunControl(shard=(i, 2), progress=False)) for i in range(2)]
    >>> torch.equal(merge_scores(parts).sums, ds.sums)     # shards add up bit for bit
    True
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.batched import fact_tokens
from tlcap.attribution.checkpoint import load_checkpoint, save_checkpoint
from tlcap.attribution.config import IGConfig
from tlcap.attribution.dataset_scores import (
    SKIP_KINDS,
    SPREADS,
    DatasetScores,
    ScoreRow,
    check_disjoint,
    check_sigma,
    merge_scores,
    sample_id,
)
from tlcap.attribution.fixed_point import FIXED_POINT_BITS, from_fixed, to_fixed
from tlcap.attribution.grouped import Unit, UnitsIG, ig_units, ig_units_stream, make_units
from tlcap.attribution.ig import integrated_gradients
from tlcap.attribution.quadrature import quadrature
from tlcap.config import check_int
from tlcap.data.sample import Sample
from tlcap.data.tasks import encode_sample
from tlcap.errors import (
    CheckpointMismatchError,
    EmptyDatasetError,
    InvalidConfigError,
    PromptTooLongError,
    TargetTokenizationError,
)
from tlcap.models.adapter import Model, PaddedPrefix
from tlcap.runtime.batching import auto_batch_rows, ig_row_bytes, run_auto_batched
from tlcap.runtime.run_control import RunControl, parse_shard
from tlcap.runtime.sites import get_site


def _fingerprint(samples: Sequence[Sample], settings: dict) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for s in samples:
        h.update(b"\x00" + s.uid.encode() + b"\x01" + s.prompt.encode() + b"\x02" + s.answer.encode())
    return h.hexdigest()[:16]


def _restore(ckpt: Path, fp: str) -> DatasetScores | None:
    loaded = load_checkpoint(ckpt)
    if loaded is None:
        return None
    tensors, state = loaded
    if state.get("fingerprint") != fp or "sums" not in tensors:
        raise CheckpointMismatchError(
            f"the checkpoint in {ckpt} was made with other samples or settings (fingerprint {state.get('fingerprint')} "
            f"vs {fp}); use another --checkpoint-dir, delete it, or pass --no-resume (resume=False)"
        )
    return DatasetScores._from_fields(state, {"sums": tensors["sums"]})


def score_dataset(
    model: Model,
    samples: Sequence[Sample],
    *,
    config: IGConfig | None = None,
    max_answer_tokens: int = 8,
    task: str = "",
    run: RunControl | None = None,
    on_sample: Callable[[int, Sample], None] | None = None,
    desc: str | None = None,
    **overrides: Any,
) -> DatasetScores:
    """CNL dataset scores of every MLP neuron, streamed (module docstring).

    Args:
        model: The model.
        samples: The dataset (e.g. :func:`tlcap.data.tasks.load_task`).
        config: Attribution settings (:class:`IGConfig`: ``steps`` S = 20 as in the paper,
            ``rule``, ``method``, ``layers``, ``batch_rows``...); others score 0.
        max_answer_tokens: Answer tokens scored per sample (the first ones), ``>= 1``.
        task: Name recorded in the result.
        run: Checkpoints (every 25 samples by default), resuming, ``shard`` (score only the samples
            at positions ``≡ i (mod n)``), ``distributed`` (under ``torchrun``: shard by rank and
            all-reduce the sums, gloo on CPU; every rank returns the merged result) and the progress
            bar (:class:`~tlcap.runtime.run_control.RunControl`; default: none of them, a bar).
        on_sample: Called as ``on_sample(position, sample)`` before each sample is scored
            (hook for logging; tests use it to simulate an interruption).
        desc: Progress-bar label (default ``"CNL {task}"``).
        **overrides: :class:`IGConfig` fields overriding ``config`` (``steps=4``, ``method="joint"``).

    Returns:
        A :class:`DatasetScores`; ``.scores`` is score(w), ``.select(sigma)`` the located set.

    Raises:
        InvalidConfigError: an invalid setting or a layer the model does not have (before any work).
        CheckpointError: a damaged checkpoint (or one of other samples/settings) when resuming.

    Example:
        >>> import tempfile
        >>> from tlcap.data.tasks import load_task
        >>> ck = tempfile.mkdtemp()
        >>> ds = score_dataset(model, load_task("emotion", split="train", n=8), method="joint",
        ...                    run=RunControl(checkpoint_dir=ck, progress=False))
        >>> ds.method, ds.n_samples
        ('joint', 8)
        >>> ds.select(sigma=3).ratio()             # share of all MLP neurons located
        0.017578125
    """
    cfg = IGConfig.resolve(config, **overrides)
    rc = RunControl.resolve(run)
    check_int("max_answer_tokens", max_answer_tokens, min=1)
    checkpoint_every = rc.every(25)
    shard: str | tuple[int, int] | None = rc.shard
    if not samples:
        raise EmptyDatasetError("score_dataset got no samples")
    layer_list = tuple(range(model.n_layers)) if cfg.layers is None else tuple(int(l) for l in cfg.layers)
    if max(layer_list) >= model.n_layers:
        raise InvalidConfigError(f"layers (--layers) must be < {model.n_layers} for {model.name}, got {max(layer_list)}")
    cfg = cfg.replace(layers=layer_list)
    dist = None
    if rc.distributed:
        dist = torch_dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")  # the sums are reduced as CPU tensors (NCCL takes GPU tensors only)
        shard = (dist.get_rank(), dist.get_world_size())
    sh = parse_shard(shard) or (0, 1)
    settings = {
        "model": model.name, "method": cfg.method, "steps": cfg.steps, "rule": cfg.rule, "layers": list(layer_list),
        "site": cfg.site, "max_answer_tokens": max_answer_tokens, "shard": list(sh),
    }
    if cfg.steps == "auto":
        settings.update(tol=cfg.tol, max_steps=cfg.max_steps)
    mine = [s for k, s in enumerate(samples) if k % sh[1] == sh[0]]
    fp = _fingerprint(mine, settings)
    common = dict(model_name=model.name, task=task, method=cfg.method, steps=cfg.steps, rule=cfg.rule, layers=layer_list,
                  max_answer_tokens=max_answer_tokens, config=cfg.to_dict())
    state = DatasetScores(sums=torch.zeros(2, model.n_layers, model.d_mlp, dtype=torch.int64), shard=sh, fingerprint=fp,
                          skipped=dict.fromkeys(SKIP_KINDS, 0), **common)
    ckpt = rc.directory
    if ckpt is not None and dist is not None:
        ckpt = ckpt / f"rank{sh[0]}of{sh[1]}"
    if ckpt is not None and rc.resume:
        state = _restore(ckpt, fp) or state
    sums = state.sums.clone()
    n_samples, n_tokens, n_seen, prob_sum = state.n_samples, state.n_tokens, state.n_seen, state.prob_sum
    skipped = {k: int(state.skipped.get(k, 0)) for k in SKIP_KINDS}
    ids = list(state.sample_ids)
    seconds = state.seconds
    stats = {k: state.meta[k] for k in STAT_KEYS if k in state.meta}
    t0 = time.perf_counter()

    def snapshot() -> DatasetScores:
        return DatasetScores(
            sums=sums.clone(), n_samples=n_samples, n_tokens=n_tokens, n_skipped=sum(skipped.values()), n_seen=n_seen,
            prob_sum=prob_sum, shard=sh, fingerprint=fp, seconds=seconds + time.perf_counter() - t0,
            skipped=dict(skipped), sample_ids=tuple(ids), meta=dict(stats), **common,
        )

    label = (desc or f"CNL {task or 'scores'}") + (f" [{sh[0]}/{sh[1]}]" if sh[1] > 1 else "")
    bar = tqdm(total=len(mine), initial=n_seen, desc=label, disable=not rc.progress, unit="sample")
    grouped = grouped_scoring(cfg)
    for window, outcome in _outcomes(model, mine, n_seen, max_answer_tokens, cfg, layer_list, grouped, on_sample):
        for p, out in zip(window, outcome):
            if isinstance(out, str):
                skipped[out] += 1
            else:
                sums += to_fixed(out.scores)
                n_samples += 1
                n_tokens += out.n_tokens
                prob_sum += out.prob
                for k, v in out.stats.items():
                    stats[k] = stats.get(k, 0) + v
            n_seen += 1
            ids.append(sample_id(mine[p]))
            bar.update(1)
            if ckpt is not None and (n_seen % checkpoint_every == 0 or n_seen == len(mine)):
                snap = snapshot()
                save_checkpoint(ckpt, {"sums": snap.sums}, snap.to_dict())
    bar.close()
    result = snapshot()
    if dist is not None:
        result = _all_reduce(dist, result, samples, settings)
    return result


STAT_KEYS = ("completeness_abs_error", "completeness_delta", "evaluations")
"""Running completeness and cost counters of a scoring run, kept in ``DatasetScores.meta``."""


@dataclass(frozen=True)
class _Scored:
    """One sample's contribution: mean-over-tokens scores, mean clean probability, counters."""

    scores: Tensor
    n_tokens: int
    prob: float
    stats: dict


def all_skipped(model: Model, samples: Sequence[Sample], max_answer_tokens: int) -> str:
    """Why every sample would be skipped (``"3 too long for ..., 1 with an empty answer"``), or ``""`` when one can be
    scored. Tokenizer only: stops at the first sample that fits, so it costs nothing on usable data.

    Args:
        model: The model (its tokenizer and context length).
        samples: The dataset.
        max_answer_tokens: Answer tokens scored per sample.

    Returns:
        The counts of samples too long and with an empty answer, or ``""`` when some sample can be scored.
    """
    too_long = empty = 0
    for s in samples:
        try:
            _, t_ids = encode_sample(model, s, max_answer_tokens)
            if t_ids:
                fact_tokens(model, s.prompt, t_ids)
                return ""
            empty += 1
        except PromptTooLongError:
            too_long += 1
        except TargetTokenizationError:
            empty += 1
    return f"{too_long} too long for the {model.n_ctx}-token context of {model.name}, {empty} with an empty answer"


def grouped_scoring(cfg: IGConfig) -> bool:
    """Whether dataset scoring batches the rows of a window of ``cfg.sample_batch`` samples in one call (exact IG with
    ``sample_batch > 1`` or ``steps="auto"``) rather than running each answer token alone.

    Args:
        cfg: The attribution settings.

    Returns:
        True for windowed (grouped) scoring.
    """
    return cfg.method == "ig" and (cfg.sample_batch > 1 or cfg.steps == "auto")


def _outcomes(model: Model, mine: Sequence[Sample], start: int, max_answer_tokens: int, cfg: IGConfig,
              layer_list: tuple[int, ...], grouped: bool, on_sample: Callable[[int, Sample], None] | None
              ) -> Iterator[tuple[list[int], list[_Scored | str]]]:
    """``(window, outcome per sample)`` for the windows of ``mine`` from ``start`` on, in order.

    Windows are ``sample_batch`` samples (grouped) or one. With ``steps="auto"`` and ``stream_depth > 1`` the
    windows' rounds run through :func:`ig_units_stream` (a window's refinements share batches with the next
    windows' first rounds); otherwise each window is scored alone (:func:`_score_window`).
    """
    size = cfg.sample_batch if grouped else 1

    def windows() -> Iterator[tuple[list[int], list[Sample]]]:
        for s in range(start, len(mine), size):
            window = list(range(s, min(s + size, len(mine))))
            for p in window:
                if on_sample is not None:
                    on_sample(p, mine[p])
            yield window, [mine[p] for p in window]

    if not (grouped and cfg.steps == "auto" and cfg.stream_depth > 1):
        for window, samples in windows():
            yield window, _score_window(model, samples, max_answer_tokens, cfg, layer_list, grouped)
        return
    li = list(layer_list)
    hook_names = [get_site(cfg.site).hook_name(l) for l in li]
    pending: deque = deque()  # every prepared window, in order; those with items wait for their stream result

    def feed() -> Iterator[tuple[list[Unit], PaddedPrefix]]:
        for window, samples in windows():
            out, items = _encode_window(model, samples, max_answer_tokens, cfg, layer_list, grouped)
            units, prefix = make_units(model, items, hook_names, li) if items else ([], None)
            pending.append((window, out, items, units))
            if items:
                yield units, prefix

    for res in ig_units_stream(model, feed(), hook_names, li, cfg, _batch_rows(model, cfg), cfg.stream_depth):
        while not pending[0][2]:  # windows with nothing to score before this one
            window, out, _, _ = pending.popleft()
            yield window, _fill(out, [])
        window, out, items, units = pending.popleft()
        yield window, _fill(out, _scored(model, items, units, res, li))
    for window, out, _, _ in pending:
        yield window, _fill(out, [])


def _batch_rows(model: Model, cfg: IGConfig) -> int | Callable[[int, int], int]:
    """Rows per batch: ``cfg.batch_rows``, or with ``"auto"`` a function of the rows to run and the longest context
    giving the size :func:`auto_batch_rows` picks (a window's, or a stream step's)."""
    if cfg.batch_rows != "auto":
        return int(cfg.batch_rows)
    return lambda rows, longest: auto_batch_rows(ig_row_bytes(model, longest), rows, cfg.max_memory, model.device,
                                                 model=model, kind="ig", context_len=longest)


def _score_window(model: Model, window: Sequence[Sample], max_answer_tokens: int, cfg: IGConfig,
                  layer_list: tuple[int, ...], grouped: bool) -> list[_Scored | str]:
    """Score the samples of a window: each alone, or (``grouped``) all their rows batched together.

    Returns, per sample, a :class:`_Scored` or the skip kind (``too_long``, ``empty_answer``).
    """
    out, items = _encode_window(model, window, max_answer_tokens, cfg, layer_list, grouped)
    return _fill(out, _grouped(model, items, cfg, layer_list) if items else [])


def _fill(out: list[_Scored | str | None], scored: list[_Scored]) -> list[_Scored | str]:
    """``out`` with its ``None`` entries (the scored samples) replaced by ``scored``, in order."""
    it = iter(scored)
    return [next(it) if o is None else o for o in out]


def _encode_window(model: Model, window: Sequence[Sample], max_answer_tokens: int, cfg: IGConfig,
                   layer_list: tuple[int, ...], grouped: bool
                   ) -> tuple[list[_Scored | str | None], list[tuple[list[int], list[int]]]]:
    """Encode a window's samples: per sample its skip kind (``too_long``, ``empty_answer``), its :class:`_Scored`
    (not ``grouped``: scored alone at once) or ``None`` (``grouped``: its ``(prompt ids, answer ids)`` is in the
    returned items, to be scored with the others)."""
    out: list[_Scored | str | None] = []
    items: list[tuple[list[int], list[int]]] = []
    for s in window:
        try:
            _, t_ids = encode_sample(model, s, max_answer_tokens)
            if not t_ids:
                raise TargetTokenizationError("empty answer")
            p_ids, t_ids = fact_tokens(model, s.prompt, t_ids)
            if not grouped:
                attr = integrated_gradients(model, s.prompt, t_ids, config=cfg)
                li = list(layer_list)
                err = (attr.layer_sums[:, li].double() - (attr.prob_full - attr.prob_baseline)[:, li].double()).abs().sum()
                den = (attr.prob_full - attr.prob_baseline)[:, li].double().abs().sum()
                n_rows = len(t_ids) * len(li) * (len(quadrature(int(cfg.steps), cfg.rule)[0]) + 1) if cfg.method == "ig" else 0
                out.append(_Scored(attr.scores, len(t_ids), float(attr.prob_full[:, layer_list[0]].double().mean()),
                                   {"completeness_abs_error": float(err), "completeness_delta": float(den),
                                    "evaluations": n_rows}))
                continue
        except PromptTooLongError:
            out.append("too_long")
            continue
        except TargetTokenizationError:
            out.append("empty_answer")
            continue
        items.append((p_ids, t_ids))
        out.append(None)
    return out, items


def _grouped(model: Model, items: list[tuple[list[int], list[int]]], cfg: IGConfig,
             layer_list: tuple[int, ...]) -> list[_Scored]:
    """Exact IG of several samples' answer tokens in shared batches (:func:`ig_units`)."""
    li = list(layer_list)
    hook_names = [get_site(cfg.site).hook_name(l) for l in li]
    units, prefix = make_units(model, items, hook_names, li)
    sized = _batch_rows(model, cfg)
    if callable(sized):
        m = cfg.max_steps if cfg.steps == "auto" else int(cfg.steps)
        rows = sized(len(units) * len(li) * (m + 1), max(len(p) + len(t) for p, t in items))
        res = run_auto_batched(lambda b: ig_units(model, units, prefix, hook_names, li, cfg, b), rows, model.device)
    else:
        res = ig_units(model, units, prefix, hook_names, li, cfg, sized)
    return _scored(model, items, units, res, li)


def _scored(model: Model, items: list[tuple[list[int], list[int]]], units: Sequence[Unit], res: UnitsIG,
            li: list[int]) -> list[_Scored]:
    """Per sample of ``items``: its mean-over-answer-tokens scores (float64 mean, then float32 on the CPU) and
    counters from its units' :class:`UnitsIG`."""
    p_clean = torch.tensor([u.p_clean for u in units], dtype=torch.float64)
    # reduced on the device the rows ran on (a stream's result), then copied to the host once for every sample
    scores = torch.zeros(len(items), model.n_layers, model.d_mlp, dtype=torch.float64, device=res.attr.device)
    bounds = [0]
    for j, (_, t) in enumerate(items):
        bounds.append(bounds[-1] + len(t))
        scores[j, li] = res.attr[bounds[j]:bounds[-1]].mean(0)
    scores_host, sums = scores.float().cpu(), res.attr.sum(-1).cpu()
    out = []
    for j, (_, t) in enumerate(items):
        sl = slice(bounds[j], bounds[j + 1])
        delta = p_clean[sl, None] - res.p_base[sl]
        err = (sums[sl] - delta).abs().sum()
        out.append(_Scored(scores_host[j], len(t), float(p_clean[sl].float().double().mean()),
                           {"completeness_abs_error": float(err), "completeness_delta": float(delta.abs().sum()),
                            "evaluations": int(res.evaluations[sl].sum())}))
    return out


def _all_reduce(dist: Any, result: DatasetScores, samples: Sequence[Sample], settings: dict) -> DatasetScores:
    """Sum a rank's result over all ranks (every rank returns the merged result)."""
    packed = torch.tensor([result.n_samples, result.n_tokens, result.n_seen, *(result.skipped[k] for k in SKIP_KINDS)],
                          dtype=torch.int64)
    total = result.sums.clone()
    dist.all_reduce(total)
    dist.all_reduce(packed)
    fl = torch.tensor([result.prob_sum, result.seconds], dtype=torch.float64)
    dist.all_reduce(fl)
    skipped = {k: int(packed[3 + j]) for j, k in enumerate(SKIP_KINDS)}
    world = int(result.shard[1])
    return DatasetScores(
        sums=total, n_samples=int(packed[0]), n_tokens=int(packed[1]), n_skipped=sum(skipped.values()),
        n_seen=int(packed[2]), prob_sum=float(fl[0]), model_name=result.model_name, task=result.task,
        method=result.method, steps=result.steps, rule=result.rule, layers=result.layers,
        max_answer_tokens=result.max_answer_tokens, shard=(-1, world),
        fingerprint=_fingerprint(samples, {**settings, "shard": [0, 1]}), seconds=float(fl[1]), skipped=skipped,
        sample_ids=tuple(sample_id(s) for s in samples), config=dict(result.config), meta={"world_size": world},
    )


def score_in_memory(
    model: Model, samples: Sequence[Sample], max_answer_tokens: int = 8, **ig_kwargs: Any
) -> Float[Tensor, "layer d_mlp"]:
    """The plain (non-streamed) reference: stack every sample's IG scores and average (float64).

    Args:
        model: The model.
        samples: The dataset.
        max_answer_tokens: Answer tokens scored per sample (the first ones).
        **ig_kwargs: Passed to :func:`~tlcap.attribution.ig.integrated_gradients` (``steps=``...).

    Returns:
        ``[n_layers, d_mlp]`` mean IG score over the samples (float64).
    """
    per = []
    for s in samples:
        _, t_ids = encode_sample(model, s, max_answer_tokens)
        per.append(integrated_gradients(model, s.prompt, t_ids, **ig_kwargs).scores.double())
    return torch.stack(per).mean(0)


__all__ = [
    "DatasetScores", "ScoreRow", "score_dataset", "merge_scores", "check_disjoint", "score_in_memory",
    "check_sigma", "sample_id", "all_skipped", "CheckpointMismatchError", "FIXED_POINT_BITS", "to_fixed", "from_fixed",
    "SKIP_KINDS", "grouped_scoring",
    "SPREADS",
]
