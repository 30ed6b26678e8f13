"""Circuit tasks: clean prompts, their targets and their corrupted counterparts, tokenized.

A :class:`CircuitTask` holds a batch of *items* (one today: :func:`make_task` builds a task of
one prompt pair) as aligned token rows, the positions whose next-token logits score each
item's target, and the metric. The pass engine (:mod:`.passes`) runs any batch of rows,
each row naming the item it belongs to, so a dataset task (many items) uses the same passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tlcap.errors import ShapeMismatchError, TargetTokenizationError, UnknownNameError
from tlcap.locate.circuits.config import METRICS
from tlcap.models import Model


def _hi(x: Tensor) -> Tensor:
    """At least float32 (float64 models stay float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


@dataclass(frozen=True)
class CircuitTask:
    """Items to find a circuit for: clean rows, corrupted rows, target tokens, metric.

    Build with :func:`make_task`. Row ``i`` of ``clean`` is item ``i``'s prompt followed by all
    but the last target token (teacher forcing); its target token ``j`` is scored by the
    next-token logits at ``positions[i, j]`` where ``target_mask[i, j]``.

    Attributes:
        clean: Clean token ids ``[item, pos]``.
        corrupt: Corrupted token ids ``[item, pos]`` (aligned with ``clean``), or ``None``.
        positions: Positions whose next-token logits score the target tokens ``[item, tgt]``.
        target_ids: Target token ids ``[item, tgt]``.
        target_mask: Which ``(item, tgt)`` entries are real target tokens ``[item, tgt]``.
        corrupt_target_ids: Token id of each item's corrupted answer ``[item, 1]``
            (``metric="logit_diff"``), or ``None``.
        metric: ``"nll"`` (MatchNLL) or ``"logit_diff"``.
    """

    clean: Int[Tensor, "item pos"]
    corrupt: Int[Tensor, "item pos"] | None
    positions: Int[Tensor, "item tgt"]
    target_ids: Int[Tensor, "item tgt"]
    target_mask: Bool[Tensor, "item tgt"]
    corrupt_target_ids: Int[Tensor, "item 1"] | None = None
    metric: str = "nll"

    @property
    def n_items(self) -> int:
        """Number of items."""
        return int(self.clean.shape[0])

    def rows(self, batch: int) -> Int[Tensor, " batch"]:
        """The item of each of ``batch`` rows: all item 0 for a one-item task, else one row per item."""
        if self.n_items == 1:
            return torch.zeros(batch, dtype=torch.long, device=self.clean.device)
        if batch != self.n_items:
            raise ShapeMismatchError(f"{batch} rows for a task of {self.n_items} items; pass the rows' items explicitly")
        return torch.arange(batch, device=self.clean.device)

    def _gather(self, logits: Tensor, items: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities of the targets ``[b, tgt]``, their mask, and the selected logits ``[b, tgt, V]``."""
        items = items.to(logits.device)
        pos = self.positions.to(logits.device)[items]  # [b, tgt]
        sel = _hi(logits[torch.arange(logits.shape[0], device=logits.device)[:, None], pos])  # [b, tgt, V]
        ids = self.target_ids.to(logits.device)[items]
        lp = sel.log_softmax(-1).gather(-1, ids[..., None])[..., 0]
        return lp, self.target_mask.to(logits.device)[items], sel

    def metric_rows(
        self, logits: Float[Tensor, "batch pos d_vocab"], items: Int[Tensor, " batch"] | None = None
    ) -> Float[Tensor, " batch"]:
        """The metric of every row: MatchNLL of its item's target, or the logit difference.

        Args:
            logits: Logits of a batch of rows.
            items: The item of each row (default :meth:`rows`).

        Returns:
            ``[batch]`` metric values (at least float32).
        """
        items = self.rows(logits.shape[0]) if items is None else items
        lp, mask, sel = self._gather(logits, items)
        if self.metric == "nll":
            return -(lp * mask).sum(-1) / mask.sum(-1)
        assert self.corrupt_target_ids is not None  # make_task guarantees it
        ids = self.target_ids.to(logits.device)[items][:, :1]
        cids = self.corrupt_target_ids.to(logits.device)[items]
        first = sel[:, 0]
        return (first.gather(-1, ids) - first.gather(-1, cids))[:, 0]

    def target_stats(
        self, logits: Float[Tensor, "batch pos d_vocab"], items: Int[Tensor, " batch"] | None = None
    ) -> dict[str, Tensor]:
        """NLL of the target, 1-based rank and logit of its first token, for every row.

        Args:
            logits: Logits of a batch of rows.
            items: The item of each row (default :meth:`rows`).

        Returns:
            ``{"nll": [batch], "rank": [batch], "target_logit": [batch]}``.
        """
        items = self.rows(logits.shape[0]) if items is None else items
        lp, mask, sel = self._gather(logits, items)
        first = sel[:, 0]
        tl = first.gather(-1, self.target_ids.to(logits.device)[items][:, :1])[:, 0]
        rank = (first > tl[:, None]).sum(-1) + 1
        return {"nll": -(lp * mask).sum(-1) / mask.sum(-1), "rank": rank, "target_logit": tl}


def make_task(
    model: Model,
    prompt: str,
    target: str,
    corrupt_prompt: str | None = None,
    metric: str = "nll",
    corrupt_target: str | None = None,
) -> CircuitTask:
    """Tokenize a one-item circuit task and check that clean and corrupted inputs align.

    Args:
        model: The model.
        prompt: Clean prompt, e.g. ``"The capital of France is"``.
        target: Answer, e.g. ``" Paris"`` (multi-token answers are teacher-forced).
        corrupt_prompt: Same-relation prompt with another subject of the same token length
            (``"The capital of Italy is"``), or ``None`` (zero ablation).
        metric: ``"nll"`` (MatchNLL) or ``"logit_diff"`` (needs ``corrupt_target``).
        corrupt_target: The corrupted prompt's answer (``" Rome"``) for ``logit_diff``.

    Returns:
        The :class:`CircuitTask` (one item).

    Raises:
        ShapeMismatchError: the corrupted prompt has a different number of tokens.
        TargetTokenizationError: the target does not tokenize cleanly after the prompt, or
            ``logit_diff`` gets a target or corrupted answer of more than one token.

    Example:
        >>> task = make_task(model, "The capital of France is", " Paris", "The capital of Italy is")
        >>> task.clean.shape, task.corrupt.shape
    """
    metric = metric.replace("-", "_")
    if metric not in METRICS:
        raise UnknownNameError.of("metric", metric, ("nll", "logit-diff"), option="--metric")
    p_ids = model.encode(prompt)
    t_ids = model.target_ids(prompt, target)
    clean = p_ids + t_ids[:-1]
    positions = list(range(len(p_ids) - 1, len(p_ids) - 1 + len(t_ids)))
    dev = model.device
    cor = None
    if corrupt_prompt is not None:
        c_ids = model.encode(corrupt_prompt)
        if len(c_ids) != len(p_ids):
            raise ShapeMismatchError(
                f"the corrupted prompt is {len(c_ids)} tokens {model.to_str_tokens(c_ids)} but the clean prompt is "
                f"{len(p_ids)} tokens {model.to_str_tokens(p_ids)}; edge patching aligns them position by position: "
                "pick a corrupted subject with the same number of tokens (change only the subject), "
                "or use zero ablation (--zero-ablate; ablation='zero' in the API)"
            )
        cor = torch.tensor([c_ids + t_ids[:-1]], dtype=torch.long, device=dev)
    cids = None
    if metric == "logit_diff":
        if corrupt_target is None:
            raise TargetTokenizationError("metric 'logit_diff' needs corrupt_target (the corrupted prompt's answer)")
        if len(t_ids) != 1:
            raise TargetTokenizationError(
                f"--metric logit-diff compares one-token answers but the target {target!r} is {len(t_ids)} tokens "
                f"{model.to_str_tokens(t_ids)}; give a one-token target or use --metric nll (teacher-forced)"
            )
        c_target = model.target_ids(corrupt_prompt or prompt, corrupt_target)
        if len(c_target) != 1:
            raise TargetTokenizationError(
                f"--corrupt-target {corrupt_target!r} is {len(c_target)} tokens {model.to_str_tokens(c_target)}; "
                "--metric logit-diff compares one-token answers: give a one-token answer (e.g. ' Rome') "
                "or use --metric nll"
            )
        cids = torch.tensor([c_target], dtype=torch.long, device=dev)
    return CircuitTask(
        clean=torch.tensor([clean], dtype=torch.long, device=dev),
        corrupt=cor,
        positions=torch.tensor([positions], dtype=torch.long, device=dev),
        target_ids=torch.tensor([t_ids], dtype=torch.long, device=dev),
        target_mask=torch.ones(1, len(t_ids), dtype=torch.bool, device=dev),
        corrupt_target_ids=cids,
        metric=metric,
    )


__all__ = ["CircuitTask", "make_task"]
