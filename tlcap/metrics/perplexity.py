"""Perplexity of a model on texts (the ΔPPL of knowledge-editing papers) and last-token logits.

``PPL = exp(Σ NLL / Σ predicted tokens)`` pooled over the texts, each truncated to ``max_tokens``
tokens (no BOS added: the first token is context only). The texts run as one right-padded batch;
padding never reaches a real token (causal attention), so the value equals running them one by
one (up to float rounding).

Example:
    >>> from tlcap.data.wikitext import load_wikitext
    >>> from tlcap.intervene.weights import erase_neurons
    >>> from tlcap.metrics.sets import NeuronSet
    >>> texts = load_wikitext(n_texts=5)
    >>> before = perplexity(model, texts)
    >>> round(before)                               # a random model: about the vocabulary size
    50966
    >>> kns = NeuronSet.from_list([(0, 3), (1, 7)], shape=(model.n_layers, model.d_mlp))
    >>> with erase_neurons(model, kns):
    ...     rel = (perplexity(model, texts) - before) / before
    >>> round(rel, 4)
    -0.0001
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.models.adapter import HookList, Model


@torch.no_grad()
def text_nll(
    model: Model, texts: Sequence[str], max_tokens: int = 128, hooks: HookList = ()
) -> tuple[Float[Tensor, " text"], Float[Tensor, " text"]]:
    """Summed next-token NLL and number of predicted tokens of each text.

    Args:
        model: The model.
        texts: The texts.
        max_tokens: Tokens kept per text (at most the context length).
        hooks: Forward hooks applied to the run.

    Returns:
        ``(nll, count)``, each ``[n_texts]`` (a text of fewer than 2 tokens counts 0).
    """
    n = len(texts)
    nll = torch.zeros(n, dtype=torch.float64)
    cnt = torch.zeros(n, dtype=torch.float64)
    keep = min(max_tokens, model.n_ctx)
    rows = [model.encode(t, prepend_bos=False, max_tokens=keep, check_length=False) for t in texts]
    live = [i for i, r in enumerate(rows) if len(r) >= 2]
    if not live:
        return nll, cnt
    batch = model.encode_batch([rows[i] for i in live])
    logp = model.logits(batch, hooks=hooks)[:, :-1].float().log_softmax(-1)
    tgt = batch.tokens[:, 1:]
    tok = logp.gather(-1, tgt[..., None])[..., 0]
    mask = batch.attention_mask[:, 1:].to(tok.dtype)
    nll[live] = (-(tok * mask).sum(-1)).double().cpu()
    cnt[live] = mask.sum(-1).double().cpu()
    return nll, cnt


def perplexity(model: Model, texts: Sequence[str], max_tokens: int = 128, hooks: HookList = ()) -> float:
    """``exp(mean next-token NLL)`` pooled over the texts, each truncated to ``max_tokens`` tokens.

    Args:
        model: The model.
        texts: The texts (e.g. WikiText-2 paragraphs, :func:`tlcap.data.load_wikitext`).
        max_tokens: Tokens kept per text.
        hooks: Forward hooks applied to the run.

    Returns:
        The perplexity (``exp(0) = 1`` when no text has two tokens).

    Example:
        >>> round(perplexity(model, ["The quick brown fox jumps over the lazy dog."]))
        48353
    """
    nll, cnt = text_nll(model, texts, max_tokens, hooks)
    return math.exp(float(nll.sum()) / max(float(cnt.sum()), 1.0))


@torch.no_grad()
def next_token_logits(model: Model, prompts: Sequence[str], hooks: HookList = ()) -> Float[Tensor, "prompt d_vocab"]:
    """Next-token logits after each prompt (float32).

    Without hooks the prompts run as one right-padded batch (:meth:`Model.last_logits` reads each
    row at its own last token); with hooks they run one at a time, since hooks that select the
    last position (``pos="last"``) would hit the padding of shorter rows.

    Args:
        model: The model.
        prompts: The prompts.
        hooks: Forward hooks applied to every run.

    Returns:
        ``[n_prompts, d_vocab]`` logits (``[0, d_vocab]`` for no prompts).
    """
    if not prompts:
        return torch.zeros(0, model.d_vocab)
    if hooks:
        return torch.stack([model.last_logits(model.to_tokens(p), hooks=hooks)[0].float() for p in prompts])
    return model.last_logits(model.encode_batch(list(prompts))).float()


__all__ = ["next_token_logits", "perplexity", "text_nll"]
