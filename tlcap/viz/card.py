"""Neuron-card figure and HTML (functions of values; the card result lives in :mod:`tlcap.explore.card`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tlcap.viz.html import card_html, esc, section, table_html, token_list_html, token_strip_html

Scored = Sequence[tuple[str, float]]


def card_figure(title: str, top: Scored, bottom: Scored, prompt_tokens: Sequence[str], prompt_acts: Sequence[float],
                snippet_values: Sequence[float]) -> go.Figure:
    """Logit weights (top and bottom tokens) and, when given, activation per prompt token and top corpus activations.

    Args:
        title: The neuron's label (the figure is titled ``Neuron {title}``).
        top: ``(token, logit weight)`` of the most promoted tokens.
        bottom: ``(token, logit weight)`` of the most suppressed tokens.
        prompt_tokens: The prompt's tokens (empty: no prompt panel).
        prompt_acts: The neuron's activation at each prompt token.
        snippet_values: The top corpus activations, largest first (empty: no corpus panel).

    Returns:
        A plotly figure with one bar panel per part given (1 to 3 rows).
    """
    panels = ["logit weights (direct path)"]
    if prompt_tokens:
        panels.append("activation on the prompt")
    if snippet_values:
        panels.append("top activations over the corpus")
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=panels, vertical_spacing=0.16)
    items = list(top) + list(reversed(list(bottom)))
    fig.add_trace(go.Bar(x=[repr(t) for t, _ in items], y=[v for _, v in items], showlegend=False,
                         marker_color=["#c0392b" if v >= 0 else "#2e5cb8" for _, v in items],
                         hovertemplate="%{x}: %{y:.4g}<extra></extra>"), row=1, col=1)
    row = 2
    if prompt_tokens:
        fig.add_trace(go.Bar(x=[f"{i}: {t!r}" for i, t in enumerate(prompt_tokens)], y=list(prompt_acts), showlegend=False,
                             marker_color="#7d3c98", hovertemplate="%{x}<br>activation %{y:.4g}<extra></extra>"),
                      row=row, col=1)
        row += 1
    if snippet_values:
        fig.add_trace(go.Bar(x=[f"#{i + 1}" for i in range(len(snippet_values))], y=list(snippet_values), showlegend=False,
                             marker_color="#16a085", hovertemplate="snippet %{x}: %{y:.4g}<extra></extra>"), row=row, col=1)
    fig.update_layout(title=f"Neuron {title}", template="plotly_white", height=300 * len(panels) + 80, width=900)
    return fig


def neuron_card_html(
    title: str,
    model_name: str,
    top: Scored,
    bottom: Scored,
    in_top: Scored,
    gate_top: Scored,
    stats: Mapping[str, float],
    corpus: str,
    corpus_tokens: int,
    snippet_tokens: Sequence[Sequence[str]],
    snippet_windows: Sequence[Sequence[float]],
    snippet_marks: Sequence[int],
    snippet_values: Sequence[float],
    prompt: str,
    prompt_tokens: Sequence[str],
    prompt_acts: Sequence[float],
    zero_changes: Sequence[tuple[str, float, float]],
    zero_kl: float,
) -> str:
    """The card as one HTML fragment (inline styles; see :func:`tlcap.viz.html.card_html`).

    Args:
        title: The neuron's label (the card is titled ``Neuron {title}``).
        model_name: The model's name (the card's subtitle).
        top: ``(token, logit weight)`` of the most promoted tokens (10 shown).
        bottom: ``(token, logit weight)`` of the most suppressed tokens (10 shown).
        in_top: ``(token, score)`` of the tokens driving the neuron through ``W_E · W_in``.
        gate_top: The same through ``W_E · W_gate`` for a gated MLP (empty: none shown).
        stats: Activation statistics over the corpus (``{name: value}``).
        corpus: The corpus name (empty: no activation index, a hint to build one is shown).
        corpus_tokens: Tokens in the corpus.
        snippet_tokens: The tokens of each top-activating snippet.
        snippet_windows: The neuron's activation at each token of each snippet.
        snippet_marks: The position of the top activation in each snippet.
        snippet_values: Each snippet's top activation.
        prompt: The prompt (empty: no prompt section).
        prompt_tokens: The prompt's tokens.
        prompt_acts: The neuron's activation at each prompt token.
        zero_changes: ``(next token, P before, P zeroed)`` of the tokens most changed by zeroing (8 shown).
        zero_kl: KL divergence of the next-token distribution when the neuron is zeroed at every position.

    Returns:
        The card's HTML fragment.
    """
    lists = token_list_html(list(top)[:10], "promotes (logit weight)") + token_list_html(list(bottom)[:10], "suppresses")
    lists += token_list_html(list(in_top)[:10], "driven by (W_E · W_in)")
    if gate_top:
        lists += token_list_html(list(gate_top)[:10], "gate driven by (W_E · W_gate)")
    parts = [section("Vocabulary (direct paths)", lists)]
    if corpus:
        st = " · ".join(f"{k} {esc(float(v))}" for k, v in stats.items())
        vmax = max((abs(v) for row in snippet_windows for v in row if math.isfinite(v)), default=0.0)
        rows = [(f"{v:.3g}", token_strip_html(toks, acts, vmax=vmax, mark=m))
                for toks, acts, m, v in zip(snippet_tokens, snippet_windows, snippet_marks, snippet_values)]
        parts.append(section(f"Top activations over {corpus} ({corpus_tokens:,} tokens)",
                             f"<div style='color:#555'>{st}</div>" + table_html(rows, header=("act", "snippet"), raw=True)))
    else:
        parts.append(section("Corpus", "<i>no activation index for this model yet: build one with "
                                       "<code>tlcap.activation_index(model)</code> (cached on disk), or pass "
                                       "<code>activations=\"build\"</code></i>"))
    if prompt:
        changes = table_html([(repr(t), f"{a:.4g}", f"{b:.4g}", f"{b - a:+.4g}") for t, a, b in zero_changes[:8]],
                             header=("next token", "P before", "P zeroed", "Δ"))
        parts.append(section(f"On {prompt!r}", token_strip_html(prompt_tokens, prompt_acts) +
                             f"<div style='margin-top:6px;color:#555'>zeroing the neuron at every position: "
                             f"KL {esc(zero_kl)}</div>" + changes))
    return card_html(f"Neuron {title}", model_name, parts)


__all__ = ["card_figure", "neuron_card_html"]
