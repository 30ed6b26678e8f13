"""Stages and their runner: a DAG of computations whose results are cached by content.

A :class:`Stage` is ``(name, function, config)`` plus the stages it depends on. Its cache key is
the sha256 of

- its name and its config (``Config.to_dict()``, a tlcap :class:`~tlcap.config.Config`);
- the model's identity (:func:`tlcap.provenance.model_identity`: GGUF sha256, HF commit, seed);
- the hash of its input data (:func:`data_hash` of what ``stage.data(ctx)`` returns: samples, facts);
- the tlcap version and the sha256 of the code of the modules it names in ``code`` and of every
  tlcap module they import, transitively (editing an experiment, or the engine it runs on, invalidates
  the stages that use it; :func:`code_files`); docstrings, comments and layout are not hashed
  (:func:`code_text`), so a documentation edit keeps the cache;
- the keys of the stages it depends on (a changed upstream result invalidates everything below).

Results are tlcap :class:`~tlcap.results.Result` values saved with ``save`` under
``CACHE/<name>-<key16>/<result name>/`` with a ``stage.json`` written last; the folder is built
under a temporary name and renamed into place, so a folder that exists is complete
(:mod:`tlcap.reproduce.stage_store`, which also checksums ``stage.json`` and lets one process at a
time compute a stage: two runs sharing a cache compute each stage once). A rerun, or
another stage that depends on the same one, loads instead of recomputing. A long stage may
checkpoint inside ``ctx.checkpoint`` (``CACHE/<name>-<key16>.partial/``, kept when the stage
fails or is interrupted, removed when it succeeds), so an interrupted run resumes where it stopped.

Example:
    >>> import tempfile
    >>> from tlcap.reproduce.run import build_stages
    >>> from tlcap.reproduce.scales import SCALES
    >>> stages = build_stages(("ql",), SCALES["smoke"])
    >>> runner = Runner(stages, cache_dir=tempfile.mkdtemp(), model=model)
    >>> records = runner.run(runner.plan(only=["ql.table2"]))
    >>> [(r.name, r.status) for r in records]
    [('ql.facts', 'computed'), ('ql.localize.ig', 'computed'), ('ql.table2', 'computed')]
    >>> summary = runner.outputs("ql.table2")["modification"].summary()
    >>> summary["n_facts"], summary["skipped_reasons"]       # a random model answers no query top-1
    (3, {'not answered top-1 before the edit': 18})
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlcap.atomic import is_storage_error
from tlcap.config import Config
from tlcap.errors import StageError, UnknownNameError
from tlcap.provenance import model_identity, tlcap_version
from tlcap.reproduce.memory import PeakMemory
from tlcap.reproduce.stage_store import STAGE_FILE, load_stage, read_record, save_stage, stage_lock
from tlcap.results import Result

Outputs = dict[str, Result]


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__type__": type(obj).__name__, **{f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                                      if not isinstance(getattr(obj, f.name), Result)}}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return "nan"
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)


def data_hash(data: Any) -> str:
    """sha256 of a JSON rendering of ``data`` (dataclasses such as ``Sample``/``Fact``, lists, dicts).

    Args:
        data: The stage's input data; dataclasses, mappings (sorted by key), lists and scalars, NaN as ``"nan"``, other
            objects by ``repr``.

    Returns:
        The 64-character lowercase sha256 hex digest.

    Example:
        >>> from tlcap.data.tasks import load_task
        >>> data_hash(load_task("emotion", split="train", n=10))
        'bc06a75afb3814bcad32cf48f16d040246099013dfc6deb2303cf1cdfc3d0dbf'
    """
    text = json.dumps(_jsonable(data), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_NOT_HASHED = ("viz",)


def _is_text(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _without_docstrings(tree: ast.Module) -> ast.Module:
    """``tree`` without its bare string statements (in place): the docstrings of the module and of every class and
    function, and the strings documenting attributes or sections, which compute nothing; a body left empty gets a
    ``pass``."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and any(map(_is_text, stmts)):
                setattr(node, name, [s for s in stmts if not _is_text(s)] or [ast.Pass()])
    return tree


def code_text(source: str | bytes) -> str:
    r"""The part of a Python source that defines what it computes: its syntax tree without docstrings (and the bare
    strings documenting attributes), written back as code (:func:`ast.unparse`), so comments, docstrings (and the
    examples in them) and layout are left out.

    Args:
        source: A module's source.

    Returns:
        The normalized code; two sources that differ only in comments, docstrings, blank lines, line breaks or quotes
        give the same text.

    Raises:
        SyntaxError: ``source`` does not parse.

    Example:
        >>> a = 'def f(x):\n    "Twice x."\n    return 2 * x  # doubled\n'
        >>> b = "def f(x):\n\n    return 2*x\n"
        >>> code_text(a) == code_text(b), code_text(a) == code_text(b.replace("2*x", "3*x"))
        (True, False)
        >>> print(code_text(a))
        def f(x):
            return 2 * x
    """
    return ast.unparse(_without_docstrings(ast.parse(source)))


def _tlcap_root() -> Path:
    return Path(importlib.import_module("tlcap").__file__ or "").parent


def _source_of(path: Path, root: Path) -> tuple[frozenset[Path], str]:
    """:func:`_parsed` of ``path``, parsed once per process and file version (every stage of a run asks)."""
    st = path.stat()
    return _parsed(str(path), str(root), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _parsed(path_s: str, root_s: str, size: int, mtime_ns: int) -> tuple[frozenset[Path], str]:
    """The tlcap source files ``path`` imports (``import tlcap.x`` / ``from tlcap.x import y``, ``y`` a module or a
    name; the top-level ``tlcap/__init__.py``, which re-exports everything, is not followed, nor ``tlcap.viz``:
    figures are drawn from the stored values, they change none) and its :func:`code_text`, from one parse."""
    path, root = Path(path_s), Path(root_s)
    out: set[Path] = set()
    tree = ast.parse(path.read_bytes(), filename=path_s)
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "tlcap" or len(parts) < 2 or parts[1] in _NOT_HASHED:
                continue
            base = root.joinpath(*parts[1:])
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.is_file():
                    out.add(f)
    return frozenset(out), ast.unparse(_without_docstrings(tree))


def code_files(modules: Sequence[str]) -> list[Path]:
    """The source files a stage's ``code`` covers: each module's own (a package: every ``.py`` below it) and every
    tlcap module they import, transitively.

    Args:
        modules: Importable module names.

    Returns:
        The files, sorted.

    Raises:
        UnknownNameError: a module that cannot be imported.

    Example:
        >>> files = code_files(["tlcap.metrics.accuracy"])
        >>> sorted({f.name for f in files} & {"accuracy.py", "set_scores.py", "answers.py"})  # the engine it imports
        ['accuracy.py', 'answers.py', 'set_scores.py']
    """
    root = _tlcap_root()
    todo: list[Path] = []
    for name in sorted(set(modules)):
        try:
            mod = importlib.import_module(name)
        except ImportError as exc:
            raise UnknownNameError(f"stage code module {name!r} cannot be imported ({exc})") from None
        path = Path(getattr(mod, "__file__", "") or "")
        todo += sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo += sorted(_source_of(f, root)[0] - seen)
    return sorted(seen)


def code_hash(modules: Sequence[str]) -> str:
    """sha256 of the code of ``modules`` and of every tlcap module they import (:func:`code_files`), each file read as
    :func:`code_text`: editing a docstring, a comment or the layout keeps a stage's cached results; editing code, even
    code that computes the same values, invalidates them.

    Args:
        modules: Importable module names (repeats ignored).

    Returns:
        The 64-character lowercase sha256 hex digest over each file's path below ``tlcap/`` and its :func:`code_text`
        (which :func:`ast.unparse` writes, so another Python minor version may give other keys).

    Raises:
        UnknownNameError: a module that cannot be imported.
    """
    h = hashlib.sha256()
    root = _tlcap_root()
    for f in code_files(modules):
        h.update(f"{f.relative_to(root).as_posix()}\n".encode())
        h.update(_source_of(f, root)[1].encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Stage:
    """One computation of a reproduction.

    Attributes:
        name: Unique name, dotted (``"cnl.locate.gsm8k"``).
        fn: ``fn(ctx) -> {result name: Result}``.
        config: The settings that define its results (a frozen tlcap ``Config``).
        deps: Names of the stages whose outputs it reads (``ctx.dep(name)``).
        code: Modules whose source defines its results (hashed into the key).
        data: ``data(ctx)`` → the stage's input data (hashed into the key; also ``ctx.inputs()``).
        workload: ``workload(ctx)`` → a :class:`tlcap.reproduce.cost.Workload` for the prediction.
        pending: Why the stage cannot run yet (it is listed, not run; dependents are blocked).
        items: The paper items it feeds (``"CNL Table 1"``).
        description: One line for the plan.
        needs_model: Whether it needs the model (a key includes the model's identity either way).
    """

    name: str
    fn: Callable[[StageContext], Mapping[str, Result]]
    config: Config
    deps: tuple[str, ...] = ()
    code: tuple[str, ...] = ()
    data: Callable[[StageContext], Any] | None = None
    workload: Callable[[StageContext], Any] | None = None
    pending: str | None = None
    items: tuple[str, ...] = ()
    description: str = ""
    needs_model: bool = True


@dataclass
class StageContext:
    """What a stage function sees: the model, its dependencies' outputs, its input data, a checkpoint folder."""

    stage: Stage
    runner: Runner
    _inputs: Any = field(default=None, repr=False)
    _has_inputs: bool = field(default=False, repr=False)

    @property
    def checkpoint(self) -> Path:
        """The stage's checkpoint folder (kept when it fails, removed when it succeeds)."""
        return self.runner.cache_dir / f"{self.runner.key(self.stage.name)}.partial"

    @property
    def model(self) -> Any:
        return self.runner.model

    @property
    def config(self) -> Any:
        return self.stage.config

    @property
    def progress(self) -> bool:
        return self.runner.progress

    def dep(self, name: str) -> Outputs:
        """The outputs of dependency ``name`` (it must be listed in ``stage.deps``).

        Args:
            name: A stage name listed in this stage's ``deps``.

        Returns:
            ``{result name: Result}`` of that stage.

        Raises:
            StageError: ``name`` is not declared in ``deps``, or has not run and is not cached.
        """
        if name not in self.stage.deps:
            raise StageError(f"stage {self.stage.name!r} reads {name!r} without declaring it in deps")
        return self.runner.outputs(name)

    def inputs(self) -> Any:
        """The stage's input data (``stage.data(ctx)``, computed once).

        Returns:
            Whatever the stage's ``data`` function returns (samples, facts...), or ``None`` when the stage has none.
        """
        if not self._has_inputs:
            self._inputs = self.stage.data(self) if self.stage.data is not None else None
            self._has_inputs = True
        return self._inputs


@dataclass(frozen=True)
class StageRecord:
    """What happened to a stage in one run: ``computed``, ``cached``, ``pending``, ``blocked`` or ``failed``."""

    name: str
    key: str
    status: str
    seconds: float = 0.0
    peak_bytes: int = 0
    memory_scope: str = "stage"
    note: str = ""


class Runner:
    """Runs stages in dependency order, loading cached results instead of recomputing them.

    Args:
        stages: Every stage of the reproduction (names unique).
        cache_dir: The cache folder (``DIR/cache``).
        model: The model (or ``None`` with ``load``).
        load: A function returning the model, called once when the model is first needed.
        progress: Show progress bars inside stages.
        model_id: The model's identity for the keys (default: :func:`model_identity` of the model).
        keep_going: A stage that raises is recorded as ``failed`` (its dependents ``blocked``) and the run goes on;
            ``False`` re-raises. Ctrl-C always stops the run.
        plan_only: Only planning (``--dry-run``): data not here may be estimated (noted in ``plan_notes``).
    """

    def __init__(self, stages: Sequence[Stage], cache_dir: str | Path, model: Any = None, *,
                 load: Callable[[], Any] | None = None, progress: bool = False, model_id: str | None = None,
                 keep_going: bool = False, plan_only: bool = False) -> None:
        self.stages: dict[str, Stage] = {}
        for s in stages:
            if s.name in self.stages:
                raise StageError(f"two stages are named {s.name!r}")
            self.stages[s.name] = s
        for s in stages:
            for d in s.deps:
                if d not in self.stages:
                    raise StageError(f"stage {s.name!r} depends on {d!r}, which is not a stage")
        self.cache_dir = Path(cache_dir)
        self._model = model
        self._load_model = load
        self._model_id = model_id
        self.keep_going = keep_going
        self.progress = progress
        self.plan_only, self.plan_notes = plan_only, {}
        self.executed: list[str] = []
        self.loaded: list[str] = []
        self.records: dict[str, StageRecord] = {}
        self._keys: dict[str, str] = {}
        self._outputs: dict[str, Outputs] = {}
        self._contexts: dict[str, StageContext] = {}
        self._meter = PeakMemory()

    def note(self, name: str, text: str) -> None:
        """Add ``text`` to the plan's note of stage ``name`` (``--dry-run``: what the prediction estimated); a note
        already there is not repeated.

        Args:
            name: A stage name.
            text: One clause.
        """
        have = self.plan_notes.get(name)
        if not have or text not in have.split("; "):
            self.plan_notes[name] = "; ".join(filter(None, [have, text]))

    # ------------------------------------------------------------------ model and keys
    @property
    def model(self) -> Any:
        if self._model is None and self._load_model is not None:
            self._model = self._load_model()
        return self._model

    @property
    def model_id(self) -> str:
        if self._model_id is None:
            m = self.model
            ident = (model_identity(m) if m is not None else None) or str(getattr(m, "name", "no model"))
            dt = str(getattr(m, "dtype", "float32"))  # bf16/fp16 stages get keys of their own; float32 keeps the old keys
            self._model_id = ident if dt in ("torch.float32", "float32") else f"{ident} dtype={dt}"
        return self._model_id

    def context(self, name: str) -> StageContext:
        """The (one) context of stage ``name``: its input data are computed once per run.

        Args:
            name: A stage name.

        Returns:
            The :class:`StageContext`, created on first use.
        """
        if name not in self._contexts:
            self._contexts[name] = StageContext(self.stage(name), self)
        return self._contexts[name]

    def stage(self, name: str) -> Stage:
        """The stage named ``name``.

        Args:
            name: A stage name.

        Returns:
            The :class:`Stage`.

        Raises:
            UnknownNameError: no stage has that name (the message lists them).
        """
        if name not in self.stages:
            raise UnknownNameError.of("stage", name, list(self.stages), option="--only")
        return self.stages[name]

    def payload(self, name: str) -> dict[str, Any]:
        """What the key of stage ``name`` hashes.

        Args:
            name: A stage name.

        Returns:
            A JSON-ready dict: stage name, config type and fields, model identity, data and code hashes, tlcap version and
            the dependencies' keys (computing them, and the stage's inputs, if not done yet).
        """
        s = self.stage(name)
        ctx = self.context(name)
        return {
            "stage": s.name, "config_type": type(s.config).__name__, "config": s.config.to_dict(),
            "model": self.model_id, "data": data_hash(ctx.inputs()) if s.data is not None else None,
            "code": code_hash(s.code) if s.code else None, "tlcap": tlcap_version(),
            "deps": {d: self.key(d) for d in s.deps},
        }

    def key(self, name: str) -> str:
        """``<name>-<16 hex digits>``: the stage's cache folder name.

        Args:
            name: A stage name.

        Returns:
            ``name``, a dash and the first 16 hex digits of the sha256 of :meth:`payload` (computed once per run).
        """
        if name not in self._keys:
            digest = hashlib.sha256(json.dumps(self.payload(name), sort_keys=True).encode()).hexdigest()
            self._keys[name] = f"{name}-{digest[:16]}"
        return self._keys[name]

    def folder(self, name: str) -> Path:
        """The cache folder of stage ``name``, ``cache_dir/<key>`` (it may not exist yet).

        Args:
            name: A stage name.

        Returns:
            The folder's path.
        """
        return self.cache_dir / self.key(name)

    def is_cached(self, name: str) -> bool:
        """Whether stage ``name`` has a complete folder in the cache (its ``stage.json`` exists).

        Args:
            name: A stage name.

        Returns:
            ``True`` when its results can be loaded instead of computed.
        """
        return (self.folder(name) / STAGE_FILE).exists()

    # ------------------------------------------------------------------ plan
    def plan(self, only: Sequence[str] | None = None) -> list[Stage]:
        """Stages to run, dependencies first: all of them, or ``only`` these and what they need.

        A name in ``only`` may also be a prefix ending in ``"."`` or ``"*"`` (``"cnl.locate.*"``).

        Args:
            only: Stage names or prefixes (``None`` or empty: every stage).

        Returns:
            The stages in dependency order, each once.

        Raises:
            UnknownNameError: a name or prefix matches no stage.
            StageError: the dependencies form a cycle.
        """
        wanted: list[str] = []
        for spec in (only if only else list(self.stages)):
            if spec.endswith("*") or spec.endswith("."):
                hits = [n for n in self.stages if n.startswith(spec.rstrip("*"))]
                if not hits:
                    raise UnknownNameError.of("stage", spec, list(self.stages), option="--only")
                wanted += hits
            else:
                wanted.append(self.stage(spec).name)
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(n: str, path: tuple[str, ...]) -> None:
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                raise StageError(f"stage dependencies form a cycle: {' -> '.join(path + (n,))}")
            state[n] = 1
            for d in self.stages[n].deps:
                visit(d, path + (n,))
            state[n] = 2
            order.append(n)

        for n in wanted:
            visit(n, ())
        return [self.stages[n] for n in order]

    # ------------------------------------------------------------------ run
    def outputs(self, name: str) -> Outputs:
        """The results of stage ``name`` (run or loaded earlier in this run, else loaded from the cache).

        Args:
            name: A stage name.

        Returns:
            ``{result name: Result}`` of that stage.

        Raises:
            StageError: the stage has not run and is not cached.
        """
        if name not in self._outputs:
            if not self.is_cached(name):
                raise StageError(f"stage {name!r} has not run; run it (or the stages that need it) first")
            self._outputs[name] = self._load(name)
            self.loaded.append(name)
        return self._outputs[name]

    def _load(self, name: str) -> Outputs:
        return load_stage(self.folder(name))

    def _cached_record(self, name: str, note: str = "") -> StageRecord:
        self.outputs(name)
        meta = read_record(self.folder(name))
        return StageRecord(name, self.key(name), "cached", float(meta.get("seconds", 0.0)), int(meta.get("peak_bytes", 0)),
                           note=note)

    def run_stage(self, stage: Stage) -> StageRecord:
        """Run (or load) one stage whose dependencies are available.

        The stage is computed while holding its lock (:func:`stage_lock`): a process that finds
        another one computing it waits and then loads its results.

        Args:
            stage: The stage to run.

        Returns:
            Its :class:`StageRecord` (also kept in :attr:`records`): ``computed``, ``cached``, ``pending``, ``blocked``
            or ``failed``.
        """
        name = stage.name
        key = self.key(name)
        blocked = [d for d in stage.deps if self.records.get(d) and self.records[d].status in ("pending", "blocked", "failed")]
        if stage.pending:
            rec = StageRecord(name, key, "pending", note=stage.pending)
        elif blocked:
            rec = StageRecord(name, key, "blocked", note=f"needs {', '.join(blocked)}")
        elif self.is_cached(name):
            rec = self._cached_record(name)
        else:
            with stage_lock(self.cache_dir, key, on_wait=lambda: self.on_wait(name)):
                if self.is_cached(name):  # another process computed it while this one waited
                    rec = self._cached_record(name, "computed by another process sharing the cache")
                else:
                    rec = self._compute(stage)
        self.records[name] = rec
        return rec

    def on_wait(self, name: str) -> None:
        """Called when another process holds stage ``name``'s lock (this one then waits for it).

        Args:
            name: The stage waited for.
        """

    def _compute(self, stage: Stage) -> StageRecord:
        name, key = stage.name, self.key(stage.name)
        ctx = self.context(name)
        ctx.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        self._meter.reset(getattr(self.model, "device", None))
        t0 = time.perf_counter()
        try:
            out = dict(stage.fn(ctx))
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on (keep_going)
            if not self.keep_going or is_storage_error(exc):  # a full or read-only disk stops every stage alike
                raise
            return StageRecord(name, key, "failed", time.perf_counter() - t0, note=f"{type(exc).__name__}: {exc}")
        seconds = time.perf_counter() - t0
        peak = self._meter.peak_bytes()
        if not out or not all(isinstance(v, Result) for v in out.values()):
            raise StageError(f"stage {name!r} must return a non-empty mapping of name → tlcap Result")
        save_stage(self.cache_dir, key, out, {
            "name": name, "key": key, "payload": self.payload(name), "types": {r: type(v).__name__ for r, v in out.items()},
            "seconds": seconds, "peak_bytes": peak, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        shutil.rmtree(ctx.checkpoint, ignore_errors=True)
        self._outputs[name] = out
        self.executed.append(name)
        return StageRecord(name, key, "computed", seconds, peak, self._meter.scope)

    def run(self, plan: Sequence[Stage], on_stage: Callable[[Stage, str], None] | None = None) -> list[StageRecord]:
        """Run ``plan`` in order (see :meth:`plan`); ``on_stage(stage, "start" | status)`` reports progress.

        Args:
            plan: Stages in dependency order.
            on_stage: Called with ``(stage, "start")`` before and ``(stage, status)`` after each stage.

        Returns:
            One :class:`StageRecord` per stage of ``plan``, in order.
        """
        out = []
        for stage in plan:
            if on_stage is not None:
                on_stage(stage, "start")
            rec = self.run_stage(stage)
            out.append(rec)
            if on_stage is not None:
                on_stage(stage, rec.status)
        return out


__all__ = ["Stage", "StageContext", "StageRecord", "Runner", "StageError", "data_hash", "code_hash", "code_text", "code_files",
           "STAGE_FILE"]
