"""Measuring a ROME edit: efficacy, paraphrase, specificity; the same edit at every layer."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.config import check_int
from tlcap.intervene.covariance import key_covariance
from tlcap.intervene.rome.config import DEFAULT_NEIGHBOURHOOD, RomeConfig
from tlcap.intervene.rome.edit import check_layer, rome_edit
from tlcap.intervene.rome.measures import edit_result, next_tokens, target_logprobs, unedited_measures
from tlcap.intervene.rome.results import RomeEditResult, RomeSweep
from tlcap.intervene.rome.sweep_rows import layers_per_pass_for, sweep_rows
from tlcap.locate.subjects import check_subject
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime import device as runtime_device
from tlcap.runtime.batching import run_auto_batched


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


def default_paraphrases(prompt: str) -> list[str]:
    """Two prefixed variants of the prompt (used when no paraphrases are given).

    Args:
        prompt: The edited prompt.

    Returns:
        ``["Fact: " + prompt, "Remember this. " + prompt]``.
    """
    return ["Fact: " + prompt, "Remember this. " + prompt]


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
    return edit_result(model, cfg, layer, (prompt, subject, target_new, target_old), paras, neigh, (lp0, top0),
                       (lp1, top1), (tuple(edit.losses), float(edit.delta.norm()), edit.update_norm),
                       (edit.seconds, time.perf_counter() - t0))


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
    layers_per_pass: int | None = None,
    **overrides: Any,
) -> RomeSweep:
    """The same edit at every layer (or ``layers``) separately; the model is restored between.

    Covariances of all layers come from one pass over the text sample (then cached), or from ``covs``;
    the unedited model's measurements, the same for every layer, are taken once.

    With ``layers_per_pass > 1`` (default on an accelerator) the layers are rows instead of one weight edit after
    another (:mod:`tlcap.intervene.rome.sweep_rows`): every layer's keys from one pass, the layers' value
    optimisations in shared passes (each its own δ and Adam), each edit measured as a rank-one write of its rows —
    the same edits and measures up to the float rounding of a batch (tested), in ``2 + 1 + (steps + 2)·⌈L/b⌉``
    passes instead of ``2 + L·(4 + steps)``.

    Args:
        model: The model.
        prompt, subject, target_new, target_old, paraphrases, neighbourhood: As in :func:`evaluate_rome`.
        layers: The layers to edit (default: all).
        config: Hyper-parameters (:class:`RomeConfig`).
        occurrence: Which occurrence of the subject is edited (see :func:`rome_edit`).
        progress: Show progress bars.
        covs: Key covariances of the layers, computed once by a caller that sweeps many facts (default:
            :func:`~tlcap.intervene.covariance.key_covariance`, read from its disk cache).
        layers_per_pass: Layers whose edits one pass carries as rows (``1``: one weight edit at a time; ``None``:
            1 on a CPU, on an accelerator as many as :data:`~tlcap.intervene.rome.sweep_rows.VALUE_TOKENS` allows,
            halved on out-of-memory).
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
    if layers_per_pass is not None:
        check_int("layers_per_pass", layers_per_pass, min=1)
    request = (prompt, subject, target_new, target_old)
    if layers_per_pass is None and runtime_device.one_pass_default(model) and len(layers) > 1:
        b = layers_per_pass_for(model, prompt, subject, target_new, cfg, occurrence, len(layers))
        results = run_auto_batched(lambda n: sweep_rows(model, request, layers, paras, neigh, cfg, covs, occurrence,
                                                        before, n), b, model.device)
    elif layers_per_pass is not None and layers_per_pass > 1:
        results = sweep_rows(model, request, layers, paras, neigh, cfg, covs, occurrence, before, layers_per_pass)
    else:
        results = [evaluate_rome(model, prompt, subject, target_new, l, target_old, paras, neigh, config=cfg,
                                 cov=covs.get(l), occurrence=occurrence, before=before)
                   for l in tqdm(layers, desc="ROME all layers", disable=not progress)]
    return RomeSweep(results=tuple(results), prompt=prompt, subject=subject, target_new=target_new,
                     seconds_total=time.perf_counter() - t0, model_name=model.name,
                     provenance=Provenance.collect(model, config=cfg, seed=cfg.seed))


__all__ = ["default_neighbourhood", "default_paraphrases", "evaluate_rome", "next_tokens", "rome_sweep", "target_logprobs",
           "unedited_measures"]
