"""The computation graph of knowledge circuits: upstream writers, downstream readers, edges.

Nodes are the input embedding (``"input"``), every attention head (``"a{l}.h{h}"``), every
MLP (``"m{l}"``) and the logits (``"logits"``). The residual stream is a running sum, so the
(pre-norm) input of every *reader* is the sum of the outputs of all *upstream* nodes computed
before it, plus constant biases. An edge ``u -> v`` is one upstream output entering one
reader input:

=============================  =========================================  ==============
reader (downstream)            site (pre-LayerNorm/RMSNorm copy)          per
=============================  =========================================  ==============
``a{l}.h{h}<q>``               ``q_input`` of layer l, ``[:, :, h]``      query head
``a{l}.h{h}<k>`` / ``<v>``     ``k_input`` / ``v_input``, ``[:, :, h]``   head (MHA)
``a{l}.kv{g}<k>`` / ``<v>``    ``k_input`` / ``v_input``, ``[:, :, g]``   kv head (GQA)
``m{l}``                       ``mlp_input`` of layer l                   layer
``logits``                     ``final_in``                               model
=============================  =========================================  ==============

Upstream outputs are read at the ``resid_pre`` site of layer 0 (input: token + position
embeddings), ``head_result[:, :, h]`` (head ``h``'s write, before the sum over heads) and
``mlp_out`` (see :mod:`tlcap.runtime.sites`); :meth:`tlcap.models.Model.edge_hooks` switches
the per-head sites on.

**Grouped-query attention.** Under GQA (SmolLM2: 9 query heads, 3 kv heads) a key/value
projection is computed once per kv head and shared by the ``n_heads / n_kv_heads`` query
heads of its group; the bridge's ``k_input``/``v_input`` sites have ``n_kv_heads``
entries. There is therefore exactly one k reader and one v reader per *kv group*
(``a{l}.kv{g}<k>``), not per query head: splitting a shared key input per query head would
invent edges the model cannot realize (patching "head 0's key" would also change heads 1
and 2). A kv reader belongs to every head of its group: its edges keep those heads alive,
and it is alive when any head of its group is. With ``n_kv_heads == n_heads`` (GPT-2) this
reduces to the usual per-head ``<q>/<k>/<v>`` readers.

**Normalisation.** LayerNorm/RMSNorm sits between the residual and each reader. Following
Hanna et al. (EAP / EAP-IG) and the knowledge-circuits implementation on TransformerLens'
split inputs, each reader's input is its own *pre-norm* copy of the residual (the bridge
forks the residual per head and re-applies ``ln1`` per head), so an edge's contribution is
exactly additive there and the norm is part of the reader.

**Post-norms (Gemma-2).** A post-norm block adds ``ln1_post(Σ_h r_h)`` to the residual, not
``Σ_h r_h``: the heads' writes ``r_h`` (``head_result``) are normalised together, so a head's
``r_h`` is not a term of the residual (patching it changes every head's share through the RMS).
The graph uses the exact additive split of that output: head ``h``'s output is its share
``r_h / rms(Σ_h r_h) ⊙ γ`` with the RMS *of the same run* (:func:`tlcap.runtime.hooks.rms_norm_shares`
at the ``attn_post_norm_scale`` site; γ from :meth:`tlcap.models.Model.attn_post_norm_gain`),
and the shares sum to the post-norm's output, so the residual is again a sum of upstream outputs
and every identity above holds (full circuit = model, empty = ablated, removing a head's
out-edges = patching its share). The MLP's output is ``mlp_out``, already after ``ln2_post``.
This is a choice (``docs/deviations.md``): "patching head h" here moves its share and leaves the
other heads' shares and the RMS as they are in the run, where patching ``r_h`` would rescale them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool
from torch import Tensor

from tlcap.errors import TlcapError, UnknownNodeError, UnsupportedModelError
from tlcap.models import Model
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.runtime.sites import get_site
from tlcap.viz.circuit import node_kind, node_parameter_figure

# Parameter-group owners named as graph nodes (tlcap.models.params calls them embed/unembed).
_GROUP_ALIAS = {"embed": "input", "unembed": "logits"}
BOUNDARY_NODES = ("input", "logits")


@dataclass(frozen=True)
class ReaderHook:
    """One hook point holding the inputs of a block of consecutive readers.

    Attributes:
        name: TransformerLens hook name.
        start: Index of the first reader of this hook in :attr:`EdgeGraph.readers`.
        count: Number of readers (heads on the head axis; 1 for a ``[batch, pos, d]`` hook).
        per_head: Whether the activation has a head axis (``batch pos head d_model``).
        n_avail: Upstream nodes ``0 .. n_avail-1`` are computed before this hook fires.
        site: The site of the hook point (``"q_input"``, ``"k_input"``, ``"v_input"``,
            ``"mlp_input"`` or ``"final_in"``).
        layer: Its layer (``None`` for ``final_in``).
    """

    name: str
    start: int
    count: int
    per_head: bool
    n_avail: int
    site: str = ""
    layer: int | None = None


@dataclass(frozen=True)
class NodeRow:
    """One row of :meth:`EdgeGraph.to_frame`: a node, its parameters and its possible edges.

    Attributes:
        node: Node name. kind: ``input``, ``head``, ``MLP`` or ``logits``.
        layer: Layer (input -1, logits ``n_layers``).
        params: Parameters held by the node (shared groups split evenly, :attr:`EdgeGraph.node_params`).
        in_edges: Edges into the node's readers (a GQA kv reader's edges count for each head of its group).
        out_edges: Edges out of the node.
    """

    node: str
    kind: str
    layer: int
    params: int
    in_edges: int
    out_edges: int


@dataclass(frozen=True)
class EdgeGraph(Result):
    """Upstream nodes, readers and the valid edges between them for one model.

    Build it with :meth:`from_model`. Upstream nodes are in computation order (input, then per
    layer its heads and its MLP), so an upstream prefix ``0 .. n`` is "everything computed so
    far".

    Attributes:
        upstream: Upstream node names (``"input"``, ``"a{l}.h{h}"``, ``"m{l}"``).
        readers: Reader names (``"a{l}.h{h}<q>"``, ``"a{l}.kv{g}<k>"``, ``"m{l}"``, ``"logits"``).
        nodes: Node names: the upstream nodes then ``"logits"``.
        n_layers, n_heads, n_kv_heads: Shape facts of the model.
        node_params: Parameters held by each node (:meth:`tlcap.models.ParameterGroups.node_counts`:
            a head's own W_Q/W_O slices, its share of its kv group's W_K/W_V and of the
            layer's ``b_O``/``ln1``; the MLP with its ``ln2``; the embeddings in ``input``;
            the final norm and an untied unembedding in ``logits``); they sum to the model's
            parameter count.
        param_groups: ``(key, n_params, users)`` of every parameter group
            (:class:`tlcap.models.ParameterGroups`, users named as graph nodes): what
            :meth:`count_params` counts exactly for a set of nodes.
        parallel: Parallel attention/MLP blocks (NeoX): the MLP of layer ``l`` reads the layer's
            input, so it has no edge from the heads of its own layer.
        post_norm: Post-norm blocks (Gemma-2): a head's output is its share of the attention
            post-norm's output (module docstring).
    """

    upstream: tuple[str, ...]
    readers: tuple[str, ...]
    nodes: tuple[str, ...]
    n_layers: int
    n_heads: int
    n_kv_heads: int
    node_params: tuple[int, ...]
    param_groups: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    parallel: bool = False
    post_norm: bool = False

    # ------------------------------------------------------------------ build
    @classmethod
    def from_model(cls, model: Model) -> "EdgeGraph":
        """The graph of ``model`` (sequential blocks: GPT-2, Llama family, Qwen2; parallel: NeoX; post-norms: Gemma-2).

        Args:
            model: The model.

        Returns:
            Its :class:`EdgeGraph`, with the parameter groups of :meth:`tlcap.models.Model.parameter_groups`.

        Raises:
            UnsupportedModelError: attention without per-head input hooks that the adapter cannot rebuild
                either (:attr:`tlcap.models.Model.emulated_split_inputs` covers GPT-J), post-norms that
                are not RMSNorms or follow an output bias, or heads not grouped evenly into kv heads.
        """
        if not model.attention_internals_patchable and not model.emulated_split_inputs:
            raise UnsupportedModelError(
                f"{model.name} ({model.architecture}): the installed TransformerLens wraps its attention with the "
                "generic AttentionBridge, which has no hook point before the q/k/v projections (use_split_qkv_input "
                "is not available) and fires the attention-pattern hook after the fact; per-head reader inputs cannot be read or "
                "patched, and tlcap cannot rebuild them for this block layout, so its edge graph cannot be built; "
                "use a GPT-2, GPT-J, NeoX, Llama, Qwen2, Gemma-2 or SmolLM2 model"
            )
        if model.post_norm_blocks:
            try:  # heads' writes are their shares of the post-norm's output (module docstring)
                model.attn_post_norm_gain(0)
            except TlcapError as exc:
                raise UnsupportedModelError(f"{exc}; knowledge circuits need RMS post-norms without an output bias") from None
        L, H, K = model.n_layers, model.n_heads, model.n_kv_heads
        if H % K:
            raise UnsupportedModelError(
                f"{model.name} has n_heads={H}, not a multiple of n_kv_heads={K}; its kv groups are not defined"
            )
        upstream = ["input"]
        readers: list[str] = []
        for l in range(L):
            readers += [f"a{l}.h{h}<q>" for h in range(H)]
            for kind in ("k", "v"):
                if K == H:
                    readers += [f"a{l}.h{h}<{kind}>" for h in range(H)]
                else:
                    readers += [f"a{l}.kv{g}<{kind}>" for g in range(K)]
            readers.append(f"m{l}")
            upstream += [f"a{l}.h{h}" for h in range(H)] + [f"m{l}"]
        readers.append("logits")
        nodes = tuple(upstream) + ("logits",)
        pg = model.parameter_groups()
        counts = pg.node_counts()
        groups = tuple((g.key, g.numel, tuple(_GROUP_ALIAS.get(u, u) for u in g.users)) for g in pg.groups)
        owner = {v: k for k, v in _GROUP_ALIAS.items()}
        node_params = tuple(counts[owner.get(n, n)] for n in nodes)
        return cls(tuple(upstream), tuple(readers), nodes, L, H, K, node_params, groups, model.parallel_attn_mlp,
                   model.post_norm_blocks)

    # ------------------------------------------------------------------ parameters
    @property
    def total_params(self) -> int:
        """Every parameter of the model (tensors that share storage counted once)."""
        return sum(n for _, n, _ in self.param_groups)

    @property
    def block_params(self) -> int:
        """Parameters of the transformer blocks: every group but the embeddings and the final norm/unembedding."""
        return sum(n for _, n, users in self.param_groups if not set(users) & set(BOUNDARY_NODES))

    def count_params(self, nodes: Iterable[str]) -> int:
        """Exact number of parameters that ``nodes`` use together.

        A group counts in full, once, when any of ``nodes`` uses it: a head brings its own
        W_Q/b_Q/W_O slices, its kv group's W_K/W_V slices (shared by the ``n_heads /
        n_kv_heads`` query heads of a GQA group: counted once however many of them are in
        ``nodes``) and its layer's ``b_O``/``ln1``; an MLP its weights and ``ln2``.

        Args:
            nodes: Node names (``"a3.h2"``, ``"m5"``, ``"input"``, ``"logits"``).

        Returns:
            The size of the union of the parameter groups the nodes use.
        """
        wanted = set(nodes)
        unknown = wanted - set(self.nodes)
        if unknown:
            raise UnknownNodeError(f"unknown nodes {sorted(unknown)}; nodes are 'input', 'a{{l}}.h{{h}}', 'm{{l}}', 'logits'")
        return sum(n for _, n, users in self.param_groups if wanted.intersection(users))

    # ------------------------------------------------------------------ sizes and indices
    @property
    def n_upstream(self) -> int:
        return len(self.upstream)

    @property
    def n_readers(self) -> int:
        return len(self.readers)

    @property
    def group_size(self) -> int:
        """Query heads per kv head (1 without GQA)."""
        return self.n_heads // self.n_kv_heads

    def head_index(self, layer: int, head: int) -> int:
        """Upstream index of head ``head`` of ``layer``.

        Args:
            layer: The layer.
            head: The head within the layer.

        Returns:
            Its index in :attr:`upstream` (after ``input`` and the earlier layers' heads and MLPs).
        """
        return 1 + layer * (self.n_heads + 1) + head

    def mlp_index(self, layer: int) -> int:
        """Upstream index of the MLP of ``layer``.

        Args:
            layer: The layer.

        Returns:
            Its index in :attr:`upstream` (right after the layer's heads).
        """
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def reader_hooks(self) -> list[ReaderHook]:
        """The reader hook points in firing order, with the readers each holds.

        Returns:
            One :class:`ReaderHook` per q/k/v/MLP input of each layer, then ``final_in`` (the logits).
        """
        H, K = self.n_heads, self.n_kv_heads
        out: list[ReaderHook] = []
        r = 0
        for l in range(self.n_layers):
            n_avail = 1 + l * (H + 1)
            for site, count in (("q_input", H), ("k_input", K), ("v_input", K)):
                out.append(ReaderHook(_hook(site, l), r, count, True, n_avail, site, l))
                r += count
            mlp_avail = n_avail if self.parallel else n_avail + H  # parallel: the MLP reads the block input
            out.append(ReaderHook(_hook("mlp_input", l), r, 1, False, mlp_avail, "mlp_input", l))
            r += 1
        out.append(ReaderHook(_hook("final_in"), r, 1, False, self.n_upstream, "final_in", None))
        return out

    def upstream_hooks(self) -> list[tuple[str, int, int]]:
        """``(hook name, first upstream index, count)`` of the upstream outputs, in order.

        Returns:
            ``resid_pre`` of layer 0 (``input``), then each layer's ``head_result`` and ``mlp_out``.
        """
        out = [(_hook("resid_pre", 0), 0, 1)]
        for l in range(self.n_layers):
            out.append((_hook("head_result", l), self.head_index(l, 0), self.n_heads))
            out.append((_hook("mlp_out", l), self.mlp_index(l), 1))
        return out

    def valid_mask(self) -> Bool[Tensor, "n_upstream n_readers"]:
        """``valid[u, v]``: upstream ``u`` is computed before reader ``v`` reads (an edge).

        Returns:
            A ``[n_upstream, n_readers]`` bool tensor (CPU).
        """
        mask = torch.zeros(self.n_upstream, self.n_readers, dtype=torch.bool)
        for rh in self.reader_hooks():
            mask[: rh.n_avail, rh.start : rh.start + rh.count] = True
        return mask

    def reader_nodes(self) -> Bool[Tensor, "n_readers n_nodes"]:
        """``rn[v, n]``: reader ``v`` is an input of node ``n`` (kv readers: every head of the group).

        Returns:
            A ``[n_readers, n_nodes]`` bool tensor (CPU).
        """
        rn = torch.zeros(self.n_readers, len(self.nodes), dtype=torch.bool)
        H, K, G = self.n_heads, self.n_kv_heads, self.group_size
        for rh in self.reader_hooks():
            if rh.layer is None:  # final_in: the logits
                rn[rh.start, len(self.nodes) - 1] = True
                continue
            l = rh.layer
            if rh.site == "mlp_input":
                rn[rh.start, self.mlp_index(l)] = True
            elif rh.site == "q_input" or K == H:
                for h in range(H):
                    rn[rh.start + h, self.head_index(l, h)] = True
            else:
                for g in range(K):
                    for h in range(g * G, (g + 1) * G):
                        rn[rh.start + g, self.head_index(l, h)] = True
        return rn

    def layer_of(self, node: str) -> int:
        """Column of a node in layer order: input -1, logits n_layers.

        Args:
            node: A node name (``"input"``, ``"a{l}.h{h}"``, ``"m{l}"`` or ``"logits"``).

        Returns:
            The node's layer, -1 for ``input`` and ``n_layers`` for ``logits``.
        """
        if node == "input":
            return -1
        if node == "logits":
            return self.n_layers
        return int(node[1:].split(".")[0])

    def reader_node_names(self, reader: str) -> list[str]:
        """The node names a reader feeds (several heads for a GQA kv reader).

        Args:
            reader: A reader name (``"a{l}.h{h}<q>"``, ``"a{l}.kv{g}<k>"``, ``"m{l}"`` or ``"logits"``).

        Returns:
            The names of the nodes it feeds: one, or every head of a kv group.
        """
        if reader == "logits" or reader.startswith("m"):
            return [reader]
        base, _ = reader.split("<")
        layer, part = base.split(".")
        if part.startswith("kv"):
            g = int(part[2:])
            return [f"{layer}.h{h}" for h in range(g * self.group_size, (g + 1) * self.group_size)]
        return [base]


    # ------------------------------------------------------------------ result contract
    def summary(self) -> dict[str, Any]:
        """Shape facts, the number of edges and the parameter totals.

        Returns:
            A JSON-ready dict: layers, heads, kv heads, upstream / reader / edge counts and ``n_params`` / ``n_block_params``.
        """
        return {
            "n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "n_upstream": self.n_upstream, "n_readers": self.n_readers, "n_edges": int(self.valid_mask().sum()),
            "n_params": self.total_params, "n_block_params": self.block_params,
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`NodeRow` per node (computation order).

        Returns:
            A DataFrame of :class:`NodeRow`: kind, layer, parameters, in- and out-edges of each node.
        """
        valid = self.valid_mask()
        in_edges = (valid.sum(0).float() @ self.reader_nodes().float()).long().tolist()
        out_edges = valid.sum(1).tolist() + [0]  # logits: no outgoing edge
        rows = [NodeRow(n, node_kind(n), self.layer_of(n), p, int(i), int(o))
                for n, p, i, o in zip(self.nodes, self.node_params, in_edges, out_edges)]
        return frame(rows, NodeRow)

    def figure(self) -> go.Figure:
        """Parameters per node (:func:`tlcap.viz.circuit.node_parameter_figure`).

        Returns:
            A plotly bar figure of :attr:`node_params`.
        """
        return node_parameter_figure(
            list(self.nodes), list(self.node_params),
            f"Parameters per node ({self.n_layers} layers, {self.n_heads} heads / {self.n_kv_heads} kv heads)",
        )


def _hook(site: str, layer: int | None = None) -> str:
    return get_site(site).hook_name(layer)


