"""Circuit tasks: clean prompts, their targets and their corrupted counterparts, tokenized.

A :class:`CircuitTask` holds a batch of *items* (:func:`make_task`: one prompt pair;
:func:`make_items_task`: a batch of :class:`CircuitItem`, right-padded) as aligned token
rows, the positions whose next-token logits score each item's target, and the metric. The
pass engine (:mod:`.passes`) runs any batch of rows, each row naming the item it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tlcap.errors import EmptyDatasetError, ShapeMismatchError, TargetTokenizationError, UnknownNameError
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
        lengths: Real (unpadded) tokens of each row (rows are right-padded; ``None``: no padding).
    """

    clean: Int[Tensor, "item pos"]
    corrupt: Int[Tensor, "item pos"] | None
    positions: Int[Tensor, "item tgt"]
    target_ids: Int[Tensor, "item tgt"]
    target_mask: Bool[Tensor, "item tgt"]
    corrupt_target_ids: Int[Tensor, "item 1"] | None = None
    metric: str = "nll"
    lengths: Int[Tensor, " item"] | None = None

    @property
    def n_items(self) -> int:
        """Number of items."""
        return int(self.clean.shape[0])

    def real_positions(self) -> Bool[Tensor, "item pos"]:
        """``[item, pos]``: which positions of each row are real tokens (not right padding).

        Returns:
            A ``[item, pos]`` bool mask (all True when ``lengths`` is None).
        """
        pos = torch.arange(self.clean.shape[1], device=self.clean.device)
        if self.lengths is None:
            return torch.ones_like(self.clean, dtype=torch.bool)
        return pos[None, :] < self.lengths.to(pos.device)[:, None]

    def rows(self, batch: int) -> Int[Tensor, " batch"]:
        """The item of each of ``batch`` rows: all item 0 for a one-item task, else one row per item.

        Args:
            batch: Number of rows.

        Returns:
            ``[batch]`` item indices: zeros for a one-item task, else ``0 .. n_items-1``.

        Raises:
            ShapeMismatchError: several items and ``batch != n_items``.
        """
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

        The rank counts ties against the target (``rank = #{tokens with logit >= the target's}``):
        a circuit whose logits are all equal — e.g. one with no path to the logits, zero-ablated
        everywhere else — ranks the target last, not first.

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
        rank = (first >= tl[:, None]).sum(-1)
        return {"nll": -(lp * mask).sum(-1) / mask.sum(-1), "rank": rank, "target_logit": tl}


@dataclass(frozen=True)
class CircuitItem:
    """One item of a circuit dataset: a clean prompt, its answer, and (optionally) its corrupted twin.

    Attributes:
        prompt: Clean prompt, e.g. ``"The capital of France is"``.
        target: Its answer with the leading space, e.g. ``" Paris"``.
        corrupt_prompt: Same relation, another subject of the same token length, or ``None``.
        corrupt_target: The corrupted prompt's answer (``metric="logit_diff"``), or ``None``.
        relation: Relation id (``"P36"``) or another group label.
        uid: An identifier of the item in its source.
    """

    prompt: str
    target: str
    corrupt_prompt: str | None = None
    corrupt_target: str | None = None
    relation: str = ""
    uid: str = ""


def _encode_item(model: Model, it: CircuitItem, metric: str, where: str) -> tuple[list[int], list[int], Any, Any]:
    """Clean ids (prompt + teacher-forced target), target ids, corrupted ids and the corrupted answer id."""
    p_ids = model.encode(it.prompt)
    t_ids = model.target_ids(it.prompt, it.target)
    c_ids = None
    if it.corrupt_prompt is not None:
        c_ids = model.encode(it.corrupt_prompt)
        if len(c_ids) != len(p_ids):
            raise ShapeMismatchError(
                f"{where}the corrupted prompt is {len(c_ids)} tokens {model.to_str_tokens(c_ids)} but the clean prompt "
                f"is {len(p_ids)} tokens {model.to_str_tokens(p_ids)}; edge patching aligns them position by position: "
                "pick a corrupted subject with the same number of tokens (change only the subject), "
                "or use zero ablation (--zero-ablate; ablation='zero' in the API)"
            )
        c_ids = c_ids + t_ids[:-1]
    cid = None
    if metric == "logit_diff":
        if it.corrupt_target is None:
            raise TargetTokenizationError(f"{where}metric 'logit_diff' needs corrupt_target (the corrupted prompt's answer)")
        if len(t_ids) != 1:
            raise TargetTokenizationError(
                f"{where}--metric logit-diff compares one-token answers but the target {it.target!r} is {len(t_ids)} "
                f"tokens {model.to_str_tokens(t_ids)}; give a one-token target or use --metric nll (teacher-forced)"
            )
        c_target = model.target_ids(it.corrupt_prompt or it.prompt, it.corrupt_target)
        if len(c_target) != 1:
            raise TargetTokenizationError(
                f"{where}--corrupt-target {it.corrupt_target!r} is {len(c_target)} tokens "
                f"{model.to_str_tokens(c_target)}; --metric logit-diff compares one-token answers: give a one-token "
                "answer (e.g. ' Rome') or use --metric nll"
            )
        cid = c_target[0]
    return p_ids + t_ids[:-1], t_ids, c_ids, cid


def _pad(rows: list[list[int]], width: int, fill: int) -> list[list[int]]:
    return [r + [fill] * (width - len(r)) for r in rows]


def make_items_task(model: Model, items: Sequence[CircuitItem], metric: str = "nll") -> CircuitTask:
    """Tokenize a batch of items into one task, right-padded to the longest row.

    **Padding.** Rows are right-padded (:attr:`~tlcap.models.Model.pad_token_id`): real tokens
    come first, so no real position ever attends to a pad (attention is causal) and every real
    position's activations equal those of the item run alone. The metric reads only real
    positions, so the gradient at every pad position is exactly 0 and pads add nothing to an edge
    score; mean ablations average real positions only (:meth:`CircuitTask.real_positions`). A
    clean prompt and its corrupted twin must have the same number of tokens (they are patched
    position by position): no alignment rule is applied, the item is refused.

    Args:
        model: The model.
        items: The items (all with a corrupted prompt, or none).
        metric: ``"nll"`` (MatchNLL) or ``"logit_diff"`` (every item needs ``corrupt_target``).

    Returns:
        The :class:`CircuitTask` (``lengths`` = real tokens per row).

    Raises:
        ShapeMismatchError: an item whose corrupted prompt has another number of tokens (the
            message names the item), or items mixing with and without corrupted prompts.
        TargetTokenizationError: a target that does not tokenize cleanly after its prompt.
        EmptyDatasetError: no items.

    Example:
        >>> task = make_items_task(model, [CircuitItem("The capital of France is", " Paris")])
        >>> task.clean.shape, task.corrupt is None               # no corrupted prompt: zero ablation
        (torch.Size([1, 5]), True)
    """
    metric = metric.replace("-", "_")
    if metric not in METRICS:
        raise UnknownNameError.of("metric", metric, ("nll", "logit-diff"), option="--metric")
    if not items:
        raise EmptyDatasetError("a circuit task needs at least one item")
    enc = [_encode_item(model, it, metric, f"item {i} ({it.prompt!r}): " if len(items) > 1 else "")
           for i, it in enumerate(items)]
    has_c = {c is not None for _, _, c, _ in enc}
    if len(has_c) > 1:
        raise ShapeMismatchError("some items have a corrupted prompt and some do not: give one to every item or to none")
    width = max(len(c) for c, _, _, _ in enc)
    n_tgt = max(len(t) for _, t, _, _ in enc)
    pad = model.pad_token_id
    dev = model.device

    def tensor(rows: list[list[int]]) -> Tensor:
        return torch.tensor(rows, dtype=torch.long, device=dev)

    positions = [list(range(len(c) - len(t), len(c))) for c, t, _, _ in enc]
    return CircuitTask(
        clean=tensor(_pad([c for c, _, _, _ in enc], width, pad)),
        corrupt=tensor(_pad([x for _, _, x, _ in enc], width, pad)) if has_c == {True} else None,
        positions=tensor(_pad(positions, n_tgt, 0)),
        target_ids=tensor(_pad([t for _, t, _, _ in enc], n_tgt, 0)),
        target_mask=tensor(_pad([[1] * len(t) for _, t, _, _ in enc], n_tgt, 0)).bool(),
        corrupt_target_ids=tensor([[x] for _, _, _, x in enc]) if metric == "logit_diff" else None,
        metric=metric,
        lengths=tensor([[len(c) for c, _, _, _ in enc]])[0],
    )


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
        >>> task.clean.shape, task.corrupt.shape            # [items, pos]: same token length
        (torch.Size([1, 5]), torch.Size([1, 5]))
    """
    return make_items_task(model, [CircuitItem(prompt, target, corrupt_prompt, corrupt_target)], metric)


__all__ = ["CircuitItem", "CircuitTask", "make_items_task", "make_task"]
