"""The model's read-out: final norm, unembedding, and the final norm frozen to a linear map.

The logit lens reads any residual-stream state through the model's own final norm and
unembedding; direct logit attribution needs the final norm *frozen* at a run's scale, so that a
write ``v`` into the final residual contributes ``gain ⊙ center(v) / σ`` to the normalised stream,
linearly (LayerNorm centres and divides by the standard deviation, RMSNorm only divides by the
root mean square; Gemma's RMSNorm multiplies by ``1 + w``). Which norm a model has, and where its
unembedding and logit soft-capping live, is known here only.

Example:
    >>> toks = model.to_tokens("The capital of France is")
    >>> name = model.hook_name("resid_post", model.n_layers - 1)
    >>> resid = model.record(toks, [name])[name][0]       # [pos, d_model]
    >>> logits = resid_logits(model, resid)              # == the model's logits for the last layer's resid_post
    >>> torch.allclose(logits, model.logits(toks)[0], atol=1e-4)
    True
    >>> frozen = frozen_final_norm(model, resid)         # σ of each position of this run
    >>> write = torch.randn(model.d_model)
    >>> tuple((frozen.apply(write) @ model.W_U).shape)   # a write's direct effect on every logit
    (50257,)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import UnsupportedModelError
from tlcap.models.adapter import Model
from tlcap.runtime.fixed import once


def _norm_module(model: Model) -> Any:
    ln = model.backend.ln_final
    return getattr(ln, "_original_component", ln)


def _norm_kind(mod: Any) -> tuple[bool, Tensor, float]:
    """(centred, gain, eps) of a final norm module (HF LayerNorm / *RMSNorm, or TL 3.9 LayerNorm / RMSNorm)."""
    name = type(mod).__name__
    w = getattr(mod, "weight", None)
    if w is None:
        w = getattr(mod, "w", None)
    if w is None:
        raise UnsupportedModelError(f"the final norm {name} has no gain (folded LayerNormPre?); load the model unfolded")
    eps = getattr(mod, "eps", None) or getattr(mod, "variance_epsilon", None)
    if eps is None:
        eps = float(getattr(getattr(mod, "cfg", None), "eps", 1e-5))
    gain = w.detach().float() + (1.0 if name.startswith("Gemma") else 0.0)
    if "LayerNorm" in name:
        return True, gain, float(eps)
    if "RMSNorm" in name:
        return False, gain, float(eps)
    raise UnsupportedModelError(f"final norm {name} is not a LayerNorm or RMSNorm; map it in tlcap/models/unembedding.py")


def final_norm_gain(model: Model) -> Float[Tensor, " d_model"]:
    """The final norm's elementwise gain (``γ``; ``1 + w`` for Gemma).

    Args:
        model: The model.

    Returns:
        The ``[d_model]`` gain.
    """
    return _norm_kind(_norm_module(model))[1]


def final_norm(model: Model, resid: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
    """The model's final norm applied to residual-stream states (no hooks run).

    Args:
        model: The model.
        resid: ``[*batch, d_model]`` residual states.

    Returns:
        The normalised states, in the model's dtype.
    """
    mod = _norm_module(model)
    return mod(resid.to(model.dtype))


def unembed(model: Model, normed: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_vocab"]:
    """Logits of normalised states: ``W_U``, its bias, and the model's logit soft-capping if any.

    Args:
        model: The model.
        normed: ``[*batch, d_model]`` states after the final norm.

    Returns:
        ``[*batch, d_vocab]`` logits (soft-capped when the model caps them).
    """
    if model.hf_model is not None:
        logits = model.hf_model.get_output_embeddings()(normed.to(model.dtype))
        cap = getattr(model.hf_model.config, "final_logit_softcapping", None)
    else:
        logits = model.backend.unembed(normed.to(model.dtype))
        cap = getattr(model.cfg, "output_logits_soft_cap", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _readout_linear(model: Model) -> tuple[Tensor, Tensor | None] | None:
    """``(weight [d_vocab, d_model], bias or None)`` of a plain linear read-out without soft-capping; ``None``
    otherwise (TL 3.9 backends, capped logits, a head that is not an ``nn.Linear``). An all-zero bias (the
    bridge's synthetic one) is ``None``."""
    if model.hf_model is None or getattr(model.hf_model.config, "final_logit_softcapping", None):
        return None
    head = model.hf_model.get_output_embeddings()
    head = getattr(head, "original_component", head)
    if not isinstance(head, torch.nn.Linear):
        return None
    bias = head.bias
    return head.weight, (bias if bias is not None and _nonzero(bias) else None)


def _nonzero(bias: Tensor) -> bool:
    """Whether ``bias`` has a non-zero entry (a host round trip on a GPU: once per
    :func:`~tlcap.runtime.fixed.weights_fixed` block, IG runs :func:`target_probs` once per batch)."""
    return once(("readout_bias_nonzero", id(bias)), lambda: bool(bias.detach().any()))


READOUT_CHUNK = 2048
"""Vocabulary rows per step of :func:`target_probs`' fused read-out (measured on a 2-core CPU at the GPT-2 shape:
1,024–4,096 within 4 % of each other, 8,192 slower)."""


class _TargetProb(torch.autograd.Function):
    """``softmax(logits)[r, tids[r]]`` with a backward that allocates nothing of the vocabulary's size.

    Autograd's softmax-then-gather allocates and fills two ``[rows, d_vocab]`` gradients (the gather's
    scatter and the softmax's); here ``d P_y / d z = P_y (onehot(y) - p)`` is written into the saved
    softmax in place (the backward runs once: :func:`target_prob` is for single-use graphs). The target's
    own entry ``P_y (1 - P_y)`` takes ``1 - P_y`` as the sum of the other probabilities, not as a difference:
    for a confident prediction (``P_y`` within 1e-5 of 1) the difference kept about two digits in float32.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, tids: Tensor) -> Tensor:
        p = torch.softmax(logits.float(), -1)
        py = p.gather(1, tids[:, None])[:, 0]
        ctx.save_for_backward(p, py, tids)
        ctx.dtype = logits.dtype
        return py

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None]:
        p, py, tids = ctx.saved_tensors
        coef = (g * py)[:, None]
        grad = p.mul_(-coef)  # -P_y p_v
        grad.scatter_(1, tids[:, None], 0.0)
        grad.scatter_(1, tids[:, None], -grad.sum(1, keepdim=True))  # P_y Σ_{v≠y} p_v = P_y (1 - P_y)
        return grad.to(ctx.dtype), None


def target_prob(logits: Float[Tensor, "rows d_vocab"], tids: Int[Tensor, " rows"]) -> Float[Tensor, " rows"]:
    """The probability of ``tids[r]`` under ``softmax(logits[r])`` (float32), differentiable once (:class:`_TargetProb`).

    Args:
        logits: ``[rows, d_vocab]`` logits.
        tids: ``[rows]`` target token of each row.

    Returns:
        ``[rows]`` float32 probabilities.
    """
    return _TargetProb.apply(logits, tids)


class _FusedTargetProb(torch.autograd.Function):
    """``P(tids[r])`` of normalised states through a linear read-out, the unembedding and its backward fused.

    The vocabulary is walked in chunks of :data:`READOUT_CHUNK` rows of ``W``: each chunk's logits are one
    matrix product, folded into a running maximum and sum of ``exp`` (an online softmax), and the same chunk
    of ``W``, still in cache, gives ``Σ_v e_v W_v`` for the gradient in a second product. No ``[rows, d_vocab]``
    tensor is kept, ``W`` is read from memory once instead of twice, and there is no separate softmax pass.
    The gradient is ``d P_y / d h = P_y / s · Σ_{v≠y} e_v (W_y − W_v)`` (``e_v = exp(z_v − m)``,
    ``s = Σ_v e_v``): the target's own term is left out of both sums, so a confident prediction
    (``P_y → 1``) loses nothing to cancellation, as in autograd's ``P_y (onehot(y) − p)``.
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, bias: Tensor | None, tids: Tensor) -> Tensor:
        n, d = h.shape
        m = torch.full((n,), float("-inf"), dtype=h.dtype, device=h.device)
        s_other = torch.zeros(n, dtype=h.dtype, device=h.device)
        acc = torch.zeros(n, d, dtype=h.dtype, device=h.device)
        zy = torch.empty(n, dtype=h.dtype, device=h.device)
        order = torch.argsort(tids)  # rows by target: each chunk's targets are one slice
        sorted_t = tids[order]
        starts = list(range(0, weight.shape[0], READOUT_CHUNK))
        edges = torch.searchsorted(sorted_t, torch.tensor([*starts, weight.shape[0]], device=tids.device)).tolist()
        for k, c0 in enumerate(starts):
            wc = weight[c0:c0 + READOUT_CHUNK]
            z = h @ wc.T if bias is None else torch.addmm(bias[c0:c0 + READOUT_CHUNK], h, wc.T)
            lo, hi = edges[k], edges[k + 1]
            rows, cols = order[lo:hi], sorted_t[lo:hi] - c0
            zy[rows] = z[rows, cols]
            new_m = torch.maximum(m, z.amax(1))
            scale = torch.exp(m - new_m)
            z.sub_(new_m[:, None]).exp_()
            z[rows, cols] = 0.0  # the target's own term is left out (class docstring)
            s_other = s_other * scale + z.sum(1)
            acc.mul_(scale[:, None]).addmm_(z, wc)
            m = new_m
        ey = torch.exp(zy - m)
        s = s_other + ey
        py = ey / s
        ctx.save_for_backward((py / s)[:, None] * (s_other[:, None] * weight[tids] - acc))
        return py

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None, None]:
        (grad,) = ctx.saved_tensors
        return g[:, None] * grad, None, None, None


def target_probs(model: Model, normed: Float[Tensor, "rows d_model"], tids: Int[Tensor, " rows"]) -> Float[Tensor, " rows"]:
    """P(target) of normalised states (after the final norm), differentiable once with respect to them.

    A float32 (or float64) model with a plain linear read-out takes the fused read-out
    (:class:`_FusedTargetProb`: the unembedding, softmax and their backward in one pass over ``W_U``); others
    (half precision, where the chunks' partial sums would be rounded to the model's dtype; soft-capped logits;
    TL 3.9) take :func:`unembed` and :func:`target_prob`. Both equal autograd's softmax-then-gather up to float
    rounding (tested).

    Args:
        model: The model.
        normed: ``[rows, d_model]`` states after the final norm (the ``unembed_in`` site).
        tids: ``[rows]`` target token of each row.

    Returns:
        ``[rows]`` probabilities (float32, or the states' dtype on the fused path).

    Example:
        >>> normed = final_norm(model, torch.randn(3, model.d_model))
        >>> tids = torch.tensor([0, 5, 7])
        >>> p = target_probs(model, normed, tids)
        >>> bool(torch.allclose(p, unembed(model, normed).float().softmax(-1)[torch.arange(3), tids], atol=1e-6))
        True
    """
    lin = _readout_linear(model) if normed.dtype in (torch.float32, torch.float64) else None
    if lin is None or lin[0].dtype != normed.dtype:
        return target_prob(unembed(model, normed), tids.to(normed.device))
    weight, bias = lin
    h = normed.to(weight.device)
    return _FusedTargetProb.apply(h, weight.detach(), None if bias is None else bias.detach(), tids.to(h.device))


def resid_logits(model: Model, resid: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_vocab"]:
    """``unembed(final_norm(resid))``: what the model would predict from this residual state.

    Args:
        model: The model.
        resid: ``[*batch, d_model]`` residual states.

    Returns:
        ``[*batch, d_vocab]`` logits.
    """
    return unembed(model, final_norm(model, resid))


@dataclass(frozen=True)
class FrozenNorm:
    """The final norm with its scale frozen at one run: a linear map of residual writes.

    Attributes:
        centered: LayerNorm (subtracts the mean over ``d_model``) or RMSNorm (does not).
        gain: ``[d_model]`` elementwise gain.
        inv_scale: ``[pos]`` 1 / σ (LayerNorm: standard deviation; RMSNorm: root mean square, each
            with the norm's ε) of the run's final residual at each position.
    """

    centered: bool
    gain: Float[Tensor, " d_model"]
    inv_scale: Float[Tensor, " pos"]

    def apply(self, write: Float[Tensor, "*batch d_model"], pos: int = -1) -> Float[Tensor, "*batch d_model"]:
        """What ``write`` (added to the final residual at position ``pos``) adds to the normalised stream.

        Args:
            write: ``[*batch, d_model]`` vectors written to the residual stream.
            pos: Position whose frozen scale is used.

        Returns:
            ``[*batch, d_model]`` float32 contribution (centred if LayerNorm, times gain and 1/σ).
        """
        v = write.float()
        if self.centered:
            v = v - v.mean(-1, keepdim=True)
        return v * self.gain * self.inv_scale[pos]


def frozen_final_norm(model: Model, resid: Float[Tensor, "pos d_model"]) -> FrozenNorm:
    """:class:`FrozenNorm` of the final residual states ``resid`` (the ``final_in`` site of a run).

    Args:
        model: The model.
        resid: ``[pos, d_model]`` final residual states of a run.

    Returns:
        The :class:`FrozenNorm` with each position's 1/σ.
    """
    centered, gain, eps = _norm_kind(_norm_module(model))
    x = resid.detach().float()
    if centered:
        x = x - x.mean(-1, keepdim=True)
    scale = (x.pow(2).mean(-1) + eps).sqrt()
    return FrozenNorm(centered, gain.to(x.device), 1.0 / scale)


def unit_final_norm(model: Model) -> FrozenNorm:
    """The final norm's linear part at unit scale (gain and centring, σ = 1): a neuron's logit weights.

    Args:
        model: The model.

    Returns:
        A :class:`FrozenNorm` with ``inv_scale`` 1.
    """
    centered, gain, _ = _norm_kind(_norm_module(model))
    return FrozenNorm(centered, gain, torch.ones(1))


__all__ = ["FrozenNorm", "final_norm", "final_norm_gain", "frozen_final_norm", "resid_logits", "target_prob", "target_probs",
           "unembed", "unit_final_norm"]
