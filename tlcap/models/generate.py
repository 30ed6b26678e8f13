"""Greedy decoding with a key/value cache.

:class:`tlcap.models.Model` mixes :class:`GenerationMixin` in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from tlcap.errors import EmptyDatasetError
from tlcap.models.cache import PrefixCache
from tlcap.runtime.hooks import HookList


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
                if tok in stop:
                    break
                if stop_text and any(s in self.decode(out) for s in stop_text):
                    break
                nxt = torch.tensor([[tok]], device=self.device)
        return out


__all__ = ["GenerationMixin"]
