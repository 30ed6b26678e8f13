"""Neuron cards: everything a researcher asks about one MLP neuron, on one page.

:func:`inspect_neuron` gathers, for neuron ``(layer, index)``:

- **Output side.** Its logit weights: the down-projection row ``W_out[j]`` through the final
  norm's gain (and centring, for LayerNorm) and ``W_U``; the tokens it promotes and suppresses
  most per unit of activation (the direct path; later layers are ignored).
- **Input side.** Which tokens' embeddings drive it directly: ``W_E @ W_in[:, j]`` (and the
  gate's, ``W_E @ W_gate[:, j]``, for gated MLPs; norms ignored).
- **Corpus.** From the :mod:`activation index <tlcap.explore.activation_index>` (cached on disk):
  mean, standard deviation, share of active tokens, the maximum, and the top-k activating
  snippets, each token shaded by the neuron's activation.
- **A prompt** (``prompt=``): its activation at each position and the effect of zeroing it (at
  every position) on the next-token distribution: the tokens whose probability changes most, and
  the KL divergence.

A card is a result value: ``summary()``, ``to_frame()``, ``figure()``, ``to_dict()``,
``save``/``load_result``, and ``_repr_html_`` for Jupyter (the dashboard embeds the same HTML).

Example (``model`` is a tiny random GPT-2, so the lists are arbitrary tokens; a SmolLM2-135M card is
opened the same way, e.g. ``tlcap.inspect_neuron(model, 27, 1094, prompt=...)``):

    >>> import tempfile
    >>> from tlcap.explore.activation_index import activation_index
    >>> idx = activation_index(model, max_tokens=2_000, cache=tempfile.mkdtemp(), progress=False)
    >>> card = tlcap.inspect_neuron(model, 1, 17, prompt="The capital of France is", activations=idx)
    >>> card                                   # in Jupyter: the card
    NeuronCard(layer=1, neuron=17, out_top=(('ogram', 0.006...), ...)
    >>> [tok for tok, _ in card.out_top[:3]], sorted(card.stats), card.zero_changes[0][0]
    (['ogram', ' obst', ' beneficiaries'], ['frac_active', 'max', 'mean', 'std'], 'ogram')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice, check_int
from tlcap.explore.activation_index import ActivationIndex, activation_index
from tlcap.intervene.activations import scale_neurons
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.models.unembedding import unit_final_norm
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.card import card_figure, neuron_card_html

Scored = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class CardRow:
    """One row of :meth:`NeuronCard.to_frame`: an entry of one of the card's lists."""

    section: str
    rank: int
    text: str
    value: float


@dataclass(frozen=True)
class NeuronCard(Result):
    """One MLP neuron, inspected (module docstring).

    Attributes:
        layer, neuron: The neuron.
        out_top, out_bottom: Tokens with the largest / smallest logit weights, with the weight.
        in_top: Tokens whose embeddings drive the neuron's input projection most.
        gate_top: The same for the gate projection (gated MLPs; empty otherwise).
        stats: Corpus statistics (``mean``, ``std``, ``frac_active``, ``max``); empty without an index.
        corpus: The indexed corpus (``""`` without an index) and its size in tokens.
        snippet_values: ``[k]`` top activations over the corpus.
        snippet_windows: ``[k, window]`` the neuron's activation on each snippet's tokens (NaN = padding).
        snippet_tokens: Each snippet's tokens.
        snippet_marks: The index of the activating token in each snippet.
        prompt, prompt_tokens: The inspected prompt and its tokens (``""`` / empty without one).
        prompt_acts: ``[pos]`` the neuron's activation at each position of the prompt.
        zero_changes: ``(token, p before, p after)`` of the next tokens whose probability changes
            most when the neuron is zeroed at every position.
        zero_kl: KL(before ‖ after) of the next-token distribution.
    """

    layer: int
    neuron: int
    out_top: tuple[tuple[str, float], ...]
    out_bottom: tuple[tuple[str, float], ...]
    in_top: tuple[tuple[str, float], ...]
    snippet_values: Float[Tensor, " k"]
    snippet_windows: Float[Tensor, "k window"]
    prompt_acts: Float[Tensor, " pos"]
    gate_top: tuple[tuple[str, float], ...] = ()
    stats: dict = field(default_factory=dict)
    corpus: str = ""
    corpus_tokens: int = 0
    snippet_tokens: tuple[tuple[str, ...], ...] = ()
    snippet_marks: tuple[int, ...] = ()
    prompt: str = ""
    prompt_tokens: tuple[str, ...] = ()
    zero_changes: tuple[tuple[str, float, float], ...] = ()
    zero_kl: float = float("nan")
    model_name: str = ""

    @property
    def title(self) -> str:
        return f"L{self.layer}/N{self.neuron}"

    def summary(self) -> dict[str, Any]:
        """The card's lists, shortened, and its statistics.

        Returns:
            A JSON-ready dict.
        """
        out: dict[str, Any] = {
            "model": self.model_name, "layer": self.layer, "neuron": self.neuron,
            "promotes": [t for t, _ in self.out_top[:8]], "suppresses": [t for t, _ in self.out_bottom[:8]],
            "driven_by": [t for t, _ in self.in_top[:8]], "stats": dict(self.stats), "corpus": self.corpus,
            "top_snippets": ["".join(s) for s in self.snippet_tokens[:3]],
        }
        if self.prompt:
            out.update(prompt=self.prompt, prompt_acts=[float(a) for a in self.prompt_acts],
                       zeroing_kl=self.zero_kl, zeroing_changes=[list(c) for c in self.zero_changes[:5]])
        return out

    def to_frame(self) -> pd.DataFrame:
        """One :class:`CardRow` per listed token, snippet and prompt position.

        Returns:
            A DataFrame with the fields of :class:`CardRow` as columns.
        """
        rows = [CardRow(sec, i, t, float(v)) for sec, items in (("promotes", self.out_top), ("suppresses", self.out_bottom),
                                                                 ("driven_by", self.in_top), ("gate_driven_by", self.gate_top))
                for i, (t, v) in enumerate(items)]
        rows += [CardRow("snippet", i, "".join(toks), float(v))
                 for i, (toks, v) in enumerate(zip(self.snippet_tokens, self.snippet_values.tolist()))]
        rows += [CardRow("prompt", i, t, float(a)) for i, (t, a) in enumerate(zip(self.prompt_tokens, self.prompt_acts.tolist()))]
        rows += [CardRow("zeroing", i, t, after - before) for i, (t, before, after) in enumerate(self.zero_changes)]
        return frame(rows, CardRow)

    def figure(self) -> go.Figure:
        """Logit weights (promoted / suppressed tokens) and, with a prompt, the activation per token.

        Returns:
            A plotly ``Figure``.
        """
        return card_figure(self.title, self.out_top, self.out_bottom, list(self.prompt_tokens),
                           self.prompt_acts.tolist(), self.snippet_values.tolist())

    def html(self) -> str:
        """The card as a self-contained HTML fragment (what Jupyter and the dashboard show).

        Returns:
            The HTML text.
        """
        windows = [[v for v in row if v == v] for row in self.snippet_windows.tolist()]
        return neuron_card_html(self.title, self.model_name, self.out_top, self.out_bottom, self.in_top, self.gate_top,
                                self.stats, self.corpus, self.corpus_tokens, list(self.snippet_tokens), windows,
                                list(self.snippet_marks), self.snippet_values.tolist(), self.prompt,
                                list(self.prompt_tokens), self.prompt_acts.tolist(), list(self.zero_changes), self.zero_kl)

    def _repr_html_(self) -> str:
        return self.html()


def _top(values: Tensor, model: Model, k: int, largest: bool = True) -> Scored:
    v, i = values.topk(k, largest=largest)
    return tuple(zip(model.to_str_tokens(i.tolist()), [float(x) for x in v]))


def vocab_projections(model: Model, layer: int, neuron: int, k: int = 12) -> dict[str, Scored]:
    """The card's vocabulary lists: ``out_top``, ``out_bottom``, ``in_top`` and ``gate_top``.

    Args:
        model: The model.
        layer: The neuron's layer.
        neuron: The neuron's index in the layer.
        k: Tokens per list.

    Returns:
        ``(token, weight)`` lists by name: tokens the neuron's output most promotes (``out_top``) and
        suppresses (``out_bottom``) through the unembedding, and embeddings most aligned with its input
        (``in_top``) and gate (``gate_top``, gated MLPs only) weights.
    """
    w_out = model.mlp_down_matrix(layer)[:, neuron].detach().float()
    logit_w = unit_final_norm(model).apply(w_out, 0) @ model.W_U.detach().float()
    out = {"out_top": _top(logit_w, model, k), "out_bottom": _top(logit_w, model, k, largest=False)}
    w_e = model.W_E.detach().float()
    for s in model.mlp_in_weights(layer):
        if s.role in ("in", "gate"):
            out[f"{s.role}_top"] = _top(w_e @ s.neuron_view()[neuron].float(), model, k)
    return out


def _snippets(idx: ActivationIndex, model: Model, layer: int, neuron: int) -> dict[str, Any]:
    snips = idx.snippets(layer, neuron)
    width = max((len(s[2]) for s in snips), default=0)
    windows = torch.full((len(snips), width), float("nan"))
    for i, (_, _, acts, _) in enumerate(snips):
        windows[i, : len(acts)] = torch.tensor(acts)
    return dict(stats=idx.stats(layer, neuron), corpus=idx.corpus, corpus_tokens=int(idx.tokens.numel()),
                snippet_values=torch.tensor([s[0] for s in snips]), snippet_windows=windows,
                snippet_tokens=tuple(tuple(model.to_str_tokens(s[1])) for s in snips),
                snippet_marks=tuple(s[3] for s in snips))


@dataclass(frozen=True)
class PromptRun:
    """One clean run of a prompt that every card of it shares: tokens, all neuron activations, next-token log-probs."""

    prompt: str
    tokens: Tensor
    str_tokens: tuple[str, ...]
    acts: Float[Tensor, "layer pos d_mlp"]
    logprobs: Float[Tensor, " d_vocab"]


@torch.no_grad()
def prompt_run(model: Model, prompt: str) -> PromptRun:
    """The clean run of ``prompt`` (one forward pass) that :func:`inspect_neuron` reads for its prompt part.

    Args:
        model: The model.
        prompt: The prompt.

    Returns:
        A :class:`PromptRun`: tokens, ``[n_layers, pos, d_mlp]`` neuron activations and last-position
        next-token log-probs (on the CPU).
    """
    toks = model.to_tokens(prompt)
    names = [model.hook_name("mlp_post", l) for l in range(model.n_layers)]
    logits, cache = model.run_with_cache(toks, names)
    acts = torch.stack([cache[n][0] for n in names]).float().cpu()
    return PromptRun(prompt, toks, tuple(model.to_str_tokens(toks[0].tolist())), acts,
                     logits[0, -1].float().log_softmax(-1).cpu())


@torch.no_grad()
def _prompt_part(model: Model, layer: int, neuron: int, run: PromptRun, k: int) -> dict[str, Any]:
    ns = NeuronSet.from_list([(layer, neuron)], (model.n_layers, model.d_mlp))
    before = run.logprobs
    after = model.last_logits(run.tokens, hooks=scale_neurons(model, ns, 0.0, pos="all")).float().log_softmax(-1)[0].cpu()
    p0, p1 = before.exp(), after.exp()
    change = (p1 - p0).abs().topk(k).indices.tolist()
    return dict(prompt=run.prompt, prompt_tokens=run.str_tokens, prompt_acts=run.acts[layer, :, neuron].clone(),
                zero_changes=tuple((t, float(p0[i]), float(p1[i])) for t, i in zip(model.to_str_tokens(change), change)),
                zero_kl=float((p0 * (before - after)).sum()))


def inspect_neuron(
    model: Model,
    layer: int,
    index: int,
    prompt: str | PromptRun | None = None,
    *,
    activations: ActivationIndex | str | None = "cached",
    top_tokens: int = 12,
    **index_options: Any,
) -> NeuronCard:
    """The :class:`NeuronCard` of neuron ``index`` of ``layer`` (module docstring).

    Args:
        model: The model.
        layer: The neuron's layer.
        index: Its index within the layer.
        prompt: A prompt to show the neuron's activation on and the effect of zeroing it (or its
            :func:`prompt_run`, shared by many cards of the same prompt).
        activations: The corpus part: an :class:`ActivationIndex`; ``"cached"`` (default) uses the
            model's cached WikiText-2 index when there is one (the card says how to build it
            otherwise); ``"build"`` builds it when missing (one pass over the corpus: minutes on a
            CPU for SmolLM2, see ``docs/explore.md``); ``None`` leaves the corpus part out.
        top_tokens: Tokens listed per vocabulary list and changed tokens listed for the prompt.
        **index_options: Settings of :func:`~tlcap.explore.activation_index.activation_index`
            (``max_tokens``, ``k``, ``context``, ``cache``...) used to find or build the index.

    Returns:
        The :class:`NeuronCard`, with provenance.
    """
    layer = check_int("layer", layer, min=0, max=model.n_layers - 1, cli="--layer")
    index = check_int("index", index, min=0, max=model.d_mlp - 1, cli="--neuron")
    idx = activations
    if isinstance(activations, str):
        check_choice("activations", activations, ("cached", "build"), cli=None)
        idx = activation_index(model, build=activations == "build", **index_options)
    parts: dict[str, Any] = dict(snippet_values=torch.zeros(0), snippet_windows=torch.zeros(0, 0), prompt_acts=torch.zeros(0))
    parts.update(vocab_projections(model, layer, index, top_tokens))
    if isinstance(idx, ActivationIndex):
        parts.update(_snippets(idx, model, layer, index))
    if prompt:
        run = prompt if isinstance(prompt, PromptRun) else prompt_run(model, prompt)
        parts.update(_prompt_part(model, layer, index, run, top_tokens))
    card = NeuronCard(layer=layer, neuron=index, model_name=model.name, **parts)
    return card.with_provenance(Provenance.collect(model))


__all__ = ["CardRow", "NeuronCard", "PromptRun", "inspect_neuron", "prompt_run", "vocab_projections"]
