"""``tlcap circuit``: the knowledge circuit of one fact (edge attribution patching)."""

from __future__ import annotations

from pathlib import Path

import typer

from tlcap.cli import app
from tlcap.cli._common import load, out_dir, seed_everything, write_summary


@app.command("circuit")
def circuit(
    model: str = typer.Option(..., help="Model name (smollm2-135m, gpt2-tiny, gpt2-small-random, ...) or path."),
    prompt: str = typer.Option(..., help="The query, e.g. 'The capital of France is'."),
    target: str = typer.Option(..., help="The answer with its leading space, e.g. ' Paris'."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, saved results)."),
    corrupt_prompt: str | None = typer.Option(
        None, help="Same-relation prompt with another subject of the same token length, e.g. 'The capital of Italy is'."
    ),
    zero_ablate: bool = typer.Option(False, "--zero-ablate", help="Ablate non-circuit edges to zero instead."),
    top_n: int | None = typer.Option(None, help="Keep the top-n edges by |score| (default 300 without --threshold)."),
    threshold: float | None = typer.Option(None, help="Keep edges with |score| > threshold instead of top-n."),
    ig_steps: int = typer.Option(5, help="EAP-IG interpolation steps (1 = plain EAP; EAP-IG is far more faithful)."),
    metric: str = typer.Option("nll", help="nll (MatchNLL of the target) | logit-diff (needs --corrupt-target)."),
    corrupt_target: str | None = typer.Option(None, help="Answer of the corrupted prompt (for --metric logit-diff)."),
    sweep: str | None = typer.Option(None, help="Comma-separated circuit sizes for the size sweep (default: log grid)."),
    no_sweep: bool = typer.Option(False, "--no-sweep", help="Skip the size sweep."),
    seed: int = typer.Option(0, help="Seed of the random-circuit control."),
) -> None:
    """Find the knowledge circuit of a fact with EAP / EAP-IG and evaluate it alone."""
    from tlcap.errors import TlcapError
    from tlcap.locate.circuits import edge_attribution, evaluate_circuit, size_sweep
    from tlcap.viz import save_figure

    if (corrupt_prompt is None) == (not zero_ablate):
        raise TlcapError("Give exactly one of --corrupt-prompt P2 or --zero-ablate.")
    if top_n is not None and threshold is not None:
        raise TlcapError("Give --top-n or --threshold, not both.")
    if top_n is None and threshold is None:
        top_n = 300
    metric_name = {"nll": "nll", "logit-diff": "logit_diff", "logit_diff": "logit_diff"}.get(metric)
    if metric_name is None:
        raise TlcapError(f"--metric must be nll or logit-diff, got {metric!r}.")
    seed_everything(seed)
    d = out_dir(out)
    m = load(model)
    typer.echo(f"scoring all edges ({'EAP-IG, %d steps' % ig_steps if ig_steps > 1 else 'EAP'}) ...", err=True)
    scores = edge_attribution(m, prompt, target, corrupt_prompt, steps=ig_steps, metric=metric_name,  # type: ignore[arg-type]
                              corrupt_target=corrupt_target)
    circ = scores.select(top_n=top_n, threshold=threshold)
    typer.echo(f"evaluating the circuit ({circ.n_edges} edges) alone ...", err=True)
    ev = evaluate_circuit(m, circ)
    rnd = evaluate_circuit(m, circ.random_like(seed))
    scores.save(d / "scores")
    circ.save(d / "circuit")
    figs = save_figure(circ.figure(), d, "circuit") + save_figure(scores.heatmap(), d, "edge_scores")
    sweep_summary = None
    if not no_sweep:
        sizes = [int(s) for s in sweep.split(",")] if sweep else None
        typer.echo("size sweep ...", err=True)
        sw = size_sweep(m, scores, sizes, seed=seed)
        sw.save(d / "sweep")
        figs += save_figure(sw.figure(), d, "size_sweep")
        sweep_summary = sw.to_frame().to_dict(orient="list")
    summary = {
        "model": m.name,
        "prompt": prompt,
        "target": target,
        "corrupt_prompt": corrupt_prompt,
        "ablation": "zero" if zero_ablate else "corrupt",
        "method": scores.method,
        "ig_steps": ig_steps,
        "metric": metric_name,
        "selection": circ.selection,
        "n_selected": circ.n_selected,
        "n_edges": circ.n_edges,
        "n_nodes": circ.n_nodes,
        "total_edges": scores.n_edges,
        "param_fraction": circ.param_fraction,
        "param_fraction_blocks": circ.param_fraction_blocks,
        "full_nll": ev.full_nll,
        "circuit_nll": ev.circuit_nll,
        "ablated_nll": ev.ablated_nll,
        "full_target_rank": ev.full_target_rank,
        "circuit_target_rank": ev.circuit_target_rank,
        "ablated_target_rank": ev.ablated_target_rank,
        "hit_at_1": ev.hit_at_1,
        "hit_at_10": ev.hit_at_10,
        "logit_diff_vs_full": ev.logit_diff_vs_full,
        "recovered": ev.recovered,
        "full_metric": ev.full_metric,
        "circuit_metric": ev.circuit_metric,
        "random_circuit_nll": rnd.circuit_nll,
        "random_circuit_target_rank": rnd.circuit_target_rank,
        "nodes": list(circ.nodes),
        "edges": [[u, v, s] for u, v, s in circ.edges],
        "sweep": sweep_summary,
        "figures": [p.name for p in figs],
    }
    write_summary(d, summary)
    typer.echo(
        f"circuit: {circ.n_edges} edges, {circ.n_nodes} nodes, {100 * circ.param_fraction:.2f}% of params; "
        f"NLL full {ev.full_nll:.3f} / circuit {ev.circuit_nll:.3f} / ablated {ev.ablated_nll:.3f}; "
        f"target rank {ev.circuit_target_rank} (full {ev.full_target_rank}, random circuit {rnd.circuit_target_rank})"
    )
