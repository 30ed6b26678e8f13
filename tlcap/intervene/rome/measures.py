"""What a ROME edit is measured by: the targets' log-probabilities after the prompt and its paraphrases, the
neighbourhood's top next tokens, and the :class:`RomeEditResult` built from the measures before and after an edit.

The measures take a row plan (:class:`~tlcap.intervene.set_rows.SetFactors`) to score several edited models in
one batch (:mod:`tlcap.intervene.rome.sweep_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.intervene.rome.config import RomeConfig
from tlcap.intervene.rome.results import RomeEditResult
from tlcap.intervene.set_rows import SetFactors
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance


@torch.no_grad()
def target_logprobs(
    model: Model, items: Sequence[tuple[str, str]], bos: bool = False, plan: SetFactors | None = None,
) -> Float[Tensor, "*set n"]:
    """Mean log-probability of each ``(prompt, target)``'s tokens (teacher forcing, one batch).

    Args:
        model: The model.
        items: ``(prompt, target)`` pairs.
        bos: Prepend the model's BOS to each prompt.
        plan: Score the items under each set of this row plan (e.g. one ROME edit per layer as rows), all in one
            batch; ``None``: the model as it is.

    Returns:
        One mean token log-probability per pair (``[n_sets, n]`` with a ``plan``).
    """
    rows, spans = [], []
    for prompt, target in items:
        p = model.encode(prompt, prepend_bos=bos)
        t = model.target_ids(prompt, target)
        rows.append(p + t[:-1])
        spans.append((len(p) - 1, t))
    S = 1 if plan is None else len(plan)
    hooks = () if plan is None else plan.hooks(model, torch.arange(S).repeat_interleave(len(rows)))
    logits = model.logits(model.encode_batch(rows * S), hooks=hooks).float().log_softmax(-1)
    out = []
    for r in range(S * len(rows)):
        start, t = spans[r % len(rows)]
        idx = torch.arange(start, start + len(t), device=logits.device)
        out.append(logits[r, idx, torch.tensor(t, device=logits.device)].mean())
    lp = torch.stack(out)
    return lp if plan is None else lp.reshape(S, len(rows))


@torch.no_grad()
def next_tokens(model: Model, prompts: Sequence[str], bos: bool = False, plan: SetFactors | None = None) -> list[Any]:
    """The top next token of each prompt.

    Args:
        model: The model.
        prompts: The prompts.
        bos: Prepend the model's BOS to each prompt.
        plan: Under each set of this row plan, in one batch (``None``: the model as it is).

    Returns:
        Token ids (one list per set with a ``plan``).
    """
    if plan is None:
        return model.last_logits(model.encode_batch(list(prompts), prepend_bos=bos)).argmax(-1).tolist()
    S = len(plan)
    hooks = plan.hooks(model, torch.arange(S).repeat_interleave(len(prompts)))
    top = model.last_logits(model.encode_batch(list(prompts) * S, prepend_bos=bos), hooks=hooks).argmax(-1)
    return top.reshape(S, len(prompts)).tolist()


def unedited_measures(model: Model, prompt: str, target_new: str, target_old: str, paraphrases: Sequence[str],
                      neighbourhood: Sequence[str], bos: bool = False) -> tuple[Tensor, list[int]]:
    """What :func:`evaluate_rome` measures before and after an edit: log-probabilities of the new and old
    object after the prompt and each paraphrase, and the top next token of each neighbourhood prompt.

    (Named for its use before the edit; inside the edit the same call measures the edited model.)

    Args:
        model: The model (as it is now).
        prompt: The edit's prompt.
        target_new: The new object.
        target_old: The old object.
        paraphrases: Prompts of the same fact worded differently.
        neighbourhood: Prompts of other subjects (specificity).
        bos: Prepend the model's BOS to each prompt.

    Returns:
        ``(logprobs, next_ids)``: mean token log-probabilities ordered ``(prompt, new), (prompt, old)``, then
        the same per paraphrase; and each neighbourhood prompt's top next token (``[]`` when there is none).
    """
    return edited_measures(model, None, prompt, target_new, target_old, paraphrases, neighbourhood, bos)


def edited_measures(model: Model, plan: SetFactors | None, prompt: str, target_new: str, target_old: str,
                    paraphrases: Sequence[str], neighbourhood: Sequence[str], bos: bool = False) -> tuple[Tensor, list[Any]]:
    """:func:`unedited_measures` under each set of a row plan (``None``: the model as it is), in one batch each.

    Args:
        model: The model.
        plan: One edit per set as rows (:class:`~tlcap.intervene.set_rows.SetFactors`), or ``None``.
        prompt, target_new, target_old, paraphrases, neighbourhood, bos: As :func:`unedited_measures`.

    Returns:
        As :func:`unedited_measures`, with a leading set dimension (``[n_sets, ...]``, a list per set) for a plan.
    """
    items = [(p, t) for p in [prompt, *paraphrases] for t in (target_new, target_old)]
    empty: list[Any] = [] if plan is None else [[] for _ in range(len(plan))]
    return (target_logprobs(model, items, bos, plan),
            next_tokens(model, list(neighbourhood), bos, plan) if neighbourhood else empty)


def edit_result(model: Model, cfg: RomeConfig, layer: int, request: tuple[str, str, str, str], paras: Sequence[str],
                neigh: Sequence[str], before: tuple[Tensor, list[int]], after: tuple[Tensor, list[int]],
                edit: tuple[tuple[float, ...], float, float], seconds: tuple[float, float]) -> RomeEditResult:
    """The :class:`RomeEditResult` of one edit from the measures before and after it.

    Args:
        model: The model.
        cfg: The edit's settings.
        layer: The edited layer.
        request: ``(prompt, subject, target_new, target_old)``.
        paras: The paraphrases measured.
        neigh: The neighbourhood prompts measured.
        before: :func:`unedited_measures` of the unedited model.
        after: The same measures of the edited model.
        edit: ``(losses, ‖δ‖, ‖ΔW‖)``.
        seconds: ``(the edit's seconds, seconds in all)``.

    Returns:
        The result with provenance.
    """
    prompt, subject, target_new, target_old = request
    lp0, top0 = before[0].reshape(-1, 2), before[1]
    lp1, top1 = after[0].reshape(-1, 2), after[1]
    succ = tuple(bool(a > b) for a, b in lp1[1:].tolist())
    kept = tuple(a == b for a, b in zip(top0, top1))
    return RomeEditResult(
        layer=layer, efficacy=bool(lp1[0, 0] > lp1[0, 1]),
        paraphrase=sum(succ) / len(succ) if succ else float("nan"),
        specificity=sum(kept) / len(kept) if kept else float("nan"),
        new_prob_before=float(lp0[0, 0].exp()), new_prob_after=float(lp1[0, 0].exp()),
        old_prob_before=float(lp0[0, 1].exp()), old_prob_after=float(lp1[0, 1].exp()),
        prompt=prompt, subject=subject, target_new=target_new, target_old=target_old,
        paraphrases=tuple(paras), paraphrase_success=succ, neighbourhood=tuple(neigh), neighbourhood_kept=kept,
        losses=edit[0], delta_norm=edit[1], update_norm=edit[2], seconds=seconds[0], seconds_total=seconds[1],
        model_name=model.name, provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


__all__ = ["edit_result", "edited_measures", "next_tokens", "target_logprobs", "unedited_measures"]
