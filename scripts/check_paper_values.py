"""Check the paper-values registry against the paper texts, line by line.

Usage:
    python scripts/check_paper_values.py --papers PAPERS_DIR

For every printed row (:class:`tlcap.reproduce.paper_values.Block`) and every ``file:line`` of
its source, the row's numbers (sign dropped: the texts print changes as arrows) must occur in
the printed order among the numbers of that line (markup such as ``<u>`` removed). For every
claim, its source line must exist. Prints one line per mismatch and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tlcap.reproduce.registry import BLOCKS, PAPER_CLAIMS

NUM = re.compile(r"\d+(?:\.\d+)?")
MARKUP = re.compile(r"<[^>]+>")


def line_numbers(text: str) -> list[str]:
    return NUM.findall(MARKUP.sub(" ", text))


def is_subsequence(needles: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(n == h for h in it) for n in needles)


def refs(source: str) -> list[tuple[str, int]]:
    out = []
    for part in source.split(" = "):
        name, line = part.rsplit(":", 1)
        out.append((name.strip(), int(line)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=Path, required=True, help="Folder holding the paper texts.")
    args = ap.parse_args(argv)
    cache: dict[str, list[str]] = {}
    bad = 0
    checked = 0
    for b in BLOCKS:
        want = [t.lstrip("-") for t in b.tokens()]
        for name, line in refs(b.source):
            if name not in cache:
                cache[name] = (args.papers / name).read_text(encoding="utf-8").splitlines()
            lines = cache[name]
            if not 1 <= line <= len(lines) or not is_subsequence(want, line_numbers(lines[line - 1])):
                bad += 1
                got = lines[line - 1][:160] if 1 <= line <= len(lines) else "<no such line>"
                print(f"MISMATCH {b.paper} {b.item} {b.model} {dict(b.coords)} {name}:{line}: want {want} in: {got}")
            checked += 1
    for c in PAPER_CLAIMS:
        for name, line in refs(c.source):
            lines = cache.get(name) or (args.papers / name).read_text(encoding="utf-8").splitlines()
            if not 1 <= line <= len(lines):
                bad += 1
                print(f"MISSING LINE claim {c.key}: {name}:{line}")
    print(f"{checked} printed rows checked, {len(PAPER_CLAIMS)} claims; {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
