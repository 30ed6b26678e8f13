"""TransformerLens compatibility for the circuit benchmark and tests (not part of the tlcap library).

TransformerLens 4.x (``transformer_lens.tools.analysis.attribution_patching``) scores
``(writer, reader)`` node pairs per sequence position. :func:`tl_edge_matrix` sums them over
positions and maps them onto tlcap's :class:`~tlcap.locate.circuits.EdgeGraph`, so its scores
can be compared with ``edge_attribution(..., direction="denoising")`` (TL's convention);
:func:`gqa_edges` is TL's ``enumerate_edges`` with one k/v reader per kv head, what its edge
mode would need on a grouped-query model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformer_lens.tools.analysis.attribution_patching import Node

from tlcap.locate.circuits import EdgeGraph


def tl_edge_matrix(graph: EdgeGraph, edge_scores: dict) -> Tensor:
    """Dense ``[n_upstream, n_readers]`` float64 matrix from TransformerLens ``attribution_patch`` edges.

    Node kinds map as ``embed`` -> ``input``, ``attn_head_out`` -> ``a{l}.h{h}``, ``mlp_out`` ->
    ``m{l}``, ``q/k/v_input`` -> ``a{l}.h{h}<q/k/v>`` (``a{l}.kv{g}<k/v>`` when a GQA edge list
    uses kv-head indices), ``mlp_in`` -> ``m{l}``, ``logits`` -> ``logits``.

    Args:
        graph: tlcap's graph of the same model.
        edge_scores: TL's ``AttributionResult.edge_scores`` (``{(writer, reader): score}``).

    Returns:
        The position-summed scores.
    """
    up = {n: i for i, n in enumerate(graph.upstream)}
    rd = {n: i for i, n in enumerate(graph.readers)}
    gqa = graph.n_kv_heads != graph.n_heads
    out = torch.zeros(graph.n_upstream, graph.n_readers, dtype=torch.float64)

    def wname(n: Any) -> str:
        return {"embed": "input", "mlp_out": f"m{n.layer}"}.get(n.kind, f"a{n.layer}.h{n.head}")

    def rname(n: Any) -> str:
        if n.kind == "logits":
            return "logits"
        if n.kind == "mlp_in":
            return f"m{n.layer}"
        kind = n.kind[0]
        if gqa and kind in "kv":
            return f"a{n.layer}.kv{n.head}<{kind}>"
        return f"a{n.layer}.h{n.head}<{kind}>"

    for (w, r), s in edge_scores.items():
        out[up[wname(w)], rd[rname(r)]] += float(s)
    return out


def gqa_edges(n_layers: int, n_heads: int, n_kv_heads: int, seq_len: int) -> list:
    """TL ``enumerate_edges`` with k/v readers per kv head (what grouped-query attention needs).

    Args:
        n_layers: Layers.
        n_heads: Query heads per layer.
        n_kv_heads: Key/value heads per layer.
        seq_len: Positions.

    Returns:
        ``[(writer Node, reader Node), ...]`` for every position.
    """
    edges = []
    for p in range(seq_len):
        avail = [Node(kind="embed", position=p)]
        for l in range(n_layers):
            readers = [Node(kind="q_input", layer=l, head=h, position=p) for h in range(n_heads)]
            readers += [Node(kind=k, layer=l, head=g, position=p) for k in ("k_input", "v_input") for g in range(n_kv_heads)]
            for r in readers:
                edges += [(w, r) for w in avail]
            avail = avail + [Node(kind="attn_head_out", layer=l, head=h, position=p) for h in range(n_heads)]
            edges += [(w, Node(kind="mlp_in", layer=l, position=p)) for w in avail]
            avail = avail + [Node(kind="mlp_out", layer=l, position=p)]
        edges += [(w, Node(kind="logits", layer=n_layers - 1, position=p)) for w in avail]
    return edges
