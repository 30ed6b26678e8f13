"""``tlcap index --model M``: build (once) and cache a model's activation index for neuron cards."""

from __future__ import annotations

import typer

from tlcap.cli import app
from tlcap.cli._common import device_option, dtype_option, load, model_option
from tlcap.config import check_int
from tlcap.explore.activation_index import activation_index, index_path


@app.command("index")
def index(
    model: str = model_option(),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Index only the first N tokens of the corpus "
                                                                     "(default: the whole WikiText-2 test split)."),
    k: int = typer.Option(16, help="Top activating contexts kept per neuron."),
    context: int = typer.Option(256, help="Tokens per context the corpus is cut into."),
    batch_contexts: int = typer.Option(8, "--batch-contexts", help="Contexts per forward pass."),
    device: str = device_option(),
    dtype: str = dtype_option(),
) -> None:
    """Build the activation index of MODEL over WikiText-2 test (cached; later cards and dashboards reuse it)."""
    if max_tokens is not None:
        check_int("max_tokens", max_tokens, min=1, cli="--max-tokens")
    check_int("k", k, min=1, cli="--k")
    check_int("context", context, min=2, cli="--context")
    check_int("batch_contexts", batch_contexts, min=1, cli="--batch-contexts")
    m = load(model, device, dtype)
    context = min(context, m.n_ctx)
    path = index_path(m, "wikitext2-test", max_tokens, k, context, 1)
    cached = (path / "result.json").exists()
    idx = activation_index(m, max_tokens=max_tokens, k=k, context=context, batch_contexts=batch_contexts)
    assert idx is not None
    what = "found" if cached else f"built in {idx.seconds:.0f} s"
    typer.echo(f"{path}: {idx.tokens.numel():,} tokens, {idx.values.shape[0]} x {idx.values.shape[1]} neurons, top {idx.k} "
               f"({what})")
