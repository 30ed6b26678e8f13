"""Measuring a ROME edit: efficacy, paraphrase, specificity; the same edit at every layer."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.intervene.covariance import key_covariance
from tlcap.intervene.rome.config import DEFAULT_NEIGHBOURHOOD, RomeConfig
from tlcap.intervene.rome.edit import check_layer, rome_edit
from tlcap.intervene.rome.results import RomeEditResult, RomeSweep
from tlcap.locate.subjects import check_subject
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance


def default_neighbourhood(prompt: str, subject: str) -> list[str]:
    """:data:`DEFAULT_NEIGHBOURHOOD` without the edited prompt and without prompts that name the subject.

    A neighbourhood prompt measures specificity: it must be about something else than the edited
    fact (editing "The Eiffel Tower is located in the city of" must not count that prompt's own
    change as a specificity failure).

    Args:
        prompt: The edited prompt.
        subject: The edited subject.

    Returns:
        The default prompts that neither equal ``prompt`` nor contain ``subject`` (case-insensitive).
    """
    key = subject.strip().lower()
    return [p for p in DEFAULT_NEIGHBOURHOOD if p.strip() != prompt.strip() and (not key or key not in p.lower())]


@torch.no_grad()
def target_logprobs(model: Model, items: Sequence[tuple[str, str]], bos: bool = False) -> Float[Tensor, " n"]:
    """Mean log-probability of each ``(prompt, target)``'s tokens (teacher forcing, one batch).

    Args:
        model: The model.
        items: ``(prompt, target)`` pairs.
        bos: Prepend the model's BOS to each prompt.

    Returns:
        One mean token log-probability per pair.
    """
    rows, spans = [], []
    for prompt, target in items:
        p = model.encode(prompt, prepend_bos=bos)
        t = model.target_ids(prompt, target)
        rows.append(p + t[:-1])
        spans.append((len(p) - 1, t))
    logits = model.logits(model.encode_batch(rows)).float().log_softmax(-1)
    out = []
    for r, (start, t) in enumerate(spans):
        idx = torch.arange(start, start + len(t), device=logits.device)
        out.append(logits[r, idx, torch.tensor(t, device=logits.device)].mean())
    return torch.stack(out)


@torch.no_grad()
def next_tokens(model: Model, prompts: Sequence[str], bos: bool = False) -> list[int]:
    """The top next token of each prompt.

    Args:
        model: The model.
        prompts: The prompts.
        bos: Prepend the model's BOS to each prompt.

    Returns:
        Token ids.
    """
    return model.last_logits(model.encode_batch(list(prompts), prepend_bos=bos)).argmax(-1).tolist()


def default_paraphrases(prompt: str) -> list[str]:
    """Two prefixed variants of the prompt (used when no paraphrases are given).

    Args:
        prompt: The edited prompt.

    Returns:
        ``["Fact: " + prompt, "Remember this. " + prompt]``.
    """
    return ["Fact: " + prompt, "Remember this. " + prompt]


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
    items = [(p, t) for p in [prompt, *paraphrases] for t in (target_new, target_old)]
    return target_logprobs(model, items, bos), next_tokens(model, list(neighbourhood), bos) if neighbourhood else []


def evaluate_rome(
    model: Model,
    prompt: str,
    subject: str,
    target_new: str,
    layer: int,
    target_old: str | None = None,
    paraphrases: Sequence[str] | None = None,
    neighbourhood: Sequence[str] | None = None,
    *,
    config: RomeConfig | None = None,
    cov: Float[Tensor, "d_mlp d_mlp"] | None = None,
    occurrence: int | None = None,
    progress: bool = False,
    before: tuple[Tensor, list[int]] | None = None,
    **overrides: Any,
) -> RomeEditResult:
    """Edit at ``layer``, measure efficacy / paraphrase / specificity, restore the weights.

    The weights are restored on every exit path (the edit is a ``with`` block around the
    measurements), also when a measurement raises.

    Args:
        model: The model (restored afterwards).
        prompt: A prompt containing ``subject``.
        subject: The subject as written in the prompt.
        target_new: The new object, e.g. ``" Rome"``.
        layer: The edited layer.
        target_old: The fact's current object (default: the model's top next token).
        paraphrases: Other prompts of the same fact (default: :func:`default_paraphrases`).
        neighbourhood: Unrelated prompts whose answers must not change (default: the 10 generic
            facts of :data:`DEFAULT_NEIGHBOURHOOD` minus the edited prompt and those naming the
            subject, :func:`default_neighbourhood`).
        config: Hyper-parameters (:class:`RomeConfig`).
        cov: The layer's key covariance (default: computed or read from the cache).
        occurrence: Which occurrence of the subject is edited (see :func:`rome_edit`).
        progress: Show a progress bar.
        before: The unedited model's measurements of these prompts (:func:`unedited_measures`), which do
            not depend on the layer: :func:`rome_sweep` computes them once for all its layers.
        **overrides: :class:`RomeConfig` fields overriding ``config``.

    Returns:
        A :class:`RomeEditResult` with provenance.

    Example:
        >>> cov = key_covariance(model, [0], n_tokens=512, cache=False)[0]
        >>> res = evaluate_rome(model, "The Eiffel Tower is located in the city of", "The Eiffel Tower", " Rome", 0,
        ...                     cov=cov, steps=10, bos=True)
        >>> res.efficacy, res.paraphrase, round(res.specificity, 2)    # too weak an edit to flip a random model
        (False, 0.0, 0.89)
        >>> len(res.paraphrases), len(res.neighbourhood)
        (2, 9)
    """
    t0 = time.perf_counter()
    cfg = RomeConfig.resolve(config, **overrides)
    check_layer(model, layer)
    check_subject(prompt, subject, occurrence)
    if target_old is None:
        target_old = model.to_str_tokens([next_tokens(model, [prompt], cfg.bos)[0]])[0]
    paras = list(paraphrases) if paraphrases is not None else default_paraphrases(prompt)
    neigh = list(neighbourhood) if neighbourhood is not None else default_neighbourhood(prompt, subject)
    lp0, top0 = before if before is not None else unedited_measures(model, prompt, target_new, target_old, paras, neigh,
                                                                     cfg.bos)
    with rome_edit(model, prompt, subject, target_new, layer, config=cfg, cov=cov, occurrence=occurrence,
                   progress=progress) as edit:
        lp1, top1 = unedited_measures(model, prompt, target_new, target_old, paras, neigh, cfg.bos)
    lp1 = lp1.reshape(-1, 2)
    lp0 = lp0.reshape(-1, 2)
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
        losses=tuple(edit.losses), delta_norm=float(edit.delta.norm()), update_norm=edit.update_norm,
        seconds=edit.seconds, seconds_total=time.perf_counter() - t0, model_name=model.name,
        provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


def rome_sweep(
    model: Model,
    prompt: str,
    subject: str,
    target_new: str,
    layers: Sequence[int] | None = None,
    target_old: str | None = None,
    paraphrases: Sequence[str] | None = None,
    neighbourhood: Sequence[str] | None = None,
    *,
    config: RomeConfig | None = None,
    occurrence: int | None = None,
    progress: bool = False,
    covs: Mapping[int, Tensor] | None = None,
    **overrides: Any,
) -> RomeSweep:
    """The same edit at every layer (or ``layers``) separately; the model is restored between.

    Covariances of all layers come from one pass over the text sample (then cached), or from ``covs``;
    the unedited model's measurements, the same for every layer, are taken once.

    Args:
        model: The model.
        prompt, subject, target_new, target_old, paraphrases, neighbourhood: As in :func:`evaluate_rome`.
        layers: The layers to edit (default: all).
        config: Hyper-parameters (:class:`RomeConfig`).
        occurrence: Which occurrence of the subject is edited (see :func:`rome_edit`).
        progress: Show progress bars.
        covs: Key covariances of the layers, computed once by a caller that sweeps many facts (default:
            :func:`~tlcap.intervene.covariance.key_covariance`, read from its disk cache).
        **overrides: :class:`RomeConfig` fields overriding ``config``.

    Returns:
        A :class:`RomeSweep` with provenance.

    Example:
        >>> covs = key_covariance(model, [0, 1], n_tokens=512, cache=False)     # default: the disk cache
        >>> sweep = rome_sweep(model, "The Eiffel Tower is located in the city of", "The Eiffel Tower", " Rome",
        ...                    covs=covs, steps=10, bos=True)
        >>> sweep.summary()["layers"], sweep.summary()["efficacy_rate"]
        ([0, 1], 0.0)
        >>> fig = sweep.figure()
    """
    t0 = time.perf_counter()
    cfg = RomeConfig.resolve(config, **overrides)
    layers = list(range(model.n_layers)) if layers is None else [check_layer(model, int(l)) for l in layers]
    check_subject(prompt, subject, occurrence)
    if not cfg.mom2_adjustment:
        covs = {}
    elif covs is None or any(l not in covs for l in layers):
        covs = key_covariance(model, layers, n_tokens=cfg.cov_tokens, seq_len=cfg.cov_seq_len, progress=progress)
    if target_old is None:
        target_old = model.to_str_tokens([next_tokens(model, [prompt], cfg.bos)[0]])[0]
    paras = list(paraphrases) if paraphrases is not None else default_paraphrases(prompt)
    neigh = list(neighbourhood) if neighbourhood is not None else default_neighbourhood(prompt, subject)
    before = unedited_measures(model, prompt, target_new, target_old, paras, neigh, cfg.bos)
    results = []
    for l in tqdm(layers, desc="ROME all layers", disable=not progress):
        results.append(evaluate_rome(model, prompt, subject, target_new, l, target_old, paras, neigh,
                                     config=cfg, cov=covs.get(l), occurrence=occurrence, before=before))
    return RomeSweep(results=tuple(results), prompt=prompt, subject=subject, target_new=target_new,
                     seconds_total=time.perf_counter() - t0, model_name=model.name,
                     provenance=Provenance.collect(model, config=cfg, seed=cfg.seed))


__all__ = ["default_neighbourhood", "default_paraphrases", "evaluate_rome", "next_tokens", "rome_sweep", "target_logprobs",
           "unedited_measures"]
