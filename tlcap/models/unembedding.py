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
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import UnsupportedModelError
from tlcap.models.adapter import Model


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


__all__ = ["FrozenNorm", "final_norm", "final_norm_gain", "frozen_final_norm", "resid_logits", "unembed", "unit_final_norm"]
