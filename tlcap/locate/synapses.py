"""Knowledge synapses (QL §3.2, eqs. 4–6): the attention columns a query's answer relies on.

For a prompt with attention patterns ``A^{l,h}`` (``[query, key]``, rows summing to 1):

- column mass ``m^{l,h}_c = Σ_r A^{l,h}[r, c]`` (the attention token ``c`` receives);
- ``τ = α · (1/LH) Σ_{l,h,r,c} A^{l,h}[r, c]`` (eq. 5; = α · #tokens for softmax patterns);
- synapses ``S = {(c, l, h) : m^{l,h}_c > τ}`` (eq. 6).

Position 0 is an attention sink in GPT-2 and SmolLM2 (it receives most of every head's mass);
``skip_first=True`` (default) leaves it out, so the synapses are the *content* tokens heads focus
on. The most-attended token of eq. 4 is the column argmax of the layer/head-mean pattern (the row
sums of a softmax pattern are all 1, so eq. 4's ``argmax_r Σ_c`` is read as a column argmax, like
eq. 6). Scaling synapses is :func:`tlcap.intervene.synapses.scale_synapses`.

Example (the paper's α = 0.3 finds no column of the tiny random model's flat attention: α = 0.1 here):
    >>> ks = locate_synapses(model, "The capital of France is", alpha=0.1)
    >>> len(ks)
    16
    >>> ks.to_frame().head(3)
       layer  head  column     token      mass
    0      0     0       1   capital  1.276677
    1      0     0       2        of  0.789578
    2      0     1       1   capital  1.265082
    >>> from tlcap.metrics import target_prob
    >>> with model.hooks(ks.hooks(0.0)):                  # suppress them
    ...     p = target_prob(model, "The capital of France is", " Paris")
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tlcap.intervene.synapses import scale_synapses
from tlcap.models.adapter import HookList, Model
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.runtime.sites import get_site
from tlcap.viz.ql import synapse_count_heatmap


@torch.no_grad()
def attention_patterns(model: Model, prompt: str, hooks: HookList = ()) -> Float[Tensor, "layer head query key"]:
    """Every layer's attention pattern for ``prompt`` (the ``attn_pattern`` site), float32.

    Args:
        model: The model.
        prompt: The prompt.
        hooks: Forward hooks applied to the run.

    Returns:
        ``[n_layers, n_heads, n_tokens, n_tokens]``.
    """
    site = get_site("attn_pattern")
    names = [site.hook_name(l) for l in range(model.n_layers)]
    rec = model.record(model.to_tokens(prompt), names, hooks=hooks)
    return torch.stack([rec[n][0] for n in names]).float()


def attention_patterns_many(model: Model, prompts: Sequence[str]) -> list[Float[Tensor, "layer head query key"]]:
    """:func:`attention_patterns` of each prompt from one right-padded pass (row ``r`` cut to its own tokens).

    A real position never attends to the padding after it (causal attention), so each prompt's patterns equal its
    run alone up to the float rounding of a batch.

    Args:
        model: The model.
        prompts: The prompts.

    Returns:
        Per prompt ``[n_layers, n_heads, n_tokens, n_tokens]``, float32.

    Example:
        >>> a, b = attention_patterns_many(model, ["The capital of France is", "Hi there"])
        >>> torch.allclose(a, attention_patterns(model, "The capital of France is"), atol=1e-6), tuple(b.shape[2:])
        (True, (2, 2))
    """
    site = get_site("attn_pattern")
    names = [site.hook_name(l) for l in range(model.n_layers)]
    toks = model.encode_batch(list(prompts))
    rec = model.record(toks, names)
    return [torch.stack([rec[n][r, :, :n_r, :n_r] for n in names]).float() for r, n_r in enumerate(toks.lengths.tolist())]


def synapse_mask(
    patterns: Float[Tensor, "layer head query key"], alpha: float = 0.3, skip_first: bool = True
) -> tuple[Bool[Tensor, "layer head key"], Float[Tensor, "layer head key"], float]:
    """QL eqs. 5–6 on a stack of patterns.

    Args:
        patterns: ``[L, H, query, key]`` attention patterns.
        alpha: Scaling factor α of τ (paper: 0.3).
        skip_first: Never count key position 0 (the attention sink) as a synapse.

    Returns:
        ``(mask, column mass, τ)``: mask and mass are ``[L, H, key]``.
    """
    col = patterns.sum(-2)
    tau = alpha * float(patterns.sum((-1, -2)).mean())
    mask = col > tau
    if skip_first:
        mask[..., 0] = False
    return mask, col, tau


def most_attended_token(model: Model, prompt: str, skip_first: bool = True,
                        patterns: Float[Tensor, "layer head query key"] | None = None) -> tuple[int, str]:
    """``t_i`` of QL eq. 4: the position whose column of the layer/head-mean pattern has most mass.

    Args:
        model: The model.
        prompt: The query.
        skip_first: Leave position 0 (the attention sink) out.
        patterns: The prompt's :func:`attention_patterns` where already computed (default: computed here).

    Returns:
        ``(position, token string)``.
    """
    col = (attention_patterns(model, prompt) if patterns is None else patterns).mean((0, 1)).sum(0)
    if skip_first and col.numel() > 1:
        col = col.clone()
        col[0] = -math.inf
    c = int(col.argmax())
    return c, model.to_str_tokens([model.encode(prompt)[c]])[0]


ROLES: tuple[str, ...] = ("subject", "relation", "last")


def token_roles(model: Model, prompt: str, subject: str | None = None) -> tuple[str, ...]:
    """The role of each token of ``prompt``: ``"subject"``, ``"last"`` or ``"relation"`` (the rest).

    Args:
        model: The model (its tokenizer).
        prompt: The query.
        subject: The subject as written in the prompt (``None``: no subject tokens).

    Returns:
        One role per token of :meth:`Model.encode` (the last token is always ``"last"``).
    """
    n = len(model.encode(prompt))
    roles = ["relation"] * n
    if subject:
        sp = model.subject_span(prompt, subject)
        for c in range(sp.start, min(sp.end, n)):
            roles[c] = "subject"
    if n:
        roles[-1] = "last"
    return tuple(roles)


def map_columns(
    mask: Bool[Tensor, "layer head key"], src_roles: tuple[str, ...], dst_roles: tuple[str, ...],
    skip_first: bool = True,
) -> Bool[Tensor, "layer head k"]:
    """Move a synapse mask from one prompt's columns to another's by token role.

    The k-th token of a role in the source goes to the k-th token of the same role in the
    destination (the role's last token when the destination has fewer); a role the destination
    lacks is dropped.

    Args:
        mask: ``[L, H, n_src]`` synapse mask of the source prompt.
        src_roles: :func:`token_roles` of the source prompt.
        dst_roles: :func:`token_roles` of the destination prompt.
        skip_first: Never mark the destination's position 0 (the attention sink).

    Returns:
        ``[L, H, n_dst]`` mask.
    """
    L, H, _ = mask.shape
    out = torch.zeros(L, H, len(dst_roles), dtype=torch.bool, device=mask.device)
    dst = {r: [c for c, x in enumerate(dst_roles) if x == r] for r in ROLES}
    seen = dict.fromkeys(ROLES, 0)
    for c, r in enumerate(src_roles[: mask.shape[-1]]):
        k = seen[r]
        seen[r] += 1
        if dst[r]:
            d = dst[r][min(k, len(dst[r]) - 1)]
            out[..., d] |= mask[..., c]
    if skip_first and out.shape[-1]:
        out[..., 0] = False
    return out


@dataclass(frozen=True)
class SynapseRow:
    """One row of :meth:`KnowledgeSynapses.to_frame`: a synapse ``(layer, head, column)``."""

    layer: int
    head: int
    column: int
    token: str
    mass: float


@dataclass(frozen=True)
class KnowledgeSynapses(Result):
    """Knowledge synapses of one query: ``(column c, layer l, head h)`` with ``Σ_r A[r, c] > τ``.

    Attributes:
        mask: ``[n_layers, n_heads, n_tokens]``: True at synapses.
        col_mass: ``[n_layers, n_heads, n_tokens]``: ``Σ_r A^{l,h}[r, c]``.
        tau: ``τ = α · (1/LH) Σ_{l,h,r,c} A`` (QL eq. 5).
        alpha: α.
        prompt: The query.
        tokens: The query's tokens.
        skip_first: Whether position 0 was left out.
    """

    mask: Bool[Tensor, "layer head key"]
    col_mass: Float[Tensor, "layer head key"]
    tau: float = 0.0
    alpha: float = 0.3
    prompt: str = ""
    tokens: tuple[str, ...] = ()
    skip_first: bool = True

    def __len__(self) -> int:
        return int(self.mask.sum())

    def mask_for(self, n_tokens: int) -> Bool[Tensor, "layer head k"]:
        """The mask cropped or zero-padded to ``n_tokens`` columns (by position index).

        Args:
            n_tokens: Token columns wanted.

        Returns:
            A ``[layer, head, n_tokens]`` bool mask (CPU).
        """
        L, Hh, C = self.mask.shape
        out = torch.zeros(L, Hh, n_tokens, dtype=torch.bool)
        c = min(C, n_tokens)
        out[..., :c] = self.mask[..., :c]
        return out

    def hooks(self, factor: float, n_tokens: int | None = None) -> HookList:
        """Hooks scaling the synapses' pattern columns by ``factor`` (0 suppresses, 2 enhances).

        Args:
            factor: The scale.
            n_tokens: Apply to a prompt of this many tokens (see :meth:`mask_for`); default the
                query's own length.

        Returns:
            ``attn_pattern`` hooks (:func:`tlcap.intervene.synapses.scale_synapses`) for a forward pass.
        """
        m = self.mask if n_tokens is None else self.mask_for(n_tokens)
        return scale_synapses(m, factor)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: prompt, τ, number of synapses, synapses per token column.

        Returns:
            A JSON-ready dict (``per_token``: synapse count of each token column).
        """
        per_col = self.mask.sum((0, 1)).tolist()
        return {
            "prompt": self.prompt, "tokens": list(self.tokens), "alpha": self.alpha, "tau": self.tau,
            "skip_first": self.skip_first, "n_synapses": len(self), "per_token": [int(x) for x in per_col],
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`SynapseRow` per synapse.

        Returns:
            A DataFrame of :class:`SynapseRow` (layer, head, column, token, attention mass).
        """
        rows = [
            SynapseRow(l, h, c, self.tokens[c] if c < len(self.tokens) else "", float(self.col_mass[l, h, c]))
            for l, h, c in self.mask.nonzero().tolist()
        ]
        return frame(rows, SynapseRow)

    def figure(self) -> go.Figure:
        """Synapses per (layer, token column), summed over heads.

        Returns:
            A plotly ``[layer, token]`` count heatmap.
        """
        return synapse_count_heatmap(self.mask.sum(1), list(self.tokens),
                                     title=f"Knowledge synapses of {self.prompt!r} (α={self.alpha:g}, τ={self.tau:.3g})")


def locate_synapses(model: Model, prompt: str, alpha: float = 0.3, skip_first: bool = True,
                    patterns: Float[Tensor, "layer head query key"] | None = None) -> KnowledgeSynapses:
    """Knowledge synapses of ``prompt`` (QL eqs. 5–6; ``skip_first`` drops the attention sink).

    Args:
        model: The model.
        prompt: The query.
        alpha: α of τ (paper: 0.3).
        skip_first: Leave position 0 out.
        patterns: The prompt's :func:`attention_patterns` where already computed (default: computed here).

    Returns:
        A :class:`KnowledgeSynapses`.

    Example:
        >>> ks = locate_synapses(model, "The capital of France is")
        >>> ks.summary()["n_synapses"], ks.summary()["tau"]     # τ = 0.3 · 5 tokens; flat random attention
        (0, 1.5)
        >>> locate_synapses(model, "The capital of France is", alpha=0.1).summary()["per_token"]
        [0, 8, 8, 0, 0]
    """
    A = attention_patterns(model, prompt) if patterns is None else patterns
    mask, col, tau = synapse_mask(A, alpha, skip_first)
    toks = tuple(model.to_str_tokens(model.encode(prompt)))
    # a result value on the host, as mask_for documents (the patterns come from the model's device)
    return KnowledgeSynapses(mask.cpu(), col.cpu(), tau, alpha, prompt, toks, skip_first)


__all__ = [
    "ROLES", "map_columns", "token_roles",
    "KnowledgeSynapses", "SynapseRow", "attention_patterns", "attention_patterns_many", "locate_synapses",
    "most_attended_token", "synapse_mask",
]
