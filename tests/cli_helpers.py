"""Run ``tlcap`` commands in-process and check the error contract (for every command's tests).

Usage::

    from tests.cli_helpers import assert_cli_error, run_cli

    def test_steps_zero(tmp_path):
        out = tmp_path / "run"
        assert_cli_error(["kn", "--model", "gpt2-tiny", ..., "--steps", "0", "--out", str(out)],
                         "steps (--steps) must be >= 1, got 0", out=out)
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tlcap.cli import main


@dataclass(frozen=True)
class CliRun:
    """Exit code and captured output of one in-process ``tlcap`` run."""

    code: int
    stdout: str
    stderr: str


def run_cli(args: Sequence[str]) -> CliRun:
    """Run ``tlcap <args>`` in this process (``tlcap.cli.main``), capturing stdout/stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CliRun(code, out.getvalue(), err.getvalue())


def _snapshot(path: Path) -> dict[str, bytes] | None:
    if not path.exists():
        return None
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(path.rglob("*"))}


def assert_cli_error(args: Sequence[str], message: str, out: Path | None = None, exact: bool = True) -> CliRun:
    """Assert ``tlcap <args>`` fails the way every user mistake must.

    Checks: exit code 2; no traceback; the last stderr line is ``error: <message>`` (the whole
    line when ``exact``, else ``message`` is a substring of it) and it is the only ``error:``
    line; ``out`` (the ``--out`` path) is exactly as before (not created, not changed), and
    no staging folder is left beside it.

    Returns:
        The :class:`CliRun` for further checks.
    """
    before = _snapshot(out) if out is not None else None
    siblings = sorted(os.listdir(out.parent)) if out is not None and out.parent.exists() else None
    run = run_cli(args)
    assert run.code == 2, f"exit code {run.code}, stderr:\n{run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines, "no error message on stderr"
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == [lines[-1]], f"expected one final 'error:' line, got:\n{run.stderr}"
    text = lines[-1][len("error: "):]
    if exact:
        assert text == message, f"\n got: {text}\nwant: {message}"
    else:
        assert message in text, f"{message!r} not in {text!r}"
    if out is not None:
        assert _snapshot(out) == before, f"{out} was created or changed by a failing command"
        if siblings is not None:
            assert sorted(os.listdir(out.parent)) == siblings, "the command left files beside --out"
    return run
