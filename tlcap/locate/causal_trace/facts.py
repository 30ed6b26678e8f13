"""Causal traces of many facts at once: the cells of several facts share forward passes.

A cell of fact ``f`` restores token ``t`` at some layers in the corrupted run of ``f``'s prompt; like
the one-fact engine (:func:`tlcap.locate.causal_trace.trace_batched`), a row recomputes only positions
``>= t`` after the corrupted prefix (one cache row per noise sample) and shares the corrupted run below
its batch's lowest restored layer. Here the rows of several (fact, token) pairs whose continuations
have the same length go into one batch: each pair's noise samples are contexts of
:meth:`tlcap.models.Model.continue_rows` after their own corrupted prefixes (padded; the noise on a
prefix's or continuation's subject tokens is a per-row tensor, zero elsewhere), and each row restores
its own fact's clean state. Rows are independent, so every fact's scores equal its own
:func:`~tlcap.locate.causal_trace.causal_trace` up to float rounding (tested on every family).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.locate.causal_trace.config import TraceConfig
from tlcap.locate.causal_trace.engine import late_chunks, trace_batched, trace_result
from tlcap.locate.causal_trace.results import CausalTrace
from tlcap.locate.causal_trace.setup import TraceSetup, add_dense, dense_noise, prepare_traces
from tlcap.models.adapter import Model
from tlcap.runtime import hooks as H
from tlcap.runtime.batching import auto_batch_rows, run_auto_batched, trace_row_bytes
from tlcap.runtime.sites import get_site

TraceFact = tuple[str, str, "str | None"]
"""``(prompt, subject, target)`` (``target`` ``None``: the clean run's top token)."""


def _shared(setups: Sequence[TraceSetup]) -> bool:
    """Whether the setups can share batches (same cells and samples; the exact speed-ups on)."""
    c0 = setups[0].config
    same = all((s.kinds, s.layers, s.window, s.samples) == (setups[0].kinds, setups[0].layers, setups[0].window,
                                                             setups[0].samples) for s in setups)
    return same and c0.prefix_reuse and c0.late_expand and c0.skip_pre_subject and setups[0].model.continues_rows


@torch.no_grad()
def trace_setups(setups: Sequence[TraceSetup], batch_rows: int | str | None = None,
                 progress: bool = False) -> list[Float[Tensor, "kind token layer"]]:
    """The ``[kind, token, layer]`` restored probabilities of every setup, cells of several facts batched.

    Args:
        setups: From :func:`~tlcap.locate.causal_trace.prepare_trace` (same kinds, layers, window and
            samples; seeds and noise may differ).
        batch_rows: Rows per forward pass or ``"auto"`` (default: the first setup's config).
        progress: A progress bar over the (fact, token) pairs.

    Returns:
        Per setup, the scores :func:`~tlcap.locate.causal_trace.trace_batched` gives it.
    """
    if not setups:
        return []
    cfg = setups[0].config
    batch_rows = cfg.batch_rows if batch_rows is None else batch_rows
    if not _shared(setups):  # compare-only settings, TL 3.9, or setups that differ: one fact at a time
        return [trace_batched(s, batch_rows, progress=progress) for s in setups]
    model = setups[0].model
    if batch_rows == "auto":  # largest batch in the budget, rerun at half on out-of-memory: same scores
        total = sum(s.samples * len(s.kinds) * len(s.layers) * s.n_tokens for s in setups)
        longest = max(s.n_tokens for s in setups)
        rows = auto_batch_rows(trace_row_bytes(model, longest), total, cfg.max_memory, model.device, model=model,
                               kind="trace", context_len=longest)
        return run_auto_batched(lambda b: trace_setups(setups, b, progress), rows, model.device)
    n = setups[0].samples
    kinds, layers = setups[0].kinds, setups[0].layers
    cells = sorted(((ki, li) for ki in range(len(kinds)) for li in range(len(layers))),
                   key=lambda c: min(setups[0].site_layers(kinds[c[0]], layers[c[1]])))
    low = [min(setups[0].site_layers(kinds[ki], layers[li])) for ki, li in cells]
    scores = [torch.full((len(kinds), s.n_tokens, len(layers)), float("nan")) for s in setups]
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    windowed = any(w is not None for w in model.attention_windows)
    for f, s in enumerate(setups):
        for t in s.config.token_positions(s.n_tokens, s.subject_range):
            if t < s.subject_range[0]:  # restoring a token before the subject is the corrupted run
                scores[f][:, t, :] = s.corrupted_prob
            else:  # a sliding window needs prefixes of one length per batch (Model.continue_rows)
                groups.setdefault((s.n_tokens - t, t if windowed else 0), []).append((f, t))
    k_max = max(1, min(len(cells), int(batch_rows) // n))
    per_batch = max(1, int(batch_rows) // (n * k_max))
    chunks = late_chunks(low, k_max, n * per_batch, model.n_layers)
    bar = tqdm(total=sum(len(g) for g in groups.values()), desc="causal traces", disable=not progress, unit="token")
    done: list[tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int]], Tensor]] = []
    for pairs in groups.values():
        for s0 in range(0, len(pairs), per_batch):
            sub = pairs[s0:s0 + per_batch]
            _run_pairs(model, setups, sub, cells, chunks, done)
            bar.update(len(sub))
    bar.close()
    if done:  # every batch's probabilities to the host in one copy (not one round trip per batch)
        flat = torch.cat([p.reshape(-1) for _, _, p in done]).cpu()
        at = 0
        for pairs, chunk, p in done:
            host = flat[at:at + p.numel()].view(p.shape)
            at += p.numel()
            for pi, (f, t) in enumerate(pairs):
                for ci, (ki, li) in enumerate(chunk):
                    scores[f][ki, t, li] = host[pi, ci]
    return scores


def _run_pairs(model: Model, setups: Sequence[TraceSetup], pairs: Sequence[tuple[int, int]],
               cells: Sequence[tuple[int, int]], chunks: Sequence[tuple[int, int]],
               done: list[tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int]], Tensor]]) -> None:
    """The cells of ``pairs`` ((fact, token) with continuations of one length): rows after corrupted prefixes.
    Appends ``(pairs, cells of the batch, [pairs, cells] mean probability on the device)`` to ``done`` per batch."""
    s_ = setups[0]
    n, kinds, layers = s_.samples, s_.kinds, s_.layers
    embed = get_site("embed").hook_name()
    dtype = model.dtype
    pre = [s.tokens[0, :t].tolist() for f, t in pairs for s in [setups[f]] for _ in range(n)]
    longest = max(len(x) for x in pre)
    with model.hooks(fwd=[(embed, add_dense(dense_noise(setups, pairs, "prefix", longest, dtype)))] if longest else []):
        prefix = model.padded_prefix(pre)
    conts = [setups[f].tokens[0, t:].tolist() for f, t in pairs for _ in range(n)]
    q = len(conts[0])
    noise = dense_noise(setups, pairs, "cont", q, dtype)
    tids = torch.tensor([setups[f].target_id for f, _ in pairs for _ in range(n)], device=model.device)
    n_ctx = len(conts)
    for c0, c1 in chunks:
        chunk = cells[c0:c1]
        k = len(chunk)
        per_hook: dict[str, list[int]] = {}
        for ci, (ki, li) in enumerate(chunk):
            for ll in s_.site_layers(kinds[ki], layers[li]):
                per_hook.setdefault(s_.hook(kinds[ki], ll), []).append(ci)
        lowest = min(min(s_.site_layers(kinds[ki], layers[li])) for ki, li in chunk)
        hooks: list = [(embed, add_dense(noise if lowest > 0 else noise.repeat_interleave(k, 0)))]
        for name, cis in per_hook.items():
            ci_t = torch.tensor(cis, dtype=torch.long)
            rows = (torch.arange(n_ctx)[:, None] * k + ci_t[None, :]).reshape(-1)  # context-major rows
            clean = torch.stack([setups[f].clean[name][0, t] for f, t in pairs])  # [pairs, d]
            vals = clean.repeat_interleave(n * len(cis), 0)
            hooks.append((name, H.replace_rows(rows.to(model.device), 0, vals)))
        logits = model.continue_rows(conts, prefix, torch.full((n_ctx,), k), hooks=hooks, expand_at=lowest or None)
        probs = logits.float().softmax(-1).gather(1, tids.repeat_interleave(k)[:, None])[:, 0]
        done.append((pairs, chunk, probs.reshape(len(pairs), n, k).mean(1)))


def causal_trace_facts(
    model: Model,
    facts: Sequence[TraceFact],
    *,
    config: TraceConfig | None = None,
    fact_batch: int = 16,
    warn: bool = True,
    progress: bool = False,
    **overrides: Any,
) -> list[CausalTrace]:
    """:func:`~tlcap.locate.causal_trace.causal_trace` of every fact, the cells of several facts batched.

    Each fact is prepared as :func:`causal_trace` prepares it (clean run, seeded noise, corrupted
    run; on an accelerator the ``fact_batch`` facts' clean runs are one padded pass and their corrupted runs
    another, :func:`~tlcap.locate.causal_trace.setup.prepare_traces`); the restorations of up to ``fact_batch``
    facts then share forward passes (module docstring).
    Each result equals :func:`causal_trace` of that fact up to float rounding.

    Args:
        model: The model.
        facts: ``(prompt, subject, target)`` per fact (``target`` ``None``: the clean top token).
        config: A :class:`TraceConfig` (default: its defaults), the same for every fact.
        fact_batch: Facts whose cells share batches (exact; memory only), ``>= 1``.
        warn: Warn when a subject starts its prompt without a BOS.
        progress: A progress bar over the facts.
        **overrides: :class:`TraceConfig` fields overriding ``config``.

    Returns:
        One :class:`CausalTrace` per fact, in order (``seconds``: the fact's share of its batch's time).

    Raises:
        InvalidConfigError: an invalid setting (before any forward pass).
        SubjectNotFoundError: a subject is not in its prompt.

    Example:
        >>> trs = causal_trace_facts(model, [("The capital of France is", "France", " Paris"),
        ...                                  ("The capital of Italy is", "Italy", " Rome")], samples=5)
        >>> [(tr.subject, tr.top_layers(3)) for tr in trs]
        [('France', [0, 1]), ('Italy', [0, 1])]
    """
    cfg = TraceConfig.resolve(config, **overrides)
    out: list[CausalTrace] = []
    bar = tqdm(total=len(facts), desc="causal traces", disable=not progress, unit="fact")
    for s in range(0, len(facts), max(1, int(fact_batch))):
        t0 = time.perf_counter()
        chunk = facts[s:s + fact_batch]
        setups = prepare_traces(model, chunk, config=cfg, warn=warn)  # on an accelerator: two passes per chunk
        scores = trace_setups(setups)
        share = (time.perf_counter() - t0) / len(chunk)
        out += [trace_result(st, sc, share) for st, sc in zip(setups, scores)]
        bar.update(len(chunk))
    bar.close()
    return out


__all__ = ["TraceFact", "causal_trace_facts", "trace_setups"]
