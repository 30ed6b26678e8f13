"""``tlcap methods`` lists the method registry; ``tlcap localize METHOD`` runs any registered method.

Both read :mod:`tlcap.method_registry`, so a method registered there (one module + one
:func:`~tlcap.method_registry.register` line) is listed and runnable with no CLI code of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from tlcap.cli import app
from tlcap.cli._common import (
    check_device_dtype,
    device_option,
    dtype_option,
    load,
    model_option,
    overwrite_option,
    seed_everything,
    staged_output,
    write_outputs,
)
from tlcap.errors import InvalidConfigError
from tlcap.method_registry import get_method, methods


@app.command("methods")
def list_methods() -> None:
    """List the registered localization methods: inputs, result type, paper and cost."""
    for m in methods():
        fields = ", ".join([*m.inputs, *(f"[{f}]" for f in m.optional)])
        typer.echo(f"{m.name:<7} {m.title}")
        typer.echo(f"{'':<7} data: {fields}; returns {m.result}; config {m.config.rpartition(':')[2] if m.config else '-'}")
        typer.echo(f"{'':<7} paper: {m.paper}")
        typer.echo(f"{'':<7} cost: {m.cost}")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as config overrides (VALUE read as JSON when it parses, else text).

    Args:
        items: The ``--set`` values.

    Returns:
        Field → value.

    Raises:
        InvalidConfigError: an item without ``=`` or a key given twice.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InvalidConfigError(f"--set takes KEY=VALUE (e.g. --set steps=10), got {item!r}")
        if key in out:
            raise InvalidConfigError(f"--set {key} given twice")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


@app.command("localize")
def localize(
    method: str = typer.Argument(..., help="A registered method (tlcap methods lists them)."),
    model: str = model_option(),
    out: Path = typer.Option(..., help="Output folder (summary.json, figure, result/); must not hold a finished run."),
    prompt: str | None = typer.Option(None, help="The prompt (kn, ig, sig, amig, trace, eap, eap-ig)."),
    target: str | None = typer.Option(None, help="The answer with its leading space, e.g. ' Paris'."),
    subject: str | None = typer.Option(None, help="trace: the subject as written in the prompt."),
    paraphrase: list[str] | None = typer.Option(None, help="kn: a paraphrase of the prompt (repeatable)."),
    corrupt_prompt: str | None = typer.Option(None, "--corrupt-prompt", help="eap, eap-ig: the corrupted prompt."),
    corrupt_target: str | None = typer.Option(None, "--corrupt-target", help="eap, eap-ig: its answer."),
    task: str | None = typer.Option(None, help="cnl: the task (emotion, imdb, gsm8k, svamp, mbpp, ...)."),
    n: int | None = typer.Option(None, help="cnl: training samples of the task."),
    set_: list[str] | None = typer.Option(None, "--set", help="A config field, KEY=VALUE (repeatable): steps=10, "
                                          "ig.rule=left, n_random=0 (tlcap methods names each method's config)."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    overwrite: bool = overwrite_option(),
) -> None:
    """Run METHOD (any entry of the method registry) on one model and its data; write its result."""
    entry = get_method(method)
    given = {"prompt": prompt, "target": target, "subject": subject, "paraphrases": paraphrase or None,
             "corrupt_prompt": corrupt_prompt, "corrupt_target": corrupt_target, "task": task, "n": n}
    taken = entry.inputs + entry.optional
    extra = [k for k, v in given.items() if v is not None and k not in taken]
    if extra:
        opt = "--paraphrase" if extra[0] == "paraphrases" else "--" + extra[0].replace("_", "-")
        raise InvalidConfigError(f"{opt} is not an input of method {method!r} (it takes: {', '.join(taken)})")
    data = entry.data({k: v for k, v in given.items() if v is not None})
    cfg = entry.resolve(None, **parse_sets(set_ or []))
    check_device_dtype(device, dtype)
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(int(getattr(cfg, "seed", 0) or 0))
        m = load(model, device, dtype)
        res = entry.run(m, data, config=cfg)
        write_outputs(stage.path, res, figures={f"{entry.name}_figure": res.figure()}, extra={"method": entry.name})
    typer.echo(f"wrote {stage.out} ({entry.name}: {type(res).__name__})")
