"""The ``tlcap`` command. Each submodule of ``tlcap.cli`` registers its commands on ``app``.

Submodules are discovered automatically: adding ``tlcap/cli/foo.py`` that decorates functions
with ``@app.command()`` (or adds a sub-app with ``app.add_typer``) is all a new command needs.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

import typer

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


def main() -> None:
    """Entry point of the ``tlcap`` console script."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _load_commands()
    from tlcap.errors import TlcapError

    try:
        app()
    except TlcapError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise SystemExit(2) from None
