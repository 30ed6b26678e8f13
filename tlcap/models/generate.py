"""Greedy decoding with a key/value cache.

:class:`tlcap.models.Model` mixes :class:`GenerationMixin` in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from tlcap.errors import EmptyDatasetError
from tlcap.models.cache import PrefixCache, fresh_cache, full_cache
from tlcap.runtime.hooks import HookList


def ends_generation(decode: Callable[[list[int]], str], out: list[int], stop_ids: set[int] | Sequence[int],
                    stop_text: Sequence[str]) -> bool:
    """Whether a greedy continuation stops after its newest token: a stop id, or a stop string in its text.

    Args:
        decode: The tokenizer's decode.
        out: The continuation so far (its newest token last).
        stop_ids: Token ids that end it (the id itself is kept).
        stop_text: Strings that end it once decoded.

    Returns:
        ``True`` where it stops.
    """
    return out[-1] in stop_ids or bool(stop_text and any(s in decode(out) for s in stop_text))


class GenerationMixin:
    """Text generation of :class:`tlcap.models.Model` (see the class for attributes)."""

    device: torch.device
    encode: Callable[..., list[int]]
    decode: Callable[..., str]
    hooks: Callable[..., Any]
    forward: Callable[..., Tensor]
    prefix_cache: Callable[..., PrefixCache]

    @torch.no_grad()
    def generate(
        self,
        prompt: str | Sequence[int] | Tensor,
        max_new_tokens: int = 32,
        hooks: HookList = (),
        stop_ids: Sequence[int] = (),
        stop_text: Sequence[str] = (),
        use_cache: bool = True,
    ) -> list[int]:
        """Greedy continuation of a prompt (the new token ids only).

        With ``use_cache`` the prompt is encoded once into a key/value cache and every step
        feeds only the newest token; ``use_cache=False`` re-runs the whole sequence each step
        (the reference the cached path is tested against). ``hooks`` apply to every forward
        pass, the prompt's included, so position-independent hooks (e.g. scaling neurons at
        all positions) give the same tokens either way.

        Args:
            prompt: Text (encoded with :meth:`encode`) or token ids.
            max_new_tokens: Most tokens to generate.
            hooks: Forward hooks (activation interventions).
            stop_ids: Stop after generating one of these ids (e.g. EOS), which is included.
            stop_text: Stop once the decoded continuation contains one of these strings.
            use_cache: Decode incrementally with a key/value cache.

        Returns:
            The generated token ids.

        Example:
            >>> ids = model.generate("Question: 2 + 2 =", 8, stop_ids=[model.special_token_id("eos")])
            >>> len(ids), model.decode(ids)    # a random tiny model repeats itself; SmolLM2 answers " 4"
            (8, ' = = = = = = = =')
        """
        if isinstance(prompt, str):
            ids = self.encode(prompt)
        elif isinstance(prompt, Tensor):
            ids = [int(i) for i in prompt.flatten().tolist()]
        else:
            ids = [int(i) for i in prompt]
        if not ids:
            raise EmptyDatasetError("generate needs a prompt of at least one token.")
        out: list[int] = []
        stop = {int(s) for s in stop_ids}
        with self.hooks(fwd=hooks):
            cache = None
            if use_cache and len(ids) > 1:
                cache = self.prefix_cache(torch.tensor([ids[:-1]], device=self.device)).expanded(1)
            nxt = torch.tensor([ids[-1:] if cache is not None else ids], device=self.device)
            for _ in range(max_new_tokens):
                if cache is not None:
                    logits = self.forward(nxt, past=cache)  # the cache grows in place
                else:
                    logits = self.forward(torch.tensor([ids + out], device=self.device))
                tok = int(logits[0, -1].argmax())
                out.append(tok)
                if ends_generation(self.decode, out, stop, stop_text):
                    break
                nxt = torch.tensor([[tok]], device=self.device)
        return out

    @torch.no_grad()
    def generate_many(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        stop_ids: Sequence[int] = (),
        stop_text: Sequence[str] = (),
    ) -> list[list[int]]:
        """:meth:`generate` of several prompts as rows of one batch (no hooks): the greedy continuation of each.

        The prompts' tokens but the last are cached as one right-padded prefix (:meth:`padded_prefix`), then every
        step feeds one token per row at the row's own position, attending to its own prompt (the padding masked)
        and its own continuation; the cache grows in place. A row that has stopped (a ``stop_ids`` token or
        ``stop_text``, as :meth:`generate` stops) keeps its tokens; the batch steps until every row has stopped
        or ``max_new_tokens``. Each row equals :meth:`generate` of its prompt up to the float rounding of a
        batch (tested token for token). Where rows cannot continue padded prefixes (TL 3.9; a sliding-window
        model with prompts of unequal lengths) the prompts are generated one at a time.

        Args:
            prompts: Token ids of each prompt (each at least one token).
            max_new_tokens: Most tokens to generate per prompt.
            stop_ids: Stop a row after it generates one of these ids (included).
            stop_text: Stop a row once its decoded continuation contains one of these strings.

        Returns:
            The generated token ids of each prompt, in order.

        Raises:
            EmptyDatasetError: an empty prompt.

        Example:
            >>> ps = [model.encode("Question: 2 + 2 ="), model.encode("The capital of France is")]
            >>> model.generate_many(ps, 4) == [model.generate(p, 4) for p in ps]
            True
        """
        rows = [[int(i) for i in p] for p in prompts]
        if any(not r for r in rows):
            raise EmptyDatasetError("generate_many needs prompts of at least one token each.")
        if not rows:
            return []
        return self._decode_rows(rows, max_new_tokens, stop_ids, stop_text)[0]

    def _decode_rows(self, rows: list[list[int]], max_new_tokens: int, stop_ids: Sequence[int], stop_text: Sequence[str],
                     keep_logits: bool = False) -> tuple[list[list[int]], list[Tensor]]:
        """:meth:`generate_many`'s decoding; with ``keep_logits`` also each step's ``[rows, d_vocab]`` logits."""
        m: Any = self
        lengths = torch.tensor([len(r) - 1 for r in rows], dtype=torch.long)
        windowed = any(w is not None for w in m.attention_windows) if m.continues_rows else True
        if not m.continues_rows or (windowed and bool((lengths != lengths[0]).any())):
            return [self.generate(r, max_new_tokens, stop_ids=stop_ids, stop_text=stop_text) for r in rows], []
        stop = {int(s) for s in stop_ids}
        prefix = m.padded_prefix([r[:-1] for r in rows])
        past = full_cache() if prefix.cache is None else fresh_cache(prefix.cache)
        n = prefix.n_tokens
        seen = (torch.arange(n)[None, :] < lengths[:, None]).long()
        out: list[list[int]] = [[] for _ in rows]
        done = [False] * len(rows)
        nxt = [r[-1] for r in rows]
        dev = self.device
        kept: list[Tensor] = []
        for step in range(max_new_tokens):
            mask = torch.cat([seen, torch.ones(len(rows), step + 1, dtype=torch.long)], 1)
            logits = m.backend(torch.tensor(nxt, device=dev)[:, None], past_key_values=past,
                               attention_mask=mask.to(dev), position_ids=(lengths + step)[:, None].to(dev))
            if keep_logits:
                kept.append(logits[:, -1].float().cpu())
            nxt = logits[:, -1].argmax(-1).tolist()
            for i, tok in enumerate(nxt):
                if done[i]:
                    continue
                out[i].append(int(tok))
                done[i] = ends_generation(self.decode, out[i], stop, stop_text)
            if all(done):
                break
        return out, kept


__all__ = ["GenerationMixin", "ends_generation"]
