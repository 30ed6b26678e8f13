"""MLP-neuron nodes: every MLP expanded into its neurons, scored like edges, compared with KN neuron sets.

A neuron ``j`` of layer ``l`` writes ``act_j * W_out[j]`` into the residual stream (``act`` = the
``mlp_post`` site: GELU output in GPT-2, ``silu(gate) * up`` in Llama), so it is a node of the
graph whose ablation replaces ``act_j`` by its ablated value at every position. Its EAP score is
the first-order estimate of that ablation's effect on the metric::

    score(l, j) = sum_pos (ablated_act - clean_act)[l, j] * d metric / d act[l, j]

averaged over the dataset's items (EAP-IG: the gradient averaged over the same input path as
the edges'). Ablated activations: the corrupted run's (``corrupt``), zeros (``zero``), or the
activation averaged over the dataset's clean real positions (``mean``; per position for
``mean-positional``). :func:`neuron_overlap` compares the top neurons (optionally only those of
a circuit's MLPs) with a knowledge-neuron set of the same facts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import DataFormatError, MissingFileError
from tlcap.locate.circuits.config import EAPConfig
from tlcap.locate.circuits.dataset import CircuitDataset, dataset_batch_size
from tlcap.locate.circuits.dataset_eval import ready_source
from tlcap.locate.circuits.eap import check_dataset_config
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.passes import run_pass
from tlcap.locate.circuits.task import CircuitTask
from tlcap.metrics.sets import NeuronSet
from tlcap.models import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.runtime.batching import run_auto_batched


@dataclass(frozen=True)
class NeuronRow:
    """One neuron of :meth:`NeuronScores.to_frame`."""

    layer: int
    neuron: int
    score: float


@dataclass(frozen=True)
class NeuronScores(Result):
    """EAP / EAP-IG scores of every MLP neuron, averaged over a dataset's items.

    Attributes:
        scores: ``[n_layers, d_mlp]`` mean neuron scores (ablated minus clean metric, first order).
        model_name, dataset, n_items, ablation, metric, steps: The run.
    """

    scores: Float[Tensor, "n_layers d_mlp"]
    model_name: str = ""
    dataset: str = ""
    n_items: int = 0
    ablation: str = ""
    metric: str = "nll"
    steps: int = 1

    def top(self, k: int, layers: Sequence[int] | None = None) -> NeuronSet:
        """The ``k`` neurons of largest ``|score|`` (only in ``layers`` when given).

        Args:
            k: How many neurons.
            layers: Layers to choose from (None: all).

        Returns:
            The :class:`NeuronSet`, by decreasing ``|score|``.
        """
        a = self.scores.abs().clone()
        if layers is not None:
            keep = torch.zeros(a.shape[0], dtype=torch.bool)
            keep[list(layers)] = True
            a[~keep] = -1.0
        idx = a.flatten().topk(min(k, int((a >= 0).sum()))).indices.tolist()
        d = a.shape[1]
        return NeuronSet.from_list([(i // d, i % d) for i in idx], tuple(a.shape))

    def summary(self, top: int = 20) -> dict[str, Any]:
        """The run and the ``top`` neurons.

        Args:
            top: How many top neurons to list.

        Returns:
            A JSON-ready dict (``top_neurons`` as ``[layer, neuron, score]`` rows).
        """
        rows = self.to_frame().head(top)
        return {"model": self.model_name, "dataset": self.dataset, "n_items": self.n_items, "ablation": self.ablation,
                "metric": self.metric, "ig_steps": self.steps, "top_neurons": rows.values.tolist()}

    def to_frame(self) -> pd.DataFrame:
        """One :class:`NeuronRow` per neuron, by decreasing ``|score|``.

        Returns:
            A DataFrame of :class:`NeuronRow` (layer, neuron, score).
        """
        d = self.scores.shape[1]
        order = self.scores.abs().flatten().argsort(descending=True).tolist()
        flat = self.scores.flatten().tolist()
        return frame([NeuronRow(i // d, i % d, flat[i]) for i in order], NeuronRow)

    def figure(self) -> go.Figure:
        """The ``[layer x neuron]`` score matrix as a heatmap.

        Returns:
            A plotly heatmap (layers as rows), centred at 0.
        """
        fig = go.Figure(go.Heatmap(z=self.scores.double().numpy(), colorscale="RdBu", zmid=0.0))
        fig.update_layout(title=f"MLP-neuron scores ({self.dataset or 'prompt'}, {self.n_items} items)",
                          xaxis_title="neuron", yaxis_title="layer", template="plotly_white")
        return fig


def _ablated_acts(model: Model, graph: EdgeGraph, tasks: Sequence[CircuitTask], ablation: str,
                  names: list[str]) -> list[Tensor] | Tensor:
    """Per task ``[b, L, pos, d_mlp]`` ablated activations (corrupt/zero), or fitted means ``[L, pos|1, d_mlp]``."""
    if ablation in ("corrupt", "zero"):
        out = []
        for t in tasks:
            if ablation == "zero" or t.corrupt is None:
                out.append(torch.zeros(t.n_items, len(names), t.clean.shape[1], model.d_mlp, device=t.clean.device))
                continue
            r = run_pass(model, graph, t, t.corrupt, items=torch.arange(t.n_items), record_sites=tuple(names))
            assert r.sites is not None
            out.append(torch.stack([r.sites[n] for n in names], 1))
        return out
    total: Tensor | None = None
    count: Tensor | None = None
    width = max(t.clean.shape[1] for t in tasks)
    for t in tasks:
        r = run_pass(model, graph, t, t.clean, items=torch.arange(t.n_items), record_sites=tuple(names))
        assert r.sites is not None
        real = t.real_positions().double()  # [b, pos]
        acts = torch.stack([r.sites[n] for n in names], 1).double() * real[:, None, :, None]  # [b, L, pos, d]
        pad = width - acts.shape[2]
        s = torch.nn.functional.pad(acts.sum(0), (0, 0, 0, pad))
        c = torch.nn.functional.pad(real.sum(0), (0, pad))
        total = s if total is None else total + s
        count = c if count is None else count + c
    assert total is not None and count is not None
    if ablation == "mean":
        return (total.sum(1, keepdim=True) / count.sum()).to(model.dtype)
    return (total / count.clamp(min=1)[None, :, None]).to(model.dtype)


def neuron_attribution(
    model: Model, dataset: CircuitDataset, *, config: EAPConfig | None = None, **overrides: Any
) -> NeuronScores:
    """Score every MLP neuron as a node (module docstring), averaged over the dataset's items.

    Args:
        model: The model.
        dataset: The items.
        config: An :class:`EAPConfig` (``steps``, ``ablation``, ``batch_size``).
        **overrides: Its fields.

    Returns:
        The :class:`NeuronScores`, with provenance.

    Example:
        >>> from tlcap.locate.circuits import load_circuit_dataset
        >>> dataset = load_circuit_dataset("pararel", relation="P36", n=8, model=model)
        >>> ns = neuron_attribution(model, dataset, steps=5)
        >>> kn_set = NeuronSet(((0, 5), (1, 9)), shape=(model.n_layers, model.d_mlp))   # e.g. knowledge neurons
        >>> ov = neuron_overlap(ns, kn_set)
        >>> ov["k"], ov["overlap"], ov["chance_overlap"]
        (2, 0, 0.0078125)
    """
    cfg = check_dataset_config(dataset, EAPConfig.resolve(config, **overrides))
    if cfg.batch_size == "auto":  # most items in the budget, rerun at half on out-of-memory: same scores
        size = dataset_batch_size(model, dataset, "auto", cfg.steps, cfg.max_memory)
        return run_auto_batched(lambda b: neuron_attribution(model, dataset, config=cfg.replace(batch_size=b)), size,
                                model.device, asked=cfg)
    ablation = str(cfg.ablation)
    d = dataset if ablation == "corrupt" else dataset.without_corrupt()
    tasks = d.tasks(model, cfg.batch_size, cfg.metric)
    graph = EdgeGraph.from_model(model)
    names = [model.hook_name("mlp_post", layer) for layer in range(model.n_layers)]
    abl = _ablated_acts(model, graph, tasks, ablation, names)
    total = torch.zeros(model.n_layers, model.d_mlp, dtype=torch.float64)
    k = cfg.steps
    source = ready_source(model, graph, tasks, ablation) if k > 1 else None
    for i, t in enumerate(tasks):
        n, pos = t.clean.shape
        items = torch.arange(n)
        clean = run_pass(model, graph, t, t.clean, items=items, record_upstream=k > 1, record_sites=tuple(names),
                         grads=k == 1)
        assert clean.sites is not None
        c_act = torch.stack([clean.sites[nm] for nm in names], 1)  # [b, L, pos, d]
        a_act = abl[i] if isinstance(abl, list) else abl[None, :, :pos].expand(n, -1, pos, -1)
        if k == 1:
            assert clean.site_grads is not None
            grad = torch.stack([clean.site_grads[nm] for nm in names], 1)
        else:  # EAP-IG: the same input path as the edges (the ablated input embedding is the input node's)
            assert clean.upstream is not None and source is not None
            x0 = source.run(model, graph, t).upstream[:, 0].to(c_act.dtype)
            alphas = ((torch.arange(k, dtype=torch.float32) + 0.5) / k).to(c_act.dtype)
            x = x0[:, None] + alphas[None, :, None, None] * (clean.upstream[:, 0] - x0)[:, None]
            rows = items.repeat_interleave(k)
            ig = run_pass(model, graph, t, t.clean[rows], items=rows, input_value=x.flatten(0, 1), grads=True,
                          record_sites=tuple(names))
            assert ig.site_grads is not None
            grad = torch.stack([ig.site_grads[nm] for nm in names], 1).unflatten(0, (n, k)).mean(1)
        total += ((a_act.to(c_act.dtype) - c_act).double() * grad.double()).sum((0, 2)).cpu()
    return NeuronScores(
        scores=(total / len(dataset)).float(), model_name=model.name, dataset=dataset.name, n_items=len(dataset),
        ablation=ablation, metric=cfg.metric, steps=k, provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


def neuron_overlap(scores: NeuronScores, kn: NeuronSet, k: int | None = None,
                   layers: Sequence[int] | None = None) -> dict[str, Any]:
    """Overlap of the top-``k`` circuit neurons with a knowledge-neuron set of the same facts.

    Args:
        scores: Neuron scores.
        kn: The KN (or CNL) neuron set, of the same model.
        k: Neurons to take from the circuit (default ``len(kn)``).
        layers: Only neurons of these layers (e.g. the MLPs of an edge circuit).

    Returns:
        ``k``, ``n_kn``, ``overlap`` (shared neurons), ``jaccard``, ``kn_recall`` (share of KN
        neurons among the top-k), ``chance_overlap`` (expected overlap of ``k`` random neurons
        from the candidate layers) and the shared neurons.
    """
    k = len(kn.neurons) if k is None else k
    top = scores.top(k, layers)
    shared = sorted(set(top.neurons) & set(kn.neurons))
    n_cand = scores.scores.shape[1] * (len(layers) if layers is not None else scores.scores.shape[0])
    union = len(set(top.neurons) | set(kn.neurons))
    return {"k": len(top.neurons), "n_kn": len(kn.neurons), "overlap": len(shared),
            "jaccard": len(shared) / union if union else float("nan"),
            "kn_recall": len(shared) / len(kn.neurons) if kn.neurons else float("nan"),
            "chance_overlap": len(top.neurons) * len(kn.neurons) / n_cand, "shared": [list(x) for x in shared]}


def read_neuron_pairs(path: str | Path) -> list[tuple[int, int]]:
    """The ``[layer, neuron]`` pairs of a JSON file: a list of pairs, or an object whose ``"neurons"`` is one
    (the ``summary.json`` of ``tlcap kn``). Checked before any model is loaded; the model's shape is checked
    by :class:`NeuronSet`.

    Args:
        path: The JSON file.

    Returns:
        ``(layer, neuron)`` tuples, in file order.

    Raises:
        MissingFileError: no such file.
        DataFormatError: not JSON, or not a list of pairs of integers ``>= 0``.
    """
    p = Path(path)
    if not p.is_file():
        raise MissingFileError(f"--kn-neurons {p} not found; give a JSON file of [layer, neuron] pairs")
    hint = "must be a JSON list of [layer, neuron] integer pairs, e.g. [[3, 10], [5, 7]]"
    try:
        data = json.loads(p.read_text())
    except ValueError as exc:
        raise DataFormatError(f"--kn-neurons {p} is not valid JSON ({exc}); it {hint}") from None
    if isinstance(data, dict) and "neurons" in data:
        data = data["neurons"]
    if not isinstance(data, list):
        raise DataFormatError(f"--kn-neurons {p} {hint}, got a JSON {type(data).__name__}")
    for i, pair in enumerate(data):
        ok = isinstance(pair, list) and len(pair) == 2 and all(type(x) is int and x >= 0 for x in pair)
        if not ok:
            raise DataFormatError(f"--kn-neurons {p} {hint}; item {i} is {json.dumps(pair)}")
    return [(a, b) for a, b in data]


__all__ = ["NeuronRow", "NeuronScores", "neuron_attribution", "neuron_overlap", "read_neuron_pairs"]
