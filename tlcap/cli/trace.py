"""``tlcap trace`` (causal tracing) and ``tlcap edit`` (ROME) commands."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from tlcap.cli import app
from tlcap.cli._common import load, out_dir, seed_everything, write_summary
from tlcap.errors import TlcapError


class CliOptionError(TlcapError, ValueError):
    """A missing or out-of-range command-line option."""


def _parse_layers(spec: str | None, n_layers: int) -> list[int] | None:
    """``"0-5,7,10"`` → ``[0, 1, 2, 3, 4, 5, 7, 10]``; ``None`` → all."""
    if not spec:
        return None
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    bad = [l for l in out if not 0 <= l < n_layers]
    if bad:
        raise CliOptionError(f"layers {bad} out of range (the model has {n_layers} layers, 0..{n_layers - 1}).")
    return out


@app.command("trace")
def trace_cmd(
    model: str = typer.Option("smollm2-135m", help="Model name (see tlcap.models.REGISTRY)."),
    prompt: str | None = typer.Option(None, help="The fact's prompt, e.g. 'The capital of France is'."),
    subject: str | None = typer.Option(None, help="Subject as written in the prompt (its tokens are noised)."),
    target: str | None = typer.Option(None, help="Answer scored (first token); default: the model's prediction."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, result)."),
    samples: int = typer.Option(10, help="Noise samples per cell."),
    noise: float | None = typer.Option(None, help="Noise std ν (default noise-factor × std of W_E)."),
    noise_factor: float = typer.Option(3.0, help="ν = factor × std(W_E) when --noise is not given."),
    window: int = typer.Option(10, help="Layers restored per MLP/attention cell."),
    kinds: str = typer.Option("resid,mlp,attn", help="Comma-separated kinds to trace."),
    layers: str | None = typer.Option(None, help="Layers to trace, e.g. '0-5,10' (default all)."),
    top_k: int = typer.Option(3, help="Located layers reported (CNL uses 3)."),
    seed: int = typer.Option(0, help="Noise seed."),
    batch_rows: int = typer.Option(256, help="Rows per forward pass."),
    dataset: str | None = typer.Option(None, help="Dataset mode: 'known' (ROME's known facts, bundled) or a "
                                          "known_1000.json-style file of facts."),
    n_facts: int = typer.Option(20, help="Dataset mode: number of facts."),
) -> None:
    """Causal tracing of one fact (or the average over a dataset with --dataset)."""
    from tlcap.data.knowns import load_known_facts
    from tlcap.locate.causal_trace import causal_trace, trace_dataset
    from tlcap.viz import save_figure

    seed_everything(seed)
    kind_list = tuple(k.strip() for k in kinds.split(",") if k.strip())
    m = load(model)
    lay = _parse_layers(layers, m.n_layers)
    o = out_dir(out)
    if dataset is not None:
        facts = load_known_facts(None if dataset == "known" else dataset, n_facts)
        ds = trace_dataset(m, facts, kind_list, lay, window, samples, noise, noise_factor, seed, top_k=top_k,
                           batch_rows=batch_rows, progress=True)
        ds.save(o / "result")
        figs = save_figure(ds.figure(), o, "average_effect") + save_figure(ds.line_figure(), o, "average_effect_last_subject")
        summary = {"model": model, "mode": "dataset", **ds.summary(), "figures": [p.name for p in figs]}
        write_summary(o, summary)
        return
    if not prompt or not subject:
        raise CliOptionError("trace needs --prompt and --subject (or --dataset FILE for dataset mode).")
    tr = causal_trace(m, prompt, subject, target, kind_list, lay, window, samples, noise, noise_factor, seed,
                      batch_rows=batch_rows, progress=True)
    tr.save(o / "result")
    figs = save_figure(tr.figure(), o, "causal_trace")
    summary = {"model": model, "mode": "single", **tr.summary(top_k), "figures": [p.name for p in figs]}
    write_summary(o, summary)
    typer.echo(f"clean p={tr.clean_prob:.4f}  corrupted p={tr.corrupted_prob:.4f}  top layers {summary['top_layers']}  "
               f"({tr.seconds:.1f}s)")


@app.command("edit")
def edit_cmd(
    model: str = typer.Option("smollm2-135m", help="Model name."),
    prompt: str = typer.Option(..., help="Prompt containing the subject, e.g. 'The Eiffel Tower is located in'."),
    subject: str = typer.Option(..., help="Subject as written in the prompt."),
    target_new: str = typer.Option(..., help="New object, e.g. ' Rome' (leading space)."),
    out: Path = typer.Option(..., help="Output folder."),
    layer: int | None = typer.Option(None, help="Layer to edit (required unless --all-layers)."),
    all_layers: bool = typer.Option(False, "--all-layers", help="Edit each layer separately (restored between)."),
    layers: str | None = typer.Option(None, help="With --all-layers: a subset of layers, e.g. '0-5,10' (default all)."),
    target_old: str | None = typer.Option(None, help="Current object (default: the model's top next token)."),
    paraphrase: list[str] = typer.Option([], help="Paraphrase prompt (repeatable); default two prefixed variants."),
    neighbour: list[str] = typer.Option([], help="Unrelated prompt (repeatable); default 10 generic facts."),
    steps: int = typer.Option(20, help="Adam steps for the value vector."),
    lr: float = typer.Option(0.5, help="Adam learning rate."),
    cov_tokens: int = typer.Option(8192, help="WikiText-2 tokens for the key covariance (cached)."),
    seed: int = typer.Option(0, help="Seed."),
) -> None:
    """ROME edit at one layer (or at every layer with --all-layers) with efficacy/specificity metrics."""
    from tlcap.intervene.rome import RomeConfig, evaluate_rome, rome_sweep
    from tlcap.viz import save_figure

    seed_everything(seed)
    m = load(model)
    o = out_dir(out)
    cfg = RomeConfig(steps=steps, lr=lr, cov_tokens=cov_tokens, seed=seed)
    paras = list(paraphrase) or None
    neigh = list(neighbour) or None
    t0 = time.perf_counter()
    if all_layers:
        sweep = rome_sweep(m, prompt, subject, target_new, _parse_layers(layers, m.n_layers), target_old, paras, neigh,
                           cfg, progress=True)
        sweep.save(o / "result")
        figs = save_figure(sweep.figure(), o, "rome_layers")
        summary = {"model": model, "mode": "all_layers", **sweep.summary(), "figures": [p.name for p in figs],
                   "seconds_total": time.perf_counter() - t0}
        write_summary(o, summary)
        typer.echo(f"efficacy by layer: {[int(bool(e)) for e in summary['efficacy']]}")
        return
    if layer is None:
        raise CliOptionError("edit needs --layer L (or --all-layers).")
    if not 0 <= layer < m.n_layers:
        _parse_layers(str(layer), m.n_layers)
    res = evaluate_rome(m, prompt, subject, target_new, layer, target_old, paras, neigh, cfg, progress=True)
    res.save(o / "result")
    summary = {"model": model, "mode": "single", **res.summary(), "seconds_total": time.perf_counter() - t0}
    write_summary(o, summary)
    typer.echo(f"layer {layer}: efficacy={res.efficacy} paraphrase={res.paraphrase:.2f} specificity={res.specificity:.2f} "
               f"P(new) {res.new_prob_before:.4f} → {res.new_prob_after:.4f} ({res.seconds:.1f}s)")
