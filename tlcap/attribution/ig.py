"""Integrated gradients on MLP neurons (knowledge-neuron attribution, Dai et al. 2022).

For a prompt x and gold token y, ``P(w) = p(y | x, neuron activations at the last position of
one layer set to w)``; ``Attr_j = (w̄_j - b_j) · ∫₀¹ ∂P(b + α(w̄ - b))/∂w_j dα`` with baseline
``b = 0`` (Dai) or a given baseline (AMIG). One layer is scaled at a time; the others keep their
clean values. The integral is a quadrature rule (:mod:`tlcap.attribution.quadrature`), computed
with the exact batched runs of :mod:`tlcap.attribution.batched`.

Cheaper estimators, labelled as such: ``method="joint"`` scales all layers at once (one batch
of ``steps`` rows; completeness holds jointly, not per layer) and ``method="grad_x_act"``
(gradient × activation, one backward pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.batched import clean_last, fact_tokens, layer_chunks, scaled_batch
from tlcap.attribution.config import IGConfig
from tlcap.attribution.facts import Fact, ig_of_facts
from tlcap.attribution.neuron_attribution import (
    SUMMARY_TOP,
    CompletenessRow,
    Method,
    NeuronAttribution,
    NeuronScoreRow,
    Rule,
    target_labels,
)
from tlcap.attribution.quadrature import RULES, quadrature
from tlcap.attribution.staged import staged_applies
from tlcap.config import check_int
from tlcap.errors import InvalidConfigError
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime.batching import auto_batch_rows, ig_row_bytes, run_auto_batched
from tlcap.runtime.sites import get_site


def integrated_gradients(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    baseline: Float[Tensor, "layer d_mlp"] | None = None,
    progress: bool = False,
    **overrides: Any,
) -> NeuronAttribution:
    """Integrated-gradient attribution of every MLP neuron for ``prompt → target``.

    Args:
        model: A :class:`tlcap.models.Model`.
        prompt: The query, e.g. ``"The capital of France is"``.
        target: The answer string (``" Paris"``) or its token ids. Multi-token targets are scored
            by teacher forcing and averaged over their tokens (CNL eq. 7).
        config: The attribution settings (:class:`~tlcap.attribution.config.IGConfig`: steps,
            quadrature rule, estimator ``method``, neuron ``site``, ``layers`` and the exact speed
            knobs ``batch_rows``/``prefix_reuse``/``late_expand``/``layer_chunks``); default
            ``IGConfig()``.
        baseline: ``[n_layers, d]`` baseline activations (default zeros); AMIG passes the
            activations of an all-<eos> prompt.
        progress: Show a progress bar.
        **overrides: Fields of ``config`` to override (``steps=10``, ``rule="left"``, ...).

    Returns:
        A :class:`NeuronAttribution` with provenance (the model and ``config``) attached.

    Raises:
        InvalidConfigError: an invalid setting (before any forward pass), or a layer beyond
            the model.
        TargetTokenizationError: a token-boundary problem between prompt and target (see
            :meth:`tlcap.models.Model.target_ids`).
        PromptTooLongError: prompt + target do not fit the context window.

    Example:
        >>> attr = integrated_gradients(model, "The capital of France is", " Paris", steps=2)
        >>> neurons = attr.select(threshold=0.2)
        >>> tuple(attr.scores.shape), len(neurons), round(attr.summary()["completeness_rel_error"], 3)
        ((2, 256), 34, 0.004)
    """
    cfg = IGConfig.resolve(config, **overrides)
    p_ids, t_ids = fact_tokens(model, prompt, target)
    layer_list = _layers(model, cfg)
    if _shared_rows(model, cfg, layer_list):  # the rows engine of many facts, with one fact
        return ig_of_facts(model, [(prompt, target)], [(p_ids, t_ids)], cfg, layer_list, [baseline])[0]
    if cfg.batch_rows == "auto":  # largest batch in the budget, rerun at half on out-of-memory: same result
        n_rows = len(layer_list) * (len(quadrature(cfg.max_steps if cfg.steps == "auto" else cfg.steps, cfg.rule)[0]) + 1)
        rows = auto_batch_rows(ig_row_bytes(model, len(p_ids) + len(t_ids)), n_rows, cfg.max_memory, model.device,
                               model=model, kind="ig", context_len=len(p_ids) + len(t_ids))
        # the provenance keeps the settings asked for ("auto"), not the size it resolved to
        return run_auto_batched(lambda b: integrated_gradients(model, prompt, target, config=cfg.replace(batch_rows=b),
                                                               baseline=baseline, progress=progress), rows, model.device,
                                asked=cfg)
    s = get_site(cfg.site)
    hook_names = [s.hook_name(l) for l in layer_list]
    alphas, weights = quadrature(cfg.steps, cfg.rule)
    L, d, nT = model.n_layers, model.d_mlp, len(t_ids)
    scores = torch.zeros(nT, L, d, dtype=torch.float64)
    p_full = torch.zeros(nT, L, dtype=torch.float64)
    p_base = torch.zeros(nT, L, dtype=torch.float64)
    sums = torch.zeros(nT, L, dtype=torch.float64)
    acts_all = torch.zeros(nT, L, d)
    rows_per_layer = len(alphas) + 1  # the quadrature points, then one baseline row (α = 0)
    per_token = len(layer_chunks(len(layer_list), rows_per_layer, cfg.batch_rows, cfg.layer_chunks)) if cfg.method == "ig" else 1
    bar = tqdm(total=nT * per_token, desc=f"IG {prompt[:30]!r}", disable=not progress, leave=False)
    for t in range(nT):
        run = _Run(model, p_ids + t_ids[:t], t_ids[t], hook_names, layer_list, cfg)
        acts_all[t, layer_list] = run.w_bar.float().cpu()
        base = torch.zeros_like(run.w_bar) if baseline is None else baseline[layer_list].to(run.w_bar)
        p_full[t, layer_list] = run.p_clean
        if cfg.method == "ig":
            attr, pb = run.per_layer(base, alphas, weights, bar)
        elif cfg.method == "joint":
            attr, pb = run.joint(base, alphas, weights)
        else:  # grad_x_act (IGConfig admits no other method)
            attr, pb = run.grad_x_act(base)
        p_base[t, layer_list] = pb
        scores[t, layer_list] = attr
        sums[t, layer_list] = attr.sum(-1)
        bar.update(0 if cfg.method == "ig" else 1)
    bar.close()
    return NeuronAttribution(
        scores=scores.mean(0).float(),
        prob_full=p_full.float(),
        prob_baseline=p_base.float(),
        layer_sums=sums.float(),
        activations=acts_all,
        prompt=prompt,
        **target_labels(model, target, t_ids),
        model_name=model.name,
        site=cfg.site,
        method=cfg.method,
        steps=cfg.steps,
        rule=cfg.rule,
        layers=tuple(layer_list),
        provenance=Provenance.collect(model, cfg),
    )


def _layers(model: Model, cfg: IGConfig) -> list[int]:
    """The scored layers; a layer beyond the model is an :class:`InvalidConfigError`."""
    layer_list = list(range(model.n_layers)) if cfg.layers is None else [int(l) for l in cfg.layers]
    if any(l >= model.n_layers for l in layer_list):
        raise InvalidConfigError(
            f"layers (--layers) must be below {model.n_layers} for {model.name}, got {max(layer_list)}"
        )
    return layer_list


def _shared_rows(model: Model, cfg: IGConfig, layers: list[int]) -> bool:
    """Whether exact IG runs on the rows engine shared by many facts (:mod:`tlcap.attribution.facts`).

    Exact IG (``method="ig"``) with the exact speed-ups on (``prefix_reuse``, ``late_expand``) on a model
    that runs staged rows; ``steps="auto"`` always (it needs rows after padded prefixes, a
    TransformerBridge). The estimators and the compare-only settings run one fact at a time.
    """
    if cfg.method != "ig":
        return False
    names = [get_site(cfg.site).hook_name(l) for l in layers]
    return cfg.steps == "auto" or (cfg.prefix_reuse and cfg.late_expand and staged_applies(model, names))


def integrated_gradients_facts(
    model: Model,
    facts: Sequence[Fact],
    *,
    config: IGConfig | None = None,
    baselines: Sequence[Float[Tensor, "layer d_mlp"] | None] | None = None,
    fact_batch: int = 32,
    progress: bool = False,
    **overrides: Any,
) -> list[NeuronAttribution]:
    """:func:`integrated_gradients` of every ``(prompt, target)`` fact, the rows of several facts in shared batches.

    Exact IG puts the rows of up to ``fact_batch`` facts into the same forward passes
    (:mod:`tlcap.attribution.facts`); the estimators (``method="joint"``, ``"grad_x_act"``), the
    compare-only settings and models without staged rows run one fact at a time. Each result equals
    :func:`integrated_gradients` on its fact alone up to float rounding.

    Args:
        model: The model.
        facts: ``(prompt, target)`` pairs; a target is the answer string or its token ids.
        config: The attribution settings (:class:`IGConfig`), as for :func:`integrated_gradients`.
        baselines: Per fact, its ``[n_layers, d]`` baseline (``None``: zeros), e.g. AMIG's.
        fact_batch: Facts whose rows share batches, ``>= 1`` (memory: their clean runs' keys/values
            are kept together). Exact: results do not depend on it.
        progress: A progress bar over the facts.
        **overrides: :class:`IGConfig` fields to override.

    Returns:
        One :class:`NeuronAttribution` per fact, in order.

    Raises:
        InvalidConfigError: an invalid setting or layer (before any forward pass).
        TargetTokenizationError: a token-boundary problem of a fact.
        PromptTooLongError: a fact does not fit the context window.

    Example:
        >>> attrs = integrated_gradients_facts(model, [("The capital of France is", " Paris"),
        ...                                            ("The capital of Italy is", " Rome")], steps=2)
        >>> [len(a.select(threshold=0.2)) for a in attrs]
        [34, 67]
    """
    cfg = IGConfig.resolve(config, **overrides)
    check_int("fact_batch", fact_batch, min=1, cli=None)
    layer_list = _layers(model, cfg)
    tokens = [fact_tokens(model, p, t) for p, t in facts]  # every fact checked before any forward pass
    bases = list(baselines) if baselines is not None else [None] * len(facts)
    if len(bases) != len(facts):
        raise InvalidConfigError(f"baselines needs one entry per fact ({len(facts)}), got {len(bases)}")
    out: list[NeuronAttribution] = []
    bar = tqdm(total=len(facts), desc="IG facts", disable=not progress, unit="fact")
    if not _shared_rows(model, cfg, layer_list):
        for (p, t), b in zip(facts, bases):
            out.append(integrated_gradients(model, p, t, config=cfg, baseline=b))
            bar.update(1)
    else:
        for s in range(0, len(facts), fact_batch):
            sl = slice(s, s + fact_batch)
            out += ig_of_facts(model, list(facts[sl]), tokens[sl], cfg, layer_list, bases[sl])
            bar.update(len(facts[sl]))
    bar.close()
    return out


class _Run:
    """One teacher-forced position of :func:`integrated_gradients`: its clean run and estimators."""

    def __init__(self, model: Model, context: list[int], target_id: int, hook_names: list[str], layers: list[int],
                 cfg: IGConfig) -> None:
        self.model, self.context, self.tid, self.hook_names, self.layers, self.cfg = (
            model, context, target_id, hook_names, layers, cfg)
        self.w_bar, logits, self.prefix = clean_last(model, context, hook_names, cfg.prefix_reuse)
        self.p_clean = float(logits.float().softmax(-1)[target_id])

    def _batch(self, row_layer: Tensor, values: Tensor, need_grad: bool = True,
               late_expand: bool = True) -> tuple[Tensor, Tensor | None]:
        return scaled_batch(self.model, self.context, self.prefix, self.hook_names, row_layer, values, self.tid,
                            need_grad=need_grad, layer_ids=self.layers, late_expand=late_expand)

    def per_layer(self, base: Tensor, alphas: Tensor, weights: Tensor, bar: Any) -> tuple[Tensor, Tensor]:
        """Exact IG, one layer scaled at a time; the steps of all layers batched together."""
        n_li, d = len(self.layers), self.w_bar.shape[-1]
        diff = self.w_bar - base
        m = len(alphas)
        a_row = torch.cat([alphas, torch.zeros(1, dtype=torch.float64)])
        w_row = torch.cat([weights, torch.zeros(1, dtype=torch.float64)])
        row_layer = torch.arange(n_li).repeat_interleave(m + 1)
        row_alpha, row_w = a_row.repeat(n_li), w_row.repeat(n_li)
        dev = self.w_bar.device  # accumulate in float64 on the model's device; one copy to the CPU per token
        grad_acc = torch.zeros(n_li, d, dtype=torch.float64, device=dev)
        row_w = row_w.to(dev)
        p_base = torch.zeros(n_li, dtype=torch.float64)
        for start, stop in layer_chunks(n_li, m + 1, self.cfg.batch_rows, self.cfg.layer_chunks):
            rl = row_layer[start:stop]
            ra = row_alpha[start:stop].to(self.w_bar.device, torch.float32)  # path points in float32, then model dtype
            vals = (base[rl].float() + ra[:, None] * diff[rl].float()).to(self.w_bar.dtype)
            probs, grad = self._batch(rl, vals, late_expand=self.cfg.late_expand)
            assert grad is not None
            grad_acc.index_add_(0, rl.to(dev), grad.double() * row_w[start:stop, None])
            is_base = torch.arange(start, stop) % (m + 1) == m  # each layer's last row: the baseline
            idx = is_base.nonzero().flatten()  # one device-to-host copy per batch, not one per layer
            p_base[rl[idx]] = probs[idx.to(probs.device)].double().cpu()
            bar.update(1)
        return (diff.double() * grad_acc).cpu(), p_base

    def joint(self, base: Tensor, alphas: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        """All layers scaled together (completeness holds jointly)."""
        diff = self.w_bar - base
        a32 = alphas.to(self.w_bar.device, torch.float32)
        vals = (base[None].float() + a32[:, None, None] * diff[None].float()).to(self.w_bar.dtype)
        vals = torch.cat([vals, base[None]])  # last row: all layers at baseline
        probs, grad = self._batch(torch.full((len(alphas) + 1,), -1), vals, late_expand=self.cfg.late_expand)
        assert grad is not None
        w_row = torch.cat([weights, torch.zeros(1, dtype=torch.float64)])
        attr = diff.double().cpu() * (grad.double().cpu() * w_row[:, None, None]).sum(0)
        return attr, probs[-1].double().cpu().expand(len(self.layers))

    def grad_x_act(self, base: Tensor) -> tuple[Tensor, Tensor]:
        """Gradient × (activation − baseline), one backward pass."""
        diff = self.w_bar - base
        _, grad = self._batch(torch.full((1,), -1), self.w_bar[None])
        assert grad is not None
        pb, _ = self._batch(torch.full((1,), -1), base[None], need_grad=False)
        return diff.double().cpu() * grad[0].double().cpu(), pb[0].double().cpu().expand(len(self.layers))


__all__ = ["NeuronAttribution", "NeuronScoreRow", "CompletenessRow", "integrated_gradients", "integrated_gradients_facts",
           "quadrature", "RULES", "SUMMARY_TOP",
           "Rule", "Method"]
