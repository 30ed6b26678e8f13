"""The registry of both papers' values and claims, and lookups into it.

Example:
    >>> from tlcap.reproduce import paper_values, paper_value, PAPER_CLAIMS
    >>> paper_value("cnl.table-1.llama2-7b.gsm8k.overlap").value
    96.42
    >>> len(paper_values(paper="ql", item="Table 1"))
    90
"""

from __future__ import annotations

import pandas as pd

from tlcap.errors import UnknownNameError
from tlcap.reproduce import values_cnl, values_ql
from tlcap.reproduce.paper_values import Block, PaperClaim, PaperValue, build, find, frame, select

BLOCKS: tuple[Block, ...] = values_cnl.BLOCKS + values_ql.BLOCKS
PAPER_VALUES: tuple[PaperValue, ...] = build(BLOCKS)
PAPER_CLAIMS: tuple[PaperClaim, ...] = values_cnl.CLAIMS + values_ql.CLAIMS


def paper_values(*, paper: str | None = None, item: str | None = None, model: str | None = None,
                 quantity: str | None = None, **coords: str) -> list[PaperValue]:
    """The paper values matching every given field and coordinate label.

    Args:
        paper: ``"cnl"`` or ``"ql"``.
        item: ``"Table 1"``, ``"§3.2 reliability"``, ...
        model: The paper's model (``"GPT-2"``, ``"LLaMA2-7B"``, ...).
        quantity: ``"overlap"``, ``"R:II"``, ``"accuracy"``, ...
        **coords: Coordinate labels, e.g. ``dataset="GSM8K"``, ``threshold="static"``.

    Returns:
        The matching :class:`PaperValue` objects in registry order (every value when nothing is given).

    Example:
        >>> [(v.key, v.value) for v in paper_values(paper="ql", item="Table 2", model="GPT-2", group="K_II", quantity="Gen")]
        [('ql.table-2.gpt-2.erasure.n-i.k-ii.gen', 0.09), ('ql.table-2.gpt-2.update.n-i.k-ii.gen', 0.11),
         ('ql.table-2.gpt-2.erasure.n-g.k-ii.gen', 0.6), ('ql.table-2.gpt-2.update.n-g.k-ii.gen', 0.55)]
    """
    return select(PAPER_VALUES, paper=paper, item=item, model=model, quantity=quantity, **coords)


def paper_value(key: str) -> PaperValue:
    """The value with ``key`` (:class:`~tlcap.errors.UnknownNameError` if there is none).

    Args:
        key: A value key such as ``"cnl.table-1.llama2-7b.gsm8k.overlap"``.

    Returns:
        The :class:`PaperValue` of that key.
    """
    return find(PAPER_VALUES, key)


def paper_claim(key: str) -> PaperClaim:
    """The claim with ``key`` (:class:`~tlcap.errors.UnknownNameError` if there is none).

    Args:
        key: A claim key, one of :data:`PAPER_CLAIMS`' keys.

    Returns:
        The :class:`PaperClaim` of that key.
    """
    for c in PAPER_CLAIMS:
        if c.key == key:
            return c
    raise UnknownNameError.of("paper claim", key, [c.key for c in PAPER_CLAIMS])


def values_frame(paper: str | None = None) -> pd.DataFrame:
    """Every registered value (of one paper) as a table.

    Args:
        paper: ``"cnl"`` or ``"ql"`` for one paper's values, ``None`` for both.

    Returns:
        One row per value, the columns of :func:`tlcap.reproduce.paper_values.frame`.
    """
    return frame(paper_values(paper=paper))


__all__ = ["BLOCKS", "PAPER_VALUES", "PAPER_CLAIMS", "paper_values", "paper_value", "paper_claim", "values_frame"]
