"""``tlcap circuit``: the knowledge circuit of one fact, or of a dataset (parse → config → call → write outputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import typer

from tlcap.cli import app
from tlcap.cli._checks import neurons_fit, spec
from tlcap.cli._common import (
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
from tlcap.config import check_choice, check_int
from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.config import (
    ABLATIONS,
    DEFAULT_TOP_NODES,
    GRANULARITIES,
    EAPConfig,
    check_circuit_inputs,
    check_node_selection,
    parse_sizes,
)
from tlcap.locate.circuits.dataset import CircuitDataset, load_circuit_dataset
from tlcap.locate.circuits.dataset_circuit import DatasetCircuit, dataset_circuit
from tlcap.locate.circuits.export import export_circuit
from tlcap.locate.circuits.knowledge_circuit import KnowledgeCircuit, knowledge_circuit
from tlcap.locate.circuits.neurons import neuron_attribution, neuron_overlap, read_neuron_pairs
from tlcap.locate.circuits.nodes import node_attribution
from tlcap.locate.circuits.task import CircuitItem
from tlcap.metrics.sets import NeuronSet
from tlcap.models import Model

DEFAULT_TOP_NEURONS = 100


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


def _check_granularity(granularity: str, dataset: str | None, greedy: bool, top_neurons: int | None,
                       kn_neurons: Path | None) -> list[tuple[int, int]] | None:
    """Refuse granularity options that do not go together (before the model is loaded); read ``--kn-neurons``."""
    check_choice("granularity", granularity, GRANULARITIES)
    if granularity != "neuron":
        for opt, value in (("--top-neurons", top_neurons), ("--kn-neurons", kn_neurons)):
            if value is not None:
                raise InvalidConfigError(f"{opt} applies to --granularity neuron: add it or drop {opt}")
    if dataset is not None:
        check_node_selection(granularity, greedy)
    if top_neurons is not None:
        check_int("top_neurons", top_neurons, min=1)
    return read_neuron_pairs(kn_neurons) if kn_neurons is not None else None


def _granularity_outputs(
    m: Model, res: KnowledgeCircuit | DatasetCircuit, ds: CircuitDataset, cfg: EAPConfig, granularity: str,
    top_neurons: int, kn_set: NeuronSet | None,
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The node or neuron tables and summary entries of ``--granularity`` (none for ``edge``)."""
    if granularity == "node":
        ns = node_attribution(res.edge_scores)
        return {"nodes": ns.to_frame()}, {"granularity": "node", "top_nodes": ns.summary()["top_nodes"]}
    if granularity != "neuron":
        return {}, {}
    _say(f"scoring every MLP neuron ({f'EAP-IG, {cfg.steps} steps' if cfg.steps > 1 else 'EAP'}, "
         f"{res.ablation} ablation) ...")
    nsc = neuron_attribution(m, ds, config=cfg.replace(ablation=res.ablation))
    top = nsc.to_frame().head(top_neurons)
    extra: dict[str, Any] = {"granularity": "neuron", "neuron_method": "eap" if cfg.steps == 1 else "eap-ig",
                             "n_top_neurons": len(top),
                             "top_neurons": [[int(r.layer), int(r.neuron), float(r.score)] for r in top.head(20).itertuples()]}
    if kn_set is not None:
        mlps = sorted(res.graph.layer_of(n) for n in res.circuit.nodes if n.startswith("m"))
        extra["kn_overlap"] = neuron_overlap(nsc, kn_set)
        extra["kn_overlap_circuit_mlps"] = neuron_overlap(nsc, kn_set, layers=mlps) if mlps else None
    return {"neurons": top}, extra


@app.command("circuit")
def circuit(
    model: str = model_option(),
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
    batch_size: str = typer.Option("auto", help="Dataset items per pass: a number >= 1, or auto (the most that fit "
                                                "--max-memory, at most 8 on a CPU, halved and rerun on out-of-memory); "
                                                "exact, bounds memory."),
    max_memory: str | None = max_memory_option(),
    known_top_k: int | None = typer.Option(None, help="ParaRel: keep facts whose answer is in the model's top-k."),
    ablation: str | None = typer.Option(
        None, help=f"What replaces non-circuit edges: {' | '.join(ABLATIONS)} (default corrupt when corrupted "
                   "prompts exist, else zero)."
    ),
    zero_ablate: bool = typer.Option(False, "--zero-ablate", help="Ablate non-circuit edges to zero instead."),
    greedy: bool = typer.Option(False, "--greedy", help="Dataset circuits: greedy selection from the logits."),
    top_n: int | None = typer.Option(None, help="Keep the top-n edges by |score|, >= 1 (default 300 without --threshold; "
                                                 "nodes for a --granularity node dataset circuit)."),
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
    granularity: str = typer.Option(
        "edge", help="edge (the circuit's edges) | node (heads/MLPs scored by the sum of their out-edge scores, "
                     f"nodes.csv; dataset circuits keep the --top-n nodes, default {DEFAULT_TOP_NODES}, and their "
                     "curve is over nodes) | neuron (MLP-neuron scores, neurons.csv; overlap with --kn-neurons)."
    ),
    top_neurons: int | None = typer.Option(
        None, help=f"--granularity neuron: neurons written to neurons.csv, >= 1 (default {DEFAULT_TOP_NEURONS})."
    ),
    kn_neurons: Path | None = typer.Option(
        None, help="--granularity neuron: a JSON list of [layer, neuron] pairs (a KN/CNL set of the same facts, or "
                   "a `tlcap kn` summary.json); summary.json gets its overlap with the top neurons."
    ),
    overwrite: bool = overwrite_option(),
) -> None:
    """Find the knowledge circuit of a fact (or a dataset's circuit) with EAP / EAP-IG and evaluate it alone."""
    _check_modes(dataset, prompt, target, corrupt_prompt, relation, n_items)
    kn = _check_granularity(granularity, dataset, greedy, top_neurons, kn_neurons)
    if sweep is not None and no_sweep:
        raise InvalidConfigError("give --sweep SIZES or --no-sweep, not both")
    if zero_ablate and ablation not in (None, "zero"):
        raise InvalidConfigError(f"give --zero-ablate or --ablation {ablation}, not both")
    sizes = parse_sizes(sweep) if sweep is not None else None
    abl = "zero" if zero_ablate else ablation
    cfg = EAPConfig(steps=ig_steps, metric=metric, ablation=abl if dataset else (abl or "corrupt"), top_n=top_n,
                    threshold=threshold, sweep=not no_sweep, sweep_sizes=sizes, seed=seed,
                    batch_size=batch_rows_value(batch_size, max_memory, "--batch-size"), max_memory=max_memory, greedy=greedy)
    if dataset is None:
        cfg = check_circuit_inputs(prompt or "", target or "", corrupt_prompt, corrupt_target, cfg)
    elif n_items is not None and n_items < 1:
        raise InvalidConfigError(f"--n-items must be >= 1, got {n_items}")
    if kn is not None:  # a --kn-neurons file of another model: refused before the load
        neurons_fit(spec(model), kn, str(kn_neurons))
    with staged_output(out, overwrite=overwrite) as stage:
        seed_everything(seed)
        m = load(model, device, dtype)
        kn_set = NeuronSet.from_list(kn, (m.n_layers, m.d_mlp)) if kn is not None else None  # shape checked now
        if dataset is not None:
            ds = load_circuit_dataset(dataset, relation=relation, n=n_items, model=m, known_top_k=known_top_k,
                                      corrupt=cfg.ablation in (None, "corrupt"))
            res: KnowledgeCircuit | DatasetCircuit = dataset_circuit(
                m, ds, config=cfg, granularity="node" if granularity == "node" else "edge", log=_say)
        else:
            res = knowledge_circuit(m, prompt or "", target or "", corrupt_prompt, corrupt_target=corrupt_target,
                                    config=cfg, log=_say)
            ds = CircuitDataset((CircuitItem(prompt or "", target or "", corrupt_prompt, corrupt_target),), "prompt")
        tables, extra = _granularity_outputs(m, res, ds, cfg, granularity, top_neurons or DEFAULT_TOP_NEURONS, kn_set)
        write_outputs(stage.path, res, figures=res.figures(), tables={"circuit_edges": res.to_frame(), **tables},
                      extra=extra or None)
        for suffix in (".dot", ".json"):
            export_circuit(res.circuit, stage.path / f"circuit{suffix}")
    s = {**res.summary(), **extra}
    typer.echo(f"wrote {stage.out}")
    if granularity == "node":
        typer.echo("top nodes: " + ", ".join(f"{n} {v:+.3g}" for n, v in s["top_nodes"][:5]))
    elif granularity == "neuron":
        typer.echo("top neurons: " + ", ".join(f"L{int(l)}.{int(j)} {v:+.3g}" for l, j, v in s["top_neurons"][:5]))
        if s.get("kn_overlap") is not None:
            o = s["kn_overlap"]
            typer.echo(f"KN overlap: {o['overlap']} of {o['n_kn']} KN neurons in the top {o['k']} "
                       f"(chance {o['chance_overlap']:.2f}, Jaccard {o['jaccard']:.3f})")
    if dataset is not None:
        typer.echo(
            f"{s['dataset']} ({s['n_items']} items): circuit {s['n_edges']} edges ({s['selection']} {s['top_n']}"
            f"{' nodes' if s['selection'] == 'node' else ''}), "
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
