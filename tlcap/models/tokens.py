"""Tokens: checked encoding, padded batches, character offsets and subject spans.

This is the only module that calls the tokenizer. :class:`tlcap.models.Model` mixes
:class:`TokensMixin` in, so every string → ids conversion in tlcap is ``model.encode``,
``model.to_tokens``, ``model.encode_batch``, ``model.target_ids`` or ``model.subject_span``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from tlcap.errors import (
    EmptyDatasetError,
    PromptTooLongError,
    SubjectNotFoundError,
    TargetTokenizationError,
    TlcapError,
    TlcapWarning,
)
from tlcap.models.token_types import SubjectSpan, TokenBatch

SPECIAL_TOKENS: tuple[str, ...] = ("bos", "eos", "pad", "mask", "unk")


class TokensMixin:
    """Tokenizer-facing methods of :class:`tlcap.models.Model` (see the class for attributes)."""

    tokenizer: Any
    prepend_bos: bool
    n_ctx: int
    name: str

    # ------------------------------------------------------------------ encoding
    @property
    def has_tokenizer(self) -> bool:
        """Whether the model has a tokenizer (random test models may have none)."""
        return self.tokenizer is not None

    def _need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise TargetTokenizationError("This model has no tokenizer; pass token ids (tensors) instead of strings.")
        return self.tokenizer

    def _raw_ids(self, text: str) -> list[int]:
        return list(self._need_tokenizer()(text, add_special_tokens=False)["input_ids"])

    def special_token_id(self, name: str) -> int | None:
        """Id of a special token of the tokenizer, or ``None`` if it has none.

        Args:
            name: One of ``"bos"``, ``"eos"``, ``"pad"``, ``"mask"``, ``"unk"``.

        Returns:
            The token id, or ``None`` (also when the model has no tokenizer).
        """
        if name not in SPECIAL_TOKENS:
            raise TlcapError(f"Unknown special token {name!r}; use one of {', '.join(SPECIAL_TOKENS)}.")
        v = getattr(self.tokenizer, f"{name}_token_id", None) if self.tokenizer is not None else None
        return None if v is None else int(v)

    @property
    def pad_token_id(self) -> int:
        """The id used for padding: the tokenizer's pad token, else its EOS token, else 0.

        Padding is never attended to by real tokens (right padding is after them, left
        padding is masked), so its value does not change any real position's output.
        """
        for name in ("pad", "eos"):
            v = self.special_token_id(name)
            if v is not None:
                return v
        return 0

    def encode(
        self,
        text: str,
        prepend_bos: bool | None = None,
        *,
        max_tokens: int | None = None,
        check_length: bool = True,
    ) -> list[int]:
        """Token ids of ``text`` (with BOS if ``prepend_bos``, default the model's setting).

        Args:
            text: The text.
            prepend_bos: Put the BOS token (EOS if the tokenizer has no BOS) first.
            max_tokens: Keep only the first ``max_tokens`` ids (after the BOS).
            check_length: Raise when the ids do not fit the context window; turn it off for
                text that is cut into windows later (e.g. a corpus sample).

        Returns:
            The token ids.

        Raises:
            PromptTooLongError: with ``check_length``, more ids than the context length.
            TargetTokenizationError: the model has no tokenizer.
        """
        ids = self._raw_ids(text)
        bos = self.prepend_bos if prepend_bos is None else prepend_bos
        if bos:
            bos_id = self.special_token_id("bos")
            if bos_id is None:
                bos_id = self.special_token_id("eos")
            ids = [bos_id] + ids
        if max_tokens is not None:
            ids = ids[:max_tokens]
        if check_length and len(ids) > self.n_ctx:
            raise PromptTooLongError(
                f"Prompt is {len(ids)} tokens but {self.name} has a context of {self.n_ctx}; "
                "shorten it or truncate it before calling."
            )
        return ids

    def token_counts(self, texts: Sequence[str], prepend_bos: bool | None = None) -> list[int]:
        """``[len(encode(t, prepend_bos, check_length=False)) for t in texts]`` in one tokenizer call.

        Args:
            texts: The texts.
            prepend_bos: Count a BOS token first (default the model's setting).

        Returns:
            The token count of each text.
        """
        if not texts:
            return []
        bos = self.prepend_bos if prepend_bos is None else prepend_bos
        ids = self._need_tokenizer()(list(texts), add_special_tokens=False)["input_ids"]
        return [len(x) + int(bool(bos)) for x in ids]

    def to_tokens(self, text: str, prepend_bos: bool | None = None) -> Int[Tensor, "1 pos"]:
        """Tokenize one prompt to a ``[1, pos]`` tensor, checking the context length.

        Args:
            text: The prompt.
            prepend_bos: Prepend the BOS token (default the model's setting).

        Returns:
            A ``[1, pos]`` long tensor on the model's device.
        """
        ids = self.encode(text, prepend_bos=prepend_bos)
        return torch.tensor([ids], dtype=torch.long, device=self.device)  # type: ignore[attr-defined]

    def encode_batch(
        self,
        texts: Sequence[str | Sequence[int] | Tensor],
        side: str = "right",
        prepend_bos: bool | None = None,
        pad_id: int | None = None,
    ) -> TokenBatch:
        """Tokenize several prompts (or take id lists) and pad them into one batch.

        Args:
            texts: Strings (tokenized with :meth:`encode`) or rows of token ids.
            side: ``"right"``: real tokens first (row ``i``'s next-token logits at column
                ``lengths[i] - 1``); ``"left"``: real tokens last (all at column ``-1``).
            prepend_bos: For strings, as in :meth:`encode`.
            pad_id: Padding id (default :attr:`pad_token_id`).

        Returns:
            A :class:`TokenBatch` on the model's device.

        Raises:
            EmptyDatasetError: no rows, or a row with no tokens.

        Example:
            >>> batch = model.encode_batch(["The capital of France is", "Paris is in"])
            >>> next_logits = model.last_logits(batch)      # [2, d_vocab]
        """
        if side not in ("right", "left"):
            raise TlcapError(f"side must be 'right' or 'left', got {side!r}.")
        rows: list[list[int]] = []
        for t in texts:
            if isinstance(t, str):
                rows.append(self.encode(t, prepend_bos=prepend_bos))
            elif isinstance(t, Tensor):
                rows.append([int(i) for i in t.flatten().tolist()])
            else:
                rows.append([int(i) for i in t])
        if not rows:
            raise EmptyDatasetError("encode_batch got no texts.")
        empty = [i for i, r in enumerate(rows) if not r]
        if empty:
            raise EmptyDatasetError(f"Rows {empty} of the batch have no tokens; drop empty texts before encoding.")
        pad = self.pad_token_id if pad_id is None else int(pad_id)
        width = max(len(r) for r in rows)
        toks, mask = [], []
        for r in rows:
            fill = width - len(r)
            toks.append(r + [pad] * fill if side == "right" else [pad] * fill + r)
            mask.append([1] * len(r) + [0] * fill if side == "right" else [0] * fill + [1] * len(r))
        dev = self.device  # type: ignore[attr-defined]
        return TokenBatch(
            tokens=torch.tensor(toks, dtype=torch.long, device=dev),
            attention_mask=torch.tensor(mask, dtype=torch.long, device=dev),
            lengths=torch.tensor([len(r) for r in rows], dtype=torch.long, device=dev),
            side=side,
        )

    # ------------------------------------------------------------------ decoding
    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of token ids (one string).

        Args:
            ids: Token ids (a tensor is flattened).

        Returns:
            The decoded text.
        """
        if isinstance(ids, Tensor):
            ids = ids.flatten().tolist()
        return str(self._need_tokenizer().decode(list(ids)))

    def to_str_tokens(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Each token id decoded on its own.

        Args:
            ids: Token ids (a tensor is flattened).

        Returns:
            One string per token.
        """
        if isinstance(ids, Tensor):
            ids = ids.flatten().tolist()
        tok = self._need_tokenizer()
        return [tok.decode([i]) for i in ids]

    # ------------------------------------------------------------------ targets and subjects
    def target_ids(self, prompt: str, target: str, single_token: bool = False) -> list[int]:
        """Token ids of ``target`` as they follow ``prompt``.

        The target is tokenized in context (``prompt + target``) so that a missing leading
        space or a merge across the boundary is noticed instead of silently mis-scored.

        Args:
            prompt: The prompt the target follows.
            target: The answer string (usually with a leading space).
            single_token: Require exactly one token.

        Returns:
            The target's token ids (no BOS).

        Raises:
            TargetTokenizationError: the target merges with the prompt's last token, is
                empty, or (with ``single_token``) is more than one token.
        """
        if not target:
            raise TargetTokenizationError("The target is empty; give the answer string, e.g. ' Paris'.")
        p_ids = self.encode(prompt, prepend_bos=False)
        joint = self.encode(prompt + target, prepend_bos=False)
        alone = self._raw_ids(target)
        if joint[: len(p_ids)] != p_ids:
            raise TargetTokenizationError(
                f"Target {target!r} merges with the end of the prompt {prompt[-20:]!r} when "
                "tokenized together; end the prompt at a word boundary or start the target "
                "with a space (e.g. ' Paris')."
            )
        ids = joint[len(p_ids):]
        if ids != alone:
            raise TargetTokenizationError(
                f"Target {target!r} tokenizes as {self.to_str_tokens(alone)} alone but as "
                f"{self.to_str_tokens(ids)} after the prompt; fix the spacing of prompt/target."
            )
        if not target[0].isspace() and prompt and not prompt[-1].isspace():
            warnings.warn(
                f"Target {target!r} has no leading space and the prompt does not end with one: "
                f"it is scored as the tokens {self.to_str_tokens(ids)} glued to the prompt. "
                "Most facts need a leading space (e.g. ' Paris').",
                TlcapWarning, stacklevel=2,
            )
        if single_token and len(ids) != 1:
            raise TargetTokenizationError(
                f"Target {target!r} is {len(ids)} tokens {self.to_str_tokens(ids)}; this method "
                "needs a single-token target. Use a shorter answer, or a method that supports "
                "multi-token targets by teacher forcing."
            )
        return ids

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character range ``(start, end)`` of each token of ``text`` (no BOS).

        Taken from the fast tokenizer's offset mapping; for slow tokenizers, from the lengths
        of decoded prefixes. GPT-2's ``" France"`` token covers the space before the word.

        Args:
            text: The text.

        Returns:
            One ``(start, end)`` character range per token.
        """
        tok = self._need_tokenizer()
        try:
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            offs = [(int(a), int(b)) for a, b in enc["offset_mapping"]]
            if len(offs) == len(enc["input_ids"]):
                return offs
        except (NotImplementedError, TypeError, ValueError, KeyError):
            pass
        ids = self._raw_ids(text)
        out, prev = [], 0
        for i in range(len(ids)):
            n = len(tok.decode(ids[: i + 1]))
            out.append((prev, n))
            prev = n
        return out

    def subject_span(
        self,
        prompt: str,
        subject: str,
        occurrence: int = 0,
        start: int = 0,
        prepend_bos: bool | None = None,
    ) -> SubjectSpan:
        """Token range of one occurrence of ``subject`` in ``prompt``, found from character offsets.

        Works whatever the tokenizer does with spaces: a token is part of the subject when its
        characters overlap the subject's. Positions are those of :meth:`encode` (a prepended
        BOS shifts them by one).

        Args:
            prompt: The prompt.
            subject: The subject exactly as written in the prompt.
            occurrence: Which occurrence to use, 0-based among those at or after ``start``
                (negative counts from the last). Occurrences are every character position
                where ``subject`` starts (overlapping ones included).
            start: Character index where the search begins (e.g. skip a prepended prefix).
            prepend_bos: As in :meth:`encode` (default the model's setting).

        Returns:
            A :class:`SubjectSpan`; its ``n_occurrences`` tells whether the subject is ambiguous.

        Raises:
            SubjectNotFoundError: ``subject`` is empty, not in ``prompt[start:]``, has no
                occurrence number ``occurrence``, or covers no token.

        Example:
            >>> span = model.subject_span("The capital of France is", "France")
            >>> span.range, span.n_occurrences
            ((3, 4), 1)
        """
        hits: list[int] = []
        if subject:
            i = prompt.find(subject, start)
            while i >= 0:
                hits.append(i)
                i = prompt.find(subject, i + 1)
        if not hits:
            raise SubjectNotFoundError(
                f"Subject {subject!r} does not occur in the prompt {prompt!r}; pass the subject exactly "
                "as it is written in the prompt (case and spacing included)."
            )
        if not -len(hits) <= occurrence < len(hits):
            raise SubjectNotFoundError(
                f"Subject {subject!r} occurs {len(hits)} time(s) in {prompt!r}; occurrence={occurrence} "
                f"must be in 0..{len(hits) - 1}."
            )
        occ = occurrence % len(hits)
        c0 = hits[occ]
        c1 = c0 + len(subject)
        idx = [i for i, (a, b) in enumerate(self.token_offsets(prompt)) if b > c0 and a < c1 and b > a]
        if not idx:
            raise SubjectNotFoundError(f"Subject {subject!r} covers no token of {prompt!r}.")
        bos = self.prepend_bos if prepend_bos is None else prepend_bos
        shift = 1 if bos else 0
        return SubjectSpan(idx[0] + shift, idx[-1] + 1 + shift, occ, len(hits), c0, c1)


__all__ = ["SPECIAL_TOKENS", "SubjectSpan", "TokenBatch", "TokensMixin"]
