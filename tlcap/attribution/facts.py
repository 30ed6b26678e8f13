"""Exact IG of many facts at once: the rows of several prompts share batches.

Every answer token of every fact is a unit (:mod:`tlcap.attribution.grouped`); one clean run per
fact records what its units need (activations, residual stream, the keys/values of its prefix), and
:func:`~tlcap.attribution.grouped.ig_units` runs the rows of all units in shared batches (staged rows,
:mod:`tlcap.attribution.staged`, where the model allows). Rows are independent, so each fact's
result equals :func:`tlcap.attribution.integrated_gradients` on that fact alone, up to float rounding
(tested on every family). This is also how one fact runs: a single-fact call is a one-fact list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from tlcap.attribution.config import IGConfig
from tlcap.attribution.grouped import UnitsIG, ig_units, make_units
from tlcap.attribution.neuron_attribution import NeuronAttribution, target_labels
from tlcap.attribution.quadrature import quadrature
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime.batching import auto_batch_rows, ig_row_bytes, run_auto_batched
from tlcap.runtime.sites import get_site

Fact = tuple[str, "str | Sequence[int]"]
"""``(prompt, target)``: the target as a string (``" Paris"``) or its token ids."""


def facts_rows(model: Model, tokens: Sequence[tuple[list[int], list[int]]], layers: Sequence[int],
               cfg: IGConfig) -> tuple[int, int]:
    """``(total rows, bytes per row)`` of exact IG over these ``(prompt ids, target ids)`` (for ``batch_rows="auto"``).

    Args:
        model: The model (bytes of a row).
        tokens: ``(prompt ids, target ids)`` per fact.
        layers: The scored layers.
        cfg: The settings (``steps``, or ``max_steps`` when ``"auto"``; ``rule``).

    Returns:
        ``(total rows, bytes per row)``: gradient rows of every target token, layer and node (plus the
        baseline row), and the bytes of one row of the longest fact.
    """
    m = cfg.max_steps if cfg.steps == "auto" else int(cfg.steps)
    per_layer = len(quadrature(m, cfg.rule)[0]) + 1
    total = sum(len(t) for _, t in tokens) * len(layers) * per_layer
    longest = max(len(p) + len(t) for p, t in tokens)
    return total, ig_row_bytes(model, longest)


def ig_of_facts(model: Model, facts: Sequence[Fact], tokens: Sequence[tuple[list[int], list[int]]], cfg: IGConfig,
                layers: Sequence[int], baselines: Sequence[Tensor | None] | None = None,
                asked: IGConfig | None = None) -> list[NeuronAttribution]:
    """Exact IG (``cfg.method == "ig"``) of ``facts`` whose rows share batches (module docstring).

    Args:
        model: The model (TransformerBridge backend).
        facts: ``(prompt, target)`` per fact (for the results' labels).
        tokens: ``(prompt ids, target ids)`` per fact (:func:`tlcap.attribution.batched.fact_tokens`).
        cfg: The settings (``batch_rows`` an int or ``"auto"``).
        layers: The scored layers.
        baselines: Per fact, its ``[n_layers, d]`` baseline (``None``: zeros).
        asked: The settings recorded in the provenance (default ``cfg``).

    Returns:
        One :class:`NeuronAttribution` per fact, in order.
    """
    asked = asked or cfg
    if cfg.batch_rows == "auto":
        total, row_bytes = facts_rows(model, tokens, layers, cfg)
        longest = max(len(p) + len(t) for p, t in tokens)
        rows = auto_batch_rows(row_bytes, total, cfg.max_memory, model.device, model=model, kind="ig", context_len=longest)
        return run_auto_batched(lambda b: ig_of_facts(model, facts, tokens, cfg.replace(batch_rows=b), layers, baselines,
                                                      asked), rows, model.device)
    site = get_site(cfg.site)
    hook_names = [site.hook_name(l) for l in layers]
    units, prefix = make_units(model, tokens, hook_names, layers, baselines=baselines)
    res = ig_units(model, units, prefix, hook_names, layers, cfg, int(cfg.batch_rows))
    prov = Provenance.collect(model, asked)
    w_bars = torch.stack([u.w_bar for u in units]).float().cpu()  # one copy to the host, not one per unit
    out, k = [], 0
    for (prompt, target), (_, t_ids) in zip(facts, tokens):
        sl = slice(k, k + len(t_ids))
        out.append(_result(model, prompt, target, t_ids, units[sl], w_bars[sl], res, sl, layers, cfg, prov))
        k += len(t_ids)
    return out


def _result(model: Model, prompt: str, target: Any, t_ids: list[int], units: Sequence[Any], w_bars: Tensor,
            res: UnitsIG, sl: slice, layers: Sequence[int], cfg: IGConfig, prov: Provenance) -> NeuronAttribution:
    """One fact's :class:`NeuronAttribution` from its units' rows of ``res`` (``w_bars``: their clean activations,
    on the host)."""
    L, d, nT = model.n_layers, model.d_mlp, len(t_ids)
    li = list(layers)
    scores = torch.zeros(nT, L, d, dtype=torch.float64)
    p_full = torch.zeros(nT, L, dtype=torch.float64)
    p_base = torch.zeros(nT, L, dtype=torch.float64)
    acts = torch.zeros(nT, L, d)
    scores[:, li] = res.attr[sl]
    p_base[:, li] = res.p_base[sl]
    for t, u in enumerate(units):
        p_full[t, li] = u.p_clean
    acts[:, li] = w_bars
    meta: dict[str, Any] = {}
    steps: int | str = cfg.steps
    if cfg.steps == "auto":
        used = torch.zeros(nT, L, dtype=torch.long)
        used[:, li] = res.steps_used[sl]
        steps = int(res.steps_used[sl].max())
        meta = {"steps": "auto", "tol": cfg.tol, "steps_used": used.tolist(), "evaluations": int(res.evaluations[sl].sum())}
    return NeuronAttribution(
        scores=scores.mean(0).float(), prob_full=p_full.float(), prob_baseline=p_base.float(),
        layer_sums=scores.sum(-1).float(), activations=acts, prompt=prompt,
        **target_labels(model, target, t_ids),
        model_name=model.name, site=cfg.site, method=cfg.method, steps=steps, rule=cfg.rule, layers=tuple(li),
        meta=meta, provenance=prov,
    )


__all__ = ["Fact", "facts_rows", "ig_of_facts"]
