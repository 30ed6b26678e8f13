"""What a report did not reproduce, computed from the papers' item list and the value registry.

For every table and figure of a paper (:data:`tlcap.reproduce.items.PAPER_ITEMS`):

- a *result* or *illustration* with no row holding our number and no figure is **not reproduced**
  (with the reason of the stage that should have computed it when one failed or was pending);
- a result with rows is **partly reproduced** when some of the reference model's printed values
  or some of the paper's claims for it have no number of ours (counted, with examples);
- *method* diagrams and *settings* (sizes, hyper-parameters, data examples) are listed once, as
  not results.

Example:
    >>> from tlcap.reproduce.report import RowBuilder
    >>> rows, figures = RowBuilder("gpt2-tiny", papers=("ql",), reference={"ql": "GPT-2"}).finalize(), []
    >>> nr = not_reproduced(("ql",), rows, figures, {"ql": "GPT-2"})     # no rows: nothing reproduced
    >>> [n.item for n in nr][:3]
    ['Fig. 1', 'Table 1', 'Fig. 3']
    >>> nr[0].why
    "no row of ours: not computed by tlcap reproduce (KN activation heatmaps of one fact's queries ...)"
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tlcap.reproduce.items import items_of
from tlcap.reproduce.registry import PAPER_CLAIMS, paper_values


@dataclass(frozen=True)
class NotReproduced:
    """An item of either paper that the report does not (fully) reproduce, and why."""

    paper: str
    item: str
    why: str


def _examples(labels: Sequence[str], k: int = 4) -> str:
    more = f", … ({len(labels) - k} more)" if len(labels) > k else ""
    return ", ".join(labels[:k]) + more


def _label(v: Any) -> str:
    return " · ".join([*(lab for _, lab in v.coords), v.quantity])


def not_reproduced(papers: Sequence[str], rows: Iterable[Any], figures: Iterable[Any], reference: dict[str, str],
                   skipped: Iterable[NotReproduced] = ()) -> list[NotReproduced]:
    """Every item (or part of one) of ``papers`` without our number (module doc).

    Args:
        papers: The report's papers.
        rows: The finalized :class:`~tlcap.reproduce.report.ReportRow` values.
        figures: The report's :class:`~tlcap.reproduce.report.FigureRef` values.
        reference: The paper model each paper's values are compared with.
        skipped: Stages that did not run (pending / blocked / failed), with why.

    Returns:
        One :class:`NotReproduced` per item, in the papers' order.
    """
    rows, figures, skipped = list(rows), list(figures), list(skipped)
    out: list[NotReproduced] = []
    for paper in papers:
        prefix = paper.upper() + " "
        not_results = []
        for it in items_of(paper):
            name = prefix + it.item
            if it.kind in ("method", "setting"):
                not_results.append(it.item)
                continue
            mine = [r for r in rows if r.item == name]
            with_number = [r for r in mine if r.ours is not None]
            has_fig = any(f.item == name for f in figures)
            stage_why = "; ".join(s.why for s in skipped if s.paper == paper and it.item in s.item)
            if not with_number and not has_fig:
                why = stage_why or ("no row of ours: " + ("; ".join(sorted({r.reason for r in mine}))[:300] if mine
                                                          else f"not computed by tlcap reproduce ({it.what})"))
                out.append(NotReproduced(paper, it.item, why))
                continue
            covered = {r.key for r in with_number if r.key}
            values = paper_values(paper=paper, item=it.item, model=reference[paper])
            model = reference[paper]
            if not values:  # an item printed for other models only (§3.1 fidelity: GPT-J-6B)
                values = paper_values(paper=paper, item=it.item)
                model = "/".join(sorted({v.model for v in values}))
            lacking = [_label(v) for v in values if v.key not in covered]
            claims = [c for c in PAPER_CLAIMS if c.paper == paper and c.item == it.item]
            lacking_claims = [c.effect for c in claims if c.key not in covered]
            parts = []
            if values and lacking:
                parts.append(f"{len(lacking)} of {len(values)} printed {model} values without our number "
                             f"({_examples(lacking)})")
            if lacking_claims:
                parts.append(f"{len(lacking_claims)} of {len(claims)} claims without our number ({_examples(lacking_claims, 2)})")
            if not with_number and has_fig and (values or claims):
                parts.append("a figure only, no numbers")
            if parts:
                tail = f" [{stage_why}]" if stage_why else ""
                out.append(NotReproduced(paper, it.item, "partly: " + "; ".join(parts) + tail))
        if not_results:
            out.append(NotReproduced(paper, "method diagrams and settings",
                                     "not results: " + ", ".join(not_results) + " (settings followed or listed in "
                                     "docs/deviations.md)"))
    return out


__all__ = ["NotReproduced", "not_reproduced"]
