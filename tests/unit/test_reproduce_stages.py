"""The reproduce stage runner: content-addressed cache, invalidation, resume, pending/blocked stages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import tlcap
from tlcap.config import Config
from tlcap.data.pararel import Fact
from tlcap.reproduce import cnl_stages, ql_stages, suite_stages
from tlcap.reproduce.ql_stages import FactSet
from tlcap.reproduce.stages import Runner, Stage, StageError, code_files, code_hash, code_text, data_hash


@dataclass(frozen=True)
class Cfg(Config):
    value: int = 1


CALLS: list[str] = []


def _fact(i: int) -> Fact:
    return Fact("P36", f"s{i}", f"o{i}", (f"q{i}",))


def _leaf(ctx):
    CALLS.append(ctx.stage.name)
    return {"facts": FactSet((_fact(ctx.config.value),))}


def _child(ctx):
    CALLS.append(ctx.stage.name)
    parent = ctx.dep("a")["facts"]
    return {"facts": FactSet(parent.facts + (_fact(ctx.config.value),))}


def _stages(a: int = 1, b: int = 2, data: list | None = None) -> list[Stage]:
    return [Stage("a", _leaf, Cfg(a), data=(lambda ctx: data) if data is not None else None, needs_model=False),
            Stage("b", _child, Cfg(b), deps=("a",), needs_model=False)]


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


def test_rerun_loads_every_stage_from_the_cache(tmp_path):
    r1 = Runner(_stages(), tmp_path, model_id="m")
    recs = r1.run(r1.plan())
    assert [r.status for r in recs] == ["computed", "computed"] and CALLS == ["a", "b"]
    r2 = Runner(_stages(), tmp_path, model_id="m")
    recs = r2.run(r2.plan())
    assert [r.status for r in recs] == ["cached", "cached"]
    assert CALLS == ["a", "b"] and r2.executed == []
    assert [f.subject for f in r2.outputs("b")["facts"].facts] == ["s1", "s2"]


def test_changed_config_model_or_data_invalidates_the_stage_and_its_dependents(tmp_path):
    Runner(_stages(), tmp_path, model_id="m").run(Runner(_stages(), tmp_path, model_id="m").plan())
    CALLS.clear()
    r = Runner(_stages(b=3), tmp_path, model_id="m")  # only b's config changed
    r.run(r.plan())
    assert CALLS == ["b"]
    CALLS.clear()
    r = Runner(_stages(a=5, b=3), tmp_path, model_id="m")  # a changed: b's key follows
    r.run(r.plan())
    assert CALLS == ["a", "b"]
    CALLS.clear()
    r = Runner(_stages(a=5, b=3), tmp_path, model_id="other model")
    r.run(r.plan())
    assert CALLS == ["a", "b"]
    k1 = Runner(_stages(data=[1, 2]), tmp_path, model_id="m").key("a")
    k2 = Runner(_stages(data=[1, 3]), tmp_path, model_id="m").key("a")
    assert k1 != k2 and data_hash([1, 2]) != data_hash([1, 3])


def test_a_shared_stage_is_computed_once_for_two_dependents(tmp_path):
    stages = [*_stages(), Stage("c", _child, Cfg(7), deps=("a",), needs_model=False)]
    r = Runner(stages, tmp_path, model_id="m")
    r.run(r.plan())
    assert CALLS.count("a") == 1 and sorted(CALLS) == ["a", "b", "c"]


def test_interrupted_stage_resumes_from_its_checkpoint(tmp_path):
    done: list[int] = []

    def work(ctx):
        for i in range(4):
            mark = ctx.checkpoint / f"item{i}"
            if mark.exists():
                continue
            if i == 2 and not done:
                done.append(i)
                raise KeyboardInterrupt  # interrupted after two items
            mark.mkdir(parents=True)
            CALLS.append(f"item{i}")
        return {"facts": FactSet((_fact(0),))}

    stages = [Stage("w", work, Cfg(), needs_model=False)]
    r = Runner(stages, tmp_path, model_id="m")
    with pytest.raises(KeyboardInterrupt):
        r.run(r.plan())
    assert CALLS == ["item0", "item1"] and not r.is_cached("w")
    r = Runner(stages, tmp_path, model_id="m")
    r.run(r.plan())
    assert CALLS == ["item0", "item1", "item2", "item3"]
    assert r.is_cached("w") and not r.context("w").checkpoint.exists()


def test_pending_stage_blocks_its_dependents_and_failures_are_recorded(tmp_path):
    def boom(ctx):
        raise RuntimeError("no")

    stages = [Stage("a", _leaf, Cfg(), pending="not run: experiment not available", needs_model=False),
              Stage("b", _child, Cfg(), deps=("a",), needs_model=False),
              Stage("c", boom, Cfg(), needs_model=False)]
    r = Runner(stages, tmp_path, model_id="m", keep_going=True)
    status = {x.name: (x.status, x.note) for x in r.run(r.plan())}
    assert status["a"] == ("pending", "not run: experiment not available")
    assert status["b"] == ("blocked", "needs a")
    assert status["c"] == ("failed", "RuntimeError: no")
    assert CALLS == []


def test_unknown_dependency_and_cycle_are_errors(tmp_path):
    with pytest.raises(StageError, match="depends on 'x'"):
        Runner([Stage("a", _leaf, Cfg(), deps=("x",))], tmp_path, model_id="m")
    r = Runner([Stage("a", _leaf, Cfg(), deps=("b",)), Stage("b", _leaf, Cfg(), deps=("a",))], tmp_path, model_id="m")
    with pytest.raises(StageError, match="cycle"):
        r.plan()


def test_a_half_precision_model_gets_stage_keys_of_its_own(tmp_path):
    # float32 keeps the bare identity (earlier caches stay valid); bfloat16 computes other numbers
    import torch  # noqa: PLC0415

    class _M:
        identity = "gguf:m.gguf sha256=ab size=1"

        def __init__(self, dtype):
            self.dtype = dtype

    f32, bf16 = (Runner(_stages(), tmp_path, _M(dt)) for dt in (torch.float32, torch.bfloat16))
    assert f32.model_id == _M.identity and bf16.model_id == f"{_M.identity} dtype=torch.bfloat16"
    assert f32.key("a") == Runner(_stages(), tmp_path, model_id=_M.identity).key("a") != bf16.key("a")


def _edit_prose(source: str) -> str:
    """``source`` with every comment dropped, every docstring rewritten and a blank line after each statement line."""
    import ast
    import io
    import tokenize

    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    spans = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                spans.append((first.lineno, first.end_lineno, first.col_offset))
    assert spans, "the file has docstrings to edit"
    for start, end, col in sorted(spans, reverse=True):
        lines[start - 1:end] = [" " * col + '"""Rewritten: another text, with a >>> example. """\n']
    text = "".join(lines)
    toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.COMMENT]
    return tokenize.untokenize(toks).replace(")\n", ")\n\n")


def test_code_hash_reads_code_not_prose():
    """A stage's key must survive a docstring, comment or layout edit (a documentation commit would otherwise
    recompute hours of cached stages) and must change with any edit to the code itself."""
    root = Path(tlcap.__file__).parent
    source = (root / "metrics" / "set_scores.py").read_text()
    edited = _edit_prose(source)
    assert edited != source and "Rewritten" in edited and "#" not in code_text(source)
    assert code_text(edited) == code_text(source)
    changed = source.replace("\nimport math\n", "\nimport cmath as math\n", 1)  # a code edit, however small
    assert changed != source and code_text(changed) != code_text(source)
    # attribute docstrings (a bare string after a dataclass field) and strings in any inner body compute nothing
    fields = 'class C:\n    a: int = 1\n    """The a."""\n    if a:\n        "x"\n    else:\n        "y"\n        b = 2\n'
    assert code_text(fields) == "class C:\n    a: int = 1\n    if a:\n        pass\n    else:\n        b = 2"
    import hashlib

    h = hashlib.sha256()
    for f in code_files(cnl_stages.CODE):
        h.update(f"{f.relative_to(root).as_posix()}\n".encode() + code_text(f.read_bytes()).encode())
    assert code_hash(cnl_stages.CODE) == h.hexdigest()


def test_a_stage_key_covers_the_engine_its_experiment_imports():
    """Editing the erase engine (set_scores), the answer readers or the model adapter must invalidate the CNL
    stages' cache, as editing the experiment does; figures (tlcap.viz) change no stored value and are left out."""
    root = Path(tlcap.__file__).parent
    for code in (cnl_stages.CODE, ql_stages.CODE, suite_stages.CODE):
        rel = {f.relative_to(root).as_posix() for f in code_files(code)}
        assert {"models/adapter.py", "runtime/hooks.py", "metrics/sets.py", "attribution/ig.py"} <= rel, code
        assert not any(r.startswith(("viz/", "reproduce/", "cli/")) for r in rel) and "__init__.py" not in rel
    rel = {f.relative_to(root).as_posix() for f in code_files(cnl_stages.CODE)}
    assert {"metrics/set_scores.py", "metrics/answers.py", "metrics/set_probs.py", "data/wikitext.py"} <= rel
