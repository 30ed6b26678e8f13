"""The pre-imported parent of the fault-injection tests (``tests/unit/test_faults.py``) and the jobs it forks.

Imported once by a ``multiprocessing`` forkserver (``set_forkserver_preload``): torch at one
thread, tlcap and its CLI imported, the tiny models built. Every job is a child forked from it,
so a job starts in milliseconds with the same models (copy-on-write: a job's edits never reach
the next one) instead of paying seconds of imports and model building per process.

A job (:func:`run_job`) runs one pipeline — the CLI in-process, or ``reproduce`` — optionally
with a fault plan:

- ``kill_at=k``: the child SIGKILLs itself at the k-th file-system event (every ``write()`` on a
  file opened for writing, every ``mkdir``/``replace``/``rename``/``unlink``/``rmdir``), before
  the event (``mode="before"``) or, for a write, after writing half of its bytes (``"torn"``, what a
  kill in the middle of a ``write`` leaves). Between two events only memory changes, so these
  points reach every state the disk can be in after a kill;
- ``fsize``: ``ulimit -f`` (RLIMIT_FSIZE) in bytes: a full disk for files larger than that;
- ``user``: run as this uid/gid (``nobody``) so that a ``chmod``-read-only folder is read-only
  even when the tests run as root.

It reports (a JSON file, unless killed) the events it saw, every file it opened for reading, and
the pipeline's own outcome (exit code, stage records).
"""

from __future__ import annotations

import builtins
import contextlib
import encodings.unicode_escape  # noqa: F401 - see below
import functools
import io
import json
import os
import resource
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

torch.set_num_threads(1)

from tlcap.cli import _load_commands  # noqa: E402
from tlcap.cli import main as cli_main  # noqa: E402 - after the thread setting
from tlcap.models import loading, make_gpt2, make_llama  # noqa: E402
from tlcap.reproduce.run import reproduce  # noqa: E402
from tlcap.reproduce.scales import ScaleConfig  # noqa: E402

_load_commands()
# A job run as ``nobody`` cannot import from an interpreter installed under a mode-700 home (pyenv in
# /root): every standard-library module a job needs must be imported here, by the server. The one a
# job would otherwise import lazily is the unicode_escape codec that ast.unparse (the reproduce stage
# keys' code text, tlcap.reproduce.stages.code_text) encodes with.
tqdm.get_lock()  # created here once (the server's own); every child replaces it (_own_tqdm_lock)
GPT2 = make_gpt2("tiny", seed=0)
LLAMA = make_llama(seed=0)
loading.REGISTRY["gpt2-tiny"] = lambda **_: GPT2  # the CLI's load("gpt2-tiny") gets the pre-built model

TINY_CNL = ScaleConfig(name="smoke", cnl_datasets=("emotion",), cnl_eval_datasets=("emotion",), cnl_locate_n=10,
                       cnl_eval_n=2, n_boot=50)
TINY_QL = ScaleConfig(name="smoke", ql_n_facts=3, ql_sig_facts=1, ql_amig_facts=1, ql_max_queries=3, n_boot=50)
TEMP_MARKERS = (".tmp-", ".part", ".saving-", ".staging-", ".old-")


class Faults:
    """Counts file-system events, kills the process at one of them, records the files read."""

    def __init__(self, kill_at: int | None = None, mode: str = "before") -> None:
        self.kill_at, self.mode = kill_at, mode
        self.n = 0
        self.reads: list[str] = []
        self.saved: dict[str, Any] = {}

    def event(self, fh: Any = None, data: Any = None) -> None:
        self.n += 1
        if self.n == self.kill_at:
            if self.mode == "torn" and fh is not None and data:
                fh.write(data[: max(1, len(data) // 2)])
                fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        orig_open = builtins.open
        faults = self

        class Writing:
            def __init__(self, fh: Any) -> None:
                self._fh = fh

            def write(self, data: Any) -> Any:
                faults.event(self._fh, data)
                return self._fh.write(data)

            def __enter__(self) -> Writing:
                return self

            def __exit__(self, *exc: Any) -> None:
                self._fh.close()

            def __iter__(self) -> Any:
                return iter(self._fh)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._fh, name)

        def opener(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            fh = orig_open(file, mode, *args, **kwargs)
            if isinstance(file, int):
                return fh
            if any(c in mode for c in "wax+"):
                return Writing(fh)
            self.reads.append(os.fspath(file))
            return fh

        def hooked(fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                self.event()
                return fn(*args, **kwargs)
            return call

        self.saved = {"open": orig_open, "io_open": io.open}
        builtins.open = io.open = opener  # type: ignore[assignment]
        for name in ("replace", "rename", "remove", "unlink", "rmdir", "mkdir"):
            self.saved[name] = getattr(os, name)
            setattr(os, name, hooked(getattr(os, name)))

    def uninstall(self) -> None:
        builtins.open = self.saved.pop("open")
        io.open = self.saved.pop("io_open")
        for name, fn in self.saved.items():
            setattr(os, name, fn)


def _cli(args: list[str]) -> int:
    try:
        cli_main(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _reproduce(job: dict[str, Any]) -> dict[str, Any]:
    scale = TINY_QL if job["paper"] == "ql" else TINY_CNL
    kw = {"jobs": 2, "load": functools.partial(make_llama, seed=0)} if job.get("jobs", 1) > 1 else {}
    try:
        run = reproduce(LLAMA, job["out"], papers=(job["paper"],), scale=scale, only=job["only"],
                        cache_dir=job["cache"], **kw)
    except Exception as exc:  # noqa: BLE001 - reported to the test (a storage error is one of the cases)
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {"code": 2, "error": type(exc).__name__, "message": str(exc)}
    return {"code": 0, "records": {r.name: r.status for r in run.records}}


def _own_tqdm_lock() -> None:
    """Give this child a progress-bar write lock of its own: a thread lock, not the semaphore forked from the server.

    That semaphore is shared by every child; one SIGKILLed while holding it (its tqdm monitor thread takes it every
    10 s, so a kill at a file-system event can land then) left every later child waiting for it forever (a CI run
    stalled in ``tqdm.__new__``). A thread lock is copied at fork, never shared.
    """
    from tqdm.auto import tqdm as auto_tqdm

    lock = threading.RLock()
    for cls in {tqdm, auto_tqdm}:
        cls.set_lock(lock)


def die_holding_tqdm_lock() -> None:
    """A child that takes the progress bars' write lock and is SIGKILLed holding it (the stalled-run regression)."""
    _own_tqdm_lock()
    tqdm.get_lock().acquire()
    os.kill(os.getpid(), signal.SIGKILL)


def run_job(job: dict[str, Any], report: str, log: Any) -> None:
    """Run one job in this (forked) process; see the module docstring. Writes ``report`` unless killed.

    ``log`` is the write end of a pipe (a ``multiprocessing`` connection) that takes stdout and
    stderr: a pipe, like a terminal, is not limited by ``ulimit -f``.
    """
    _own_tqdm_lock()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
    os.environ["TLCAP_FIGURES"] = "html"  # the figure export has its own tests (test_viz_export)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    if job.get("fsize") is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize"], limit[1]))
    if job.get("user") is not None:
        os.setgid(job["user"])
        os.setuid(job["user"])
    faults = Faults(job.get("kill_at"), job.get("mode", "before"))
    faults.install()
    try:
        if job["pipeline"] == "cli":
            outcome: dict[str, Any] = {"code": _cli(job["args"])}
        else:
            outcome = _reproduce(job)
    except BaseException:  # noqa: BLE001 - a traceback is a test failure, reported in full
        outcome = {"code": 99, "traceback": traceback.format_exc()}
    finally:
        faults.uninstall()
    resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    with contextlib.suppress(OSError):
        Path(report).write_text(json.dumps({"events": faults.n, "reads": faults.reads, **outcome}))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
