"""Every number of the CNL and QL papers that ``tlcap reproduce`` compares against.

The values are transcribed from the paper texts shared with the project (the papers folder:
``capability-localization.txt`` and ``capability-localization-poster.md`` for CNL,
``query-localization.md`` for QL) as *printed rows*: each :class:`Block` holds one printed table
row (its numbers in printed order, markup removed), the line it is printed on, and what each
column means; :func:`expand` turns it into one :class:`PaperValue` per number. Keeping the row
as printed makes a transcription checkable line by line (``scripts/check_paper_values.py
--papers DIR`` compares every block with the text) and keeps the paper's own rounding
(``printed``). Statements the papers make without a number (most figures) are
:class:`PaperClaim`\\ s: an effect whose sign the paper asserts.

Example:
    >>> from tlcap.reproduce import paper_values
    >>> v = paper_values(paper="cnl", item="Table 1", model="LLaMA2-7B", quantity="overlap", dataset="GSM8K")[0]
    >>> v.value, v.unit, v.source
    (96.42, '%', 'capability-localization-poster.md:93 = capability-localization.txt:110')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from tlcap.errors import DataFormatError, UnknownNameError

UNITS = ("%", "fraction", "t", "count", "threshold")
Coords = tuple[tuple[str, str], ...]


def slug(text: str) -> str:
    """Lower-case key part: ``"LLaMA2-7B"`` → ``"llama2-7b"``, ``"R: II"`` → ``"r-ii"``.

    Args:
        text: Any label (model, item, coordinate or quantity).

    Returns:
        ``text`` lower-cased, runs of other characters than ``a-z0-9`` as one ``-``, trimmed (``"x"`` if nothing is left).
    """
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "x"


@dataclass(frozen=True)
class PaperValue:
    """One number printed in a paper.

    Attributes:
        key: Unique id, ``paper.item.model.coords.quantity`` in :func:`slug` form.
        paper: ``"cnl"`` or ``"ql"``.
        item: Table or figure (``"Table 1"``, ``"§3.2 reliability"``, ``"App. G"``).
        model: The paper's model (``"GPT-2"``, ``"LLaMA2-7B"``, ``"LLaMA2-13B"``, ``"LLaMA3-8B"``,
            ``"GPT-J-6B"``).
        quantity: What the number measures (``"overlap"``, ``"R:II"``, ``"accuracy"``, ...).
        coords: The row/column labels that place it, e.g. ``(("dataset", "GSM8K"),)``.
        value: The number as printed, in ``unit``.
        printed: The printed text of the number (keeps its rounding).
        unit: ``"%"`` (percentage points), ``"fraction"`` (0–1), ``"t"`` (a t statistic),
            ``"count"`` or ``"threshold"``.
        definition: What the quantity is, in one sentence.
        source: ``file:line`` of the printed row; ``" = "`` joins the same row printed elsewhere.
        note: Inconsistencies or ambiguities of the printed value.
    """

    key: str
    paper: str
    item: str
    model: str
    quantity: str
    coords: Coords
    value: float
    printed: str
    unit: str
    definition: str
    source: str
    note: str = ""

    def coord(self, name: str) -> str | None:
        """The label of coordinate ``name`` (``None`` if the value has none).

        Args:
            name: A coordinate name, e.g. ``"dataset"``.

        Returns:
            The label, e.g. ``"GSM8K"``, or ``None``.
        """
        return dict(self.coords).get(name)

    @property
    def decimals(self) -> int:
        """Decimals printed (``"0.062"`` → 3)."""
        return len(self.printed.split(".")[1]) if "." in self.printed else 0

    @property
    def rounding(self) -> float:
        """Half a unit of the last printed digit: the printed value stands for ±this."""
        return 0.5 * 10 ** (-self.decimals)

    @property
    def fraction(self) -> float:
        """The value on a 0–1 scale when it is a percentage or a fraction (else the value)."""
        return self.value / 100.0 if self.unit == "%" else self.value

    def text(self) -> str:
        """``"96.42 % (LLaMA2-7B)"``.

        Returns:
            The printed number, `` %`` for a percentage, and the paper's model in brackets.
        """
        unit = " %" if self.unit == "%" else ""
        return f"{self.printed}{unit} ({self.model})"


@dataclass(frozen=True)
class PaperClaim:
    """A statement of a paper about the sign of an effect, usually shown only in a figure.

    Attributes:
        key: Unique id.
        paper: ``"cnl"`` or ``"ql"``.
        item: The figure or section (``"Fig. 4"``).
        models: The paper's models it is made for.
        statement: The claim, close to the paper's words.
        effect: The effect whose sign is claimed, defined so tlcap can measure it.
        sign: ``+1`` (the effect is positive) or ``-1``.
        source: ``file:line`` of the sentence.
        value: The effect's size where the paper prints the numbers it follows from.
        unit: Unit of ``value``.
    """

    key: str
    paper: str
    item: str
    models: tuple[str, ...]
    statement: str
    effect: str
    sign: int
    source: str
    value: float | None = None
    unit: str = ""


@dataclass(frozen=True)
class Column:
    """What one printed column holds: its quantity and the coordinates it adds."""

    quantity: str
    coords: Coords = ()


@dataclass(frozen=True)
class Block:
    """One printed table row: its numbers, where it is printed, and its columns."""

    paper: str
    item: str
    model: str
    numbers: str
    columns: tuple[Column, ...]
    source: str
    unit: str
    definitions: dict[str, str]
    coords: Coords = ()
    notes: dict[str, str] = field(default_factory=dict)

    def tokens(self) -> list[str]:
        """The printed numbers of the row, as strings (``numbers`` split on whitespace).

        Returns:
            One string per number, in column order.
        """
        return self.numbers.split()


def columns(quantity: str | None, /, **axes: Sequence[str]) -> tuple[Column, ...]:
    """Columns as the product of labelled axes (first axis outermost).

    ``columns("accuracy", epoch=("1", "5"), dataset=("GSM8K", "Avg."))`` gives 4 columns;
    an axis named ``quantity`` sets the quantity per column instead of ``quantity``.

    Args:
        quantity: The quantity of every column (``None`` when an axis named ``quantity`` sets it).
        **axes: ``name=labels`` per axis, outermost first; each column gets one ``(name, label)`` coordinate per axis.

    Returns:
        The columns, one per combination of labels.
    """
    cols: list[Column] = [Column(quantity or "", ())]
    for name, labels in axes.items():
        nxt = []
        for c in cols:
            for lab in labels:
                if name == "quantity":
                    nxt.append(Column(lab, c.coords))
                else:
                    nxt.append(Column(c.quantity, c.coords + ((name, lab),)))
        cols = nxt
    return tuple(cols)


def expand(block: Block) -> list[PaperValue]:
    """One :class:`PaperValue` per number of ``block``.

    Args:
        block: One printed table row.

    Returns:
        The row's values in column order, keys built by :func:`slug`.

    Raises:
        DataFormatError: the row has another count of numbers than columns, a number does not
            parse, a unit is unknown or a quantity has no definition.
    """
    toks = block.tokens()
    if len(toks) != len(block.columns):
        raise DataFormatError(
            f"{block.paper} {block.item} {block.model} ({block.source}): {len(toks)} numbers for {len(block.columns)} columns"
        )
    if block.unit not in UNITS:
        raise DataFormatError(f"unit {block.unit!r} of {block.source} is not one of {UNITS}")
    out = []
    for tok, col in zip(toks, block.columns):
        try:
            value = float(tok)
        except ValueError:
            raise DataFormatError(f"{block.source}: {tok!r} is not a number") from None
        if col.quantity not in block.definitions:
            raise DataFormatError(f"{block.source}: no definition for quantity {col.quantity!r}")
        coords = block.coords + col.coords
        parts = [block.paper, block.item, block.model, *(lab for _, lab in coords), col.quantity]
        key = ".".join(slug(p) for p in parts)
        note = " ".join(n for k, n in block.notes.items() if k in (col.quantity, *(lab for _, lab in coords), "*"))
        out.append(PaperValue(key, block.paper, block.item, block.model, col.quantity, coords, value, tok, block.unit,
                              block.definitions[col.quantity], block.source, note))
    return out


def build(blocks: Iterable[Block]) -> tuple[PaperValue, ...]:
    """All values of ``blocks``; keys must be unique.

    Args:
        blocks: The printed rows (e.g. :data:`tlcap.reproduce.registry.BLOCKS`).

    Returns:
        Every value of every block, in order.

    Raises:
        DataFormatError: two values have the same key, or a block does not expand (see :func:`expand`).
    """
    values = [v for b in blocks for v in expand(b)]
    seen: dict[str, PaperValue] = {}
    for v in values:
        if v.key in seen:
            raise DataFormatError(f"paper value key {v.key!r} occurs twice ({seen[v.key].source} and {v.source})")
        seen[v.key] = v
    return tuple(values)


def select(values: Iterable[PaperValue], *, paper: str | None = None, item: str | None = None, model: str | None = None,
           quantity: str | None = None, **coords: str) -> list[PaperValue]:
    """The values matching every given field and coordinate (case-sensitive labels).

    Args:
        values: The values to filter.
        paper: ``"cnl"`` or ``"ql"`` (``None``: any).
        item: The table or figure, e.g. ``"Table 1"`` (``None``: any).
        model: The paper's model, e.g. ``"GPT-2"`` (``None``: any).
        quantity: The quantity, e.g. ``"overlap"`` (``None``: any).
        **coords: Coordinate labels the value must have, e.g. ``dataset="GSM8K"``.

    Returns:
        The matching values, in the order of ``values``.
    """
    out = []
    for v in values:
        if paper is not None and v.paper != paper:
            continue
        if item is not None and v.item != item:
            continue
        if model is not None and v.model != model:
            continue
        if quantity is not None and v.quantity != quantity:
            continue
        if any(v.coord(k) != lab for k, lab in coords.items()):
            continue
        out.append(v)
    return out


def find(values: Iterable[PaperValue], key: str) -> PaperValue:
    """The value with ``key``.

    Args:
        values: The values to search.
        key: The key of the value.

    Returns:
        The first value with that key.

    Raises:
        UnknownNameError: no such key (the message lists near keys).
    """
    vals = list(values)
    for v in vals:
        if v.key == key:
            return v
    near = [v.key for v in vals if v.key.split(".")[:2] == key.split(".")[:2]][:8]
    raise UnknownNameError.of("paper value", key, near or [v.key for v in vals[:8]])


def frame(values: Iterable[PaperValue]) -> pd.DataFrame:
    """The values as a table (one row per number; coordinates as one ``"k=v; ..."`` column).

    Args:
        values: The values.

    Returns:
        A DataFrame with columns ``key, paper, item, model, quantity, coords, value, printed, unit, source, note``.
    """
    rows = [{"key": v.key, "paper": v.paper, "item": v.item, "model": v.model, "quantity": v.quantity,
             "coords": "; ".join(f"{k}={lab}" for k, lab in v.coords), "value": v.value, "printed": v.printed,
             "unit": v.unit, "source": v.source, "note": v.note} for v in values]
    return pd.DataFrame(rows, columns=["key", "paper", "item", "model", "quantity", "coords", "value", "printed", "unit",
                                       "source", "note"])


__all__ = ["PaperValue", "PaperClaim", "Block", "Column", "columns", "expand", "build", "select", "find", "frame", "slug"]
