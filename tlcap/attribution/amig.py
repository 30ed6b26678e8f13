"""AMIG — Architecture-adapted Multilingual Integrated Gradients (Chen et al. 2024; QL app. A.4).

Integrated gradients on the MLP neurons whose baseline is not zero but the neurons' activation
on a *baseline sentence* of the same length made only of ``<eos>`` tokens (QL eqs. 16–17),
summed over the query's words and normalised over all neurons (QL eq. 18)::

    b_{l,i}    = activation of layer l at position i of "<eos> <eos> ... <eos>" (m tokens)
    Attr_i(w)  = (w̄_i − b_i) · Σ_k ∂P(w_i = b_i + α_k (w̄_i − b_i)) / ∂w_i · 1/N
                 (word i of one layer moves; every other position and layer is clean)
    Attr(w)    = Σ_{i=1..m} Attr_i(w) / Σ_{all neurons} Σ_i Attr_i          (eq. 18)

``words="all"`` (default) is eq. 18. ``words="last"`` scores only the last word (the position
that predicts the answer; one IG run, what tlcap did before). ``"all"`` costs one IG run per word
whose rows recompute the positions from that word on (the prefix before it is cached and the
layers below a batch's lowest scaled layer run once): about ``(m + 1) / 2`` times SIG's cost.

Knowledge neurons of eq. 19 are those with ``Attr > τ`` on these normalised scores
(:func:`tlcap.locate.selection.absolute_select`); the shared ``score > t · max`` rule stays available.

Normalisation: eq. 18 divides by the signed sum over neurons. When that sum is ≤ 0 (the baseline
sentence already predicts the target better than the prompt) the sign of every score would flip,
so the sum of absolute values is used instead and ``meta["normaliser"]`` says which was used.
For a multi-token target the scores are the mean over its tokens (teacher forcing), as in IG;
the words are then every position of the context (prompt + earlier target tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.batched import fact_tokens
from tlcap.attribution.config import IGConfig
from tlcap.attribution.grouped import Unit, ig_units
from tlcap.attribution.ig import NeuronAttribution, integrated_gradients_facts
from tlcap.attribution.neuron_attribution import target_labels
from tlcap.attribution.quadrature import quadrature
from tlcap.attribution.word_ig import words_one_fact
from tlcap.config import check_choice, check_int
from tlcap.errors import InvalidConfigError
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime import device as runtime_device
from tlcap.runtime import hooks as H
from tlcap.runtime.batching import auto_batch_rows, ig_row_bytes, run_auto_batched
from tlcap.runtime.sites import get_site

WORDS: tuple[str, ...] = ("all", "last")


def _eos_id(model: Model, token_id: int | None) -> int:
    if token_id is not None:
        return int(token_id)
    eos = model.special_token_id("eos")
    if eos is None:
        raise InvalidConfigError("The model's tokenizer has no <eos> token; pass baseline_token_id= for the AMIG baseline.")
    return int(eos)


def _record_all(model: Model, toks: Tensor, names: list[str]) -> Tensor:
    """``[pos, n_hooks, d]`` activations of one row at every position."""
    store: dict[str, Tensor] = {}
    with torch.no_grad():
        model.logits(toks, hooks=[(n, H.record(store, n)) for n in names])
    return torch.stack([store[n][0] for n in names], dim=1)


def eos_baselines(
    model: Model, n_tokens: int, site: str = "mlp_post", token_id: int | None = None
) -> Float[Tensor, "word layer d_mlp"]:
    """Neuron activations at every position of an all-``<eos>`` sentence of ``n_tokens`` tokens.

    Args:
        model: The model.
        n_tokens: Length of the baseline sentence (the query's length).
        site: Neuron site.
        token_id: Baseline token (default ``<eos>``).

    Returns:
        ``[n_tokens, n_layers, d_mlp]``: row ``i`` is the baseline of word ``i`` (eq. 16's ``w'``).
    """
    s = get_site(site)
    names = [s.hook_name(l) for l in range(model.n_layers)]
    toks = torch.full((1, max(1, n_tokens)), _eos_id(model, token_id), dtype=torch.long, device=model.device)
    return _record_all(model, toks, names).float()


def eos_baselines_of(
    model: Model, lengths: Sequence[int], site: str = "mlp_post", token_id: int | None = None, one_pass: bool = False
) -> list[Float[Tensor, "word layer d_mlp"]]:
    """:func:`eos_baselines` of a sentence of each length, from one sentence as long as the longest with ``one_pass``.

    Position ``i`` of an all-``<eos>`` sentence sees only ``<eos>`` tokens (attention is causal), so its activation
    is eq. 16's ``b_i`` whatever the sentence's length: one pass serves every length, equal to a sentence of each
    length up to float rounding (tested). Without ``one_pass`` (a CPU) each length runs its own sentence.

    Args:
        model: The model.
        lengths: Sentence lengths (the queries' token counts).
        site: Neuron site.
        token_id: Baseline token (default ``<eos>``).
        one_pass: One sentence for every length.

    Returns:
        Per length ``n``, ``[n, n_layers, d_mlp]``.
    """
    if one_pass and lengths:
        eos = eos_baselines(model, max(int(n) for n in lengths), site, token_id)
        return [eos[: int(n)] for n in lengths]
    return [eos_baselines(model, int(n), site, token_id) for n in lengths]


def eos_baseline(
    model: Model, n_tokens: int, site: str = "mlp_post", token_id: int | None = None
) -> Float[Tensor, "layer d_mlp"]:
    """Neuron activations at the last position of an all-``<eos>`` sentence of ``n_tokens`` tokens.

    Args:
        model: The model.
        n_tokens: Length of the baseline sentence (the prompt's token count).
        site: The neuron site read (``"mlp_post"``: MLP neurons).
        token_id: Token the sentence repeats (default ``<eos>``).

    Returns:
        ``[n_layers, d_mlp]`` activations of every layer at the sentence's last position.
    """
    return eos_baselines(model, n_tokens, site, token_id)[-1]


def word_attributions(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    baseline_token_id: int | None = None,
    **overrides: Any,
) -> tuple[Float[Tensor, "target word layer d_mlp"], Float[Tensor, "target word layer"], Float[Tensor, " target"]]:
    """Un-normalised ``Attr_i`` of eq. 17 for every word ``i`` (and target token), QL app. A.4.

    Args:
        model: The model.
        prompt: The query.
        target: The answer or its token ids.
        config: Attribution settings (``steps`` = N quadrature steps per word and layer; exact
            ``method="ig"`` only).
        baseline_token_id: Token of the baseline sentence (default ``<eos>``).
        **overrides: Fields of ``config`` to override.

    Returns:
        ``(attr, p_base, p_clean)``: ``attr[t, i, l, j]`` = Attr_i of neuron ``(l, j)`` for target
        token ``t``; ``p_base[t, i, l]`` = P(target) with word ``i`` of layer ``l`` at its baseline;
        ``p_clean[t]`` = clean P(target token t). Per word and layer, ``Σ_j attr ≈ p_clean − p_base``.

    Raises:
        InvalidConfigError: an estimator other than ``method="ig"``, or a layer beyond the model.
    """
    cfg = IGConfig.resolve(config, **overrides)
    return word_attributions_facts(model, [(prompt, target)], config=cfg, baseline_token_id=baseline_token_id)[0]


def word_attributions_facts(
    model: Model,
    facts: Sequence[tuple[str, str | Sequence[int]]],
    *,
    config: IGConfig | None = None,
    baseline_token_id: int | None = None,
    one_pass: bool | None = None,
    **overrides: Any,
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """:func:`word_attributions` of every ``(prompt, target)`` fact, the rows of all facts' words in shared batches.

    Each (fact, target token, word) is a unit of :mod:`tlcap.attribution.grouped` whose rows scale
    the word's neurons and continue the prefix before it with the rest of the context
    (``Unit.at``); units with continuations of one length share batches, so the rows of every word
    of every fact run together (:meth:`tlcap.models.Model.continue_rows`). Equal to the fact-at-a-time
    result up to float rounding.

    With ``one_pass`` (default on an accelerator) the facts' clean runs are one right-padded pass
    (:meth:`~tlcap.models.Model.context_states_many`) and every fact's baseline comes from one all-``<eos>``
    sentence as long as the longest context (:func:`eos_baselines_of`). Two passes instead of two per fact, equal
    up to float rounding (tested); a CPU keeps two passes per fact (each fact's result then does not depend on the
    facts beside it to the last bit).

    Args:
        model: The model.
        facts: ``(prompt, target)`` per fact; a target is the answer or its token ids.
        config: Attribution settings (exact ``method="ig"`` with a number of ``steps``, not ``"auto"``).
        baseline_token_id: Token of the baseline sentence (default ``<eos>``).
        one_pass: The clean runs and baselines of all facts in two passes (default: on an accelerator).
        **overrides: :class:`IGConfig` fields overriding ``config``.

    Returns:
        Per fact, ``(attr, p_base, p_clean)`` as :func:`word_attributions` returns them.
    """
    cfg = IGConfig.resolve(config, **overrides)
    return [run[:3] for run in _word_runs(model, facts, cfg, baseline_token_id, one_pass)]


def _word_runs(model: Model, facts: Sequence[tuple[str, str | Sequence[int]]], cfg: IGConfig,
               baseline_token_id: int | None, one_pass: bool | None) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """:func:`word_attributions_facts` with each fact's clean activations at its scored positions as a fourth entry
    (``[target, n_layers, d_mlp]``, float32 on the host, zero outside the scored layers)."""
    if cfg.method != "ig":
        raise InvalidConfigError(f"AMIG over the query's words needs method='ig' (exact), got {cfg.method!r}; "
                                 "use words='last' for the cheaper estimators")
    if cfg.steps == "auto":
        raise InvalidConfigError("AMIG over the query's words needs a number of steps (--steps), not 'auto'")
    layers = list(range(model.n_layers)) if cfg.layers is None else [int(l) for l in cfg.layers]
    if any(l >= model.n_layers for l in layers):
        raise InvalidConfigError(f"layers (--layers) must be below {model.n_layers} for {model.name}, got {max(layers)}")
    tokens = [fact_tokens(model, p, t) for p, t in facts]
    if cfg.batch_rows == "auto":  # largest batch in the budget, rerun at half on out-of-memory: same result
        per = len(quadrature(cfg.steps, cfg.rule)[0]) + 1
        n_rows = sum(len(t) * (len(p) + len(t)) for p, t in tokens) * len(layers) * per
        longest = max(len(p) + len(t) for p, t in tokens)
        rows = auto_batch_rows(ig_row_bytes(model, longest), n_rows, cfg.max_memory, model.device, model=model, kind="ig",
                               context_len=longest)
        return run_auto_batched(lambda b: _word_runs(model, facts, cfg.replace(batch_rows=b), baseline_token_id, one_pass),
                                rows, model.device)
    s = get_site(cfg.site)
    names = [s.hook_name(l) for l in layers]
    if not model.continues_rows:  # TL 3.9: no rows after padded prefixes, each word on its own
        return [words_one_fact(model, p, t, eos_baselines(model, len(p) + len(t) - 1, cfg.site, baseline_token_id)[:, layers],
                               names, layers, cfg) for p, t in tokens]
    seqs = [[int(x) for x in (*p_ids, *t_ids[:-1])] for p_ids, t_ids in tokens]
    firsts = [len(p_ids) - 1 for p_ids, _ in tokens]  # the positions that predict t_ids start here
    one = one_pass if one_pass is not None else runtime_device.one_pass_default(model)
    if one:
        many, prefix = model.context_states_many(seqs, names, (), firsts)  # every fact's clean run: one pass
        cleans = [(acts, logits) for acts, _, logits in many]
    else:
        cleans, parts = [], []
        for seq, first in zip(seqs, firsts):
            acts, logits, cache = model.context_run(seq, names)
            cleans.append((acts, logits[first:]))
            parts.append((cache, len(seq)))
        prefix = model.stack_prefixes(parts)
    eos = eos_baselines_of(model, [len(q) for q in seqs], cfg.site, baseline_token_id, one_pass=one)
    runs, probs = [], []
    for (_, t_ids), seq, (acts, logits), b in zip(tokens, seqs, cleans, eos):
        tid = torch.tensor([int(x) for x in t_ids], device=logits.device)  # logits row j: position first + j
        probs.append(logits.float().softmax(-1).gather(-1, tid[:, None])[:, 0])
        runs.append((seq, acts, b[:, layers].to(acts)))
    p_clean = torch.cat(probs).tolist()  # one copy to the host for every fact's clean probabilities
    units, j = [], 0
    for k, ((p_ids, t_ids), (seq, acts, bases)) in enumerate(zip(tokens, runs)):
        for t, tid in enumerate(t_ids):
            n_ctx = len(p_ids) + t
            units += [Unit(tuple(seq[:n_ctx]), int(tid), acts[i], bases[i], p_clean[j], k, None, i) for i in range(n_ctx)]
            j += 1
    res = ig_units(model, units, prefix, names, layers, cfg, int(cfg.batch_rows))
    L, d = model.n_layers, model.d_mlp
    # target t is scored at its context's last word; every fact's in one copy to the host
    scored_all = torch.cat([acts[len(p) - 1:len(p) + len(t) - 1] for (p, t), (_, acts, _) in zip(tokens, runs)]).float().cpu()
    out, j, k0 = [], 0, 0
    for p_ids, t_ids in tokens:
        n_ctx = len(p_ids) + len(t_ids) - 1
        attr = torch.zeros(len(t_ids), n_ctx, L, d, dtype=torch.float64)
        p_base = torch.zeros(len(t_ids), n_ctx, L, dtype=torch.float64)
        p_clean = torch.zeros(len(t_ids), dtype=torch.float64)
        scored = torch.zeros(len(t_ids), L, d)
        scored[:, layers] = scored_all[k0:k0 + len(t_ids)]
        k0 += len(t_ids)
        for t in range(len(t_ids)):
            k = len(p_ids) + t  # the words of target token t: every position of its context
            attr[t, :k, layers] = res.attr[j:j + k]
            p_base[t, :k, layers] = res.p_base[j:j + k]
            p_clean[t] = units[j].p_clean
            j += k
        out.append((attr.float(), p_base.float(), p_clean.float(), scored))
    return out


def amig(
    model: Model,
    prompt: str,
    target: str | Sequence[int],
    *,
    config: IGConfig | None = None,
    words: str = "all",
    baseline_token_id: int | None = None,
    normalize: bool = True,
    progress: bool = False,
    **overrides: Any,
) -> NeuronAttribution:
    """AMIG attribution of every MLP neuron for ``prompt → target`` (QL eqs. 16–18).

    Args:
        model: The model.
        prompt: The query.
        target: The answer (``" Paris"``) or its token ids.
        config: Attribution settings (:class:`~tlcap.attribution.config.IGConfig`; ``steps`` is
            the number N of quadrature steps per word and layer).
        words: ``"all"``: eq. 18, Attr summed over the query's words (default); ``"last"``: only
            the last word (one IG run).
        baseline_token_id: Token of the baseline sentence (default ``<eos>``).
        normalize: Apply eq. 18's normalisation (divide by the sum over all neurons).
        progress: Progress bar (``words="last"``).
        **overrides: Fields of ``config`` to override.

    Returns:
        A :class:`NeuronAttribution` with ``method="amig"``; ``layer_sums`` keep the
        un-normalised per-layer sums so ``completeness_rel_error`` checks them (for
        ``words="all"`` against Σ_i (P(w̄) − P(word i at baseline))); ``meta["words"]`` the mode.

    Raises:
        InvalidConfigError: unknown ``words``, or a setting ``words="all"`` does not support.

    Example:
        >>> from tlcap.locate.selection import absolute_select
        >>> attr = amig(model, "The capital of France is", " Paris", steps=10)
        >>> kns = absolute_select(attr.scores, 0.01)          # eq. 19
        >>> attr.method, attr.meta["words"], len(kns)
        ('amig', 'all', 2)
    """
    return amig_facts(model, [(prompt, target)], config=config, words=words, baseline_token_id=baseline_token_id,
                      normalize=normalize, progress=progress, **overrides)[0]


def amig_facts(
    model: Model,
    facts: Sequence[tuple[str, str | Sequence[int]]],
    *,
    config: IGConfig | None = None,
    words: str = "all",
    baseline_token_id: int | None = None,
    normalize: bool = True,
    fact_batch: int = 16,
    progress: bool = False,
    **overrides: Any,
) -> list[NeuronAttribution]:
    """:func:`amig` of every ``(prompt, target)`` fact, the rows of several facts in shared batches.

    ``words="all"``: every word of up to ``fact_batch`` facts (:func:`word_attributions_facts`);
    ``words="last"``: :func:`~tlcap.attribution.ig.integrated_gradients_facts` with each fact's
    all-``<eos>`` baseline. Each result equals :func:`amig` on its fact alone up to float rounding.

    Args:
        model, config, words, baseline_token_id, normalize, **overrides: As for :func:`amig`.
        facts: ``(prompt, target)`` pairs.
        fact_batch: Facts whose rows share batches (exact; memory only), ``>= 1``.
        progress: A progress bar over the facts.

    Returns:
        One :class:`NeuronAttribution` per fact, in order.

    Example:
        >>> attrs = amig_facts(model, [("The capital of France is", " Paris"), ("Rome is the capital of", " Italy")],
        ...                    steps=2)
        >>> [(a.method, a.target) for a in attrs]
        [('amig', ' Paris'), ('amig', ' Italy')]
    """
    cfg = IGConfig.resolve(config, **overrides)
    check_choice("words", words, WORDS, cli="--amig-words")
    check_int("fact_batch", fact_batch, min=1, cli=None)
    lens = [len(model.encode(p)) for p, _ in facts]
    if words == "last":
        bases = [b[-1] for b in eos_baselines_of(model, lens, cfg.site, baseline_token_id,
                                                  one_pass=runtime_device.one_pass_default(model))]
        attrs = integrated_gradients_facts(model, facts, config=cfg, baselines=bases, fact_batch=fact_batch,
                                           progress=progress)
        return [_normalised(a, n, words, {"n_words": 1}, normalize) for a, n in zip(attrs, lens)]
    layers = list(range(model.n_layers)) if cfg.layers is None else [int(l) for l in cfg.layers]
    prov = Provenance.collect(model, cfg)
    out = []
    bar = tqdm(total=len(facts), desc="AMIG facts", disable=not progress, unit="fact")
    for s in range(0, len(facts), fact_batch):
        chunk = list(facts[s:s + fact_batch])
        per = _word_runs(model, chunk, cfg, baseline_token_id, None)
        for (p, t), (a, pb, pc, acts), n in zip(chunk, per, lens[s:s + fact_batch]):
            attr = _words_result(model, p, t, a, pb, pc, acts, layers, cfg, prov)
            extra = {"n_words": int(a.shape[1]), "word_totals": a.double().sum((2, 3)).mean(0).tolist()}
            out.append(_normalised(attr, n, words, extra, normalize))
        bar.update(len(chunk))
    bar.close()
    return out


def _words_result(model: Model, prompt: str, target: str | Sequence[int], a: Tensor, pb: Tensor, pc: Tensor,
                  acts: Tensor, layers: Sequence[int], cfg: IGConfig, prov: Provenance) -> NeuronAttribution:
    """One fact's eq.-18 sum over words as a :class:`NeuronAttribution` (before :func:`_normalised`).

    ``prob_full`` is the clean P(target token) on every scored layer and ``prob_baseline`` is
    ``prob_full − Σ_i (P(w̄) − P_i(b))``, so ``layer_sums`` checks completeness summed over the words.
    """
    L = model.n_layers
    p_full = torch.zeros(len(pc), L, dtype=torch.float64)
    p_full[:, list(layers)] = pc.double()[:, None]
    p_ids, t_ids = fact_tokens(model, prompt, target)
    words = torch.arange(pb.shape[1])[None, :] < len(p_ids) + torch.arange(len(pc))[:, None]  # target t: its context's
    gap = (pc.double()[:, None, None] - pb.double()) * words[:, :, None]  # words, not the later (padded) positions
    delta = torch.zeros(len(pc), L, dtype=torch.float64)
    delta[:, list(layers)] = gap.sum(1)[:, list(layers)]  # Σ_i (P(w̄) − P_i(b))
    return NeuronAttribution(
        scores=a.double().sum(1).mean(0).float(), prob_full=p_full.float(), prob_baseline=(p_full - delta).float(),
        layer_sums=a.double().sum((1, 3)).float(), activations=acts, prompt=prompt,
        **target_labels(model, target, t_ids),
        model_name=model.name, site=cfg.site, method=cfg.method, steps=cfg.steps, rule=cfg.rule, layers=tuple(layers),
        provenance=prov,
    )


def _normalised(attr: NeuronAttribution, n: int, words: str, extra: dict[str, Any], normalize: bool) -> NeuronAttribution:
    """Eq. 18's normalisation of an AMIG attribution, and its ``meta``."""
    scores = attr.scores
    normaliser, denom = "none", 1.0
    if normalize:
        tot = float(scores.double().sum())
        if tot > 1e-12:
            denom, normaliser = tot, "sum"
        else:
            denom, normaliser = float(scores.double().abs().sum()) or 1.0, "abs_sum"
        scores = (scores.double() / denom).float()
    meta = dict(attr.meta)
    meta.update({"baseline": "eos", "baseline_len": n, "words": words, "normaliser": normaliser, "denominator": denom,
                 **extra})
    return dataclasses.replace(attr, scores=scores, method="amig", meta=meta)


__all__ = ["WORDS", "amig", "amig_facts", "eos_baseline", "eos_baselines", "eos_baselines_of", "word_attributions",
           "word_attributions_facts"]
