"""Reading answers out of generations: the final number of a math answer, stop strings, and the reference
tokens a code task scores (:mod:`tlcap.metrics.accuracy` and :mod:`tlcap.metrics.set_scores` share them).

Example:
    >>> extract_number("12 + 30 = 42. The answer is 42")
    '42'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

CODE_TOKENS = 64
"""Reference-solution tokens a code task scores (teacher-forced argmax accuracy)."""
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_number(text: str) -> str | None:
    """The answer number in a generation: after "The answer is", after "####", else the last one.

    Args:
        text: The generated text.

    Returns:
        The number as a string without thousands commas, or None when the text has none.
    """
    for pat in (r"[Tt]he answer is\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", r"####\s*(-?\d[\d,]*(?:\.\d+)?)"):
        m = re.search(pat, text)
        if m:
            return m.group(1).replace(",", "")
    nums = _NUM.findall(text)
    return nums[-1].replace(",", "").rstrip(".") if nums else None


def same_number(a: str | None, b: str) -> bool:
    """Whether the extracted number ``a`` equals the gold number ``b`` (as floats, thousands commas removed).

    Args:
        a: The extracted number (``None``: none found).
        b: The gold number.

    Returns:
        ``True`` when both parse and differ by less than 1e-6.

    Example:
        >>> same_number("1200", "1,200"), same_number(None, "3"), same_number("x", "3")
        (True, False, False)
    """
    if a is None:
        return False
    try:
        return abs(float(a) - float(b.replace(",", ""))) < 1e-6
    except ValueError:
        return False


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first occurrence of each stop string in turn.

    Args:
        text: A generation.
        stops: Stop strings (e.g. a blank line, ``"Question:"``).

    Returns:
        The text before the stops.

    Example:
        >>> cut_at_stops("The answer is 4. Question: next", ("\\n\\n", "Question:"))
        'The answer is 4. '
    """
    for s in stops:
        if s in text:
            text = text[: text.index(s)]
    return text


__all__ = ["CODE_TOKENS", "extract_number", "same_number", "cut_at_stops"]
