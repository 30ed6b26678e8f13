"""ROME's "known facts" (``known_1000.json``, Meng et al. 2022): causal-tracing and editing targets.

1,209 facts GPT-2 XL knows, each a dict with ``known_id``, ``subject``, ``attribute``,
``template``, ``prediction``, ``prompt`` and ``relation_id``; bundled with tlcap (MIT, see
``tlcap/data/bundled/rome/``).

Example:
    >>> facts = load_known_facts(n=20)
    >>> facts[0]["prompt"], facts[0]["subject"]
    ('Vinson Massif is located in the continent of', 'Vinson Massif')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tlcap.data.files import read_text, resolve_file

KNOWN_RELATIVE = Path("rome") / "known_1000.json"


def load_known_facts(path: str | Path | None = None, n: int | None = None) -> list[dict[str, Any]]:
    """ROME's ``known_1000.json`` facts (``prompt``, ``subject``, ``attribute``, ...), in file order.

    Args:
        path: The JSON file (or ``.gz``), or a data folder holding ``rome/known_1000.json``;
            default ``$TLCAP_DATA/rome/known_1000.json`` when it exists, else the bundled copy.
        n: Keep the first ``n`` facts.

    Returns:
        A list of fact dicts.

    Raises:
        MissingFileError: ``path`` names no such file.

    Example:
        >>> [f["attribute"] for f in load_known_facts(n=2)]
        ['Antarctica', 'Apple']
    """
    facts = json.loads(read_text(resolve_file(path, KNOWN_RELATIVE)))
    return facts[:n] if n is not None else facts


__all__ = ["load_known_facts"]
