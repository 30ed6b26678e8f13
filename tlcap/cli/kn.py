"""``tlcap kn``: knowledge neurons of one fact."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tlcap.cli import app
from tlcap.cli._common import load, out_dir, seed_everything, write_summary


@app.command("kn")
def kn(
    model: str = typer.Option(..., help="Model name (smollm2-135m, gpt2, gpt2-small-random, ...) or path."),
    prompt: str = typer.Option(..., help="The query, e.g. 'The capital of France is'."),
    target: str = typer.Option(..., help="The answer with its leading space, e.g. ' Paris'."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, tensors)."),
    paraphrase: Optional[List[str]] = typer.Option(None, help="A paraphrase of the prompt (repeatable) for refinement."),
    steps: int = typer.Option(20, help="Integration steps m."),
    rule: str = typer.Option("midpoint", help="Quadrature: midpoint | left (Dai) | linspace (EleutherAI) | trapezoid."),
    method: str = typer.Option("ig", help="ig (exact) | joint | grad_x_act (cheaper estimators)."),
    site: str = typer.Option("mlp_post", help="mlp_post (neuron activations) or mlp_pre."),
    threshold: float = typer.Option(0.2, help="Keep neurons with score > threshold * max (Dai: 0.2)."),
    top_k: Optional[int] = typer.Option(None, help="Keep the top-k neurons instead of thresholding."),
    refine_p: float = typer.Option(0.5, help="With paraphrases: keep neurons found in more than this share of prompts."),
    n_random: int = typer.Option(10, help="Random neuron sets (same count per layer) for the control; 0 = none."),
    seed: int = typer.Option(0, help="Seed of the random controls."),
) -> None:
    """Locate the knowledge neurons of a fact and test them by suppression and enhancement."""
    from tlcap.experiments.knowledge_neurons import KNConfig, locate_knowledge_neurons
    from tlcap.viz import save_figure

    cfg = KNConfig(steps=steps, rule=rule, method=method, site=site, threshold=threshold, top_k=top_k,
                   refine_p=refine_p, n_random=n_random, seed=seed)
    seed_everything(seed)
    d = out_dir(out)
    m = load(model)
    res = locate_knowledge_neurons(m, prompt, target, paraphrase or [], config=cfg)
    res.save(d / "result")
    figs = save_figure(res.heatmap(), d, "kn_heatmap") + save_figure(res.activation_heatmap(), d, "kn_activations")
    prov = res.provenance.to_dict() if res.provenance is not None else None
    write_summary(d, {**res.summary(), "figures": [p.name for p in figs], "provenance": prov})
    e = res.effects
    rnd = "none" if e["suppress_random"] is None else f"{e['suppress_random']:+.1%}"
    typer.echo(
        f"{len(res.neurons)} neurons; P(target)={res.target_prob:.3f}; suppress located "
        f"{e['suppress_located']:+.1%} vs random {rnd}; completeness error {res.completeness_rel_error:.2%}"
    )
