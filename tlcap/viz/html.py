"""Small HTML pieces for Jupyter (``_repr_html_``) and the dashboard: tables, shaded tokens, cards.

Functions of values (strings, numbers, tensors), like the rest of :mod:`tlcap.viz`: no result type
is imported. Everything is escaped; styles are inline so a fragment renders the same in a notebook,
in a saved HTML page and in the dashboard.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

BOX = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.35;max-width:980px"
TH = "text-align:left;padding:2px 10px 2px 0;color:#555;font-weight:600;vertical-align:top"
TD = "text-align:left;padding:2px 10px 2px 0;vertical-align:top;font-variant-numeric:tabular-nums"


def esc(x: Any) -> str:
    """``x`` as escaped HTML text (numbers compact: 4 significant digits).

    Args:
        x: Any value; a float is written with 4 significant digits (``nan`` for NaN), anything else via ``str``.

    Returns:
        The HTML-escaped text.
    """
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return html.escape(str(x))


def compact(value: Any, limit: int = 8) -> str:
    """A JSON-ish value as short HTML: long lists cut after ``limit`` items with the count.

    Args:
        value: A mapping, list/tuple (rendered recursively) or scalar.
        limit: Most items shown per mapping or list.

    Returns:
        Escaped HTML such as ``[1, 2, … (40 items)]``.
    """
    if isinstance(value, Mapping):
        items = list(value.items())
        inner = ", ".join(f"{esc(k)}: {compact(v, limit)}" for k, v in items[:limit])
        return "{" + inner + (f", … ({len(items)})" if len(items) > limit else "") + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(compact(v, limit) for v in value[:limit])
        return "[" + inner + (f", … ({len(value)} items)" if len(value) > limit else "") + "]"
    return esc(value)


def table_html(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None, raw: bool = False) -> str:
    """A plain table; cells are escaped unless ``raw`` (pre-rendered HTML).

    Args:
        rows: The table's rows, each a sequence of cells.
        header: Column titles, or ``None`` for no header row.
        raw: The cells are already HTML (not escaped).

    Returns:
        A ``<table>`` fragment with inline styles.
    """
    out = ["<table style='border-collapse:collapse'>"]
    if header:
        out.append("<tr>" + "".join(f"<th style=\"{TH}\">{esc(h)}</th>" for h in header) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td style=\"{TD}\">{c if raw else esc(c)}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def summary_html(title: str, summary: Mapping[str, Any], note: str = "") -> str:
    """A result's ``summary()`` as a key/value table under a title.

    Args:
        title: Bold title above the table.
        summary: ``{key: value}`` rows (the ``provenance`` key is left out; values via :func:`compact`).
        note: Grey note under the table (none when empty).

    Returns:
        A ``<div>`` fragment.
    """
    rows = [(f"<b>{esc(k)}</b>", compact(v)) for k, v in summary.items() if k != "provenance"]
    foot = f"<div style='color:#777;margin-top:4px'>{esc(note)}</div>" if note else ""
    return f"<div style=\"{BOX}\"><div style='font-weight:700;margin-bottom:4px'>{esc(title)}</div>" \
           f"{table_html(rows, raw=True)}{foot}</div>"


def shade(value: float, vmax: float) -> str:
    """Background colour of a value: red for positive, blue for negative, alpha by ``|value| / vmax``.

    Args:
        value: The value to colour (a non-finite value is transparent).
        vmax: The magnitude of full colour (``<= 0``: transparent).

    Returns:
        A CSS ``rgba(...)`` colour, alpha at most 0.85.
    """
    a = 0.0 if vmax <= 0 or not math.isfinite(value) else min(1.0, abs(value) / vmax)
    rgb = "220,60,40" if value >= 0 else "40,90,220"
    return f"rgba({rgb},{a * 0.85:.3f})"


def token_strip_html(tokens: Sequence[str], values: Sequence[float], vmax: float | None = None,
                     mark: int | None = None) -> str:
    """Tokens shaded by their values (hover shows the value); ``mark`` underlines one position.

    Args:
        tokens: The token strings (spaces shown as non-breaking, newlines as ⏎, empty as ∅).
        values: One value per token.
        vmax: The magnitude of full colour (default: the largest finite ``|value|``).
        mark: Position to outline, or ``None``.

    Returns:
        A monospace ``<span>`` of shaded token spans.
    """
    vals = [float(v) for v in values]
    top = vmax if vmax is not None else max((abs(v) for v in vals if math.isfinite(v)), default=0.0)
    spans = []
    for i, (t, v) in enumerate(zip(tokens, vals)):
        text = esc(t).replace(" ", "&nbsp;").replace("\n", "⏎") or "∅"
        style = f"background:{shade(v, top)};border-radius:3px;padding:0 1px"
        if i == mark:
            style += ";outline:2px solid #222"
        spans.append(f"<span title=\"{esc(v)}\" style=\"{style}\">{text}</span>")
    return "<span style='font-family:ui-monospace,Menlo,monospace;font-size:12px'>" + "".join(spans) + "</span>"


def token_list_html(items: Sequence[tuple[str, float]], title: str) -> str:
    """A titled column of ``token  value`` pairs (vocabulary projections, changed tokens).

    Args:
        items: ``(token, value)`` pairs, in display order.
        title: The column's title.

    Returns:
        An inline-block ``<div>`` holding the title and a table of tokens and signed values.
    """
    rows = [(f"<code>{esc(repr(t))}</code>", f"{v:+.3f}") for t, v in items]
    return f"<div style='display:inline-block;vertical-align:top;margin-right:18px'><div style='font-weight:600'>" \
           f"{esc(title)}</div>{table_html(rows, raw=True)}</div>"


def neuron_set_html(by_layer: Mapping[int, Sequence[int]], shape: tuple[int, int], title: str = "NeuronSet") -> str:
    """A neuron set: its size, ratio and the neurons of each layer.

    Args:
        by_layer: ``{layer: neuron indices}``.
        shape: ``(n_layers, d_mlp)`` of the model, for the ratio.
        title: Title shown before the count.

    Returns:
        A ``<div>`` fragment with one row per layer (``empty`` when there is none).
    """
    n = sum(len(v) for v in by_layer.values())
    total = shape[0] * shape[1]
    rows = [(f"<b>layer {l}</b>", f"{len(js)}", compact(list(js), limit=16)) for l, js in sorted(by_layer.items())]
    return f"<div style=\"{BOX}\"><div style='font-weight:700'>{esc(title)}: {n} neurons " \
           f"({n / total:.3%} of {shape[0]} × {shape[1]})</div>" \
           f"{table_html(rows, header=('layer', 'count', 'neurons'), raw=True) if rows else '<i>empty</i>'}</div>"


def attribution_html(summary: Mapping[str, Any]) -> str:
    """A neuron attribution's summary: the fact, P(target), completeness, located count and the top neurons.

    Args:
        summary: The attribution's ``summary()`` dict (``prompt``, ``target``, ``top_neurons`` and the headline keys).

    Returns:
        A summary table followed by a table of the top neurons and their scores.
    """
    head = {k: summary.get(k) for k in ("model", "method", "steps", "rule", "target_prob", "completeness_rel_error",
                                        "n_located", "max_score")}
    rows = [(f"L{l}/N{j}", f"{v:.4g}") for l, j, v in summary.get("top_neurons", [])]
    title = f"NeuronAttribution of {summary.get('prompt', '')!r} → {summary.get('target', '')!r}"
    return summary_html(title, head, note="n_located: score > 0.2 · max; .heatmap() for every neuron") + \
        table_html(rows, header=("top neuron", "score"))


def section(title: str, body: str) -> str:
    """A titled block inside a card.

    Args:
        title: The section's bold, underlined title.
        body: The section's HTML (not escaped).

    Returns:
        A ``<div>`` fragment.
    """
    return f"<div style='margin:8px 0'><div style='font-weight:700;border-bottom:1px solid #ddd;margin-bottom:3px'>" \
           f"{esc(title)}</div>{body}</div>"


def card_html(title: str, subtitle: str, sections: Sequence[str]) -> str:
    """A card: title, subtitle and sections (pre-rendered HTML).

    Args:
        title: The card's title.
        subtitle: Grey line under the title.
        sections: Pre-rendered HTML blocks (e.g. from :func:`section`), in order.

    Returns:
        A bordered ``<div class='tlcap-card'>`` fragment.
    """
    return f"<div class='tlcap-card' style=\"{BOX};border:1px solid #ccc;border-radius:6px;padding:8px 12px\">" \
           f"<div style='font-size:16px;font-weight:700'>{esc(title)}</div>" \
           f"<div style='color:#666;margin-bottom:4px'>{esc(subtitle)}</div>{''.join(sections)}</div>"


__all__ = [
    "esc", "compact", "table_html", "summary_html", "attribution_html", "shade", "token_strip_html", "token_list_html",
    "neuron_set_html", "section", "card_html",
]
