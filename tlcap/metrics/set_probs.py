"""Target probabilities and text perplexity under many neuron sets, batched (one row per set).

- :func:`scaled_target_probs` — ``P(target)`` with each set's neurons scaled (doubled, zeroed) at
  the positions that predict the target: the batched form of ``target_prob(model, prompt,
  target, hooks=scale_neurons(model, set, factor))`` for many (set, factor) pairs. The prompt
  before its last token is cached once (the intervention never reaches it) and every row runs
  only the predicting positions, packed as query positions of that prefix for a one-token
  target (:mod:`tlcap.models.packed_rows`).
- :func:`erased_text_nll` — the summed next-token NLL of each text with each set erased (every
  position), the batched form of :func:`~tlcap.metrics.perplexity.text_nll` inside
  ``erase_neurons``: a perplexity control for many matched random sets at once;
  :func:`edited_text_nll` the same for any row plan (erasures, updates and the unedited model together).

Example:
    >>> from tlcap.data.wikitext import load_wikitext
    >>> shape = (model.n_layers, model.d_mlp)
    >>> located = NeuronSet.from_list([(0, 55), (1, 23)], shape=shape)
    >>> randoms = [located.random_like(seed=k) for k in range(5)]
    >>> base, p = scaled_target_probs(model, "The capital of France is", " Paris", [located, *randoms], (2.0, 0.0))
    >>> p.shape                           # [factors, sets]
    torch.Size([2, 6])
    >>> nll, count = erased_text_nll(model, load_wikitext(n_texts=2), [NeuronSet((), shape), located, *randoms])
    >>> ppl = (nll.sum(1) / count.sum()).exp()
    >>> nll.shape, count.shape, ppl.shape   # [sets, texts], [texts], one perplexity per set
    (torch.Size([7, 2]), torch.Size([2]), torch.Size([7]))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import EmptyDatasetError, ShapeMismatchError
from tlcap.intervene.set_rows import SetFactors
from tlcap.metrics.set_scores import teacher_forced
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model

PROB_ROWS = 256
"""Rows per forward call of :func:`scaled_target_probs`."""


@torch.no_grad()
def scaled_target_probs(
    model: Model, prompt: str, target: str | Sequence[int], sets: Sequence[NeuronSet],
    factors: Sequence[float] = (2.0, 0.0),
) -> tuple[float, Float[Tensor, "factor set"]]:
    """``P(target)`` (geometric mean over its tokens) with each set scaled by each factor.

    Equal to :func:`~tlcap.metrics.probs.target_prob` with
    :func:`~tlcap.intervene.activations.scale_neurons` (``pos="target"``) for every pair, up to
    float rounding of batched products (tested).

    Args:
        model: The model.
        prompt: The query.
        target: The answer (tokenized in context), or its token ids.
        sets: The neuron sets.
        factors: Multipliers (2 doubles, 0 zeroes).

    Returns:
        ``(P(target) of the unchanged model, [n_factors, n_sets] probabilities)``.

    Example:
        >>> prompt, target = "The capital of France is", " Paris"
        >>> located = NeuronSet.from_list([(0, 55), (1, 23)], shape=(model.n_layers, model.d_mlp))
        >>> randoms = [located.random_like(seed=k) for k in range(5)]
        >>> base, p = scaled_target_probs(model, prompt, target, [located, *randoms])
        >>> (p[0] > base).float().mean()          # share of sets whose doubling raises P(target)
        tensor(0.6667)
    """
    p_ids = model.encode(prompt)
    t_ids = model.target_ids(prompt, target) if isinstance(target, str) else [int(i) for i in target]
    pairs = [(f, s) for f in factors for s in sets]
    plan = SetFactors.of(model, [NeuronSet((), (model.n_layers, model.d_mlp)), *(s for _, s in pairs)],
                         [1.0, *(f for f, _ in pairs)])
    prefix = model.prefix_cache(torch.tensor([p_ids[:-1]], device=model.device)) if len(p_ids) > 1 else None
    cont = torch.tensor([p_ids[-1:] + t_ids[:-1]], device=model.device)
    tgt = torch.tensor(t_ids, device=model.device)
    out = torch.zeros(len(plan), dtype=torch.float64)
    for r0 in range(0, len(plan), PROB_ROWS):
        rows = torch.arange(r0, min(len(plan), r0 + PROB_ROWS))
        hooks = plan.hooks(model, rows)
        b = len(rows)
        if len(t_ids) == 1:
            logits = model.last_logits(cont, hooks=hooks, prefix=prefix, batch=b)[:, None]
        else:
            logits = model.logits(cont.expand(b, -1), hooks=hooks, prefix=prefix, batch=b)
        logp = logits.float().log_softmax(-1)[:, torch.arange(len(t_ids)), tgt]
        out[rows] = logp.mean(1).exp().double().cpu()
    return float(out[0]), out[1:].reshape(len(factors), len(sets))


@torch.no_grad()
def scaled_next_token_probs_many(
    model: Model, prompts: Sequence[str], target_ids: Sequence[int], sets: Sequence[Sequence[NeuronSet]],
    factors: Sequence[float] = (2.0, 0.0),
) -> list[tuple[float, Float[Tensor, "factor set"]]]:
    """:func:`scaled_target_probs` of several prompts, each with its own sets and one target token, as rows of
    right-padded passes (an accelerator's path: one pass instead of one per prompt).

    Row ``r`` is one prompt, unchanged or with one of its sets scaled by one factor at its last token (the
    position that predicts the target; :meth:`SetFactors.hooks` with ``starts``); the padding after a prompt
    reaches none of its positions (causal attention). Equal to :func:`scaled_target_probs` of each prompt up to
    the float rounding of a batch and of running the prompt without a cached prefix (tested).

    Args:
        model: The model.
        prompts: The queries.
        target_ids: One target token per prompt.
        sets: Per prompt, its neuron sets.
        factors: Multipliers (2 doubles, 0 zeroes).

    Returns:
        Per prompt ``(P(target) of the unchanged model, [n_factors, n_sets] probabilities)``.

    Example:
        >>> located = NeuronSet.from_list([(0, 55), (1, 23)], shape=(model.n_layers, model.d_mlp))
        >>> prompts = ["The capital of France is", "Paris is the capital of"]
        >>> tids = [model.target_ids(prompts[0], " Paris")[0], model.target_ids(prompts[1], " France")[0]]
        >>> many = scaled_next_token_probs_many(model, prompts, tids, [[located], [located, located.random_like(0)]])
        >>> alone = scaled_target_probs(model, prompts[1], [tids[1]], [located, located.random_like(0)])
        >>> abs(many[1][0] - alone[0]) < 1e-6, torch.allclose(many[1][1], alone[1], atol=1e-6)
        (True, True)
    """
    if not (len(prompts) == len(target_ids) == len(sets)):
        raise ShapeMismatchError(f"{len(prompts)} prompts, {len(target_ids)} targets and {len(sets)} set lists: give "
                                 "one of each per prompt")
    ids = [model.encode(p) for p in prompts]
    all_sets: list[NeuronSet] = [NeuronSet((), (model.n_layers, model.d_mlp))]
    all_factors: list[float] = [1.0]
    rows: list[tuple[int, int]] = []  # (prompt, plan index)
    for i, ss in enumerate(sets):
        rows.append((i, 0))
        for f in factors:
            for ns in ss:
                rows.append((i, len(all_sets)))
                all_sets.append(ns)
                all_factors.append(f)
    plan = SetFactors.of(model, all_sets, all_factors)
    out = torch.zeros(len(rows), dtype=torch.float64)
    for r0 in range(0, len(rows), PROB_ROWS):
        chunk = rows[r0:r0 + PROB_ROWS]
        batch = model.encode_batch([ids[i] for i, _ in chunk])
        row_set = torch.tensor([k for _, k in chunk], device=model.device)
        starts = batch.last_positions.to(model.device)
        logits = model.last_logits(batch, hooks=plan.hooks(model, row_set, starts=starts))
        tgt = torch.tensor([int(target_ids[i]) for i, _ in chunk], device=logits.device)
        out[r0:r0 + len(chunk)] = logits.float().log_softmax(-1).gather(-1, tgt[:, None])[:, 0].exp().double().cpu()
    res, r = [], 0
    for ss in sets:
        n = len(factors) * len(ss)
        res.append((float(out[r]), out[r + 1:r + 1 + n].reshape(len(factors), len(ss))))
        r += 1 + n
    return res


@torch.no_grad()
def erased_text_nll(
    model: Model, texts: Sequence[str], sets: Sequence[NeuronSet], max_tokens: int = 128,
) -> tuple[Float[Tensor, "set text"], Float[Tensor, " text"]]:
    """Summed next-token NLL of each text with each set erased, and the predicted tokens per text.

    Equal to :func:`~tlcap.metrics.perplexity.text_nll` inside ``erase_neurons(model, set)``
    for every set (up to float rounding; tested). Perplexity of set ``k``:
    ``exp(nll[k].sum() / count.sum())``.

    Args:
        model: The model (no weight is changed).
        texts: The texts (each truncated to ``max_tokens`` tokens, no BOS).
        sets: The neuron sets (an empty set: the unedited model).
        max_tokens: Tokens kept per text.

    Returns:
        ``(nll [n_sets, n_texts], count [n_texts])`` in float64 (a text of fewer than 2 tokens: 0, 0).

    Raises:
        EmptyDatasetError: no sets.
    """
    if not sets:
        raise EmptyDatasetError("erased_text_nll needs at least one neuron set")
    return edited_text_nll(model, texts, SetFactors.of(model, sets, 0.0), max_tokens)


@torch.no_grad()
def edited_text_nll(
    model: Model, texts: Sequence[str], plan: SetFactors, max_tokens: int = 128,
) -> tuple[Float[Tensor, "set text"], Float[Tensor, " text"]]:
    """:func:`erased_text_nll` for any row plan: each text's summed NLL under each set of ``plan`` (every position).

    A plan's set may erase, scale or update its neurons (:class:`~tlcap.intervene.set_rows.SetFactors` with
    ``writes=``), so a query's erasures, updates and the unedited model score their texts in one batched run.

    Args:
        model: The model (no weight is changed).
        texts: The texts (each truncated to ``max_tokens`` tokens, no BOS).
        plan: The sets, applied at every position.
        max_tokens: Tokens kept per text.

    Returns:
        ``(nll [n_sets, n_texts], count [n_texts])`` in float64 (a text of fewer than 2 tokens: 0, 0).

    Example:
        >>> from tlcap.intervene.update import update_neurons, update_write
        >>> from tlcap.metrics.perplexity import text_nll
        >>> kns = NeuronSet(((0, 250), (1, 192)), shape=(model.n_layers, model.d_mlp))
        >>> edit = update_write(model, kns, 11, 22)
        >>> plan = SetFactors.of(model, [NeuronSet((), kns.shape), kns], 1.0, writes=[None, edit])
        >>> texts = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France."]
        >>> nll, count = edited_text_nll(model, texts, plan)
        >>> with update_neurons(model, kns, 11, 22):
        ...     torch.allclose(nll[1], text_nll(model, texts)[0], rtol=1e-5)
        True
        >>> torch.allclose(nll[0], text_nll(model, texts)[0], rtol=1e-5), count.tolist()   # row 0: unedited
        (True, [9.0, 6.0])
    """
    keep = min(max_tokens, model.n_ctx)
    rows = [model.encode(t, prepend_bos=False, max_tokens=keep, check_length=False) for t in texts]
    live = [i for i, r in enumerate(rows) if len(r) >= 2]
    nll = torch.zeros(len(plan), len(texts), dtype=torch.float64)
    cnt = torch.zeros(len(texts), dtype=torch.float64)
    if not live:
        return nll, cnt
    seqs = [rows[i] for i in live]
    k = max(len(s) for s in seqs) - 1
    nxt = torch.tensor([s[1:] + [s[-1]] * (k + 1 - len(s)) for s in seqs])
    real = torch.tensor([[1.0] * (len(s) - 1) + [0.0] * (k + 1 - len(s)) for s in seqs])

    def summed(logits: Tensor, idx: Tensor) -> Tensor:
        lp = logits.float().log_softmax(-1)
        w = lp.shape[1]
        tok = lp.gather(2, nxt[idx][:, :w, None].to(lp.device))[..., 0]
        return -(tok * real[idx][:, :w].to(tok.device)).sum(1).double()

    vals, _ = teacher_forced(model, plan, seqs, [list(range(len(s) - 1)) for s in seqs], summed)
    nll[:, live] = vals
    cnt[live] = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.float64)
    return nll, cnt


__all__ = ["scaled_target_probs", "scaled_next_token_probs_many", "erased_text_nll", "edited_text_nll", "PROB_ROWS"]
