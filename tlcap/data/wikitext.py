"""WikiText-2 (raw) paragraphs: text for key statistics (ROME covariance) and perplexity.

The one reader of WikiText-2 in tlcap. Reads the raw test split, ``wikitext2/wiki.test.raw`` (one
row per line, CRLF, titles `` = X = ``), bundled with tlcap under its own licence (CC BY-SA 3.0;
see ``tlcap/data/bundled/wikitext2/``); ``$TLCAP_DATA`` or ``path`` point to another copy, and
``path="hf:"`` reads ``wikitext-2-raw-v1`` from the Hugging Face hub (online, ``datasets``).

Example:
    >>> texts = load_wikitext(n_texts=200)            # first 200 paragraphs
    >>> len(texts), texts[0][:60]
    (200, 'Robert Boulter is an English film , television and theatre a')
    >>> path = resolve_file(None, "wikitext2/wiki.test.raw")   # the bundled copy; any wiki.test.raw will do
    >>> texts = load_wikitext(path, min_chars=200, n_texts=5)
    >>> min(len(t) for t in texts) >= 200
    True
"""

from __future__ import annotations

from pathlib import Path

from tlcap.data.files import is_hf, read_text, resolve_file
from tlcap.errors import MissingFileError

DEFAULT_RELATIVE = Path("wikitext2") / "wiki.test.raw"


def _from_hub(split: str) -> list[str]:
    try:
        from datasets import load_dataset  # type: ignore[import-not-found]  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise MissingFileError("path='hf:' needs `pip install datasets`; or omit path to use the bundled copy") from exc
    return [r["text"] for r in load_dataset("wikitext", "wikitext-2-raw-v1", split=split)]


def load_wikitext(
    path: str | Path | None = None,
    n_texts: int | None = None,
    min_chars: int = 100,
    include_headings: bool = False,
    split: str = "test",
) -> list[str]:
    """Paragraphs of WikiText-2 (raw), in file order.

    Args:
        path: ``wiki.test.raw`` (or ``.gz``), a data folder holding ``wikitext2/wiki.test.raw``, or
            ``"hf:"`` for the Hugging Face hub; default ``$TLCAP_DATA`` when it holds the file, else
            the copy bundled with tlcap.
        n_texts: Keep the first ``n_texts`` paragraphs (``None``: all).
        min_chars: Drop shorter rows (headings, fragments).
        include_headings: Keep `` = Title = `` rows.
        split: Split read from the hub with ``path="hf:"`` (local files are the test split).

    Returns:
        The paragraphs (stripped), at most ``n_texts`` of them.

    Raises:
        MissingFileError: ``path`` names no WikiText-2 file.

    Example:
        >>> load_wikitext(n_texts=1)[0][:30]
        'Robert Boulter is an English f'
    """
    lines = _from_hub(split) if is_hf(path) else read_text(resolve_file(path, DEFAULT_RELATIVE)).splitlines()
    out: list[str] = []
    for line in lines:
        s = line.strip()
        if not s:
            continue
        if not include_headings and s.startswith("=") and s.endswith("="):
            continue
        if len(s) < min_chars:
            continue
        out.append(s)
        if n_texts is not None and len(out) >= n_texts:
            break
    return out


__all__ = ["load_wikitext"]
