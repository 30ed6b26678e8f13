"""The ``tlcap`` command. Each submodule of ``tlcap.cli`` registers its commands on ``app``.

Submodules are discovered automatically: adding ``tlcap/cli/foo.py`` that decorates functions
with ``@app.command()`` (or adds a sub-app with ``app.add_typer``) is all a new command needs.

Errors: a :class:`~tlcap.errors.TlcapError` and a usage error (unknown option, a value typer
cannot parse, a missing required option) are printed as one line, ``error: ...``, exit code 2;
never a traceback. Ctrl-C exits 130.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import threading
from collections.abc import Sequence

import typer

from tlcap.errors import TlcapError

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


def _fail(message: str, code: int = 2) -> None:
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


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``tlcap`` console script (``argv``: arguments, default ``sys.argv[1:]``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stop_on_sigterm()
    _load_commands()
    try:
        rv = app(args=None if argv is None else list(argv), prog_name="tlcap", standalone_mode=False)
    except TlcapError as exc:
        _fail(str(exc))
    except typer.TyperException as exc:  # typer's (vendored click) usage and file errors
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            raise SystemExit(exc.exit_code) from None
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        _fail(exc.format_message() + where, exc.exit_code)
    except typer.Abort:
        _fail("aborted", 130)
    if isinstance(rv, int) and not isinstance(rv, bool) and rv != 0:
        raise SystemExit(rv)
