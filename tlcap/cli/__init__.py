"""The ``tlcap`` command. Each submodule of ``tlcap.cli`` registers its commands on ``app``.

Submodules are discovered automatically: adding ``tlcap/cli/foo.py`` that decorates functions
with ``@app.command()`` (or adds a sub-app with ``app.add_typer``) is all a new command needs.

Errors: a :class:`~tlcap.errors.TlcapError` and a usage error (unknown option, a value typer
cannot parse, a missing required option) are printed as one line, ``error: ...``, exit code 2;
never a traceback. A disk that is full, a file-size limit or a read-only place is one such line
too (:class:`~tlcap.errors.StorageError`). Ctrl-C (or SIGTERM) exits 130 with one line saying
how to resume. Warnings are printed as one line each, ``warning: ...``, each text once per run.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer
from tqdm import tqdm

from tlcap.atomic import is_storage_error, storage_error
from tlcap.errors import TlcapError, TlcapWarning

app = typer.Typer(
    name="tlcap",
    help="Localize knowledge and capabilities inside language models (TransformerLens runtime).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_LOADED = False


@app.callback()
def _root() -> None:
    """tlcap: knowledge neurons, causal tracing / ROME, circuits, CNL and Query Localization."""


def _load_commands() -> None:
    global _LOADED
    if _LOADED:
        return
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    _LOADED = True


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _close_progress_bars() -> None:
    """Close the progress bars an error left open, so the error starts its own line (the bars show where it stopped)."""
    for bar in list(getattr(tqdm, "_instances", ())):
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - a bar that cannot close must not hide the error
            continue


def _fail(message: str, code: int = 2) -> None:
    _close_progress_bars()
    typer.secho(f"error: {_one_line(message)}", fg=typer.colors.RED, err=True)
    raise SystemExit(code)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a scheduler's time limit) stop a command the way Ctrl-C does.

    The long commands save their checkpoints and remove partial outputs on ``KeyboardInterrupt``;
    Python's default SIGTERM exits without unwinding, which would lose the items since the last
    periodic save. (A command started in the background of a non-interactive shell ignores
    SIGINT, so ``kill`` is how such a run is stopped.)
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)


@contextmanager
def one_line_warnings() -> Iterator[set[str]]:
    """Print every warning shown inside as one line, ``warning: <text>``, each text once (yields the texts seen).

    tlcap's own warnings (:class:`~tlcap.errors.TlcapWarning`) are always shown; other libraries'
    follow the warning filters in force. Warnings are printed when they are raised (a data warning
    at the start of an hour-long run is seen at the start). Code that records warnings around the
    call (``warnings.catch_warnings(record=True)``, ``pytest.warns``) still gets every one.
    """
    seen: set[str] = set()

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        recorder = getattr(getattr(warnings, "_showwarnmsg_impl", None), "__self__", None)
        if isinstance(recorder, list):  # an enclosing catch_warnings(record=True) keeps them too
            recorder.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        text = _one_line(str(message))
        if text not in seen:
            seen.add(text)
            print(f"warning: {text}", file=sys.stderr if file is None else file, flush=True)

    with warnings.catch_warnings():  # restores the filters and showwarning on the way out
        warnings.simplefilter("always", TlcapWarning)  # every text once (show), not once per source line
        warnings.showwarning = show
        yield seen


_INTERRUPTED: list[str] = []
_DEFAULT_HINT = "interrupted; rerun the same command to start over (or to resume, for commands that keep checkpoints)"


def note_interrupt(hint: str) -> None:
    """Remember what the exit message of an interrupted command says (typer turns Ctrl-C into exit code 130)."""
    _INTERRUPTED.append(hint)


def _interrupt_hint(exc: BaseException | None = None) -> str:
    while exc is not None:
        if getattr(exc, "hint", None):
            return str(exc.hint)  # type: ignore[attr-defined]
        exc = exc.__cause__ or exc.__context__
    return _INTERRUPTED[-1] if _INTERRUPTED else _DEFAULT_HINT


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``tlcap`` console script (``argv``: arguments, default ``sys.argv[1:]``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stop_on_sigterm()
    _load_commands()
    with one_line_warnings():
        _run(argv)


def _run(argv: Sequence[str] | None) -> None:
    _INTERRUPTED.clear()
    try:
        rv = app(args=None if argv is None else list(argv), prog_name="tlcap", standalone_mode=False)
        if rv == 130:  # Ctrl-C or SIGTERM: typer returns 130
            _fail(_interrupt_hint(), 130)
    except TlcapError as exc:
        _fail(str(exc))
    except KeyboardInterrupt as exc:
        _fail(_interrupt_hint(exc), 130)
    except OSError as exc:  # a disk error outside tlcap's own writes (a library's file, a figure)
        if not is_storage_error(exc):
            raise
        _fail(str(storage_error(exc)))
    except typer.TyperException as exc:  # typer's (vendored click) usage and file errors
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            raise SystemExit(exc.exit_code) from None
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        _fail(exc.format_message() + where, exc.exit_code)
    except typer.Abort as exc:  # click turns Ctrl-C into Abort (the KeyboardInterrupt is its cause)
        _fail(_interrupt_hint(exc), 130)
    if isinstance(rv, int) and not isinstance(rv, bool) and rv != 0:
        raise SystemExit(rv)
