"""WikiText-2 (raw) paragraphs: text for key statistics (ROME covariance) and perplexity.

Reads the raw test split from a local file (the layout of ``shared/data``: ``wikitext2/
wiki.test.raw``, one row per line, CRLF, titles `` = X = ``) or, when no file is found and the
machine is online, Hugging Face ``datasets`` (``wikitext``, ``wikitext-2-raw-v1``).

Example:
    >>> texts = load_wikitext(n_texts=200)            # first 200 paragraphs
    >>> texts = load_wikitext("path/to/wiki.test.raw", min_chars=200)
"""

from __future__ import annotations

import os
from pathlib import Path

from tlcap.errors import MissingFileError

DEFAULT_RELATIVE = Path("wikitext2") / "wiki.test.raw"


def _candidates(path: str | Path | None) -> list[Path]:
    if path is not None:
        p = Path(path)
        return [p / DEFAULT_RELATIVE, p / "wiki.test.raw"] if p.is_dir() else [p]
    out = []
    if os.environ.get("TLCAP_DATA"):
        out.append(Path(os.environ["TLCAP_DATA"]) / DEFAULT_RELATIVE)
    here = Path(__file__).resolve()
    out += [here.parents[3] / "shared" / "data" / DEFAULT_RELATIVE, Path("/work/shared/data") / DEFAULT_RELATIVE]
    return out


def _from_hub(split: str) -> list[str]:
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise RuntimeError("offline")
    from datasets import load_dataset  # type: ignore[import-not-found]

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
        path: ``wiki.test.raw`` or a data folder holding ``wikitext2/wiki.test.raw``; default
            ``$TLCAP_DATA``, then ``shared/data`` next to the checkout.
        n_texts: Keep the first ``n_texts`` paragraphs (``None``: all).
        min_chars: Drop shorter rows (headings, fragments).
        include_headings: Keep `` = Title = `` rows.
        split: Split used for the Hugging Face fallback.

    Raises:
        MissingFileError: no local file and the hub fallback is unavailable (offline, or
            ``datasets`` missing).
    """
    lines: list[str] | None = None
    tried = _candidates(path)
    for cand in tried:
        if cand.is_file():
            lines = cand.read_text(encoding="utf-8").splitlines()
            break
    if lines is None:
        if path is not None:
            raise MissingFileError(f"WikiText-2 file not found at {path}; pass the path of wiki.test.raw.")
        try:
            lines = _from_hub(split)
        except Exception as exc:  # noqa: BLE001 - offline / no datasets package
            raise MissingFileError(
                "WikiText-2 not found (looked at " + ", ".join(map(str, tried)) + ") and the Hugging Face "
                f"fallback failed ({exc}); pass path= to wiki.test.raw or set TLCAP_DATA to the data folder."
            ) from None
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
