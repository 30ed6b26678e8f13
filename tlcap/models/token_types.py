"""Value types of the tokens API: padded batches (:class:`TokenBatch`) and subject spans (:class:`SubjectSpan`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor


@dataclass(frozen=True)
class TokenBatch:
    """Rows of token ids of different lengths, padded into one ``[batch, pos]`` tensor.

    Build with :meth:`TokensMixin.encode_batch`. With ``side="right"`` row ``i``'s tokens sit at
    columns ``0 .. lengths[i]-1`` (causal attention never lets a real token see the padding
    after it, so no mask is needed); with ``side="left"`` they end at the last column (every
    row's next-token logits are at ``[:, -1]``; the model then needs ``attention_mask``, which
    :meth:`tlcap.models.Model.logits` passes when given a ``TokenBatch``).

    Attributes:
        tokens: Padded token ids; padding holds the pad id.
        attention_mask: 1 at real tokens, 0 at padding.
        lengths: Number of real tokens of each row.
        side: ``"right"`` or ``"left"``: where the padding goes.
    """

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    side: str = "right"

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def is_padded(self) -> bool:
        """Whether any row is shorter than the batch."""
        return bool((self.lengths < self.tokens.shape[1]).any())

    @property
    def starts(self) -> Int[Tensor, " batch"]:
        """Column of each row's first real token (0 with right padding)."""
        if self.side == "right":
            return torch.zeros_like(self.lengths)
        return self.tokens.shape[1] - self.lengths

    @property
    def last_positions(self) -> Int[Tensor, " batch"]:
        """Column of each row's last real token (where its next-token logits are)."""
        return self.starts + self.lengths - 1

    def positions(self, index: int | Sequence[int] | Tensor) -> Int[Tensor, " batch"]:
        """Column of token number ``index`` of each row (one index, or one per row).

        Args:
            index: 0-based token index within the row's real tokens; negative values count
                from the row's end (``-1`` is :attr:`last_positions`).

        Returns:
            ``[batch]`` column indices.
        """
        idx = torch.as_tensor(index, dtype=torch.long, device=self.lengths.device).expand(len(self))
        return torch.where(idx < 0, self.starts + self.lengths + idx, self.starts + idx)

    def row(self, i: int) -> list[int]:
        """The real (unpadded) token ids of row ``i``.

        Args:
            i: Row index.

        Returns:
            The row's ``lengths[i]`` token ids from ``starts[i]`` on.
        """
        s = int(self.starts[i])
        return self.tokens[i, s : s + int(self.lengths[i])].tolist()


@dataclass(frozen=True)
class SubjectSpan:
    """Where a subject sits in a tokenized prompt.

    Attributes:
        start: First token of the subject (a BOS token, when prepended, counts as position 0).
        end: One past its last token.
        occurrence: Which occurrence of the subject in the prompt this is (0-based).
        n_occurrences: How many times the subject occurs in the prompt (at or after the
            character ``start`` the search began at); more than one means it is ambiguous.
        char_start: Character index of the occurrence in the prompt.
        char_end: One past its last character.
    """

    start: int
    end: int
    occurrence: int = 0
    n_occurrences: int = 1
    char_start: int = 0
    char_end: int = 0

    @property
    def range(self) -> tuple[int, int]:
        """``(start, end)``: the token range ``[start, end)``."""
        return self.start, self.end

    @property
    def last(self) -> int:
        """Position of the subject's last token (ROME's key position)."""
        return self.end - 1

    @property
    def ambiguous(self) -> bool:
        """The subject occurs more than once in the prompt."""
        return self.n_occurrences > 1


Tokens = Int[Tensor, "batch pos"] | TokenBatch  # what Model.logits and friends accept

__all__ = ["SubjectSpan", "TokenBatch", "Tokens"]
