"""``tlcap circuit``: the knowledge circuit of one fact, or of a dataset (parse → config → call → write outputs)."""

from __future__ import annotations

from pathlib import Path

import typer

from tlcap.cli import app
from tlcap.cli._common import device_option, dtype_option, load, overwrite_option, seed_everything, staged_output, write_outputs
from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.config import ABLATIONS, EAPConfig, check_circuit_inputs, parse_sizes
from tlcap.locate.circuits.dataset import load_circuit_dataset
from tlcap.locate.circuits.dataset_circuit import dataset_circuit
from tlcap.locate.circuits.export import export_circuit
from tlcap.locate.circuits.knowledge_circuit import knowledge_circuit


def _say(text: str) -> None:
    typer.echo(text, err=True)


def _check_modes(dataset: str | None, prompt: str | None, target: str | None, corrupt_prompt: str | None,
                 relation: str | None, n_items: int | None) -> None:
    if dataset is None:
        if prompt is None or target is None:
            raise InvalidConfigError("give --prompt and --target (one fact), or --dataset (pararel, known or a file)")
        if relation is not None or n_items is not None:
            raise InvalidConfigError("--relation and --n-items select dataset items: use them with --dataset")
    elif prompt is not None or target is not None or corrupt_prompt is not None:
        raise InvalidConfigError("give --dataset or --prompt/--target/--corrupt-prompt, not both")


@app.command("circuit")
def circuit(
    model: str = typer.Option(..., help="Model name (smollm2-135m, gpt2-tiny, gpt2-small-random, ...) or path."),
    device: str = device_option(),
    dtype: str = dtype_option(),
    prompt: str | None = typer.Option(None, help="The query, e.g. 'The capital of France is' (one fact)."),
    target: str | None = typer.Option(None, help="The answer with its leading space, e.g. ' Paris'."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, result/); must not hold a finished run."),
    corrupt_prompt: str | None = typer.Option(
        None, help="Same-relation prompt with another subject of the same token length, e.g. 'The capital of Italy is'."
    ),
    dataset: str | None = typer.Option(
        None, help="A dataset instead of one fact: pararel (with --relation), known (ROME's known facts) or a "
                   ".json/.jsonl/.csv file of prompt,target[,corrupt_prompt] rows; scores are the mean over items."
    ),
    relation: str | None = typer.Option(None, help="ParaRel relation (e.g. P36) or known-facts relation_id."),
    n_items: int | None = typer.Option(None, help="Use at most this many dataset items (>= 1)."),
    batch_size: int = typer.Option(8, help="Dataset items per pass (>= 1; exact, bounds memory)."),
    known_top_k: int | None = typer.Option(None, help="ParaRel: keep facts whose answer is in the model's top-k."),
    ablation: str | None = typer.Option(
        None, help=f"What replaces non-circuit edges: {' | '.join(ABLATIONS)} (default corrupt when corrupted "
                   "prompts exist, else zero)."
    ),
    zero_ablate: bool = typer.Option(False, "--zero-ablate", help="Ablate non-circuit edges to zero instead."),
    greedy: bool = typer.Option(False, "--greedy", help="Dataset circuits: greedy selection from the logits."),
    top_n: int | None = typer.Option(None, help="Keep the top-n edges by |score|, >= 1 (default 300 without --threshold)."),
    threshold: float | None = typer.Option(None, help="Keep edges with |score| > threshold (> 0) instead of top-n."),
    ig_steps: int = typer.Option(5, help="EAP-IG interpolation steps, >= 1 (1 = plain EAP; EAP-IG is far more faithful)."),
    metric: str = typer.Option("nll", help="nll (MatchNLL of the target) | logit-diff (needs --corrupt-target)."),
    corrupt_target: str | None = typer.Option(
        None, help="One-token answer of the corrupted prompt, e.g. ' Rome' (for --metric logit-diff only)."
    ),
    sweep: str | None = typer.Option(
        None, help="Comma-separated circuit sizes (integers >= 0) for the size sweep / faithfulness curve."
    ),
    no_sweep: bool = typer.Option(False, "--no-sweep", help="Skip the size sweep."),
    seed: int = typer.Option(0, help="Seed of the random-circuit controls (>= 0)."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Find the knowledge circuit of a fact (or a dataset's circuit) with EAP / EAP-IG and evaluate it alone."""
    _check_modes(dataset, prompt, target, corrupt_prompt, relation, n_items)
    if sweep is not None and no_sweep:
        raise InvalidConfigError("give --sweep SIZES or --no-sweep, not both")
    if zero_ablate and ablation not in (None, "zero"):
        raise InvalidConfigError(f"give --zero-ablate or --ablation {ablation}, not both")
    sizes = parse_sizes(sweep) if sweep is not None else None
    abl = "zero" if zero_ablate else ablation
    cfg = EAPConfig(steps=ig_steps, metric=metric, ablation=abl if dataset else (abl or "corrupt"), top_n=top_n,
                    threshold=threshold, sweep=not no_sweep, sweep_sizes=sizes, seed=seed, batch_size=batch_size,
                    greedy=greedy)
    if dataset is None:
        cfg = check_circuit_inputs(prompt or "", target or "", corrupt_prompt, corrupt_target, cfg)
    elif n_items is not None and n_items < 1:
        raise InvalidConfigError(f"--n-items must be >= 1, got {n_items}")
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        if dataset is not None:
            ds = load_circuit_dataset(dataset, relation=relation, n=n_items, model=m, known_top_k=known_top_k,
                                      corrupt=cfg.ablation in (None, "corrupt"))
            res = dataset_circuit(m, ds, config=cfg, log=_say)
        else:
            res = knowledge_circuit(m, prompt or "", target or "", corrupt_prompt, corrupt_target=corrupt_target,
                                    config=cfg, log=_say)
        write_outputs(stage.path, res, figures=res.figures(), tables={"circuit_edges": res.to_frame()})
        for suffix in (".dot", ".json"):
            export_circuit(res.circuit, stage.path / f"circuit{suffix}")
    s = res.summary()
    typer.echo(f"wrote {stage.out}")
    if dataset is not None:
        typer.echo(
            f"{s['dataset']} ({s['n_items']} items): circuit {s['n_edges']} edges ({s['selection']} {s['top_n']}), "
            f"{s['n_nodes']} nodes, {100 * s['param_fraction']:.2f}% of block params; faithfulness "
            f"{s['circuit_faithfulness']:.3f}; curve CPR {s['cpr']:.3f}, CMD {s['cmd']:.3f} ({s['ablation']} ablation)"
        )
        return
    typer.echo(
        f"circuit: {s['n_edges']} edges, {s['n_nodes']} nodes, {100 * s['param_fraction']:.2f}% of block params "
        f"({100 * s['param_fraction_with_embeddings']:.2f}% of all, embeddings included); "
        f"NLL full {s['full_nll']:.3f} / circuit {s['circuit_nll']:.3f} / ablated {s['ablated_nll']:.3f}; "
        f"target rank {s['circuit_target_rank']} (full {s['full_target_rank']}, "
        f"random circuit {s['random_circuit_target_rank']})"
    )
