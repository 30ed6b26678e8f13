"""Exact IG of many teacher-forced positions at once: rows batched across samples, ``steps="auto"``.

A *unit* is one answer token of one sample: its context (prompt ⊕ earlier answer tokens), the
token predicted, and the clean activations of the scored layers at the last position. Exact IG
of a unit is the same batched computation as :func:`tlcap.attribution.integrated_gradients`
(row r scales layer ``l(r)`` at ``α(r)``, the prefix's keys/values are reused, a batch runs as
one row per unit below its lowest scaled layer), but a batch holds the rows of *several* units:
the prefixes are cached together, right-padded (:meth:`tlcap.models.Model.padded_prefix`), and
each unit's rows continue its own prefix (:meth:`tlcap.models.Model.continue_rows`). Rows are
independent, so the result is the per-sample result (equal up to float rounding; tested).

``steps="auto"`` chooses the quadrature size per unit and layer by completeness: every layer
starts at :data:`AUTO_START` nodes; while a unit's completeness error
``Σ_l |Σ_j Attr_l − ΔP_l| / Σ_l |ΔP_l|`` exceeds ``tol``, its layers with the largest errors (of those whose own error exceeds
``tol · |ΔP_l|``; the fewest whose removal would bring the rest within the target) are
recomputed with twice the nodes (up to ``max_steps``). A layer's
result is exactly the fixed-size result at the size it ended with (``steps_used``).

The ``trapezoid`` rule is refined without recomputing a node: it starts at ``AUTO_START + 1``
points (``AUTO_START`` intervals) and a refinement halves the intervals, which adds only the
midpoints of the current ones: ``T_2n = (T_n + M_n) / 2`` with ``M_n`` the midpoint rule on the
same ``n`` intervals, so a layer that ends at ``2^k·4 + 1`` points cost exactly that many gradient
rows (Gauss–Legendre, not nested, costs every earlier round again). A rule whose first node is
``α = 0`` (``left``, ``linspace``, ``trapezoid``, ``cnl``) uses that row as the baseline row of the
completeness check instead of running a second one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tlcap.attribution.config import IGConfig
from tlcap.attribution.quadrature import n_points, quadrature
from tlcap.attribution.staged import run_staged, staged_applies
from tlcap.models.adapter import Model, PaddedPrefix
from tlcap.models.rows import concat_prefixes
from tlcap.runtime import device as runtime_device
from tlcap.runtime import hooks as H
from tlcap.runtime.batching import run_auto_batched
from tlcap.runtime.fixed import weights_fixed
from tlcap.runtime.sites import get_site

AUTO_START = 4
"""Quadrature nodes per layer of the first ``steps="auto"`` round."""
STREAM_DEPTH = 4
"""Windows in flight in :func:`ig_units_stream` (each keeps its prefix's keys/values until it returns)."""
DELTA_FLOOR = 1e-6
"""A unit whose Σ_l |ΔP_l| is below this is accepted when its absolute error is below ``tol`` times it."""


@dataclass(frozen=True)
class Unit:
    """One teacher-forced position: ``context`` (ending with the token whose next token is scored).

    Attributes:
        context: The tokens up to the scored position.
        target_id: The token whose probability is scored.
        w_bar: Clean activations of the scored layers at the last position.
        base: The IG baseline of those layers.
        p_clean: Clean probability of the target.
        row: The unit's row in the prefix :func:`make_units` returns (its sample's run).
        states: Clean residual stream (``resid_pre``) of the scored layers at the last position, where
            the unit's rows join a staged run (:mod:`tlcap.attribution.staged`).
        at: Position in ``context`` of the scaled token (``-1``: the last, the KN case); the rows then
            continue the prefix before it with the rest of the context (AMIG's words).
    """

    context: tuple[int, ...]
    target_id: int
    w_bar: Float[Tensor, "layer d"]
    base: Float[Tensor, "layer d"]
    p_clean: float
    row: int = 0
    states: Float[Tensor, "layer d_model"] | None = None
    at: int = -1


@dataclass(frozen=True)
class UnitsIG:
    """Exact IG of a list of units (module docstring).

    Attributes:
        attr: ``[units, layers, d]`` attribution (float64) of the scored layers.
        p_base: ``[units, layers]`` P(target) with the layer at the baseline.
        steps_used: ``[units, layers]`` quadrature size each layer ended with.
        evaluations: Gradient rows run per unit (every round's nodes plus the baseline rows).
    """

    attr: Float[Tensor, "unit layer d"]
    p_base: Float[Tensor, "unit layer"]
    steps_used: Int[Tensor, "unit layer"]
    evaluations: Int[Tensor, " unit"]


def make_units(model: Model, items: Sequence[tuple[Sequence[int], Sequence[int]]], hook_names: Sequence[str],
               layers: Sequence[int], baseline: Tensor | None = None,
               baselines: Sequence[Tensor | None] | None = None,
               one_pass: bool | None = None) -> tuple[list[Unit], PaddedPrefix]:
    """Units of ``(prompt ids, answer ids)`` samples (one per answer token) and their prefixes.

    One forward of ``prompt ⊕ answer[:-1]`` per sample gives every answer token's clean activations,
    clean probability, residual stream and prefix keys/values; the returned prefix holds one row per
    sample (its whole run), which every answer token's unit reads up to its own position (``Unit.row``).
    Samples whose runs are the same (the same tokens and scored positions; SIG's words of one query) share
    one forward and one prefix row.
    On an accelerator the samples' forwards are one right-padded pass (:meth:`Model.context_states_many`:
    one pass's launches instead of one per sample, about a quarter of ``steps="auto"``'s time at 7B); on a
    CPU each runs alone (the padding would cost compute, and a sample's result then does not depend on
    the samples beside it to the last bit, which resumed runs rely on).

    Args:
        model: The model.
        items: ``(prompt ids, answer ids)`` per sample.
        hook_names: The neuron site's hook of each scored layer.
        layers: The scored layers (model layer of each hook).
        baseline: ``[n_layers, d]`` baseline of every sample (default zeros).
        baselines: Per sample, its own ``[n_layers, d]`` baseline (``None`` entries: ``baseline``).
        one_pass: Run the samples' forwards as one padded pass (default: on an accelerator, not on a CPU).

    Returns:
        ``(units, prefix)``: one :class:`Unit` per answer token of every sample, in order, and the
        :class:`PaddedPrefix` with one row per distinct run (samples with the same tokens and scored positions share
        one, e.g. SIG's words of a query).
    """
    units = []
    states_names = [get_site("resid_pre").hook_name(int(l)) for l in layers]
    all_seqs = [[int(x) for x in (*p_ids, *t_ids[:-1])] for p_ids, t_ids in items]
    all_firsts = [max(len(p_ids) - 1, 0) for p_ids, _ in items]  # the positions whose next token is scored start here
    # samples with the same run (SIG's words of one query: the same prompt, other baselines) share one clean run
    run_of: dict[tuple[tuple[int, ...], int], int] = {}
    which = [run_of.setdefault((tuple(q), f), len(run_of)) for q, f in zip(all_seqs, all_firsts)]
    seqs = [list(q) for q, _ in run_of]
    firsts = [f for _, f in run_of]
    if one_pass if one_pass is not None else runtime_device.one_pass_default(model):
        runs, prefix = model.context_states_many(seqs, hook_names, states_names, firsts)  # one padded pass
    else:
        runs, parts = [], []
        for seq, first in zip(seqs, firsts):
            acts, states, logits, cache = model.context_states(seq, hook_names, states_names, logits_from=first)
            runs.append((acts, states, logits))
            parts.append((cache, len(seq)))
        prefix = model.stack_prefixes(parts)
    probs = []  # every unit's clean probability, read back to the host in one copy (not one sync per unit)
    for (p_ids, t_ids), r in zip(items, which):
        logits = runs[r][2]
        at = torch.arange(len(p_ids) - 1, len(p_ids) + len(t_ids) - 1) - firsts[r]
        tid = torch.tensor([int(x) for x in t_ids], device=logits.device)
        probs.append(logits[at.to(logits.device)].float().softmax(-1).gather(-1, tid[:, None])[:, 0])
    p_clean = torch.cat(probs).tolist() if probs else []
    for k, ((p_ids, t_ids), r) in enumerate(zip(items, which)):
        seq, (acts, states, _) = seqs[r], runs[r]
        own = baselines[k] if baselines is not None and baselines[k] is not None else baseline
        for t, tid in enumerate(t_ids):
            pos = len(p_ids) + t - 1
            w_bar = acts[pos]
            base = torch.zeros_like(w_bar) if own is None else own[list(layers)].to(w_bar)
            units.append(Unit(tuple(seq[: pos + 1]), int(tid), w_bar, base, p_clean[len(units)], r, states[pos]))
    return units, prefix


def _layer_groups(n_li: int, n_chunks: int) -> list[range]:
    per = max(1, math.ceil(n_li / max(n_chunks, 1)))
    return [range(s, min(s + per, n_li)) for s in range(0, n_li, per)]


def run_rows(model: Model, units: Sequence[Unit], prefix: PaddedPrefix, hook_names: Sequence[str],
             layers: Sequence[int], cfg: IGConfig, batch_rows: int, steps: Int[Tensor, "unit layer"],
             with_base: bool | Sequence[bool]) -> tuple[Float[Tensor, "unit layer d"], Float[Tensor, "unit layer"]]:
    """One round: layer ``i`` of unit ``g`` at ``steps[g, i]`` nodes (0: skipped), batched across units.

    Staged rows (:mod:`tlcap.attribution.staged`: every row joins the pass at its own layer) where the
    model allows them, else rows after per-unit prefixes in layer groups (:meth:`Model.continue_rows`).

    Args:
        model: The model.
        units: The units (:func:`make_units`).
        prefix: Their prefixes (:func:`make_units`).
        hook_names: The neuron site's hook of each scored layer.
        layers: The scored layers.
        cfg: The settings (``rule``, ``late_expand``).
        batch_rows: Rows per batch.
        steps: ``[units, layers]`` quadrature nodes per layer this round (0: skipped).
        with_base: Also run each layer's baseline row (``p_base``): for every unit, or per unit.

    Returns:
        ``attr`` (zero where skipped; on the units' device: a round's dense result is not copied to the host)
        and ``p_base`` (NaN where not computed; CPU), float64.
    """
    with weights_fixed():  # values read from the weights (the read-out's bias check) once, not once per batch
        return _run_rows(model, units, prefix, hook_names, layers, cfg, batch_rows, steps, with_base)


def _run_rows(model: Model, units: Sequence[Unit], prefix: PaddedPrefix, hook_names: Sequence[str],
              layers: Sequence[int], cfg: IGConfig, batch_rows: int, steps: Tensor,
              with_base: bool | Sequence[bool]) -> tuple[Tensor, Tensor]:
    """:func:`run_rows` inside its :func:`~tlcap.runtime.fixed.weights_fixed` block."""
    with_base = [bool(with_base)] * len(units) if isinstance(with_base, bool) else [bool(b) for b in with_base]
    if cfg.late_expand and all(u.at < 0 for u in units) and staged_applies(model, hook_names):
        return run_staged(model, units, prefix, hook_names, layers, cfg, batch_rows, steps, with_base)
    n_u, n_li = steps.shape
    dev = units[0].w_bar.device
    attr = torch.zeros(n_u, n_li, units[0].w_bar.shape[-1], dtype=torch.float64, device=dev)
    p_base = torch.full((n_u, n_li), float("nan"), dtype=torch.float64, device=dev)  # to the host once, at the end
    conts = [u.context[u.at:] if u.at >= 0 else u.context[-1:] for u in units]
    for q in sorted({len(c) for c in conts}):  # rows after their prefixes, one continuation length per pass
        sel = [g for g, c in enumerate(conts) if len(c) == q]
        sub = prefix.select([units[g].row for g in sel], [len(units[g].context) - len(conts[g]) for g in sel])
        a_q, p_q = _rows_after_prefixes(model, [units[g] for g in sel], [list(conts[g]) for g in sel], sub, hook_names,
                                        layers, cfg, batch_rows, steps[sel], [with_base[g] for g in sel])
        attr[sel], p_base[sel] = a_q, p_q
    return attr, p_base.cpu()


def _rows_after_prefixes(model: Model, units: Sequence[Unit], conts: list[list[int]], prefix: PaddedPrefix,
                         hook_names: Sequence[str], layers: Sequence[int], cfg: IGConfig, batch_rows: int,
                         steps: Tensor, with_base: list[bool]) -> tuple[Tensor, Tensor]:
    """:func:`run_rows` as rows after per-unit prefixes (:meth:`Model.continue_rows`), in layer groups; every
    unit continues its prefix with ``conts[g]`` (equal lengths), the first of which is scaled. Returns
    ``(attr, p_base)``, both on the units' device."""
    n_u, n_li = steps.shape
    W = torch.stack([u.w_bar for u in units])
    B = torch.stack([u.base for u in units])
    D = W - B
    dev = W.device
    grad_acc = torch.zeros(n_u * n_li, W.shape[-1], dtype=torch.float64, device=dev)
    p_base = torch.full((n_u, n_li), float("nan"), dtype=torch.float64, device=dev)  # to the host once, at the end
    rules = {int(m): quadrature(int(m), cfg.rule) for m in steps.unique().tolist() if m > 0}
    zero_first = {m: bool(a[0] == 0.0) for m, (a, _) in rules.items()}  # α = 0 is the baseline row itself
    tids = torch.tensor([u.target_id for u in units])
    for group in _layer_groups(n_li, cfg.layer_chunks):
        ru, rl, ra, rw, rb = [], [], [], [], []
        for g in range(n_u):
            for i in group:
                m = int(steps[g, i])
                if m == 0:
                    continue
                a, w = rules[m]
                extra = int(with_base[g] and not zero_first[m])
                k = len(a) + extra
                ru += [g] * k
                rl += [i] * k
                ra += a.tolist() + [0.0] * extra
                rw += w.tolist() + [0.0] * extra
                rb += ([with_base[g]] + [False] * (len(a) - 1) if zero_first[m] else [False] * len(a)) + [True] * extra
        for s in range(0, len(ru), batch_rows):
            u_ = torch.tensor(ru[s:s + batch_rows])
            l_ = torch.tensor(rl[s:s + batch_rows])
            a_ = torch.tensor(ra[s:s + batch_rows], dtype=torch.float64).to(dev, torch.float32)
            w_ = torch.tensor(rw[s:s + batch_rows], dtype=torch.float64).to(dev)
            b_ = torch.tensor(rb[s:s + batch_rows])
            vals = (B[u_, l_].float() + a_[:, None] * D[u_, l_].float()).to(W.dtype)
            leaf = vals.detach().clone().requires_grad_(True)
            fwd = []
            for i in l_.unique().tolist():
                sel = (l_ == i).nonzero().flatten()
                fwd.append((hook_names[i], H.replace_rows(sel, 0, leaf[sel])))
            lowest = min(layers[i] for i in l_.unique().tolist())
            counts = torch.bincount(u_, minlength=n_u)
            with torch.enable_grad():
                logits = model.continue_rows(conts, prefix, counts, hooks=fwd, expand_at=lowest if cfg.late_expand else None)
                probs = logits.float().softmax(-1)[torch.arange(len(u_)), tids[u_].to(logits.device)]
                grad = torch.autograd.grad(probs.sum(), leaf)[0]
            grad_acc.index_add_(0, (u_ * n_li + l_).to(dev), grad.double() * w_[:, None])
            idx = b_.nonzero().flatten()
            p_base[u_[idx].to(dev), l_[idx].to(dev)] = probs.detach()[idx.to(probs.device)].double().to(dev)
    return D.double() * grad_acc.view(n_u, n_li, -1), p_base  # both on the device (run_rows copies p_base once)


def _worst_layers(err: Float[Tensor, "unit layer"], budget: Float[Tensor, " unit"],
                  allowed: Bool[Tensor, "unit layer"]) -> Bool[Tensor, "unit layer"]:
    """Per unit over budget: its largest-error allowed layers, fewest first, until the rest fit the budget."""
    order = err.masked_fill(~allowed, -1.0).argsort(1, descending=True)
    e_sorted = err.gather(1, order) * allowed.gather(1, order)
    rest = err.sum(1, keepdim=True) - e_sorted.cumsum(1)  # error left after refining the first k+1
    need = torch.cat([torch.ones_like(rest[:, :1], dtype=torch.bool), rest[:, :-1] > budget[:, None]], 1)
    pick = need & allowed.gather(1, order) & (err.sum(1, keepdim=True) > budget[:, None])
    return torch.zeros_like(allowed).scatter(1, order, pick)


Round = tuple[Tensor, IGConfig, bool]
"""A round a :func:`ig_rounds` generator asks for: ``(steps [units, layers], settings, with_base)``."""


def ig_rounds(units: Sequence[Unit], n_layers: int, cfg: IGConfig) -> Generator[Round, tuple[Tensor, Tensor], UnitsIG]:
    """The rounds of :func:`ig_units` as a generator: it yields each round it needs (:data:`Round`), is sent that
    round's ``(attr, p_base)`` (:func:`run_rows`), and returns the :class:`UnitsIG`.

    The rounds of several generators can run in one :func:`run_rows` call (:func:`ig_units_stream`): a round's
    result does not depend on what else shares its batches.

    Args:
        units: The units.
        n_layers: Scored layers per unit.
        cfg: The settings (``steps`` fixed or ``"auto"``).

    Returns:
        The :class:`UnitsIG` (as the generator's return value).
    """
    n_u, n_li = len(units), n_layers
    auto = cfg.steps == "auto"
    nested = auto and cfg.rule == "trapezoid"  # refined by adding midpoints (module docstring)
    m0 = min(AUTO_START + int(nested), int(cfg.max_steps)) if auto else int(cfg.steps)
    steps = torch.full((n_u, n_li), m0, dtype=torch.long)
    attr, p_base = yield steps, cfg, True
    a0 = quadrature(m0, cfg.rule)[0]
    evaluations = torch.full((n_u,), n_li * (len(a0) + int(bool(a0[0] != 0.0))), dtype=torch.long)
    p_clean = torch.tensor([u.p_clean for u in units], dtype=torch.float64)
    delta = p_clean[:, None] - p_base
    mid = cfg.replace(rule="midpoint")
    while auto:
        err = (attr.sum(-1).cpu() - delta).abs()
        den = delta.abs().sum(1)
        budget = cfg.tol * den.clamp_min(DELTA_FLOOR)
        bigger = steps * 2 - 1 if nested else steps * 2
        cap = cfg.max_steps + int(nested)  # trapezoid: max_steps intervals (max_steps + 1 points)
        redo = _worst_layers(err, budget, (err > cfg.tol * delta.abs()) & (bigger <= cap) & (steps > 1))
        if not bool(redo.any()):
            break
        if nested:  # the midpoints of the current intervals: T_2n = (T_n + M_n) / 2
            run = torch.where(redo, steps - 1, torch.zeros_like(steps))
            a2, _ = yield run, mid, False
            r = redo.to(attr.device)
            attr[r] = 0.5 * (attr[r] + a2[r])
        else:
            run = torch.where(redo, bigger, torch.zeros_like(steps))
            a2, _ = yield run, cfg, False
            r = redo.to(attr.device)
            attr[r] = a2[r]
        steps = torch.where(redo, bigger, steps)
        rule = "midpoint" if nested else cfg.rule
        evaluations += torch.tensor([sum(n_points(int(m), rule) for m in row if m > 0) for row in run.tolist()],
                                    dtype=torch.long)
    return UnitsIG(attr=attr, p_base=p_base, steps_used=steps, evaluations=evaluations)


def ig_units(model: Model, units: Sequence[Unit], prefix: PaddedPrefix, hook_names: Sequence[str],
             layers: Sequence[int], cfg: IGConfig, batch_rows: int) -> UnitsIG:
    """Exact IG of every unit (``prefix``: their prefixes, from :func:`make_units`), rows batched
    across units; ``cfg.steps`` fixed or ``"auto"``.

    Args:
        model: The model.
        units: The units (:func:`make_units`).
        prefix: Their prefixes (:func:`make_units`).
        hook_names: The neuron site's hook of each scored layer.
        layers: The scored layers.
        cfg: The settings (``steps`` fixed or ``"auto"`` with ``tol`` / ``max_steps``; ``rule``).
        batch_rows: Rows per batch.

    Returns:
        A :class:`UnitsIG`: attribution (CPU), baseline probability and steps used per unit and layer, and
        the gradient rows run per unit.
    """
    res = next(ig_units_stream(model, [(units, prefix)], hook_names, layers, cfg, batch_rows, depth=1))
    return dataclasses.replace(res, attr=res.attr.cpu())


def _step(model: Model, units: Sequence[Unit], prefix: PaddedPrefix, hook_names: Sequence[str], layers: Sequence[int],
          cfg: IGConfig, batch_rows: int | Callable[[int, int], int], steps: Tensor,
          with_base: list[bool]) -> tuple[Tensor, Tensor]:
    """One :func:`run_rows` call of a stream step (``batch_rows`` a function: sized, and halved on out-of-memory)."""
    if not callable(batch_rows):
        return run_rows(model, units, prefix, hook_names, layers, cfg, int(batch_rows), steps, with_base)
    rows = int(steps.sum()) + sum(with_base) * len(layers)
    start = batch_rows(rows, max(len(u.context) for u in units))
    return run_auto_batched(lambda b: run_rows(model, units, prefix, hook_names, layers, cfg, b, steps, with_base),
                            start, model.device)


@dataclass
class _Job:
    """A window of units in :func:`ig_units_stream`: its rounds, its prefix, the round it waits for."""

    gen: Generator[Round, tuple[Tensor, Tensor], UnitsIG]
    units: Sequence[Unit]
    prefix: PaddedPrefix
    request: Round | None
    result: UnitsIG | None = None


def ig_units_stream(model: Model, windows: Iterable[tuple[Sequence[Unit], PaddedPrefix]], hook_names: Sequence[str],
                    layers: Sequence[int], cfg: IGConfig, batch_rows: int | Callable[[int, int], int],
                    depth: int = STREAM_DEPTH) -> Iterator[UnitsIG]:
    """:func:`ig_units` of a stream of windows (each ``(units, prefix)`` of :func:`make_units`), rounds of
    several windows in one call, results in window order.

    Every step admits the next window and runs, in one :func:`run_rows` call (one set of batches), its
    first round together with the round every earlier unfinished window waits for (with ``steps="auto"``:
    the refinements of the windows before it), so a refinement round of a few units does not run as
    small batches of its own. At most ``depth`` windows are in flight (admitted and not yet returned).
    Each window's result is exactly :func:`ig_units`' (a round's rows do not depend on what shares
    their batches; equal up to float rounding, tested).

    Args:
        model: The model.
        windows: ``(units, prefix)`` per window, consumed one per step.
        hook_names: The neuron site's hook of each scored layer.
        layers: The scored layers.
        cfg: The settings (as :func:`ig_units`).
        batch_rows: Rows per batch; or a function of a step's rows and longest context giving the rows per batch,
            then halved and the step rerun on out-of-memory (:func:`tlcap.runtime.batching.run_auto_batched`).
        depth: Windows in flight at most (``>= 1``; 1 runs each window alone, as :func:`ig_units`).

    Yields:
        One :class:`UnitsIG` per window, in order (its ``attr`` on the model's device: the caller reduces it
        there).
    """
    todo = iter(windows)
    active: list[_Job] = []
    more = True
    while True:
        if more and len(active) < max(1, depth):
            nxt = next(todo, None)
            if nxt is None:
                more = False
            else:
                gen = ig_rounds(nxt[0], len(layers), cfg)
                active.append(_Job(gen, nxt[0], nxt[1], next(gen)))
        while active and active[0].result is not None:
            res = active.pop(0).result
            assert res is not None
            yield res
        if not active:
            if more:
                continue
            return
        waiting = [(j, j.request) for j in active if j.request is not None]  # this step's round of each window
        for rule in dict.fromkeys(r[1].rule for _, r in waiting):  # one call per rule (trapezoid refines by midpoints)
            group = [(j, r) for j, r in waiting if r[1].rule == rule]
            units, offset = [], 0
            for j, _ in group:
                units += [dataclasses.replace(u, row=u.row + offset) for u in j.units] if offset else list(j.units)
                offset += j.prefix.rows
            steps = torch.cat([r[0] for _, r in group])
            with_base = [bool(r[2]) for j, r in group for _ in j.units]
            attr, p_base = _step(model, units, concat_prefixes([j.prefix for j, _ in group]), hook_names, layers,
                                 group[0][1][1], batch_rows, steps, with_base)
            k = 0
            for j, _ in group:
                n = len(j.units)
                try:
                    j.request = j.gen.send((attr[k:k + n], p_base[k:k + n]))
                except StopIteration as done:
                    j.request, j.result = None, done.value
                k += n


__all__ = ["Unit", "UnitsIG", "make_units", "run_rows", "ig_rounds", "ig_units", "ig_units_stream", "AUTO_START",
           "STREAM_DEPTH"]
