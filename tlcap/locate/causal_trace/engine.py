"""The batched trace engine, the one-cell-at-a-time reference, and :func:`causal_trace`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.locate.causal_trace.config import TraceConfig
from tlcap.locate.causal_trace.results import CausalTrace
from tlcap.locate.causal_trace.setup import TraceSetup, prepare_trace
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime import hooks as H
from tlcap.runtime.batching import auto_batch_rows, run_auto_batched, trace_row_bytes


def trace_result(setup: TraceSetup, scores: Tensor, seconds: float) -> CausalTrace:
    """The :class:`CausalTrace` of a traced setup (its scores and the seconds it took).

    Args:
        setup: The prepared trace (model, prompt, config, clean / corrupted probabilities).
        scores: ``[kind, token, layer]`` restored probabilities.
        seconds: Wall time of the trace.

    Returns:
        The :class:`CausalTrace`, with provenance.
    """
    m, cfg = setup.model, setup.config
    return CausalTrace(
        scores=scores, clean_prob=setup.clean_prob, corrupted_prob=setup.corrupted_prob,
        prompt=setup.prompt, subject=setup.subject, target=setup.target, target_id=setup.target_id,
        tokens=tuple(m.to_str_tokens(setup.tokens[0])), subject_range=tuple(setup.subject_range),
        kinds=setup.kinds, layers=setup.layers, window=cfg.window, samples=setup.samples,
        noise_std=setup.noise_std, seed=cfg.seed, bos=cfg.bos, subject_at_start=setup.subject_at_start,
        top_k=cfg.top_k, seconds=seconds, model_name=m.name,
        provenance=Provenance.collect(m, config=cfg, seed=cfg.seed),
    )


def late_chunks(lowest: Sequence[int], k_max: int, rows: int, n_layers: int) -> list[tuple[int, int]]:
    """Split cells sorted by their lowest restored layer into batches of at most ``k_max`` cells.

    A batch ``[a, b)`` runs ``rows`` rows through the layers below ``lowest[a]`` and ``(b - a) · rows``
    rows above it; each batch also costs about one ``rows``-row forward of overhead. The split
    minimising that total is found by dynamic programming (exact: it only groups the work).

    Args:
        lowest: Each cell's lowest restored layer, ascending.
        k_max: Most cells per batch.
        rows: Rows per cell (noise samples).
        n_layers: Layers of the model.

    Returns:
        ``(start, stop)`` cell ranges covering every cell, in order.
    """
    c = len(lowest)
    best = [0.0] + [float("inf")] * c
    cut = [0] * (c + 1)
    for b in range(1, c + 1):
        for a in range(max(0, b - k_max), b):
            cost = best[a] + (b - a) * rows * (n_layers - lowest[a]) + rows * lowest[a] + rows * n_layers
            if cost < best[b]:
                best[b], cut[b] = cost, a
    out, b = [], c
    while b > 0:
        out.append((cut[b], b))
        b = cut[b]
    return out[::-1]


@torch.no_grad()
def trace_batched(
    setup: TraceSetup,
    batch_rows: int | str | None = None,
    prefix_reuse: bool | None = None,
    skip_pre_subject: bool | None = None,
    progress: bool = False,
    late_expand: bool | None = None,
) -> Float[Tensor, "kind token layer"]:
    """All cells of ``setup``, batched; returns ``[kind, token, layer]`` restored probabilities.

    Only the rows of the config's ``tokens`` are traced; the others are NaN.

    One forward pass carries many rows, each row one noise sample × one (kind, layer)
    restoration of the current token (:func:`tlcap.runtime.hooks.patch_rows`); the corrupted
    prefix before the token is computed once per token (a :class:`tlcap.models.PrefixCache` with
    one row per noise sample); cells before the subject get the corrupted probability.

    Args:
        setup: From :func:`prepare_trace`.
        batch_rows: Rows per forward pass, or ``"auto"`` (default: the setup's config).
        prefix_reuse: Reuse the corrupted prefix (default: the setup's config).
        skip_pre_subject: Skip the cells before the subject (default: the setup's config).
        progress: Show a progress bar.
        late_expand: Share the corrupted run below each batch's lowest restored layer (exact;
            default: the setup's config).

    Returns:
        The scores tensor.
    """
    cfg = setup.config
    batch_rows = cfg.batch_rows if batch_rows is None else batch_rows
    if batch_rows == "auto":  # plateau batch within the budget, rerun at half on out-of-memory: same scores
        dev = setup.model.device
        total = setup.samples * len(setup.kinds) * len(setup.layers)
        rows = auto_batch_rows(trace_row_bytes(setup.model, setup.n_tokens), total, cfg.max_memory, dev, model=setup.model,
                               kind="trace", context_len=setup.n_tokens)
        return run_auto_batched(lambda b: trace_batched(setup, b, prefix_reuse, skip_pre_subject, progress, late_expand),
                                rows, dev)
    prefix_reuse = cfg.prefix_reuse if prefix_reuse is None else prefix_reuse
    skip_pre_subject = cfg.skip_pre_subject if skip_pre_subject is None else skip_pre_subject
    late_expand = cfg.late_expand if late_expand is None else late_expand
    model = setup.model
    n, T = setup.samples, setup.n_tokens
    kinds, layers = setup.kinds, setup.layers
    s0 = setup.subject_range[0]
    scores = torch.full((len(kinds), T, len(layers)), float("nan"))
    cells = [(ki, li) for ki in range(len(kinds)) for li in range(len(layers))]
    k_max = max(1, batch_rows // n)
    traced = cfg.token_positions(T, setup.subject_range)  # other rows stay NaN
    todo = [t for t in traced if not (skip_pre_subject and t < s0)]
    for t in traced:
        if t not in todo:
            scores[:, t, :] = setup.corrupted_prob
    bar = tqdm(total=len(todo) * len(cells), desc="causal trace", disable=not progress, unit="cell")
    late = late_expand and model.continues_rows
    chunks = [(c0, min(c0 + k_max, len(cells))) for c0 in range(0, len(cells), k_max)]
    if late:  # cells that first touch the same layers share batches (and the layers below them)
        cells.sort(key=lambda c: min(setup.site_layers(kinds[c[0]], layers[c[1]])))
        low = [min(setup.site_layers(kinds[ki], layers[li])) for ki, li in cells]
        chunks = late_chunks(low, k_max, n, model.n_layers)
    for t in todo:
        offset = t if (prefix_reuse and t > 0) else 0
        prefix = None
        if offset:  # one cache row per noise sample; a batch of n*k rows repeats each k times
            with model.hooks(setup.noise_hooks(upto=t)):
                prefix = (model.padded_prefix(setup.tokens[:, :t].expand(n, -1).tolist()) if late
                          else model.prefix_cache(setup.tokens[:, :t].expand(n, -1)))
        run = setup.tokens[:, offset:]
        for c0, c1 in chunks:
            chunk = cells[c0:c1]
            k = len(chunk)
            per_hook: dict[str, list[int]] = {}
            for ci, (ki, li) in enumerate(chunk):
                kind = kinds[ki]
                for ll in setup.site_layers(kind, layers[li]):
                    per_hook.setdefault(setup.hook(kind, ll), []).append(ci)
            # rows differ from the corrupted run only from the lowest restored layer on
            lowest = min(min(setup.site_layers(kinds[ki], layers[li])) for ki, li in chunk) if late else 0
            hooks = list(setup.noise_hooks(rows_per_sample=1 if lowest > 0 else k, offset=offset))
            for name, cis in per_hook.items():
                ci_t = torch.tensor(cis, dtype=torch.long)
                rows = (torch.arange(n)[:, None] * k + ci_t[None, :]).reshape(-1)  # sample-major rows
                src = setup.clean[name][:, offset:]
                hooks.append((name, H.patch_rows(src, rows, t - offset)))
            if late:
                if prefix is None:
                    prefix = model.padded_prefix([[]] * n)
                logits = model.continue_rows(run.expand(n, -1).tolist(), prefix, torch.full((n,), k), hooks=hooks,
                                             expand_at=lowest or None)
            else:
                logits = model.last_logits(run.expand(n * k, -1), hooks=hooks, prefix=prefix)
            p = setup.probs(logits).reshape(n, k).mean(0)
            for ci, (ki, li) in enumerate(chunk):
                scores[ki, t, li] = p[ci]
            bar.update(k)
    bar.close()
    return scores


@torch.no_grad()
def trace_cell(setup: TraceSetup, kind: str, token: int, layer: int) -> float:
    """One cell, the reference way: one forward of ``samples`` rows with ``patch`` hooks.

    Args:
        setup: From :func:`prepare_trace`.
        kind: ``resid``, ``mlp`` or ``attn``.
        token: Token position restored.
        layer: The cell's layer (MLP/attention cells restore its window).

    Returns:
        The restored probability, mean over the noise samples.
    """
    return setup.restored_prob([(kind, token, layer)])


def causal_trace(
    model: Model,
    prompt: str,
    subject: str,
    target: str | None = None,
    *,
    config: TraceConfig | None = None,
    occurrence: int | None = None,
    warn: bool = True,
    progress: bool = False,
    **overrides: Any,
) -> CausalTrace:
    """Causal trace of one fact: restored probability for every (kind, token, layer).

    Args:
        model: The :class:`tlcap.models.Model`.
        prompt: The fact's prompt, e.g. ``"The capital of France is"``.
        subject: The subject as written in the prompt (``"France"``); its tokens are noised.
        target: The answer (first token scored); ``None`` = the model's clean prediction.
        config: A :class:`TraceConfig` (default: its defaults).
        occurrence: Which occurrence of the subject to noise (``None``: the first, warning when
            there are several; see :func:`prepare_trace`).
        warn: Warn when the subject starts the prompt without a BOS (see :func:`prepare_trace`).
        progress: Show a progress bar.
        **overrides: :class:`TraceConfig` fields overriding ``config`` (``samples=5``,
            ``kinds=("mlp",)``, ``layers=[0, 5]``...).

    Returns:
        A :class:`CausalTrace` with provenance.

    Raises:
        InvalidConfigError: an invalid setting or a layer beyond the model (before any forward).
        SubjectNotFoundError: the subject is not in the prompt.

    Example:
        >>> tr = causal_trace(model, "The capital of France is", "France", " Paris", samples=10)
        >>> round(tr.clean_prob, 7), tr.top_layers(3)           # a random model: P(Paris) is tiny
        (2.13e-05, [0, 1])
        >>> fig = tr.figure()                                   # fig.show() in a notebook
    """
    t0 = time.perf_counter()
    setup = prepare_trace(model, prompt, subject, target, config=config, occurrence=occurrence, warn=warn,
                          **overrides)
    scores = trace_batched(setup, progress=progress)
    return trace_result(setup, scores, time.perf_counter() - t0)


def trace_reference(
    model: Model,
    prompt: str,
    subject: str,
    target: str | None = None,
    *,
    config: TraceConfig | None = None,
    tokens: Sequence[int] | None = None,
    progress: bool = False,
    **overrides: Any,
) -> CausalTrace:
    """The per-cell loop: one forward (``samples`` rows, full prompt) per (kind, token, layer).

    Args:
        model, prompt, subject, target, config, progress, overrides: As in :func:`causal_trace`.
        tokens: Restrict the loop to these token positions (the other rows are NaN) — the
            benchmark times a subset of cells this way (default: the config's ``tokens``).

    Returns:
        A :class:`CausalTrace` equal to :func:`causal_trace`'s up to float rounding.

    Example:
        >>> ref = trace_reference(model, "The capital of France is", "France", samples=3)
        >>> fast = causal_trace(model, "The capital of France is", "France", samples=3)
        >>> ref.target, torch.allclose(ref.scores, fast.scores, rtol=1e-4, atol=1e-9)   # target: the top token
        (' is', True)
    """
    t0 = time.perf_counter()
    setup = prepare_trace(model, prompt, subject, target, config=config, **overrides)
    T = setup.n_tokens
    toks = setup.config.token_positions(T, setup.subject_range) if tokens is None else tokens
    scores = torch.full((len(setup.kinds), T, len(setup.layers)), float("nan"))
    bar = tqdm(total=len(toks) * len(setup.kinds) * len(setup.layers), desc="trace (per cell)", disable=not progress)
    for ki, kind in enumerate(setup.kinds):
        for t in toks:
            for li, l in enumerate(setup.layers):
                scores[ki, t, li] = trace_cell(setup, kind, t, l)
                bar.update(1)
    bar.close()
    return trace_result(setup, scores, time.perf_counter() - t0)


__all__ = ["causal_trace", "late_chunks", "trace_batched", "trace_cell", "trace_reference", "trace_result"]
