"""No machine-specific path in the package, tests, scripts, notebooks, docs or figures: the product
must not depend on a folder that exists only beside one checkout (issue 9 §7)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_FORBIDDEN = [
    re.compile("/" + "work/"),                       # this machine's checkout root
    re.compile("shared" + r"[/\\]data"),              # the developers' data folder beside the repository
    re.compile(r"""["']shared["']\s*/\s*["']data["']"""),
    re.compile(r"\.\./" + "shared"),
    re.compile(r"(?<![\w.~])/(home|Users|root)/\w"),   # someone's home folder
]
_TEXT = {".py", ".md", ".ipynb", ".sh", ".toml", ".txt", ".cfg", ".json", ".yml", ".yaml", ""}


def test_no_machine_specific_paths():
    roots = ["tlcap", "tests", "scripts", "notebooks", "docs", "benchmarks", "figures", ".ci", "README.md", "Makefile",
             "pyproject.toml"]
    hits = []
    for root in roots:
        base = REPO / root
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for p in files:
            if p.suffix not in _TEXT or "__pycache__" in p.parts or p.name.endswith(".gz") or p.parent.name == "gpt2_bpe":
                continue
            text = p.read_text(encoding="utf-8", errors="replace")
            for i, line in enumerate(text.splitlines(), 1):
                if any(rx.search(line) for rx in _FORBIDDEN):
                    hits.append(f"{p.relative_to(REPO)}:{i}: {line.strip()[:120]}")
    assert not hits, "machine-specific paths:\n" + "\n".join(hits)
