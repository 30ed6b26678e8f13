"""Direct logit attribution (DLA) of MLP neurons: each neuron's direct contribution to a target logit.

Neuron ``j`` of layer ``l`` writes ``a_j · W_out[j]`` into the residual stream at a position. Its
*direct* effect on the target logit is that write read straight out by the final norm, frozen at
the run's scale σ (:class:`tlcap.models.unembedding.FrozenNorm`), and the unembedding column of
the target::

    DLA_j = a_j · (γ ⊙ center(W_out[j]) / σ) · W_U[:, target]

It ignores every path through later layers (that is what "direct" means) and is linear in the
writes, so the contributions of a set sum exactly to the set's direct effect: the target logit
minus the target logit with the set's writes removed from the final residual and σ held at its
value (the test checks this against the model's own final norm with its scale hook patched).

Example:
    >>> attr = tlcap.integrated_gradients(model, "The capital of France is", " Paris")
    >>> neurons = attr.select(threshold=0.2)
    >>> dla = tlcap.direct_logit_attribution(model, "The capital of France is", " Paris", neurons)
    >>> round(dla.direct_effect, 4), dla.to_frame().head(3)    # sum over the set; one row per neuron
    (0.2613,    layer  neuron  activation  direct_effect
    0      0      55   -0.083152       0.006758
    1      0      79    0.133410       0.009076
    2      0     114   -0.082410       0.006498)
    >>> fig = dla.figure()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import EmptyNeuronSetError
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.models.unembedding import frozen_final_norm
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.html import summary_html, table_html
from tlcap.viz.lens import dla_figure


@dataclass(frozen=True)
class DLARow:
    """One neuron of :meth:`DirectLogitAttribution.to_frame`."""

    layer: int
    neuron: int
    activation: float
    direct_effect: float


@dataclass(frozen=True)
class DirectLogitAttribution(Result):
    """Direct contributions of a neuron set to a target logit at one position.

    Attributes:
        contributions: ``[n]`` DLA of each neuron, in the order of :attr:`neurons`.
        activations: ``[n]`` their activations at :attr:`position`.
        neurons: The neurons ``(layer, index)``, sorted.
        prompt, target, target_id: The run and the scored token.
        position: The scored position (index into the prompt's tokens).
        target_logit: The model's target logit there.
        direct_effect: The set's direct effect (the sum of :attr:`contributions`).
        promoted: Tokens the set's writes raise most directly, with the logit change.
        suppressed: Tokens they lower most.
    """

    contributions: Float[Tensor, " n"]
    activations: Float[Tensor, " n"]
    neurons: tuple[tuple[int, int], ...]
    prompt: str = ""
    target: str = ""
    target_id: int = -1
    position: int = -1
    target_logit: float = float("nan")
    direct_effect: float = float("nan")
    promoted: tuple[tuple[str, float], ...] = ()
    suppressed: tuple[tuple[str, float], ...] = ()
    model_name: str = ""

    def summary(self) -> dict[str, Any]:
        """The set's direct effect, the target logit, and the neurons with the largest contributions.

        Returns:
            A JSON-ready dict.
        """
        order = self.contributions.abs().argsort(descending=True)[:10].tolist()
        return {
            "prompt": self.prompt, "target": self.target, "position": self.position, "n_neurons": len(self.neurons),
            "target_logit": self.target_logit, "direct_effect": self.direct_effect,
            "top_neurons": [[*self.neurons[i], float(self.contributions[i])] for i in order],
            "promoted": [list(x) for x in self.promoted[:5]], "suppressed": [list(x) for x in self.suppressed[:5]],
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`DLARow` per neuron.

        Returns:
            A DataFrame with the fields of :class:`DLARow` as columns.
        """
        rows = [DLARow(l, j, float(a), float(c)) for (l, j), a, c in zip(self.neurons, self.activations, self.contributions)]
        return frame(rows, DLARow)

    def figure(self) -> go.Figure:
        """Per-neuron direct effects, largest first, with the set's total in the title.

        Returns:
            A plotly ``Figure``.
        """
        return dla_figure([f"L{l}/N{j}" for l, j in self.neurons], [float(c) for c in self.contributions],
                          self.direct_effect, f"Direct logit attribution to {self.target!r} ({self.prompt!r})")

    def _repr_html_(self) -> str:
        order = self.contributions.abs().argsort(descending=True)[:12].tolist()
        rows = [(f"L{self.neurons[i][0]}/N{self.neurons[i][1]}", f"{float(self.activations[i]):.4g}",
                 f"{float(self.contributions[i]):+.4g}") for i in order]
        head = summary_html(f"Direct logit attribution to {self.target!r}", {
            "prompt": self.prompt, "neurons": len(self.neurons), "target logit": self.target_logit,
            "direct effect of the set": self.direct_effect,
            "promoted": [t for t, _ in self.promoted[:6]], "suppressed": [t for t, _ in self.suppressed[:6]],
        })
        return head + table_html(rows, header=("neuron", "activation", "direct effect"))


@torch.no_grad()
def neuron_writes(model: Model, prompt: str, position: int = -1) -> tuple[Float[Tensor, "layer d_mlp"], Any]:
    """Every neuron's activation at ``position`` and the frozen final norm of the run.

    Args:
        model: The model.
        prompt: The prompt.
        position: The position read (default the last).

    Returns:
        ``(activations [n_layers, d_mlp], FrozenNorm)``.
    """
    toks = model.to_tokens(prompt)
    names = [model.hook_name("mlp_post", l) for l in range(model.n_layers)] + [model.hook_name("final_in")]
    rec = model.record(toks, names)
    acts = torch.stack([rec[n][0, position] for n in names[:-1]]).float()
    return acts, frozen_final_norm(model, rec[names[-1]][0])


def direct_logit_attribution(
    model: Model, prompt: str, target: str, neurons: NeuronSet, position: int = -1, top_tokens: int = 10
) -> DirectLogitAttribution:
    """DLA of ``neurons`` for ``prompt → target`` (module docstring).

    Args:
        model: The model.
        prompt: The prompt.
        target: The answer token (its first token when it has several).
        neurons: The neurons (e.g. a located set).
        position: The position read (default the last, which predicts the target).
        top_tokens: How many promoted / suppressed tokens to keep.

    Returns:
        A :class:`DirectLogitAttribution` with provenance.

    Raises:
        EmptyNeuronSetError: ``neurons`` is empty.
    """
    if not len(neurons):
        raise EmptyNeuronSetError("direct_logit_attribution needs at least one neuron; the set is empty")
    tid = int(model.target_ids(prompt, target)[0])
    acts, frozen = neuron_writes(model, prompt, position)
    w_u = model.W_U.detach().float()
    contrib, act_list, total_write = [], [], None
    for layer, js in sorted(neurons.by_layer().items()):
        idx = torch.tensor(js)
        rows = model.mlp_down_matrix(layer).detach().float().T[idx]  # [n, d_model]: what each neuron writes per unit
        a = acts[layer, idx]
        read = frozen.apply(rows, position) @ w_u[:, tid]
        contrib.append(a * read)
        act_list.append(a)
        write = (a[:, None] * rows).sum(0)
        total_write = write if total_write is None else total_write + write
    assert total_write is not None
    vocab = frozen.apply(total_write, position) @ w_u  # the set's direct effect on every logit
    up, down = vocab.topk(top_tokens), (-vocab).topk(top_tokens)
    names = model.to_str_tokens(up.indices.tolist() + down.indices.tolist())
    contributions = torch.cat(contrib)
    toks = model.to_tokens(prompt)
    logit = float(model.logits(toks)[0, position, tid])
    res = DirectLogitAttribution(
        contributions=contributions, activations=torch.cat(act_list), neurons=tuple(sorted(neurons)), prompt=prompt,
        target=target, target_id=tid, position=position if position >= 0 else toks.shape[1] + position,
        target_logit=logit, direct_effect=float(contributions.sum()),
        promoted=tuple(zip(names[:top_tokens], up.values.tolist())),
        suppressed=tuple(zip(names[top_tokens:], (-down.values).tolist())), model_name=model.name,
    )
    return res.with_provenance(Provenance.collect(model))


__all__ = ["DLARow", "DirectLogitAttribution", "direct_logit_attribution", "neuron_writes"]
