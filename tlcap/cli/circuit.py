"""``tlcap circuit``: the knowledge circuit of one fact (parse → config → call → write outputs)."""

from __future__ import annotations

from pathlib import Path

import typer

from tlcap.cli import app
from tlcap.cli._common import device_option, dtype_option, load, overwrite_option, seed_everything, staged_output, write_outputs
from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.config import EAPConfig, check_circuit_inputs, parse_sizes
from tlcap.locate.circuits.knowledge_circuit import knowledge_circuit


def _say(text: str) -> None:
    typer.echo(text, err=True)


@app.command("circuit")
def circuit(
    model: str = typer.Option(..., help="Model name (smollm2-135m, gpt2-tiny, gpt2-small-random, ...) or path."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    prompt: str = typer.Option(..., help="The query, e.g. 'The capital of France is'."),
    target: str = typer.Option(..., help="The answer with its leading space, e.g. ' Paris'."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, result/); must not hold a finished run."),
    corrupt_prompt: str | None = typer.Option(
        None, help="Same-relation prompt with another subject of the same token length, e.g. 'The capital of Italy is'."
    ),
    zero_ablate: bool = typer.Option(False, "--zero-ablate", help="Ablate non-circuit edges to zero instead."),
    top_n: int | None = typer.Option(None, help="Keep the top-n edges by |score|, >= 1 (default 300 without --threshold)."),
    threshold: float | None = typer.Option(None, help="Keep edges with |score| > threshold (> 0) instead of top-n."),
    ig_steps: int = typer.Option(5, help="EAP-IG interpolation steps, >= 1 (1 = plain EAP; EAP-IG is far more faithful)."),
    metric: str = typer.Option("nll", help="nll (MatchNLL of the target) | logit-diff (needs --corrupt-target)."),
    corrupt_target: str | None = typer.Option(
        None, help="One-token answer of the corrupted prompt, e.g. ' Rome' (for --metric logit-diff only)."
    ),
    sweep: str | None = typer.Option(
        None, help="Comma-separated circuit sizes (integers >= 0) for the size sweep (default: a log grid)."
    ),
    no_sweep: bool = typer.Option(False, "--no-sweep", help="Skip the size sweep."),
    seed: int = typer.Option(0, help="Seed of the random-circuit controls (>= 0)."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Find the knowledge circuit of a fact with EAP / EAP-IG and evaluate it alone."""
    if sweep is not None and no_sweep:
        raise InvalidConfigError("give --sweep SIZES or --no-sweep, not both")
    sizes = parse_sizes(sweep) if sweep is not None else None
    cfg = EAPConfig(steps=ig_steps, metric=metric, ablation="zero" if zero_ablate else "corrupt", top_n=top_n,
                    threshold=threshold, sweep=not no_sweep, sweep_sizes=sizes, seed=seed)
    cfg = check_circuit_inputs(prompt, target, corrupt_prompt, corrupt_target, cfg)
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        res = knowledge_circuit(m, prompt, target, corrupt_prompt, corrupt_target=corrupt_target, config=cfg, log=_say)
        write_outputs(stage.path, res, figures=res.figures(), tables={"circuit_edges": res.to_frame()})
    s = res.summary()
    typer.echo(f"wrote {stage.out}")
    typer.echo(
        f"circuit: {s['n_edges']} edges, {s['n_nodes']} nodes, {100 * s['param_fraction']:.2f}% of block params "
        f"({100 * s['param_fraction_with_embeddings']:.2f}% of all, embeddings included); "
        f"NLL full {s['full_nll']:.3f} / circuit {s['circuit_nll']:.3f} / ablated {s['ablated_nll']:.3f}; "
        f"target rank {s['circuit_target_rank']} (full {s['full_target_rank']}, "
        f"random circuit {s['random_circuit_target_rank']})"
    )
