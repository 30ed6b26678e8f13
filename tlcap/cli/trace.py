"""``tlcap trace`` (causal tracing) and ``tlcap edit`` (ROME): parse → config → call → write outputs."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from tlcap.cli import app
from tlcap.cli._checks import layers_fit, spec
from tlcap.cli._common import (
    batch_rows_option,
    batch_rows_value,
    check_device_dtype,
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
from tlcap.config import check_int, check_str
from tlcap.data.knowns import load_known_facts
from tlcap.errors import InvalidConfigError
from tlcap.intervene.rome import RomeConfig, evaluate_rome, rome_sweep
from tlcap.locate.causal_trace import TraceConfig, causal_trace, trace_dataset
from tlcap.locate.subjects import check_subject

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_layers(spec: str | None, option: str = "--layers") -> list[int] | None:
    """``"0-5,7,10"`` → ``[0, 1, 2, 3, 4, 5, 7, 10]``; ``None`` or ``""`` → ``None`` (all layers).

    Bounds against the model are checked after it is loaded (before any forward pass).

    Raises:
        InvalidConfigError: a part that is not a layer number ``>= 0`` or a range ``a-b`` with ``a <= b``.
    """
    if spec is None or not spec.strip():
        return None
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        m = _RANGE.match(part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise InvalidConfigError(
                f"layers ({option}) cannot read {part!r} in {spec!r}; give layer numbers >= 0 and ranges such as 0-5,10"
            )
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        out.extend(range(a, b + 1))
    return out


def parse_kinds(spec: str) -> tuple[str, ...]:
    """``"resid,mlp"`` → ``("resid", "mlp")`` (checked by :class:`TraceConfig`)."""
    return tuple(k.strip() for k in spec.split(",") if k.strip())


def parse_tokens(spec: str) -> str | tuple[int, ...]:
    """``"last_subject"`` → itself; ``"0,3,-1"`` → ``(0, 3, -1)`` (checked by :class:`TraceConfig`).

    Raises:
        InvalidConfigError: a list that mixes positions and words (``"3,abc"``).
    """
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    numeric = [p.lstrip("-").isdigit() for p in parts]
    if any(numeric) and not all(numeric):
        bad = [p for p, n in zip(parts, numeric) if not n]
        raise InvalidConfigError(f"tokens (--tokens) {bad[0]!r} in {spec!r} is not a position; give all, subject, "
                                 "last_subject or positions such as 0,3,-1 (counted with the BOS under --bos)")
    if parts and all(numeric):
        return tuple(int(p) for p in parts)
    return spec.strip()


@app.command("trace")
def trace_cmd(
    model: str = model_option("smollm2-135m"),
    device: str = device_option(),
    dtype: str = dtype_option(),
    prompt: str | None = typer.Option(None, help="The fact's prompt, e.g. 'The capital of France is'."),
    subject: str | None = typer.Option(None, help="Subject as written in the prompt (its tokens are noised)."),
    occurrence: int | None = typer.Option(None, help="Which occurrence of the subject to noise when it occurs more "
                                                     "than once (0-based, -1 = last; default the first, warned)."),
    target: str | None = typer.Option(None, help="Answer scored (first token); default: the model's prediction."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, result/); must not hold a finished run."),
    samples: int = typer.Option(10, help="Noise samples per cell (>= 1)."),
    noise: float | None = typer.Option(None, help="Noise std ν (> 0; default noise-factor × the std --noise-from names)."),
    noise_factor: float = typer.Option(3.0, help="ν = factor × std when --noise is not given (> 0; ROME: 3)."),
    noise_from: str = typer.Option("subjects", help="Std of: subjects (token embeddings of the subjects, ROME) | "
                                                    "embedding (all of W_E)."),
    bos: bool = typer.Option(False, "--bos", help="Prepend the model's BOS token so the subject is not at position 0 "
                                                  "(the attention sink)."),
    window: int = typer.Option(10, help="Layers restored per MLP/attention cell (>= 1)."),
    kinds: str = typer.Option("resid,mlp,attn", help="Comma-separated kinds to trace: resid, mlp, attn."),
    layers: str | None = typer.Option(None, help="Layers to trace, e.g. '0-5,10' (default all)."),
    top_k: int = typer.Option(3, help="Located layers reported (CNL uses 3)."),
    tokens: str = typer.Option("all", help="Token rows traced: all | subject | last_subject (ROME's and CNL's "
                                           "located layers read only that row) | positions, e.g. '0,3,-1' (with --bos the BOS "
                                           "is position 0)."),
    seed: int = typer.Option(0, help="Noise seed (>= 0)."),
    batch_rows: str = batch_rows_option(),
    max_memory: str | None = max_memory_option(),
    dataset: str | None = typer.Option(None, help="Dataset mode: 'known' (ROME's known facts, bundled) or a "
                                                  "known_1000.json-style file of facts."),
    n_facts: int = typer.Option(20, help="Dataset mode: number of facts (>= 1)."),
    use_attribute: bool = typer.Option(False, "--use-attribute", help="Dataset mode: score each fact's attribute "
                                                                      "instead of the model's own prediction."),
    overwrite: bool = overwrite_option(),
) -> None:
    """Causal tracing of one fact (or the average over a dataset with --dataset)."""
    cfg = TraceConfig(kinds=parse_kinds(kinds), layers=parse_layers(layers), window=window, samples=samples,
                      noise_std=noise, noise_factor=noise_factor, noise_from=noise_from, bos=bos, seed=seed,
                      top_k=top_k, use_attribute=use_attribute, batch_rows=batch_rows_value(batch_rows, max_memory),
                      max_memory=max_memory, tokens=parse_tokens(tokens))
    if dataset is not None:
        if prompt is not None or subject is not None or target is not None or occurrence is not None:
            raise InvalidConfigError("--dataset traces the dataset's facts; leave out --prompt, --subject, --target "
                                     "and --occurrence")
        check_int("n_facts", n_facts, min=1)
        facts = load_known_facts(None if dataset == "known" else dataset, n_facts)
    else:
        if prompt is None or subject is None:
            raise InvalidConfigError("trace needs --prompt and --subject (or --dataset for dataset mode)")
        check_subject(prompt, subject, occurrence)
        if target is not None:
            check_str("target", target)
    check_device_dtype(device, dtype)
    layers_fit(spec(model), cfg.layers, "layers", "--layers")  # before the model load, from its config
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        if dataset is not None:
            ds = trace_dataset(m, facts, config=cfg, progress=True)
            write_outputs(stage.path, ds, figures={"average_effect": ds.figure(),
                                                   "average_effect_last_subject": ds.line_figure()})
        else:
            tr = causal_trace(m, prompt, subject, target, config=cfg, occurrence=occurrence, progress=True)
            summary = write_outputs(stage.path, tr, figures={"causal_trace": tr.figure()})
    typer.echo(f"wrote {stage.out}")
    if dataset is not None:
        typer.echo(f"{ds.n_facts} facts: clean p={ds.clean_prob:.4f}  corrupted p={ds.corrupted_prob:.4f}  "
                   f"({ds.seconds:.1f}s)")
    else:
        typer.echo(f"clean p={tr.clean_prob:.4f}  corrupted p={tr.corrupted_prob:.4f}  top layers "
                   f"{summary['top_layers']}  ({tr.seconds:.1f}s)")


@app.command("edit")
def edit_cmd(
    model: str = model_option("smollm2-135m"),
    device: str = device_option(),
    dtype: str = dtype_option(),
    prompt: str = typer.Option(..., help="Prompt containing the subject, e.g. 'The Eiffel Tower is located in'."),
    subject: str = typer.Option(..., help="Subject as written in the prompt."),
    occurrence: int | None = typer.Option(None, help="Which occurrence of the subject to edit when it occurs more "
                                                     "than once (0-based, -1 = last; default the first, warned)."),
    target_new: str = typer.Option(..., help="New object, e.g. ' Rome' (leading space)."),
    out: Path = typer.Option(..., help="Output folder (summary.json, figures, result/); must not hold a finished run."),
    layer: int | None = typer.Option(None, help="Layer to edit (>= 0; required unless --all-layers)."),
    all_layers: bool = typer.Option(False, "--all-layers", help="Edit each layer separately (restored between)."),
    layers: str | None = typer.Option(None, help="With --all-layers: a subset of layers, e.g. '0-5,10' (default all)."),
    target_old: str | None = typer.Option(None, help="Current object (default: the model's top next token)."),
    paraphrase: list[str] = typer.Option([], help="Paraphrase prompt (repeatable); default two prefixed variants."),
    neighbour: list[str] = typer.Option([], help="Unrelated prompt (repeatable); default 10 generic facts."),
    steps: int = typer.Option(20, help="Adam steps for the value vector (>= 1)."),
    lr: float = typer.Option(0.5, help="Adam learning rate (> 0)."),
    kl_factor: float = typer.Option(0.0625, help="Weight of the KL essence term (>= 0)."),
    weight_decay: float = typer.Option(0.5, help="Weight decay of the value vector (>= 0)."),
    clamp_norm_factor: float = typer.Option(4.0, help="Clamp ‖δ‖ to this factor × ‖v₀‖ (> 0)."),
    stop_loss: float = typer.Option(0.05, help="Stop the optimisation when the loss falls below this (>= 0)."),
    cov_tokens: int = typer.Option(8192, help="WikiText-2 tokens for the key covariance (cached; >= 1)."),
    cov_reg: float = typer.Option(0.01, help="Relative ridge added to the key covariance (>= 0; 0 = ROME)."),
    seed: int = typer.Option(0, help="Seed (>= 0)."),
    bos: bool = typer.Option(False, "--bos", help="Prepend the model's BOS token to every prompt (the subject is then "
                                                  "not at position 0, the attention sink)."),
    overwrite: bool = overwrite_option(),
) -> None:
    """ROME edit at one layer (or at every layer with --all-layers) with efficacy/specificity metrics."""
    cfg = RomeConfig(steps=steps, lr=lr, kl_factor=kl_factor, weight_decay=weight_decay,
                     clamp_norm_factor=clamp_norm_factor, stop_loss=stop_loss, cov_tokens=cov_tokens, cov_reg=cov_reg,
                     seed=seed, bos=bos)
    check_subject(prompt, subject, occurrence)
    check_str("target_new", target_new)
    if all_layers and layer is not None:
        raise InvalidConfigError("give --layer L or --all-layers, not both")
    if not all_layers:
        if layer is None:
            raise InvalidConfigError("edit needs --layer L (or --all-layers)")
        check_int("layer", layer, min=0)
    sweep_layers = parse_layers(layers)
    shapes = spec(model)  # layers checked before the model load, from its config
    layers_fit(shapes, layer if not all_layers else None, "layer", "--layer")
    layers_fit(shapes, sweep_layers if all_layers else None, "layers", "--layers")
    paras = list(paraphrase) or None
    neigh = list(neighbour) or None
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        if all_layers:
            sweep = rome_sweep(m, prompt, subject, target_new, sweep_layers, target_old, paras, neigh, config=cfg,
                               occurrence=occurrence, progress=True)
            summary = write_outputs(stage.path, sweep, figures={"rome_layers": sweep.figure()},
                                    tables={"rome_layers": sweep.to_frame()})
        else:
            assert layer is not None
            res = evaluate_rome(m, prompt, subject, target_new, layer, target_old, paras, neigh, config=cfg,
                                occurrence=occurrence, progress=True)
            write_outputs(stage.path, res, figures={"rome_edit": res.figure()})
    typer.echo(f"wrote {stage.out}")
    if all_layers:
        typer.echo(f"efficacy by layer: {[int(bool(e)) for e in summary['efficacy']]}")
    else:
        typer.echo(f"layer {layer}: efficacy={res.efficacy} paraphrase={res.paraphrase:.2f} "
                   f"specificity={res.specificity:.2f} P(new) {res.new_prob_before:.4f} → {res.new_prob_after:.4f} "
                   f"({res.seconds:.1f}s)")
