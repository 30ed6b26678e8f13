"""Clickable neuron heatmaps: click a cell, the neuron's card opens beside the heatmap.

:func:`explore_neurons` takes a neuron result (a :class:`~tlcap.attribution.ig.NeuronAttribution`,
a knowledge-neuron experiment, a CNL location, EAP neuron scores, dataset scores or a plain
:class:`~tlcap.metrics.NeuronSet`) and precomputes the :class:`~tlcap.explore.card.NeuronCard`
of every located neuron and of the ``top`` highest-scoring ones. The :class:`NeuronExplorer` it
returns renders as one self-contained HTML block — the heatmap (plotly, inlined), a card panel,
the cards as JSON and a few lines of JavaScript that show a cell's card on ``plotly_click``:

- **In Jupyter** it is the cell's output (``_repr_html_``); clicking works wherever the notebook
  runs output JavaScript (trusted notebooks in Jupyter / JupyterLab / VS Code).
- **Without JavaScript** (a static renderer, an untrusted notebook) it degrades to hover text:
  the carded cells carry their card's one-line summary (what the neuron promotes, where it fires).
- **As a page**, :meth:`NeuronExplorer.save` writes the full HTML document
  ``tlcap dashboard`` writes: no server, no network.

Cards are precomputed because a click in a static page cannot run the model; in a live Python
session any neuron's card is ``tlcap.inspect_neuron(model, layer, neuron)``.

Example:
    >>> import os, tempfile
    >>> attr = tlcap.integrated_gradients(model, "The capital of France is", " Paris")
    >>> ex = explore_neurons(model, attr, prompt="The capital of France is", activations=None)  # no corpus part
    >>> len(ex.cards), ex.title  # Jupyter shows ``ex`` as heatmap + card panel
    (34, "IG attribution: 'The capital of France is' → ' Paris'")
    >>> ex.save(os.path.join(tempfile.mkdtemp(), "paris.html"))   # the same as a self-contained page
    PosixPath('.../paris.html')
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from torch import Tensor

from tlcap.errors import ResultTypeError
from tlcap.explore.activation_index import ActivationIndex
from tlcap.explore.card import NeuronCard, inspect_neuron, prompt_run
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.viz.heatmaps import located_heatmap, neuron_heatmap
from tlcap.viz.html import BOX, esc, summary_html

SUPPORTED = "NeuronAttribution, KnowledgeNeurons, CNLLocation, NeuronScores, DatasetScores or NeuronSet"


@dataclass(frozen=True)
class NeuronView:
    """What a neuron heatmap of a result shows: scores (or none), the located set, its prompt."""

    scores: Tensor | None
    located: NeuronSet
    prompt: str | None
    title: str
    summary: dict = field(default_factory=dict)


def neuron_view(result: Any) -> NeuronView:
    """The heatmap parts of a neuron result (see ``SUPPORTED``).

    Args:
        result: A result of one of the kinds of ``SUPPORTED``.

    Returns:
        A :class:`NeuronView`: its scores (``None`` for a bare set), located neurons, prompt, title and summary.

    Raises:
        ResultTypeError: another kind of result.
    """
    kind = type(result).__name__
    summary = result.summary() if hasattr(result, "summary") else {}
    if isinstance(result, NeuronSet):
        return NeuronView(None, result, None, "Located neurons", summary)
    if kind == "NeuronAttribution":
        return NeuronView(result.scores, result.select(threshold=0.2), result.prompt,
                          f"{result.method.upper()} attribution: {result.prompt!r} → {result.target!r}", summary)
    if kind == "KnowledgeNeurons":
        return NeuronView(result.scores[0], result.neurons, result.prompts[0],
                          f"Knowledge neurons: {result.prompts[0]!r} → {result.target!r}", summary)
    if kind == "CNLLocation":
        return NeuronView(result.scores, result.neuron_set(), None, f"CNL scores: {result.task}", summary)
    if kind in ("NeuronScores", "DatasetScores"):
        scores = result.scores.float()
        flat = scores.abs().flatten().topk(min(20, scores.numel())).indices.tolist()
        top = NeuronSet.from_list([(i // scores.shape[1], i % scores.shape[1]) for i in flat], tuple(scores.shape))
        return NeuronView(scores, top, None, f"{kind} (top 20 by |score| ringed)", summary)
    raise ResultTypeError(f"a neuron explorer shows neuron results ({SUPPORTED}); got a {kind}")


def _card_line(card: NeuronCard) -> str:
    promotes = ", ".join(repr(t) for t, _ in card.out_top[:4])
    line = f"<b>L{card.layer}/N{card.neuron}</b> promotes {esc(promotes)}"
    if card.stats:
        line += f"; max act {card.stats['max']:.3g} on {esc(card.corpus)}"
    return line + "<br>(click for the card)"


@dataclass(frozen=True)
class NeuronExplorer:
    """A heatmap with precomputed neuron cards (module docstring)."""

    figure: go.Figure
    cards: dict[str, str]
    title: str
    header: str = ""

    def html(self, full_page: bool = False, plotlyjs: bool | str = True) -> str:
        """The explorer as an HTML block (``full_page``: a whole document); ``plotlyjs`` as in plotly's ``to_html``.

        Args:
            full_page: Return a whole HTML document (what :meth:`save` writes) rather than a block for a notebook.
            plotlyjs: ``include_plotlyjs`` of plotly's ``to_html``: ``True`` embeds plotly.js, ``"cdn"`` links it.

        Returns:
            The HTML text: the heatmap, the precomputed cards (JSON) and the script that shows a clicked neuron's card.
        """
        uid = uuid.uuid4().hex[:8]
        plot = self.figure.to_html(full_html=False, include_plotlyjs=plotlyjs, div_id=f"tlx-plot-{uid}",
                                   config={"displaylogo": False, "responsive": True})
        data = json.dumps(self.cards).replace("</", "<\\/")
        hint = (f"Click a cell of the heatmap: cards are precomputed for {len(self.cards)} neurons (ringed: located). "
                "In Python, any neuron: tlcap.inspect_neuron(model, layer, neuron).")
        body = f"""<div class="tlcap-explorer" style="{BOX};max-width:none">{self.header}
<div style="display:grid;grid-template-columns:minmax(0,1fr) minmax(320px,40%);gap:12px;align-items:start">
<div style="min-width:0;overflow:hidden">{plot}</div>
<div id="tlx-card-{uid}" class="tlcap-card-panel" style="max-height:90vh;overflow:auto">
<div style="color:#666;padding:8px">{esc(hint)}</div></div></div>
<script type="application/json" id="tlx-cards-{uid}">{data}</script>
<script>(function() {{
  var cards = JSON.parse(document.getElementById("tlx-cards-{uid}").textContent);
  var panel = document.getElementById("tlx-card-{uid}");
  function show(layer, neuron) {{
    var key = Math.round(layer) + "," + Math.round(neuron);
    panel.innerHTML = cards[key] || ('<div class="tlcap-card" style="padding:8px;color:#555">No card precomputed for L' +
      Math.round(layer) + '/N' + Math.round(neuron) + '. In Python: tlcap.inspect_neuron(model, ' + Math.round(layer) + ', ' +
      Math.round(neuron) + ')</div>');
    panel.setAttribute("data-neuron", key);
  }}
  function attach(tries) {{
    var gd = document.getElementById("tlx-plot-{uid}");
    if (!gd || !gd.on) {{ if (tries < 200) setTimeout(function() {{ attach(tries + 1); }}, 50); return; }}
    gd.on("plotly_click", function(ev) {{ var p = ev.points[0]; show(p.y, p.x); }});
    gd.setAttribute("data-tlcap-ready", "1");
  }}
  attach(0);
}})();</script></div>"""
        if not full_page:
            return body
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(self.title)}</title></head>"
                f"<body style='margin:16px'>{body}</body></html>")

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path: str | Path) -> Path:
        """Write the self-contained page (atomically: a temporary file renamed into place).

        Args:
            path: The HTML file to write (replaced if it exists).

        Returns:
            ``path`` as a :class:`~pathlib.Path`.
        """
        out = Path(path)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(self.html(full_page=True), encoding="utf-8")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out


def explore_neurons(
    model: Model,
    result: Any,
    prompt: str | None = None,
    *,
    top: int = 20,
    activations: ActivationIndex | str | None = "cached",
    on_card: Callable[[int, int], None] | None = None,
    **index_options: Any,
) -> NeuronExplorer:
    """A clickable heatmap of ``result`` with the cards of its located and ``top`` highest-scoring neurons.

    Args:
        model: The model the result was computed on.
        result: A neuron result (``SUPPORTED``).
        prompt: Prompt shown on every card (default: the result's own prompt, if it has one).
        top: Also card the ``top`` neurons by score (0: located neurons only).
        activations: Corpus part of the cards (see :func:`~tlcap.explore.card.inspect_neuron`).
        on_card: Called with ``(layer, neuron)`` before each card (progress).
        **index_options: Activation-index settings (``max_tokens``, ``cache``...).

    Returns:
        The :class:`NeuronExplorer`.
    """
    view = neuron_view(result)
    carded = list(view.located)
    if view.scores is not None and top > 0:
        s = view.scores.float()
        for i in s.flatten().topk(min(top, s.numel())).indices.tolist():
            n = (i // s.shape[1], i % s.shape[1])
            if n not in carded:
                carded.append(n)
    shown_prompt = prompt if prompt is not None else view.prompt
    run = prompt_run(model, shown_prompt) if shown_prompt else None  # one clean run shared by every card
    cards: dict[str, NeuronCard] = {}
    for layer, neuron in carded:
        if on_card is not None:
            on_card(layer, neuron)
        cards[f"{layer},{neuron}"] = inspect_neuron(model, layer, neuron, run, activations=activations, **index_options)
    if view.scores is not None:
        fig = neuron_heatmap(view.scores.float(), highlight=view.located, title=view.title)
    else:
        fig = located_heatmap({"located": view.located}, title=view.title, shape=view.located.shape)
    fig.update_layout(width=None, autosize=True)  # fill the explorer's column, beside the card panel
    if cards:
        ls, js = zip(*[(c.layer, c.neuron) for c in cards.values()])
        fig.add_trace(go.Scatter(x=list(js), y=list(ls), mode="markers", name=f"cards ({len(cards)})",
                                 marker=dict(size=12, color="rgba(0,0,0,0)"), text=[_card_line(c) for c in cards.values()],
                                 hovertemplate="%{text}<extra></extra>"))
    header = summary_html(view.title, {k: v for k, v in view.summary.items() if not isinstance(v, (list, dict))},
                          note=f"{model.name}; cards: {len(cards)} neurons")
    return NeuronExplorer(fig, {k: c.html() for k, c in cards.items()}, view.title, header)


__all__ = ["NeuronExplorer", "NeuronView", "explore_neurons", "neuron_view", "SUPPORTED"]
