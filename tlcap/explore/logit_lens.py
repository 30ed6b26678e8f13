"""The logit lens (nostalgebraist 2020): read the residual stream of every layer through the model's read-out.

For a prompt, the residual stream after the embeddings and after each layer (``resid_pre`` of
layer 0, ``resid_post`` of every layer) is passed through the model's own final norm and
unembedding (:func:`tlcap.models.unembedding.resid_logits`). For the last layer that *is* the
model's output (tested). At every (layer, position) the result keeps the target token's
probability, rank and logit and the top token, so the figure shows where in depth and in the
prompt the answer appears.

Example:
    >>> lens = tlcap.logit_lens(model, "The capital of France is", " Paris")
    >>> lens.first_layer(top=1)           # first layer whose read-out ranks " Paris" first at the last position
    >>> lens.figure().show()              # layers × positions, colour = P(" Paris"), hover = top token
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import InvalidConfigError
from tlcap.models.adapter import Model
from tlcap.models.unembedding import resid_logits
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.html import summary_html, table_html
from tlcap.viz.lens import lens_figure

METRICS = ("prob", "rank", "logit")


@dataclass(frozen=True)
class LensRow:
    """One (layer, position) cell of :meth:`LogitLens.to_frame`."""

    layer: str
    position: int
    token: str
    target_prob: float
    target_rank: int
    target_logit: float
    top_token: str
    top_prob: float


@dataclass(frozen=True)
class LogitLens(Result):
    """The target's read-out at every layer and position.

    Attributes:
        probs: ``[n_layers + 1, pos]`` P(target) from each residual state (row 0: the embeddings).
        ranks: ``[n_layers + 1, pos]`` the target's rank (1 = top) there.
        logits: ``[n_layers + 1, pos]`` the target's logit there.
        top_ids: ``[n_layers + 1, pos]`` the top token's id there.
        top_probs: ``[n_layers + 1, pos]`` its probability.
        prompt: The prompt.
        target: The tracked token (the model's prediction at the last position when not given).
        target_id: Its id.
        tokens: The prompt's tokens.
        top_tokens: The top tokens as strings, row-major ``[layer][pos]``.
    """

    probs: Float[Tensor, "layer pos"]
    ranks: Int[Tensor, "layer pos"]
    logits: Float[Tensor, "layer pos"]
    top_ids: Int[Tensor, "layer pos"]
    top_probs: Float[Tensor, "layer pos"]
    prompt: str = ""
    target: str = ""
    target_id: int = -1
    tokens: tuple[str, ...] = ()
    top_tokens: tuple[tuple[str, ...], ...] = ()
    model_name: str = ""

    @property
    def layer_labels(self) -> list[str]:
        """``["embed", "0", "1", ...]``: what each row read."""
        return ["embed"] + [str(i) for i in range(self.probs.shape[0] - 1)]

    def first_layer(self, top: int = 1, position: int = -1) -> int | None:
        """The first layer (0-based; -1 = the embeddings) at which the target ranks within ``top`` at ``position``.

        Args:
            top: The rank the target must reach (1: top-1).
            position: The prompt position (-1: the last).

        Returns:
            The layer, or ``None`` when the target never ranks within ``top`` there.
        """
        hit = (self.ranks[:, position] <= top).nonzero().flatten()
        return int(hit[0]) - 1 if len(hit) else None

    def summary(self) -> dict[str, Any]:
        """The target, its final probability and rank, and where it first ranks 1st and within the top 10.

        Returns:
            A JSON-ready dict.
        """
        return {
            "prompt": self.prompt, "target": self.target, "target_id": self.target_id, "model": self.model_name,
            "final_prob": float(self.probs[-1, -1]), "final_rank": int(self.ranks[-1, -1]),
            "first_layer_top1": self.first_layer(1), "first_layer_top10": self.first_layer(10),
            "last_position_probs": [float(p) for p in self.probs[:, -1]],
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`LensRow` per (layer, position).

        Returns:
            A DataFrame with the fields of :class:`LensRow` as columns.
        """
        rows = [
            LensRow(lab, p, self.tokens[p], float(self.probs[i, p]), int(self.ranks[i, p]), float(self.logits[i, p]),
                    self.top_tokens[i][p], float(self.top_probs[i, p]))
            for i, lab in enumerate(self.layer_labels) for p in range(len(self.tokens))
        ]
        return frame(rows, LensRow)

    def figure(self, metric: str = "prob") -> go.Figure:
        """Layers × positions heatmap of the target's ``prob``, ``rank`` (log colour) or ``logit``; hover: top token.

        Args:
            metric: ``"prob"``, ``"rank"`` or ``"logit"``.

        Returns:
            A plotly ``Figure``.
        """
        if metric not in METRICS:
            raise InvalidConfigError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        z = {"prob": self.probs, "rank": self.ranks.float().log10(), "logit": self.logits}[metric]
        return lens_figure(z, self.ranks, self.probs, self.layer_labels, list(self.tokens),
                           [list(r) for r in self.top_tokens], self.top_probs, metric,
                           title=f"Logit lens: {self.target!r} after {self.prompt!r} ({self.model_name})")

    def _repr_html_(self) -> str:
        rows = [(lab, f"{float(self.probs[i, -1]):.3g}", int(self.ranks[i, -1]), repr(self.top_tokens[i][-1]))
                for i, lab in enumerate(self.layer_labels)]
        body = table_html(rows, header=("layer", f"P({self.target!r})", "rank", "top token"))
        return summary_html(f"LogitLens of {self.prompt!r} → {self.target!r}", {
            "model": self.model_name, "final P": float(self.probs[-1, -1]), "first layer ranked 1st": self.first_layer(1),
        }, note="last position, every layer; .figure() for all positions") + body


@torch.no_grad()
def logit_lens(model: Model, prompt: str, target: str | None = None) -> LogitLens:
    """The logit lens of ``prompt``, tracking ``target`` (module docstring).

    Args:
        model: The model.
        prompt: The prompt.
        target: The token to track (its first token when it has several); ``None`` = the model's
            top prediction at the last position.

    Returns:
        A :class:`LogitLens` with provenance.
    """
    toks = model.to_tokens(prompt)
    names = [model.hook_name("resid_pre", 0)] + [model.hook_name("resid_post", l) for l in range(model.n_layers)]
    rec = model.record(toks, names)
    resid = torch.stack([rec[n][0] for n in names])  # [L + 1, pos, d]
    logits = resid_logits(model, resid).float()
    if target is None:
        tid = int(logits[-1, -1].argmax())
        target = model.decode([tid])
    else:
        tid = int(model.target_ids(prompt, target)[0])
    logp = logits.log_softmax(-1)
    t_logit = logits[..., tid]
    ranks = (logits > t_logit[..., None]).sum(-1) + 1
    top_p, top_i = logp.max(-1)
    strs = model.to_str_tokens(top_i.flatten().tolist())
    n = toks.shape[1]
    top_tokens = tuple(tuple(strs[i * n:(i + 1) * n]) for i in range(len(names)))
    res = LogitLens(
        probs=logp[..., tid].exp(), ranks=ranks, logits=t_logit, top_ids=top_i, top_probs=top_p.exp(), prompt=prompt,
        target=target, target_id=tid, tokens=tuple(model.to_str_tokens(toks[0].tolist())), top_tokens=top_tokens,
        model_name=model.name,
    )
    return res.with_provenance(Provenance.collect(model))


__all__ = ["LensRow", "LogitLens", "logit_lens", "METRICS"]
