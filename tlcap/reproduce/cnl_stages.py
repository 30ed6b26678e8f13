"""The CNL paper's stages, wired to :mod:`tlcap.experiments.cnl` and ``tlcap.experiments.cnl_eval``.

=====================  ==========================================  ===================================
stage                  computes (tlcap API)                        feeds
=====================  ==========================================  ===================================
``cnl.locate.<ds>``    CNL scores of ``cnl_groups`` sample groups   Table 1, Fig. 6 (and every stage
                       (:func:`score_dataset`, checkpointed) and    below, at σ = 3 / 6 / 12 by
                       the located set (:func:`finalize`)           re-thresholding the saved scores)
``cnl.erase.<ds>``     :func:`erase_effect` at σ = 3, 6, 12 with    Table 3 (+ the WikiText-2
                       ``n_random`` matched random sets, batched    perplexity control)
                       (per-item scores of base, located and every
                       random set) + perplexity of the located and
                       ``ppl_n_random`` random sets
``cnl.enhance.<ds>``   :func:`enhance_effect` (located /            Table 2
                       ``n_random`` random sets / w/o located)
``cnl.cross``          :func:`cross_dataset` (erase matrix)         Fig. 5 (Fig. 4 from the locates)
``cnl.fidelity`` …     ``tlcap.experiments.cnl_eval`` (issue 11),   fidelity, reliability, Fig. 2,
                       :mod:`tlcap.reproduce.suite_stages`          decoupling, Table 4
=====================  ==========================================  ===================================

The groups of ``cnl.locate.<ds>`` are the two random halves of :func:`split_halves` (as
:func:`cnl_locate` draws them), each cut into ``cnl_groups / 2`` consecutive groups; since the
fixed-point sums add exactly, the located set and the split-half overlap are those of
:func:`cnl_locate` on the same samples, and the groups are the clusters of the bootstrap CI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from tlcap.attribution.config import IGConfig
from tlcap.attribution.dataset import DatasetScores, grouped_scoring, score_dataset
from tlcap.config import Config, check_int, check_nested, check_sequence
from tlcap.data.tasks import encode_sample, get_task, load_task
from tlcap.data.wikitext import load_wikitext
from tlcap.errors import DatasetUnavailableError
from tlcap.experiments.cnl import CNLLocation, cross_dataset, enhance_effect, erase_effect, finalize, split_halves
from tlcap.experiments.cnl.erase import located_accuracy
from tlcap.experiments.cnl.erase_sets import CHUNK_SETS
from tlcap.metrics.accuracy import GEN_ROWS, task_accuracy
from tlcap.metrics.answers import CODE_TOKENS
from tlcap.metrics.set_scores import GEN_TOKENS, common_prefix, decode_batches, teacher_forced_passes, teacher_forced_rows
from tlcap.reproduce.cost import (
    SET_ROW_TOKENS,
    ModelShape,
    Workload,
    forward,
    generate,
    ig_rows,
    ig_rows_batched,
    n_tokens,
    set_rows,
    train,
)
from tlcap.reproduce.scales import SIGMAS, ScaleConfig, locate_n
from tlcap.reproduce.stages import Stage, StageContext, StageError
from tlcap.reproduce.suite_cost import ig_token_rows
from tlcap.reproduce.suite_stages import suite_stages
from tlcap.results import Result
from tlcap.runtime.run_control import RunControl

CODE = ("tlcap.experiments.cnl", "tlcap.attribution", "tlcap.metrics.accuracy", "tlcap.intervene", "tlcap.data.tasks")


@dataclass(frozen=True)
class LocateConfig(Config):
    """``cnl.locate.<ds>``: what is scored and how."""

    dataset: str = "emotion"
    split: str = "train"
    n: int | None = 200
    seed: int = 0
    ig: IGConfig = field(default_factory=IGConfig)
    max_answer_tokens: int = 8
    groups: int = 20
    sigma: float = 3.0
    data_dir: str | None = None

    def validate(self) -> None:
        check_nested(self, ig=IGConfig)
        check_int("max_answer_tokens", self.max_answer_tokens, min=1)
        check_int("groups", self.groups, min=2)


@dataclass(frozen=True)
class EvalConfig(Config):
    """``cnl.erase.<ds>`` / ``cnl.enhance.<ds>`` / ``cnl.cross``: the evaluation settings."""

    dataset: str = "emotion"
    n_eval: int = 200
    n_train: int = 0
    n_random: int = 20
    sigmas: tuple[float, ...] = SIGMAS
    epochs: tuple[int, ...] = (1,)
    lr: float = 1e-5
    seed: int = 0
    datasets: tuple[str, ...] = ()
    data_dir: str | None = None
    ppl_texts: int = 0
    ppl_n_random: int = 0
    checkpoint_every: int = CHUNK_SETS

    def validate(self) -> None:
        check_int("n_eval", self.n_eval, min=1)
        check_int("n_random", self.n_random, min=1)
        check_int("ppl_texts", self.ppl_texts, min=0)
        check_int("ppl_n_random", self.ppl_n_random, min=0)
        check_int("checkpoint_every", self.checkpoint_every, min=1)
        self._set("sigmas", check_sequence("sigmas", self.sigmas, min_len=1, cli=None))
        self._set("epochs", check_sequence("epochs", self.epochs, min_len=1, cli=None))
        self._set("datasets", check_sequence("datasets", self.datasets, cli=None))


# ------------------------------------------------------------------ locate
def _groups(cfg: LocateConfig, samples: list) -> list[tuple[str, list]]:
    """``[("A0", samples), ..., ("B0", ...)]``: each random half cut into ``groups / 2`` consecutive groups."""
    out = []
    per = cfg.groups // 2
    for half_name, half in zip("AB", split_halves(samples, cfg.seed)):
        k = min(per, len(half)) or 1
        bounds = [round(i * len(half) / k) for i in range(k + 1)]
        out += [(f"{half_name}{j}", half[bounds[j]:bounds[j + 1]]) for j in range(k) if bounds[j + 1] > bounds[j]]
    return out


def _locate(ctx: StageContext) -> dict[str, Result]:
    cfg: LocateConfig = ctx.config
    parts: dict[str, DatasetScores] = {}
    for name, chunk in _groups(cfg, ctx.inputs()):
        parts[name] = score_dataset(ctx.model, chunk, task=cfg.dataset, config=cfg.ig,
                                    max_answer_tokens=cfg.max_answer_tokens,
                                    run=RunControl(checkpoint_dir=str(ctx.checkpoint / name), checkpoint_every=5,
                                                   progress=ctx.progress),
                                    desc=f"CNL {cfg.dataset} group {name}")
    loc = finalize(parts, cfg.sigma)
    return {"location": loc, **{f"group_{k}": v for k, v in parts.items()}}


def _locate_work(ctx: StageContext) -> Workload:
    cfg: LocateConfig = ctx.config
    m = ctx.model
    shape = ModelShape.of(m)
    rows, toks, longest, evals = 0.0, 0.0, 0, 0
    inputs = list(ctx.inputs())
    per_token = ig_token_rows(m, cfg.ig)
    for s in inputs:
        p, t = encode_sample(m, s, cfg.max_answer_tokens)
        rows += len(t) * per_token  # the quadrature points and the baseline rows
        toks += sum(len(p) + i for i in range(len(t)))
        longest = max(longest, len(p) + len(t))
        evals += len(t)  # one IG evaluation per answer token (its clean run is part of it)
    # the clean runs are read at their answer position only (tested against counted FLOPs)
    clean = forward(shape, toks, longest / 2, longest, reads=evals)
    if grouped_scoring(cfg.ig):  # windows of samples whose rows share passes (as score_dataset runs them)
        windows = math.ceil(len(inputs) / cfg.ig.sample_batch)
        return ig_rows_batched(shape, rows, windows, ctx=longest) + clean
    return ig_rows(shape, rows, ctx=longest, evals=evals) + clean


def location(ctx: StageContext, dataset: str) -> CNLLocation:
    """The :class:`CNLLocation` of ``cnl.locate.<dataset>`` (a dependency of the calling stage).

    Args:
        ctx: The running stage's context (it must depend on ``cnl.locate.<dataset>``).
        dataset: The task name, e.g. ``"gsm8k"``.

    Returns:
        The stored ``location`` output of that stage.

    Raises:
        StageError: the stored output is not a :class:`CNLLocation` (a stale cache).
    """
    res = ctx.dep(f"cnl.locate.{dataset}")["location"]
    if not isinstance(res, CNLLocation):
        raise StageError(f"cnl.locate.{dataset} holds a {type(res).__name__}, not a CNLLocation; delete its cache folder")
    return res


# ------------------------------------------------------------------ evaluation workloads
def eval_work(model: Any, task: str, samples: list, times: float = 1.0) -> Workload:
    """The cost of one :func:`task_accuracy` pass over ``samples``, ``times`` times.

    Args:
        model: A :class:`tlcap.models.Model` (shapes and tokenizer are read).
        task: The task name; its kind (choice, number, code) sets what each sample runs.
        samples: The evaluated samples.
        times: How many passes (a float scales the workload).

    Returns:
        The :class:`Workload` of forward calls (and generated tokens for number tasks).
    """
    shape = ModelShape.of(model)
    t = get_task(task)
    n = len(samples)  # one forward call per sample
    if t.kind == "number":  # on an accelerator GEN_ROWS samples per batch: their prompts one padded pass, then
        # one pass per decoding step
        lens = [n_tokens(model, s.prompt) for s in samples]
        longest = max(lens, default=0)
        w = replace(forward(shape, sum(lens), longest / 2, longest, n),
                    accelerator_passes={"fwd_token": float(math.ceil(n / GEN_ROWS) - n)}) + replace(
            generate(shape, n * t.max_new_tokens, longest + t.max_new_tokens / 2),
            gen_steps=math.ceil(n / GEN_ROWS) * t.max_new_tokens,
            gen_bytes=shape.sequence_bytes(min(n, GEN_ROWS) * (longest + t.max_new_tokens)))
    else:  # on an accelerator the samples are rows of teacher-forced passes (their shared prefix once), counted here;
        # the FLOPs stay one sample at a time's (an upper bound there)
        # (a choice task with one-token labels reads each prompt's last position, with longer labels runs one
        # sequence per label, every position unembedded (choice_logprobs; the accelerator's rows read the labels'
        # only: an upper bound there); a code task runs its prompt and reference tokens, every position unembedded;
        # tested against counted FLOPs)
        seqs, reads = teacher_forced_rows(model, t, samples, CODE_TOKENS) if samples else ([], [])
        seq_lens = [len(q) for q in seqs]
        one_token = t.kind == "choice" and all(len(r) == 1 for r in reads)
        w = forward(shape, sum(seq_lens), sum(seq_lens) / max(2 * len(seqs), 1), max(seq_lens, default=0), n,
                    reads=len(seqs) if one_token else None)
        if samples:
            w = replace(w, accelerator_passes={"fwd_token": float(teacher_forced_passes(seqs, reads, 1, model.d_vocab) - n)})
    return w.scaled(times)


def number_set_passes(prompt_lengths: list[int], n_sets: int, max_new_tokens: int, every: int = CHUNK_SETS,
                      budget: int | None = None) -> int:
    """Forward calls of a number task's erased generation (:func:`~tlcap.metrics.set_scores.erased_scores` over
    :func:`~tlcap.experiments.cnl.erase_sets.erase_sets`' chunks of ``every`` sets). On a CPU (``budget=None``): per
    item and chunk, its sets in groups of ``ROW_TOKENS // longest prompt`` rows; on an accelerator (``budget``: the
    key/value tokens a batch holds, :data:`~tlcap.metrics.set_scores.GEN_TOKENS`): per chunk, the ``(set, item)``
    rows of :func:`~tlcap.metrics.set_scores.decode_batches`. Each group or batch is one prefix pass (prompts of 2+
    tokens) and one pass per decoding step — at most ``max_new_tokens`` (a batch stops early once all its rows
    have: an upper bound).

    Args:
        prompt_lengths: Tokens of each item's prompt.
        n_sets: Sets scored.
        max_new_tokens: Most tokens generated per row.
        every: Sets per chunk (``checkpoint_every``; :data:`~tlcap.experiments.cnl.erase_sets.CHUNK_SETS` by default).
        budget: An accelerator's key/value budget per batch, in tokens (``None``: a CPU's groups).

    Returns:
        The number of forward calls.

    Example:
        >>> number_set_passes([10, 12], n_sets=30, max_new_tokens=4)    # chunks 25 + 5, one group each: 2 · 2 · 5
        20
        >>> number_set_passes([10, 12], n_sets=30, max_new_tokens=4, budget=2**16)   # one batch per chunk: 2 · 5
        10
    """
    if not prompt_lengths or n_sets < 1:
        return 0
    chunks = [min(every, n_sets - k) for k in range(0, n_sets, every)]
    if budget is not None:
        per_chunk = {c: decode_batches(prompt_lengths, c, max_new_tokens, budget) for c in set(chunks)}
        return sum((1 if max(prompt_lengths[j] for _, j in b) > 1 else 0) + max_new_tokens
                   for c in chunks for b in per_chunk[c])
    per_group = max(1, SET_ROW_TOKENS // max(prompt_lengths))
    groups = sum(math.ceil(c / min(c, per_group)) for c in chunks)
    return sum(groups * ((1 if n > 1 else 0) + max_new_tokens) for n in prompt_lengths)


def erase_sets_work(model: Any, task: str, samples: list, n_sets: int, *, ppl_texts: int = 0, ppl_sets: int = 0,
                    ppl_max_tokens: int = 128, every: int = CHUNK_SETS) -> Workload:
    """The cost of :func:`~tlcap.experiments.cnl.erase_sets.erase_sets` (batched): ``n_sets`` sets scored on
    ``samples`` (every set runs the items' tokens after their shared prefix, and the prefix once; choice tasks
    unembed one position per row, code tasks the reference tokens, number tasks generate ``max_new_tokens``, in
    small passes: one per decoding step of each group of sets, on an accelerator of each batch of several items'
    rows, whose keys/values are its working memory, :func:`number_set_passes`), and ``ppl_sets`` sets
    on ``ppl_texts`` WikiText-2 texts (every position unembedded); ``every``: the sets per chunk the run uses."""
    shape = ModelShape.of(model)
    t = get_task(task)
    ids = [model.encode(s.prompt, check_length=False) for s in samples]
    if t.kind == "code":
        enc = [encode_sample(model, s, CODE_TOKENS) for s in samples]
        seqs, reads = [p + a[:-1] for p, a in enc], sum(len(a) for _, a in enc)
    else:
        seqs, reads = ids, len(ids)
    pre = common_prefix(seqs, min(len(p) for p in ids) - 1) if t.kind != "number" else 0
    toks = pre + sum(len(q) - pre for q in seqs)
    mean = sum(len(q) for q in seqs) / max(len(seqs), 1)
    if t.kind == "number":
        toks, reads = toks + len(samples) * t.max_new_tokens, len(samples) * t.max_new_tokens
        mean += t.max_new_tokens / 2
    w = set_rows(shape, n_sets * toks, n_sets * reads, mean / 2)
    if t.kind == "number":  # the decoding steps' calls (their FLOPs are the set_token ones above); on an accelerator
        # several items' rows share them, their keys/values the batch's memory
        lens = [len(p) for p in ids]
        cpu = number_set_passes(lens, n_sets, t.max_new_tokens, every)
        gpu = number_set_passes(lens, n_sets, t.max_new_tokens, every, budget=GEN_TOKENS)
        widest = max((len(b) * (max(lens[j] for _, j in b) + t.max_new_tokens)
                      for b in decode_batches(lens, min(every, n_sets), t.max_new_tokens, GEN_TOKENS)), default=0)
        w = w + Workload(passes={"fwd_token": float(cpu)}, accelerator_passes={"fwd_token": float(gpu - cpu)},
                         gen_bytes=widest * shape.kv_token_bytes())
    if ppl_texts and ppl_sets:
        lens = [len(model.encode(x, prepend_bos=False, max_tokens=ppl_max_tokens, check_length=False))
                for x in load_wikitext(n_texts=ppl_texts)]
        w = w + set_rows(shape, ppl_sets * sum(lens), ppl_sets * sum(lens), sum(lens) / max(len(lens), 1) / 2)
    return w


# ------------------------------------------------------------------ erase (Table 3)
def _erase(ctx: StageContext) -> dict[str, Result]:
    """``base`` (TaskAccuracy), per σ ``sigma<σ>`` (EraseResult: per-item scores of base, located, every random set,
    and the perplexity control) and ``sigma<σ>_located`` (the located-erased TaskAccuracy, from the same run)."""
    cfg: EvalConfig = ctx.config
    m, samples = ctx.model, ctx.inputs()
    loc = location(ctx, cfg.dataset)
    base = task_accuracy(m, cfg.dataset, samples)
    out: dict[str, Result] = {"base": base}
    for sigma in cfg.sigmas:
        ns = loc.reselect(sigma)
        tag = f"sigma{sigma:g}"
        if not ns.to_list():  # nothing above mean + σ·std: the report lists this σ as not computed, with the reason
            continue
        runs: list = []
        out[tag] = erase_effect(m, cfg.dataset, samples, ns, n_random=cfg.n_random, seed=cfg.seed, base_accuracy=base,
                                source=cfg.dataset, ppl_texts=cfg.ppl_texts, ppl_n_random=cfg.ppl_n_random,
                                run=RunControl(checkpoint_dir=str(ctx.checkpoint / tag),
                                               checkpoint_every=cfg.checkpoint_every, progress=ctx.progress), runs=runs)
        out[f"{tag}_located"] = located_accuracy(runs[0], cfg.dataset)
    return out


def _erase_work(ctx: StageContext) -> Workload:
    cfg: EvalConfig = ctx.config
    m, samples = ctx.model, ctx.inputs()
    # per σ: base, located and the random sets in batched passes (a set's cost does not depend on its size)
    per_sigma = erase_sets_work(m, cfg.dataset, samples, 1 + cfg.n_random, ppl_texts=cfg.ppl_texts,
                                ppl_sets=2 + min(cfg.ppl_n_random, cfg.n_random), every=cfg.checkpoint_every)
    return eval_work(m, cfg.dataset, samples) + per_sigma.scaled(len(cfg.sigmas))


# ------------------------------------------------------------------ enhance (Table 2)
def _enhance(ctx: StageContext) -> dict[str, Result]:
    cfg: EvalConfig = ctx.config
    train_s, test_s = ctx.inputs()
    ns = location(ctx, cfg.dataset).reselect(cfg.sigmas[0])
    res = enhance_effect(ctx.model, cfg.dataset, train_s, test_s, ns, epochs=max(cfg.epochs), eval_epochs=cfg.epochs, lr=cfg.lr,
                         seed=cfg.seed, n_random=cfg.n_random, source=cfg.dataset, progress=ctx.progress)
    return {"enhance": res}


def _enhance_work(ctx: StageContext) -> Workload:
    cfg: EvalConfig = ctx.config
    m = ctx.model
    train_s, test_s = ctx.inputs()
    shape = ModelShape.of(m)
    toks, longest = 0, 0
    for s in train_s:
        p, t = encode_sample(m, s, 16)
        toks += len(p) + len(t) - 1  # teacher-forced: the last answer token is not fed
        longest = max(longest, len(p) + len(t))
    modes = 2 + cfg.n_random  # located, w/o located and each random set
    steps = train(shape, toks * max(cfg.epochs) * modes, shape.n_mlp_params, longest / 2, longest,
                  len(train_s) * max(cfg.epochs) * modes, m.dtype.itemsize)
    return steps + eval_work(m, cfg.dataset, test_s, 1 + modes * len(cfg.epochs))


# ------------------------------------------------------------------ cross-dataset (Fig. 5)
def _cross(ctx: StageContext) -> dict[str, Result]:
    cfg: EvalConfig = ctx.config
    evals = ctx.inputs()
    located = {ds: location(ctx, ds).reselect(cfg.sigmas[0]) for ds in cfg.datasets}
    res = cross_dataset(ctx.model, located, evals, n_random=cfg.n_random, seed=cfg.seed)
    return {"cross": res}


def _cross_work(ctx: StageContext) -> Workload:
    cfg: EvalConfig = ctx.config
    k = len(cfg.datasets)
    w = Workload()
    for ds, samples in ctx.inputs().items():
        # base (one task_accuracy pass); per cell the located set and the random draws, batched
        w = w + eval_work(ctx.model, ds, samples) + erase_sets_work(ctx.model, ds, samples, 1 + cfg.n_random).scaled(k)
    return w


# ------------------------------------------------------------------ the stage list
def cnl_stages(scale: ScaleConfig, *, seed: int = 0, data_dir: str | None = None) -> list[Stage]:
    """Every CNL stage at ``scale`` (see the module table).

    Args:
        scale: The scale's sizes (datasets, samples, IG settings, random sets).
        seed: Seed of the sampling and of the random sets.
        data_dir: Folder holding the datasets (``None``: the default data folder).

    Returns:
        The stages in dependency order: ``cnl.locate.*``, ``cnl.erase.*``/``cnl.enhance.*``, ``cnl.cross`` (two or
        more evaluated datasets), then the :func:`suite_stages`.
    """
    stages: list[Stage] = []
    for ds in scale.cnl_datasets:
        cfg = LocateConfig(dataset=ds, n=locate_n(scale, ds), seed=seed, ig=scale.cnl_ig,
                           max_answer_tokens=scale.cnl_max_answer_tokens, groups=scale.cnl_groups, sigma=scale.cnl_sigma,
                           data_dir=data_dir)
        stages.append(Stage(f"cnl.locate.{ds}", _locate, cfg, code=CODE, data=_train_data, workload=_locate_work,
                            items=("CNL Table 1", "CNL Fig. 6"), description=f"CNL scores + located set on {ds}"))
    for ds in scale.cnl_eval_datasets:
        if ds not in scale.cnl_datasets:
            continue
        n_eval = scale.cnl_eval_n_code if get_task(ds).kind == "code" else scale.cnl_eval_n
        ecfg = EvalConfig(dataset=ds, n_eval=n_eval, n_random=scale.n_random, seed=seed, data_dir=data_dir,
                          ppl_texts=scale.cnl_ppl_texts, ppl_n_random=scale.cnl_ppl_n_random)
        stages.append(Stage(f"cnl.erase.{ds}", _erase, ecfg, deps=(f"cnl.locate.{ds}",), code=CODE, data=_test_data,
                            workload=_erase_work, items=("CNL Table 3",), description=f"erase at σ 3/6/12 on {ds}"))
        hcfg = EvalConfig(dataset=ds, n_eval=scale.enhance_eval_n, n_train=scale.enhance_train_n,
                          n_random=scale.enhance_n_random,
                          sigmas=(scale.cnl_sigma,), epochs=scale.enhance_epochs, seed=seed, data_dir=data_dir)
        stages.append(Stage(f"cnl.enhance.{ds}", _enhance, hcfg, deps=(f"cnl.locate.{ds}",), code=CODE, data=_train_test_data,
                            workload=_enhance_work, items=("CNL Table 2",), description=f"masked fine-tuning on {ds}"))
    cross_ds = tuple(ds for ds in scale.cnl_eval_datasets if ds in scale.cnl_datasets)
    if len(cross_ds) >= 2:
        ccfg = EvalConfig(dataset="cross", n_eval=scale.cross_eval_n, n_random=scale.cross_n_random,
                          sigmas=(scale.cnl_sigma,), seed=seed, datasets=cross_ds, data_dir=data_dir)
        stages.append(Stage("cnl.cross", _cross, ccfg, deps=tuple(f"cnl.locate.{d}" for d in cross_ds), code=CODE,
                            data=_cross_data, workload=_cross_work, items=("CNL Fig. 5",),
                            description="erase each dataset's neurons, measure every dataset"))
    stages += suite_stages(scale, seed=seed)
    return stages


def _load(ctx: StageContext, dataset: str, data_dir: str | None, split: str, n: int | None, seed: int) -> list:
    """``load_task``; when only planning, a dataset larger than what is here (offline: the bundled subset) is
    estimated by cycling the samples that are here up to ``n`` (noted in the plan)."""
    try:
        return load_task(dataset, data_dir, split, n, seed)
    except DatasetUnavailableError:
        if not ctx.runner.plan_only or n is None:
            raise
        have = load_task(dataset, data_dir, split, None, seed)
        note = f"{dataset} {split}: {n} samples estimated from the {len(have)} here"
        ctx.runner.note(ctx.stage.name, note)
        return [have[i % len(have)] for i in range(n)]


def _train_data(ctx: StageContext) -> list:
    cfg: LocateConfig = ctx.config
    return _load(ctx, cfg.dataset, cfg.data_dir, cfg.split, cfg.n, cfg.seed)


def _test_data(ctx: StageContext) -> list:
    cfg: EvalConfig = ctx.config
    return _load(ctx, cfg.dataset, cfg.data_dir, "test", cfg.n_eval, cfg.seed)


def _train_test_data(ctx: StageContext) -> tuple[list, list]:
    cfg: EvalConfig = ctx.config
    return (_load(ctx, cfg.dataset, cfg.data_dir, "train", cfg.n_train, cfg.seed),
            _load(ctx, cfg.dataset, cfg.data_dir, "test", cfg.n_eval, cfg.seed))


def _cross_data(ctx: StageContext) -> dict[str, list]:
    cfg: EvalConfig = ctx.config
    return {ds: _load(ctx, ds, cfg.data_dir, "test", cfg.n_eval, cfg.seed) for ds in cfg.datasets}


__all__ = ["LocateConfig", "EvalConfig", "cnl_stages", "eval_work", "location"]
