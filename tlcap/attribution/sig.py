"""SIG — Sequential Integrated Gradients (Enguehard 2023), adapted to MLP neurons (QL app. A.4).

Enguehard's SIG attributes word i of the input by integrating along a straight line from a
baseline sequence x̄^i — the input with *only word i* replaced by a mask token — to the input
(QL eqs. 12–14). The QL paper uses it to score knowledge neurons; what tlcap implements is:

1. For every prompt position i, build x̄^i = the prompt with token i replaced by the mask token
   (``<mask>`` if the tokenizer has one, else ``<pad>``, else ``<eos>`` — GPT-2 and SmolLM2 have
   no mask token, so ``<pad>``/``<eos>`` as in the paper).
2. Record the neurons' activations at the last position for x̄^i: ``b^i_l`` (one batched
   forward pass for all i).
3. The input-space straight line x̄^i → x maps to a *curved* path of the neurons; following the
   paper's Riemann approximation at the neuron level, the path is **approximated by the
   straight line b^i → w̄ in neuron space** (one layer scaled at a time, the other layers clean,
   exactly like Dai's IG). This is :func:`integrated_gradients` with ``baseline=b^i``:
   ``SIG_i(w) = (w̄ − b^i) · Σ_k ∂P(b^i + α_k (w̄ − b^i))/∂w · 1/m``.
4. The neuron's score sums the per-word attributions and is normalised by the L2 norm over all
   neurons (eq. 14's ``Σ_j SIG_ij / ‖SIG‖`` with words and neurons exchanging roles — the
   quantity of interest is now a neuron, the sequential part runs over words):
   ``SIG(w) = Σ_i SIG_i(w) / ‖Σ_i SIG_i‖₂``.

Cost: (number of prompt tokens) × the cost of one IG run with the same ``steps`` — ``steps`` is
per word. The per-layer completeness still holds for the un-normalised sum:
``layer_sums`` = Σ_i Σ_j SIG_i and ``prob_baseline`` is stored as
``P(w̄) − Σ_i (P(w̄) − P(b^i))`` so that :attr:`NeuronAttribution.completeness_rel_error` checks
it. Multi-token targets: the baselines b^i are taken at the last prompt position and reused
for every target token (an approximation; the QL analyses use single-token objects).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.attribution.config import IGConfig
from tlcap.attribution.ig import NeuronAttribution, integrated_gradients_facts
from tlcap.errors import InvalidConfigError
from tlcap.models.adapter import Model
from tlcap.runtime import device as runtime_device
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site


def mask_token_id(model: Model) -> int:
    """The token SIG masks words with: ``<mask>``, else ``<pad>``, else ``<eos>``.

    Args:
        model: The model (its tokenizer's special tokens).

    Returns:
        The mask token id.

    Raises:
        InvalidConfigError: the tokenizer has none of the three (pass ``mask_id=`` to :func:`sig`).
    """
    for name in ("mask", "pad", "eos"):
        v = model.special_token_id(name)
        if v is not None:
            return v
    raise InvalidConfigError("The tokenizer has no mask, pad or eos token; pass mask_id= to sig().")


def masked_baselines(model: Model, ids: Sequence[int], mask_id: int, site: str = "mlp_post") -> Float[Tensor, "word layer d_mlp"]:
    """Last-position neuron activations of the prompt with each token masked in turn (one batch).

    Args:
        model: The model.
        ids: The prompt's token ids.
        mask_id: The token that replaces each word (:func:`mask_token_id`).
        site: The neuron site read (``"mlp_post"``: MLP neurons).

    Returns:
        ``[n_words, n_layers, d_mlp]`` float32: row ``i`` is the prompt with token ``i`` masked.
    """
    return masked_baselines_many(model, [ids], mask_id, site)[0]  # one prompt: no padding, the same batch


MASK_ROWS = 1024
"""Masked rows (one per word of every prompt) per right-padded pass of :func:`masked_baselines_many`."""


@torch.no_grad()
def masked_baselines_many(model: Model, ids: Sequence[Sequence[int]], mask_id: int, site: str = "mlp_post",
                          rows: int = MASK_ROWS) -> list[Float[Tensor, "word layer d_mlp"]]:
    """:func:`masked_baselines` of several prompts, their masked rows in right-padded passes of up to ``rows`` rows.

    Each row's neurons are read at its own last token; the padding after a prompt reaches none of its positions
    (causal attention), so each prompt's baselines equal :func:`masked_baselines` of it alone up to the float
    rounding of a batch (an accelerator's path: one pass instead of one per prompt).

    Args:
        model: The model.
        ids: Each prompt's token ids.
        mask_id: The token that replaces each word.
        site: The neuron site read.
        rows: Masked rows per pass (>= 1; memory only).

    Returns:
        Per prompt, ``[n_words, n_layers, d_mlp]`` float32.

    Example:
        >>> ids = [model.encode("The capital of France is"), model.encode("Hi there")]
        >>> many = masked_baselines_many(model, ids, 0)
        >>> [tuple(b.shape[:1]) for b in many], torch.allclose(many[1], masked_baselines(model, ids[1], 0), atol=1e-5)
        ([(5,), (2,)], True)
    """
    masked = []
    for p in ids:
        for i in range(len(p)):
            row = [int(x) for x in p]
            row[i] = int(mask_id)
            masked.append(row)
    s = get_site(site)
    names = [s.hook_name(l) for l in range(model.n_layers)]
    out = []
    for r0 in range(0, len(masked), max(1, int(rows))):
        batch = model.encode_batch(masked[r0:r0 + max(1, int(rows))])
        store: dict[str, Tensor] = {}
        model.last_logits(batch, hooks=[(n, H.record_at(store, n, batch.last_positions)) for n in names])
        dev = store[names[-1]].device  # layers may sit on different devices
        out.append(torch.stack([store[n].to(dev) for n in names], 1).float())
    flat = torch.cat(out)
    res, k = [], 0
    for p in ids:
        res.append(flat[k:k + len(p)])
        k += len(p)
    return res


def sig(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    mask_id: int | None = None,
    normalize: bool = True,
    progress: bool = False,
    **overrides: Any,
) -> NeuronAttribution:
    """Sequential-IG attribution of every MLP neuron for ``prompt → target`` (module docstring).

    Args:
        model: The model.
        prompt: The query.
        target: The answer or its token ids.
        config: Attribution settings (:class:`~tlcap.attribution.config.IGConfig`; ``steps`` are
            the Riemann steps per word and layer).
        mask_id: Mask token (default :func:`mask_token_id`).
        normalize: Divide by the L2 norm over all neurons (eq. 14).
        progress: Progress bar.
        **overrides: Fields of ``config`` to override.

    Returns:
        A :class:`NeuronAttribution` with ``method="sig"``.

    Example:
        >>> attr = sig(model, "The capital of France is", " Paris", steps=2)
        >>> attr.method, tuple(attr.scores.shape)
        ('sig', (2, 256))
    """
    return sig_facts(model, [(prompt, target)], config=config, mask_id=mask_id, normalize=normalize, progress=progress,
                     **overrides)[0]


def sig_facts(
    model: Model,
    facts: Sequence[tuple[str, str | Sequence[int]]],
    *,
    config: IGConfig | None = None,
    mask_id: int | None = None,
    normalize: bool = True,
    fact_batch: int = 32,
    progress: bool = False,
    **overrides: Any,
) -> list[NeuronAttribution]:
    """:func:`sig` of every ``(prompt, target)`` fact: the IG runs of every word of every fact share batches.

    Every (fact, word) pair is one fact of :func:`~tlcap.attribution.ig.integrated_gradients_facts`
    with the word's masked baseline (rows of up to ``fact_batch`` pairs per batch); each result equals
    :func:`sig` on its fact alone up to float rounding.

    Args:
        model, config, mask_id, normalize, **overrides: As for :func:`sig`.
        facts: ``(prompt, target)`` pairs.
        fact_batch: (fact, word) pairs whose rows share batches (exact; memory only).
        progress: A progress bar.

    Returns:
        One :class:`NeuronAttribution` per fact, in order.
    """
    cfg = IGConfig.resolve(config, **overrides)
    mid = mask_token_id(model) if mask_id is None else int(mask_id)
    ids = [model.encode(prompt) for prompt, _ in facts]
    if runtime_device.one_pass_default(model):  # every prompt's masked rows in shared passes
        masked = masked_baselines_many(model, ids, mid, cfg.site)
    else:  # a CPU: one batch per prompt (its result independent of its neighbours to the last bit)
        masked = [masked_baselines(model, p, mid, cfg.site) for p in ids]
    pairs, bases, n_words = [], [], []
    for (prompt, target), p, b in zip(facts, ids, masked):
        pairs += [(prompt, target)] * len(p)
        bases += list(b)
        n_words.append(len(p))
    attrs = integrated_gradients_facts(model, pairs, config=cfg, baselines=bases, fact_batch=fact_batch, progress=progress)
    out, k = [], 0
    for n in n_words:
        out.append(_combined(attrs[k:k + n], mid, cfg, normalize))
        k += n
    return out


def _combined(per_word: Sequence[NeuronAttribution], mid: int, cfg: IGConfig, normalize: bool) -> NeuronAttribution:
    """SIG of one fact from its words' IG runs (module docstring, step 4)."""
    total = per_word[0]
    acc = sum((a.scores.double() for a in per_word[1:]), per_word[0].scores.double().clone())
    sums = sum((a.layer_sums.double() for a in per_word[1:]), per_word[0].layer_sums.double().clone())
    pb = sum(((a.prob_full - a.prob_baseline).double() for a in per_word[1:]),
             (per_word[0].prob_full - per_word[0].prob_baseline).double())
    norm = float(acc.norm()) if normalize else 1.0
    scores = acc / (norm if norm > 0 else 1.0)
    meta = dict(total.meta)
    meta.update({"baseline": "masked_word", "mask_id": mid, "n_words": len(per_word), "steps_per_word": cfg.steps,
                 "normaliser": "l2" if normalize else "none", "denominator": norm})
    return dataclasses.replace(
        total, scores=scores.float(), layer_sums=sums.float(), prob_baseline=(total.prob_full.double() - pb).float(),
        method="sig", meta=meta,
    )


__all__ = ["MASK_ROWS", "mask_token_id", "masked_baselines", "masked_baselines_many", "sig", "sig_facts"]
