"""ROME at every layer with the layers as rows of shared passes (:func:`~tlcap.intervene.rome.rome_sweep` on an
accelerator).

One edit per layer, as :func:`~tlcap.intervene.rome.evaluate_rome` makes it, but:

- **keys**: every layer's ``k*`` (over the prefixed prompts), the prompt's own key and ``v₀`` from one recorded pass
  (:func:`~tlcap.intervene.rome.value.subject_keys_layers`) instead of two per layer;
- **values**: the layers' δ optimised together (:func:`~tlcap.intervene.rome.value.optimise_values`): each pass
  holds the value rows of ``layers_per_pass`` layers, each copy with its own δ at its own layer and its own Adam;
- **measures**: the rank-one update ``W ← W + right ⊗ u`` makes the layer's MLP write ``(u·a)·right`` more, ``a``
  its ``mlp_post`` activations, so each layer's edited model is a row plan
  (:class:`~tlcap.intervene.set_rows.SetFactors` with ``writes=``) and the targets' log-probabilities and the
  neighbourhood's top tokens of every edit are two batches instead of two per edit, with no weight touched.

The values equal the one-edit-at-a-time sweep's up to the float rounding of a batch (tested on tiny models), and
rows compute ``W a + (u·a)·right`` where the weight edit rounds ``W + right ⊗ u`` to the model's dtype first.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from tlcap.intervene.rome.config import RomeConfig
from tlcap.intervene.rome.edit import edited_occurrence, rank_one
from tlcap.intervene.rome.measures import edit_result, edited_measures
from tlcap.intervene.rome.results import RomeEditResult
from tlcap.intervene.rome.value import optimise_values, subject_keys_layers, value_rows
from tlcap.intervene.set_rows import SetFactors
from tlcap.locate.subjects import find_subject
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model

VALUE_TOKENS = 2048
"""Tokens (layers × value rows × their length) one pass of the layers' value optimisation holds by default."""


def layers_per_pass_for(model: Model, prompt: str, subject: str, target_new: str, cfg: RomeConfig,
                        occurrence: int | None, n_layers: int) -> int:
    """Layers whose value rows fit :data:`VALUE_TOKENS` tokens in one pass (at least 1, at most ``n_layers``).

    Args:
        model: The model.
        prompt, subject, target_new: The request.
        cfg: The ROME settings (prefixes, KL prompt).
        occurrence: Which occurrence of the subject.
        n_layers: Layers swept.

    Returns:
        The number of layers per pass.
    """
    occ = find_subject(model, prompt, subject, occurrence, prepend_bos=cfg.bos).occurrence
    rows = value_rows(model, prompt, subject, model.target_ids(prompt, target_new), cfg, occ)
    return max(1, min(n_layers, VALUE_TOKENS // max(1, rows.tokens.numel())))


def sweep_rows(
    model: Model,
    request: tuple[str, str, str, str],
    layers: Sequence[int],
    paras: Sequence[str],
    neigh: Sequence[str],
    cfg: RomeConfig,
    covs: Mapping[int, Tensor],
    occurrence: int | None,
    before: tuple[Tensor, list[int]],
    layers_per_pass: int,
) -> list[RomeEditResult]:
    """One ROME edit per layer, the layers as rows (module docstring).

    Args:
        model: The model (no weight is changed).
        request: ``(prompt, subject, target_new, target_old)``.
        layers: The edited layers.
        paras: The paraphrases measured.
        neigh: The neighbourhood prompts measured.
        cfg: The ROME settings.
        covs: Key covariance per layer (``cfg.mom2_adjustment``).
        occurrence: Which occurrence of the subject is edited.
        before: The unedited model's measures (:func:`~tlcap.intervene.rome.evaluate.unedited_measures`).
        layers_per_pass: Layers per pass of the value optimisation and of the measures.

    Returns:
        One :class:`RomeEditResult` per layer, in ``layers`` order.
    """
    t0 = time.perf_counter()
    prompt, subject, target_new, _ = request
    occ = edited_occurrence(model, prompt, subject, occurrence, cfg.bos, stacklevel=3)
    torch.manual_seed(cfg.seed)
    P = len(cfg.prefixes)
    keys, outs = subject_keys_layers(model, layers, [*(p + prompt for p in cfg.prefixes), prompt], subject,
                                     [*(len(p) for p in cfg.prefixes), 0], occ, cfg.bos)
    k_star, k_prompt, v0 = keys[:, :P].mean(1), keys[:, P], outs[:, P]
    rows = value_rows(model, prompt, subject, model.target_ids(prompt, target_new), cfg, occ)
    values = optimise_values(model, layers, rows, v0, cfg, layers_per_pass)
    writes, norms = [], []
    for j, l in enumerate(layers):
        u, right = rank_one(k_star[j], k_prompt[j], values[j][0], covs.get(l), cfg)
        writes.append(({l: u}, right))
        norms.append(float(right.norm() * u.norm()))
    seconds = (time.perf_counter() - t0) / len(layers)  # the edits' shared time, per layer
    empty = NeuronSet((), (model.n_layers, model.d_mlp))
    after: list[tuple[Tensor, list[int]]] = []
    for c0 in range(0, len(layers), layers_per_pass):
        chunk = writes[c0:c0 + layers_per_pass]
        plan = SetFactors.of(model, [empty] * len(chunk), 1.0, writes=chunk)
        lp, tops = edited_measures(model, plan, prompt, target_new, request[3], paras, neigh, cfg.bos)
        after += [(lp[t], tops[t]) for t in range(len(chunk))]
    total = time.perf_counter() - t0
    return [edit_result(model, cfg, l, request, paras, neigh, before, after[j],
                        (tuple(s.total for s in values[j][1]), float(values[j][0].norm()), norms[j]), (seconds, total))
            for j, l in enumerate(layers)]


__all__ = ["VALUE_TOKENS", "layers_per_pass_for", "sweep_rows"]
