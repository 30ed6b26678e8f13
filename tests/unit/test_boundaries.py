"""Layering rules checked on the package source: hook names live in ``runtime/sites.py``, the
backend and the tokenizer only in ``tlcap/models/``."""

from __future__ import annotations

import re
from pathlib import Path

import tlcap

PKG = Path(tlcap.__file__).resolve().parent

# The only places allowed to know hook names / backends / tokenizers.
ALLOWED = {
    "hook names": ("runtime/sites.py", "models/"),
    "backend": ("models/",),
}

RULES = {
    # literal TransformerLens hook names (``hook_name(s)``/``hook_fn`` are API words, not hook points)
    "hook names": re.compile(r"\bhook_(?!names?\b|fn\b)[a-z]\w*|\bblocks\.[\d{]|\bunembed\.\w|\bln_final\b"),
    # the tokenizer, backend flags and objects, the backend's config
    "backend": re.compile(
        r"tokenizer\s*\(|\.tokenizer\b|\bset_use_\w+|\boriginal_model\b|\.backend\b|\.hf_model\b|\.is_bridge\b|\bmodel\.cfg\b|\bhook_dict\b"
    ),
}


def _violations(rule: str) -> list[str]:
    pattern, allowed = RULES[rule], ALLOWED[rule]
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(allowed) or rel in allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in pattern.finditer(line):
                out.append(f"tlcap/{rel}:{n}: {m.group(0)!r}")
    return out


def test_rules_catch_what_they_are_for():
    assert RULES["hook names"].search('("blocks.0.hook_resid_pre", fn)')
    assert RULES["hook names"].search('f"blocks.{l}.attn.hook_pattern"')
    assert RULES["hook names"].search('"unembed.hook_in"') and RULES["hook names"].search("ln_final")
    assert not RULES["hook names"].search("site.hook_name(l) for hook_names in x")
    assert RULES["backend"].search('model.tokenizer(t, add_special_tokens=False)')
    assert RULES["backend"].search("model.backend.set_use_attn_result(True)")
    assert RULES["backend"].search("getattr(model.cfg, 'parallel_attn_mlp')")
    assert not RULES["backend"].search("model.encode(text) and cfg.steps")


def test_no_hook_name_outside_sites_and_adapter():
    assert _violations("hook names") == []


def test_no_backend_or_tokenizer_outside_adapter():
    assert _violations("backend") == []
