"""Probabilities of target tokens under (optionally hooked) runs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.models.adapter import HookList, Model
from tlcap.runtime.positions import predicting, prediction_positions


@torch.no_grad()
def token_probs(model: Model, prompt: str, target: str, hooks: HookList = ()) -> Float[Tensor, " n_target"]:
    """Probability of each target token under teacher forcing (one forward pass).

    The run declares its predicting positions (the last prompt position, then one per further
    target token; :func:`tlcap.runtime.positions.predicting`), so interventions with the
    default ``pos="target"`` — in ``hooks`` or in an enclosing ``model.hooks`` block — act at
    every position that predicts a target token.

    Args:
        model: The model.
        prompt: The query.
        target: The answer (tokenized in context, see :meth:`Model.target_ids`).
        hooks: Forward hooks applied for this run (e.g. :func:`tlcap.intervene.suppress`).

    Returns:
        ``P(y_t | prompt, y_<t)`` for each target token.
    """
    t_ids = model.target_ids(prompt, target)
    p_ids = model.encode(prompt)
    toks = torch.tensor([p_ids + t_ids[:-1]], device=model.device)
    with predicting(prediction_positions(len(p_ids), len(t_ids))):
        logits = model.logits(toks, hooks=hooks)[0, len(p_ids) - 1 :]
    probs = logits.float().softmax(-1)
    return probs[torch.arange(len(t_ids)), torch.tensor(t_ids)]


def target_prob(model: Model, prompt: str, target: str, hooks: HookList = ()) -> float:
    """Probability of the target: the token's, or the geometric mean over its tokens.

    Args:
        model: The model.
        prompt: The query.
        target: The answer, e.g. ``" Paris"``.
        hooks: Forward hooks applied for this run.

    Returns:
        ``exp(mean_t log P(y_t | prompt, y_<t))``.

    Example:
        >>> from tlcap.intervene.activations import suppress
        >>> neurons = tlcap.NeuronSet.from_list([(0, 55), (1, 23)], shape=(model.n_layers, model.d_mlp))
        >>> round(target_prob(model, "The capital of France is", " Paris"), 8)
        2.134e-05
        >>> round(target_prob(model, "The capital of France is", " Paris", hooks=suppress(model, neurons)), 8)
        2.11e-05
    """
    p = token_probs(model, prompt, target, hooks)
    return float(p.log().mean().exp())


@torch.no_grad()
def next_token_probs(
    model: Model, tokens: Int[Tensor, "batch pos"], target_ids: Sequence[int] | Tensor, hooks: HookList = ()
) -> Float[Tensor, " batch"]:
    """Probability of ``target_ids[b]`` at the last position of each row."""
    logits = model.last_logits(tokens, hooks=hooks).float()
    tid = torch.as_tensor(target_ids, device=logits.device).reshape(-1)
    return logits.softmax(-1)[torch.arange(logits.shape[0]), tid.expand(logits.shape[0])]
