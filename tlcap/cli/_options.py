"""The options every model-loading command shares (re-exported by :mod:`tlcap.cli._common`)."""

from __future__ import annotations

from typing import Any

import typer

from tlcap.config import check_int
from tlcap.errors import InvalidConfigError
from tlcap.runtime.batching import parse_memory

MODEL_HELP = ("Model: a registry name (smollm2-135m, gpt2, gpt2-tiny, gpt2-small-random, llama-7b-shape, ...), "
              "a hub id or a local folder.")


def model_option(default: Any = ..., help: str = MODEL_HELP) -> Any:
    """The ``--model`` / ``-m`` option every model-loading command takes (``...``: required).

    Args:
        default: The default model, or ``...`` (required) or ``None`` (optional, the command decides).
        help: The help text (default: :data:`MODEL_HELP`).

    Returns:
        The typer option.
    """
    return typer.Option(default, "--model", "-m", help=help)


def device_option() -> Any:
    """The ``--device`` option every command that loads a model takes."""
    return typer.Option("auto", "--device", help="Torch device: auto (CUDA when available, else CPU), cpu, cuda, cuda:N, "
                        "or cuda*N (the model's layers split over N GPUs; under torchrun each process takes its own N).")


def dtype_option() -> Any:
    """The ``--dtype`` option every command that loads a model takes."""
    return typer.Option("float32", "--dtype", help="Model dtype: float32, bfloat16 or float16 (scores accumulate in float32).")


def batch_rows_option(default: int | str = "auto") -> Any:
    """The ``--batch-rows`` option of commands whose batch size does not change the result."""
    return typer.Option(str(default), "--batch-rows", help=(
        "Rows per forward pass: a number >= 1, or auto (within what fits --max-memory: on a GPU the smallest batch "
        "that reaches the throughput plateau, measured once by a short probe; at most 256 on a CPU; halved and rerun "
        "on out-of-memory). Results do not depend on it."))


def max_memory_option() -> Any:
    """The ``--max-memory`` option: the budget of ``--batch-rows auto``."""
    return typer.Option(None, "--max-memory", help=(
        "Memory budget of --batch-rows auto per device, e.g. 8GiB or 500MB (default: the device's free memory)."))


def batch_rows_value(value: str, max_memory: str | None, option: str = "--batch-rows") -> int | str:
    """``--batch-rows`` (or ``option``, e.g. ``--batch-size``) as the config takes it (an int or
    ``"auto"``), ``--max-memory`` checked.

    Raises:
        InvalidConfigError: not ``auto`` or an integer >= 1; ``--max-memory`` without ``auto``
            or not a size.
    """
    text = str(value).strip().lower()
    if max_memory is not None:
        parse_memory(max_memory)
        if text != "auto":
            raise InvalidConfigError(f"--max-memory applies to {option} auto only; got {option} {value}")
    if text == "auto":
        return "auto"
    try:
        rows = int(text)
    except ValueError:
        raise InvalidConfigError(f"{option} must be auto or an integer >= 1, got {value!r}") from None
    return check_int(option.lstrip("-").replace("-", "_"), rows, min=1, cli=option)
