"""``tlcap dashboard RESULT_DIR --out page.html``: one self-contained page to explore a saved neuron result.

The page holds the result's heatmap and the neuron card of every located neuron (and of the
``--top`` highest-scoring ones), shown beside the heatmap when a cell is clicked: plotly and the
cards are inlined, so the page needs no server and no network (:mod:`tlcap.explore.explorer`).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from tlcap.cli import app
from tlcap.cli._common import device_option, dtype_option, load, model_option, overwrite_option
from tlcap.config import check_choice, check_int
from tlcap.errors import MissingFileError, OutputExistsError, OutputPathError
from tlcap.explore.explorer import explore_neurons, neuron_view
from tlcap.results import load_result

ACTIVATIONS = ("cached", "build", "none")


def result_folder(path: Path) -> Path:
    """The saved result in ``path``: ``path`` itself, or the ``result/`` a command wrote there.

    Raises:
        MissingFileError: neither holds a ``result.json``.
    """
    for cand in (path, path / "result"):
        if (cand / "result.json").is_file():
            return cand
    raise MissingFileError(f"{path} holds no saved result (result.json, or result/result.json as `tlcap kn --out` "
                           "writes); give a result folder")


def check_page(out: Path, overwrite: bool) -> Path:
    """Check ``--out`` before any work: an ``.html`` file path in a writable folder, not there unless ``overwrite``."""
    if out.suffix.lower() not in (".html", ".htm"):
        raise OutputPathError(f"--out {out} must be an .html file path")
    if out.is_dir():
        raise OutputPathError(f"--out {out} is a folder; give an .html file path")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise OutputPathError(f"--out {out}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"--out {out} cannot be written ({parent} is read-only); choose another --out")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it or choose another --out")
    return out


@app.command("dashboard")
def dashboard(
    result_dir: Path = typer.Argument(..., help="A saved neuron result: a command's --out folder or a result folder."),
    out: Path = typer.Option(..., "--out", help="The page to write (.html; self-contained: no server, no network)."),
    model: str | None = model_option(None, help="Model for the cards (default: the one recorded in the result's provenance)."),
    prompt: str | None = typer.Option(None, help="Prompt shown on every card (default: the result's own prompt, if any)."),
    top: int = typer.Option(20, help="Also card the TOP highest-scoring neurons (0: the located neurons only)."),
    activations: str = typer.Option("cached", help="Corpus snippets on the cards: cached (use the model's cached "
                                                   "activation index if any), build (build it: minutes), none."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Activation index over the first N corpus tokens only."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    overwrite: bool = overwrite_option(),
) -> None:
    """Write one self-contained HTML page: the result's heatmap, and a neuron card per located neuron on click."""
    check_choice("activations", activations, ACTIVATIONS, cli="--activations")
    check_int("top", top, min=0, cli="--top")
    if max_tokens is not None:
        check_int("max_tokens", max_tokens, min=1, cli="--max-tokens")
    page = check_page(out, overwrite)
    res = load_result(result_folder(result_dir))
    neuron_view(res)  # a result the page cannot show is an error before the model loads
    name = model or (res.provenance.model_name if res.provenance is not None else None)
    if not name:
        raise MissingFileError(f"{result_dir}: the result records no model; pass --model")
    m = load(name, device, dtype)
    opts = {} if max_tokens is None else {"max_tokens": max_tokens}
    explorer = explore_neurons(m, res, prompt, top=top, activations=None if activations == "none" else activations,
                               on_card=lambda l, j: typer.echo(f"card L{l}/N{j}", err=True), **opts)
    explorer.save(page)
    typer.echo(f"wrote {page} ({len(explorer.cards)} neuron cards)")
