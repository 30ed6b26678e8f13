"""Token counts of the texts a stage's cost model reads, remembered per model (re-exported by :mod:`tlcap.reproduce.cost`)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

_TOKENS: weakref.WeakKeyDictionary[Any, dict[tuple[str, bool | None], int]] = weakref.WeakKeyDictionary()


def n_tokens(model: Any, text: str, bos: bool | None = None) -> int:
    """``len(model.encode(text))`` (``prepend_bos=bos`` when given), remembered per model: a full-scale plan
    counts the same queries in several stages.

    Args:
        model: A :class:`tlcap.models.Model` (anything with ``encode``); the memo is dropped with it.
        text: The text to count.
        bos: Whether a BOS token is prepended (``None``: the model's default).

    Returns:
        The number of tokens.
    """
    memo = _TOKENS.setdefault(model, {})
    key = (text, bos)
    if key not in memo:
        kw: dict[str, Any] = {"check_length": False} if bos is None else {"prepend_bos": bos, "check_length": False}
        memo[key] = len(model.encode(text, **kw))
    return memo[key]


def prefill_tokens(model: Any, texts: Sequence[str], bos: bool | None = None) -> None:
    """Count the tokens of every text :func:`n_tokens` has not seen, in one tokenizer call per 4096 texts.

    Args:
        model: A :class:`tlcap.models.Model`; a model without ``token_counts`` is left to :func:`n_tokens`.
        texts: The texts to count (repeats and texts already counted are skipped).
        bos: Whether a BOS token is prepended (``None``: the model's default).
    """
    memo = _TOKENS.setdefault(model, {})
    todo = list(dict.fromkeys(t for t in texts if (t, bos) not in memo))
    counts = getattr(model, "token_counts", None)
    if counts is None:
        return
    for i in range(0, len(todo), 4096):
        chunk = todo[i:i + 4096]
        for t, n in zip(chunk, counts(chunk, bos)):
            memo[(t, bos)] = int(n)


__all__ = ["n_tokens", "prefill_tokens"]
