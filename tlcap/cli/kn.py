"""``tlcap kn``: knowledge neurons of one fact (parse → config → call → write outputs)."""

from __future__ import annotations

from pathlib import Path

import typer

from tlcap.attribution.config import IGConfig
from tlcap.cli import app
from tlcap.cli._common import (
    batch_rows_option,
    batch_rows_value,
    device_option,
    dtype_option,
    load,
    max_memory_option,
    model_option,
    overwrite_option,
    seed_everything,
    staged_output,
    write_outputs,
)
from tlcap.experiments.knowledge_neurons import KNConfig, check_fact, locate_knowledge_neurons


def _pct(x: float | None) -> str:
    return "none (--n-random 0)" if x is None else f"{x:+.1%}"


@app.command("kn")
def kn(
    model: str = model_option(),
    device: str = device_option(),
    dtype: str = dtype_option(),
    prompt: str = typer.Option(..., help="The query, e.g. 'The capital of France is'."),
    target: str = typer.Option(..., help="The answer with its leading space, e.g. ' Paris'."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, result/); must not hold a finished run."),
    paraphrase: list[str] | None = typer.Option(None, help="A paraphrase of the prompt (repeatable) for refinement."),
    steps: int = typer.Option(20, help="Integration steps m (>= 1)."),
    rule: str = typer.Option(
        "midpoint", help="Quadrature: midpoint | left (Dai's code) | right (Dai, QL eq. 10 as printed) | linspace "
        "(EleutherAI) | trapezoid | cnl (CNL eq. 7, steps+1 points) | gauss_legendre (captum). See docs/kn.md."
    ),
    method: str = typer.Option("ig", help="ig (exact) | joint | grad_x_act (cheaper estimators)."),
    site: str = typer.Option("mlp_post", help="mlp_post (neuron activations) or mlp_pre."),
    threshold: float = typer.Option(0.2, help="Keep neurons with score > threshold * max, in (0, 1) (Dai: 0.2)."),
    top_k: int | None = typer.Option(None, help="Keep the top-k neurons (>= 1) instead of thresholding."),
    refine_p: float = typer.Option(
        0.5, help="With paraphrases: keep neurons found in more than this share of prompts, in [0, 1)."
    ),
    n_random: int = typer.Option(10, help="Random neuron sets (same count per layer) for the control; 0 = no control."),
    seed: int = typer.Option(0, help="Seed of the random controls."),
    batch_rows: str = batch_rows_option(),
    max_memory: str | None = max_memory_option(),
    overwrite: bool = overwrite_option(),
) -> None:
    """Locate the knowledge neurons of a fact and test them by suppression and enhancement."""
    rows = batch_rows_value(batch_rows, max_memory)
    cfg = KNConfig(ig=IGConfig(steps=steps, rule=rule, method=method, site=site, batch_rows=rows,
                               max_memory=max_memory), threshold=threshold, top_k=top_k,
                   refine_p=refine_p, n_random=n_random, seed=seed)
    check_fact(prompt, target, paraphrase or [])  # before any model load (warnings: one line each, once per run)
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        res = locate_knowledge_neurons(m, prompt, target, paraphrase or [], config=cfg)
        write_outputs(stage.path, res, figures={"kn_heatmap": res.heatmap(), "kn_activations": res.activation_heatmap()},
                      tables={"kn_neurons": res.to_frame()})
    e = res.effects
    typer.echo(f"wrote {stage.out}")
    if len(res.neurons) == 0:
        typer.echo(f"0 neurons (empty located set: no intervention run); P(target)={res.target_prob:.3f}; "
                   f"completeness error {res.completeness_rel_error:.2%}")
        return
    typer.echo(
        f"{len(res.neurons)} neurons; P(target)={res.target_prob:.3f}; suppress located "
        f"{_pct(e['suppress_located'])} vs random {_pct(e['suppress_random'])}; completeness error "
        f"{res.completeness_rel_error:.2%}"
    )
