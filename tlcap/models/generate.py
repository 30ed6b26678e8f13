"""Greedy decoding with a key/value cache.

:class:`tlcap.models.Model` mixes :class:`GenerationMixin` in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tlcap.errors import EmptyDatasetError, TlcapError
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
        and its own continuation; the cache grows in place (:meth:`decode_rows`). A row that has stopped (a
        ``stop_ids`` token or ``stop_text``, as :meth:`generate` stops) keeps its tokens, and once a quarter of the
        batch has stopped those rows leave it; the batch steps until every row has stopped or
        ``max_new_tokens``. Each row equals :meth:`generate` of its prompt up to the float rounding of a
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
        if not self.decodes_rows([len(r) for r in rows]):
            return [self.generate(r, max_new_tokens, stop_ids=stop_ids, stop_text=stop_text) for r in rows]
        return self.decode_rows(rows, max_new_tokens, stop_ids, stop_text, compact=True).tokens

    def decodes_rows(self, lengths: Sequence[int]) -> bool:
        """Whether prompts of these lengths can decode as rows of one batch (:meth:`decode_rows`): a TransformerBridge
        backend, and prompts of one length where a layer has a sliding attention window.

        Args:
            lengths: Tokens of each prompt.

        Returns:
            ``True`` where :meth:`decode_rows` runs them.
        """
        m: Any = self
        if not m.continues_rows:
            return False
        return not (any(w is not None for w in m.attention_windows) and len(set(lengths)) > 1)

    @torch.no_grad()
    def decode_rows(self, rows: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                    stop_text: Sequence[str] = (), *, row_hooks: Callable[[Tensor], HookList] | None = None,
                    compact: bool = False, keep_logits: bool = False) -> Decoded:
        """Greedy continuations of several prompts as rows of one batch (:meth:`generate_many`'s engine).

        The prompts' tokens but the last are cached as one right-padded prefix (:meth:`padded_prefix`); every step
        feeds one token per row at the row's own position. ``row_hooks`` gives each pass its forward hooks from the
        indices (into ``rows``) of the rows it holds, so every row can carry its own intervention (a neuron set of
        :class:`~tlcap.intervene.set_rows.SetFactors`, applied at every position, the prompt's included). With
        ``compact`` the rows that have stopped leave the batch, their keys/values with them, once they are a quarter
        of it: later steps run the rows still decoding only (each row's tokens do not depend on the rows beside it,
        up to the float rounding of a batch). The batch steps until every row has stopped or ``max_new_tokens``.

        Args:
            rows: Token ids of each prompt (each at least one token; lengths as :meth:`decodes_rows` allows).
            max_new_tokens: Most tokens to generate per row.
            stop_ids: Stop a row after it generates one of these ids (included).
            stop_text: Stop a row once its decoded continuation contains one of these strings.
            row_hooks: ``rows held -> hooks`` of a pass (default: no hooks).
            compact: Drop stopped rows from the batch.
            keep_logits: Also keep each step's ``[rows, d_vocab]`` logits (every row kept: not with ``compact``).

        Returns:
            A :class:`Decoded`: the tokens of each row, the kept logits and the tokens run.

        Raises:
            TlcapError: the rows cannot decode as one batch (:meth:`decodes_rows`), or ``compact`` with ``keep_logits``.

        Example:
            >>> ps = [model.encode("Question: 2 + 2 ="), model.encode("Hi")]
            >>> d = model.decode_rows(ps, 3, compact=True)
            >>> d.tokens == [model.generate(p, 3) for p in ps], d.passes     # the padded prefix, then 3 steps
            (True, 4)
        """
        m: Any = self
        lengths = torch.tensor([len(r) - 1 for r in rows], dtype=torch.long)
        if not self.decodes_rows([len(r) for r in rows]):
            raise TlcapError("these prompts cannot decode as rows of one batch (a TL 3.9 backend, or prompts of "
                             "unequal lengths on a sliding-window model); generate them one at a time")
        if compact and keep_logits:
            raise TlcapError("decode_rows keeps every row's logits only without compact=True")
        stop = {int(s) for s in stop_ids}
        alive = torch.arange(len(rows))
        out: list[list[int]] = [[] for _ in rows]
        done = [False] * len(rows)
        nxt = [int(r[-1]) for r in rows]
        dev = self.device
        kept: list[Tensor] = []
        tokens, passes = 0, 0
        scope = contextlib.ExitStack()
        try:
            if row_hooks is not None:
                scope.enter_context(self.hooks(fwd=row_hooks(alive)))
            prefix = m.padded_prefix([list(r[:-1]) for r in rows])
            past = full_cache() if prefix.cache is None else fresh_cache(prefix.cache)
            n = prefix.n_tokens
            if n:
                tokens, passes = n * len(rows), 1
            seen = (torch.arange(n)[None, :] < lengths[:, None]).long()
            for step in range(max_new_tokens):
                held = alive.tolist()
                mask = torch.cat([seen, torch.ones(len(held), step + 1, dtype=torch.long)], 1)
                logits = m.backend(torch.tensor([nxt[i] for i in held], device=dev)[:, None], past_key_values=past,
                                   attention_mask=mask.to(dev), position_ids=(lengths[alive] + step)[:, None].to(dev))
                tokens, passes = tokens + len(held), passes + 1
                if keep_logits:
                    kept.append(logits[:, -1].float().cpu())
                for i, tok in zip(held, logits[:, -1].argmax(-1).tolist()):
                    nxt[i] = int(tok)
                    if not done[i]:
                        out[i].append(int(tok))
                        done[i] = ends_generation(self.decode, out[i], stop, stop_text)
                if all(done):
                    break
                finished = sum(done[i] for i in held)
                if compact and 4 * finished >= len(held):
                    keep = torch.tensor([j for j, i in enumerate(held) if not done[i]])
                    past, seen, alive = fresh_cache(past, keep), seen[keep], alive[keep]
                    if row_hooks is not None:
                        scope.close()
                        scope = contextlib.ExitStack()
                        scope.enter_context(self.hooks(fwd=row_hooks(alive)))
        finally:
            scope.close()
        return Decoded(out, kept, tokens, passes)


@dataclass(frozen=True)
class Decoded:
    """What :meth:`GenerationMixin.decode_rows` generated.

    Attributes:
        tokens: The generated token ids of each row (up to and including its stop).
        logits: Each step's ``[rows, d_vocab]`` logits (``keep_logits=True``; else empty).
        tokens_run: Tokens the passes ran (the padded prefix's rows × length, then one per held row and step).
        passes: Forward calls (the prefix pass, if any prompt has 2+ tokens, and one per step).
    """

    tokens: list[list[int]]
    logits: list[Tensor]
    tokens_run: int
    passes: int


__all__ = ["GenerationMixin", "Decoded", "ends_generation"]
