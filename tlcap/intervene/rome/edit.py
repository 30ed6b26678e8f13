"""The ROME edit: key, value, and the rank-one update applied as a reversible :class:`WeightEdit`."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_int, check_str
from tlcap.errors import InvalidConfigError
from tlcap.intervene.covariance import key_covariance, solve_key
from tlcap.intervene.rome.config import RomeConfig
from tlcap.intervene.rome.value import ValueStep, optimise_value, subject_keys, value_rows
from tlcap.intervene.weights import WeightEdit
from tlcap.locate.subjects import ROME_SINK, SubjectWarning, find_subject, sink_message
from tlcap.models.adapter import Model


class RomeEdit(WeightEdit):
    """A ROME edit applied in place; ``undo()`` / ``with`` restores the weights exactly.

    Attributes:
        layer: Edited layer. key: ``k*`` (averaged). prompt_key: the prompt's own key.
        delta: Optimised δ. u: ``C⁻¹k*``. right: the column of the update (``ΔW = right ⊗ u``).
        steps: The objective's terms at each optimisation step (:class:`ValueStep`).
        losses: The total loss minimised, at each step. seconds: Wall time of the edit.
    """

    layer: int
    key: Tensor
    prompt_key: Tensor
    delta: Tensor
    u: Tensor
    right: Tensor
    steps: list[ValueStep]
    losses: list[float]
    seconds: float

    @property
    def update_norm(self) -> float:
        """‖ΔW‖ (Frobenius norm of the rank-one update)."""
        return float(self.right.norm() * self.u.norm())


def check_layer(model: Model, layer: int) -> int:
    """Check that ``layer`` is a layer of ``model``; returns it.

    Args:
        model: The model.
        layer: The layer to edit.

    Returns:
        ``layer`` unchanged.

    Raises:
        InvalidConfigError: ``layer`` is negative or beyond the model.
    """
    check_int("layer", layer, min=0)
    if layer >= model.n_layers:
        raise InvalidConfigError(
            f"layer (--layer) {layer} out of range for {model.name} ({model.n_layers} layers: 0..{model.n_layers - 1})"
        )
    return layer


def rome_edit(
    model: Model,
    prompt: str,
    subject: str,
    target_new: str,
    layer: int,
    *,
    config: RomeConfig | None = None,
    cov: Float[Tensor, "d_mlp d_mlp"] | None = None,
    occurrence: int | None = None,
    progress: bool = False,
    **overrides: Any,
) -> RomeEdit:
    """Apply a ROME edit at ``layer`` and return its handle (already applied).

    Args:
        model: The model (edited in place, reversibly).
        prompt: A prompt containing ``subject`` whose continuation is the fact's object.
        subject: The subject as written in the prompt.
        target_new: The new object, e.g. ``" Rome"`` (all its tokens are optimised).
        layer: The layer whose MLP down projection is edited.
        config: Hyper-parameters (:class:`RomeConfig`, default: its defaults).
        cov: ``C = E[kkᵀ]`` of the layer (default: :func:`key_covariance`, cached on disk).
        occurrence: Which occurrence of the subject in the prompt is edited (0-based, negative
            from the last); ``None``: the first, with a
            :class:`~tlcap.locate.subjects.SubjectWarning` when it occurs more than once.
        progress: Show a progress bar.
        **overrides: :class:`RomeConfig` fields overriding ``config`` (``steps=10``...).

    Returns:
        The applied :class:`RomeEdit` (use it as a context manager, or call ``undo()``).

    Raises:
        InvalidConfigError: an invalid setting, an empty prompt, subject or new object, an
            occurrence the prompt does not have, or a layer beyond the model (before any work).
        SubjectNotFoundError: the subject is not in the prompt.

    Example:
        >>> from tlcap.metrics import target_prob
        >>> cov = key_covariance(model, [0], n_tokens=512, cache=False)[0]     # default: cached on disk
        >>> p = target_prob(model, "The Eiffel Tower is located in", " Rome")
        >>> with rome_edit(model, "The Eiffel Tower is located in", "The Eiffel Tower", " Rome", layer=0,
        ...                cov=cov, steps=10, bos=True) as edit:
        ...     print(target_prob(model, "The Eiffel Tower is located in", " Rome") > p, len(edit.losses))
        True 10
    """
    cfg = RomeConfig.resolve(config, **overrides)
    check_layer(model, layer)
    check_str("target_new", target_new)
    occ = edited_occurrence(model, prompt, subject, occurrence, cfg.bos, stacklevel=2)
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    t_ids = model.target_ids(prompt, target_new)
    if cov is None and cfg.mom2_adjustment:
        cov = key_covariance(model, [layer], n_tokens=cfg.cov_tokens, seq_len=cfg.cov_seq_len)[layer]

    # 1. key: average over prefixes; the prompt's own key and output.
    keys, _ = subject_keys(model, layer, [p + prompt for p in cfg.prefixes], subject, [len(p) for p in cfg.prefixes],
                           occ, cfg.bos)
    k_star = keys.mean(0)
    k_prompt, v0 = (x[0] for x in subject_keys(model, layer, [prompt], subject, [0], occ, cfg.bos))

    # 2. value: optimise delta at the subject's last token.
    rows = value_rows(model, prompt, subject, t_ids, cfg, occ)
    delta, steps = optimise_value(model, layer, rows, v0, cfg, progress=progress)

    # 3. rank-one update of the down projection.
    u, right = rank_one(k_star, k_prompt, delta, cov, cfg)
    edit = RomeEdit()

    def apply(e: WeightEdit) -> None:
        e.touch(model.mlp_out_weight(layer).param)
        W = model.mlp_down_matrix(layer)  # [d_model, d_mlp] view of the parameter
        W.add_(torch.outer(right, u).to(W.dtype))

    try:
        edit.apply(apply)
    except BaseException:
        edit.undo()  # a partly applied update never stays in the model
        raise
    edit.layer, edit.key, edit.prompt_key, edit.delta = layer, k_star, k_prompt, delta
    edit.u, edit.right, edit.steps = u, right, steps
    edit.losses = [s.total for s in steps]
    edit.seconds = time.perf_counter() - t0
    return edit


def edited_occurrence(model: Model, prompt: str, subject: str, occurrence: int | None, bos: bool,
                      stacklevel: int = 2) -> int:
    """Which occurrence of the subject an edit keys on, warning when it starts the prompt (the attention sink).

    Args:
        model: The model.
        prompt: The prompt.
        subject: The subject as written in it.
        occurrence: As :func:`rome_edit` takes it (``None``: the first, warned when there are several).
        bos: The prompt is encoded with the BOS first.
        stacklevel: Of the warning as the caller would give it (2: the caller's caller).

    Returns:
        The 0-based occurrence.
    """
    span = find_subject(model, prompt, subject, occurrence, prepend_bos=bos)
    if span.start == 0:
        warnings.warn(sink_message(prompt, subject, ROME_SINK), SubjectWarning, stacklevel=stacklevel + 1)
    return span.occurrence


def rank_one(k_star: Tensor, k_prompt: Tensor, delta: Tensor, cov: Tensor | None,
             cfg: RomeConfig) -> tuple[Tensor, Tensor]:
    """ROME's update ``ΔW = right ⊗ u`` from the keys and the optimised δ (module :mod:`tlcap.intervene.rome`).

    Args:
        k_star: The key averaged over the prefixes.
        k_prompt: The prompt's own key.
        delta: The optimised δ.
        cov: The layer's key covariance (used with ``cfg.mom2_adjustment``).
        cfg: The settings (``mom2_adjustment``, ``cov_reg``).

    Returns:
        ``(u, right)``: ``u = C⁻¹k*`` (``k*`` without the covariance), ``right = δ / (uᵀ k)``.
    """
    u = solve_key(cov.to(k_star.device), k_star, cfg.cov_reg) if cov is not None and cfg.mom2_adjustment else k_star.clone()
    return u, delta / torch.dot(u, k_prompt)


__all__ = ["RomeEdit", "check_layer", "edited_occurrence", "rank_one", "rome_edit"]
