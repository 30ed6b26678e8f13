"""Parameter groups: which parameters each attention head, MLP and the embeddings own.

Every parameter element of the model belongs to exactly one :class:`ParamGroup`; a group
lists the *nodes* that use it (node names: ``"embed"``, ``"a{l}.h{h}"`` for head ``h`` of
layer ``l``, ``"m{l}"`` for the MLP of layer ``l``, ``"unembed"``):

==================  ==================================================  ===========================
group               parameters                                          used by
==================  ==================================================  ===========================
``a{l}.h{h}``       head ``h``'s slices of ``W_Q``, ``b_Q`` and ``W_O``   that head
``a{l}.kv{g}``      kv head ``g``'s slices of ``W_K``, ``W_V``, biases    the ``n_heads / n_kv_heads``
                                                                        query heads of group ``g``
``a{l}``            ``b_O``, ``ln1``, a post-norm ``ln1_post`` (and any    every head of layer ``l``
                    other attention parameter)
``m{l}``            the MLP (in, gate, out, biases), ``ln2`` and a        ``m{l}``
                    post-norm ``ln2_post`` (Gemma-2)
``b{l}``            any other parameter of block ``l``                    every head and the MLP
``embed``           token (and position) embeddings, anything outside   ``embed``
                    the blocks not listed below
``unembed``         ``ln_final`` and an *untied* unembedding            ``unembed``
==================  ==================================================  ===========================

Without GQA (``n_kv_heads == n_heads``) every kv group has one user, so a head owns its whole
W_Q/W_K/W_V/W_O slices. Tied tensors (the unembedding of GPT-2 and SmolLM2 is the token
embedding) and tensors the backend exposes twice (the TransformerBridge's GPT-2 ``q``/``k``/``v``
are views of the fused ``c_attn``) are counted once, at their first owner.

Two ways to count, both exact integers:

- :meth:`ParameterGroups.count` — the parameters a *set* of nodes needs: every group that any
  of them uses, in full (a kv group counts once, however many of its heads are in the set).
- :meth:`ParameterGroups.node_counts` — one number per node that sums to the model total: a
  shared group is split evenly among its users (a head gets its own slices, ``1/G`` of its kv
  group and ``1/n_heads`` of ``a{l}``); the remainder of the integer division goes to the
  lower-numbered users.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tlcap.errors import UnknownNodeError


@dataclass(frozen=True)
class ParamPart:
    """A parameter, or a slice of it along one axis.

    Attributes:
        name: Where the parameter lives (``"blocks.0.attn.q.weight"``).
        role: ``"W_Q"``, ``"b_Q"``, ``"W_K"``, ``"b_K"``, ``"W_V"``, ``"b_V"``, ``"W_O"``,
            ``"b_O"``, ``"ln1"``, ``"ln2"``, ``"mlp"``, ``"embed"``, ``"ln_final"``,
            ``"unembed"`` or ``"other"``.
        param: The parameter tensor.
        dim: The sliced axis, or ``None`` for the whole tensor.
        start, stop: The slice ``[start, stop)`` along ``dim``.
    """

    name: str
    role: str
    param: torch.nn.Parameter
    dim: int | None = None
    start: int = 0
    stop: int = 0

    def view(self) -> Tensor:
        """The part as a view of the parameter's data (writes go through).

        Returns:
            The whole parameter data, or its ``[start, stop)`` slice along ``dim``.
        """
        if self.dim is None:
            return self.param.data
        return self.param.data.narrow(self.dim, self.start, self.stop - self.start)

    @property
    def numel(self) -> int:
        """Number of elements of the part."""
        if self.dim is None:
            return int(self.param.numel())
        return int(self.param.numel() // self.param.shape[self.dim] * (self.stop - self.start))


@dataclass(frozen=True)
class ParamGroup:
    """Parameters used together by the same nodes.

    Attributes:
        key: Group name (module docstring table).
        users: The nodes that use these parameters.
        parts: The parameters (or slices).
    """

    key: str
    users: tuple[str, ...]
    parts: tuple[ParamPart, ...]

    @property
    def numel(self) -> int:
        """Number of parameter elements in the group."""
        return sum(p.numel for p in self.parts)


@dataclass(frozen=True)
class ParameterGroups:
    """A partition of the model's parameters by the nodes that use them (module docstring).

    Build with :meth:`tlcap.models.Model.parameter_groups`.

    Attributes:
        groups: Every group; together they hold each parameter element exactly once.
        nodes: Node names in computation order: ``"embed"``, per layer its heads then its
            MLP, ``"unembed"``.
        n_layers, n_heads, n_kv_heads: Shape facts of the model.

    Example:
        >>> pg = model.parameter_groups()
        >>> pg.node_counts()["a0.h1"], round(pg.count(["a0.h0", "a0.h1", "m1"]) / pg.block_total, 3)
        (4192, 0.417)
    """

    groups: tuple[ParamGroup, ...]
    nodes: tuple[str, ...]
    n_layers: int
    n_heads: int
    n_kv_heads: int

    @property
    def total(self) -> int:
        """All parameter elements of the model."""
        return sum(g.numel for g in self.groups)

    @property
    def block_total(self) -> int:
        """Parameter elements of the transformer blocks (every group but embed/unembed)."""
        return sum(g.numel for g in self.groups if g.key not in ("embed", "unembed"))

    def group(self, key: str) -> ParamGroup:
        """The group called ``key``.

        Args:
            key: Group name (module docstring table).

        Returns:
            The :class:`ParamGroup`.

        Raises:
            UnknownNodeError: no group of that name.
        """
        for g in self.groups:
            if g.key == key:
                return g
        raise UnknownNodeError(f"no parameter group {key!r}")

    def _check(self, nodes: Iterable[str]) -> set[str]:
        wanted = set(nodes)
        unknown = wanted - set(self.nodes)
        if unknown:
            raise UnknownNodeError(f"unknown nodes {sorted(unknown)}; nodes are 'embed', 'a{{l}}.h{{h}}', 'm{{l}}', 'unembed'")
        return wanted

    def count(self, nodes: Iterable[str]) -> int:
        """Exact number of parameter elements that ``nodes`` use together.

        Args:
            nodes: Node names (``"a3.h2"``, ``"m5"``, ``"embed"``, ``"unembed"``).

        Returns:
            The size of the union of every group any of ``nodes`` uses.
        """
        wanted = self._check(nodes)
        return sum(g.numel for g in self.groups if wanted.intersection(g.users))

    def node_counts(self) -> dict[str, int]:
        """One count per node, shared groups split evenly among their users; sums to :attr:`total`.

        Returns:
            Node name → parameter elements (the remainder of an uneven split goes to the first users).
        """
        out = {n: 0 for n in self.nodes}
        for g in self.groups:
            q, r = divmod(g.numel, len(g.users))
            for i, u in enumerate(g.users):
                out[u] += q + (1 if i < r else 0)
        return out

    def node_parts(self, node: str) -> list[ParamPart]:
        """Every parameter (slice) ``node`` uses, shared ones included.

        Args:
            node: A node name (``"input"``, ``"a{l}.h{h}"``, ``"m{l}"`` or ``"logits"``).

        Returns:
            The :class:`ParamPart` list of every group ``node`` is a user of.
        """
        self._check([node])
        return [p for g in self.groups if node in g.users for p in g.parts]


# ---------------------------------------------------------------------------- building
def _storage(p: Tensor) -> int:
    return int(p.untyped_storage().data_ptr())


class _Builder:
    def __init__(self) -> None:
        self.taken: set[int] = set()
        self.groups: list[ParamGroup] = []

    def params(self, module: Any, name: str, role: str) -> list[ParamPart]:
        """Whole parameters of ``module`` not yet taken (by storage)."""
        if module is None:
            return []
        out = []
        for n, p in module.named_parameters():
            if _storage(p) in self.taken:
                continue
            self.taken.add(_storage(p))
            out.append(ParamPart(f"{name}.{n}", role, p))
        return out

    def add(self, key: str, users: Iterable[str], parts: Iterable[ParamPart]) -> None:
        self.groups.append(ParamGroup(key, tuple(users), tuple(parts)))


def _linear(comp: Any) -> tuple[Any, bool]:
    """The torch module of a bridge linear component and whether it is an HF ``Conv1D`` ([in, out])."""
    mod = getattr(comp, "_original_component", comp)
    return mod, type(mod).__name__ == "Conv1D"


_Split = tuple[list[list[ParamPart]], list[list[ParamPart]], list[ParamPart]]


def _bridge_attention(attn: Any, name: str, n_heads: int, n_kv: int) -> _Split:
    """Per-head (Q, O) and per-kv-group (K, V) slices of a bridge attention's q/k/v/o linears, and ``b_O``."""
    heads: list[list[ParamPart]] = [[] for _ in range(n_heads)]
    kv: list[list[ParamPart]] = [[] for _ in range(n_kv)]
    for letter, n_slots, slots in (("q", n_heads, heads), ("k", n_kv, kv), ("v", n_kv, kv)):
        mod, conv = _linear(getattr(attn, letter))
        w, bias = mod.weight, getattr(mod, "bias", None)
        axis = 1 if conv else 0  # the output-feature axis
        size = w.shape[axis] // n_slots
        for i in range(n_slots):
            slots[i].append(ParamPart(f"{name}.{letter}.weight", f"W_{letter.upper()}", w, axis, i * size, (i + 1) * size))
            if bias is not None:
                slots[i].append(ParamPart(f"{name}.{letter}.bias", f"b_{letter.upper()}", bias, 0, i * size, (i + 1) * size))
    mod, conv = _linear(attn.o)
    w = mod.weight
    axis = 0 if conv else 1  # the input-feature axis (concatenated head outputs)
    size = w.shape[axis] // n_heads
    for h in range(n_heads):
        heads[h].append(ParamPart(f"{name}.o.weight", "W_O", w, axis, h * size, (h + 1) * size))
    b_o = getattr(mod, "bias", None)
    return heads, kv, [ParamPart(f"{name}.o.bias", "b_O", b_o)] if b_o is not None else []


_HOOKED_ROLES = {"W_Q": "head", "b_Q": "head", "W_O": "head", "W_K": "kv", "_W_K": "kv", "b_K": "kv", "_b_K": "kv",
                 "W_V": "kv", "_W_V": "kv", "b_V": "kv", "_b_V": "kv"}


def _hooked_attention(attn: Any, name: str, n_heads: int, n_kv: int) -> _Split:
    """Per-head and per-kv-group slices of a TL 3.9 ``HookedTransformer`` attention (``[head, ...]`` params)."""
    heads: list[list[ParamPart]] = [[] for _ in range(n_heads)]
    kv: list[list[ParamPart]] = [[] for _ in range(n_kv)]
    shared: list[ParamPart] = []
    for pname, p in attn.named_parameters(recurse=False):
        kind = _HOOKED_ROLES.get(pname)
        if kind is None:
            if pname == "b_O":
                shared.append(ParamPart(f"{name}.b_O", "b_O", p))
            continue
        slots = heads if kind == "head" else kv
        for i in range(len(slots)):
            slots[i].append(ParamPart(f"{name}.{pname}", pname.lstrip("_"), p, 0, i, i + 1))
    return heads, kv, shared


def build_parameter_groups(backend: Any, n_layers: int, n_heads: int, n_kv_heads: int, is_bridge: bool) -> ParameterGroups:
    """Partition the parameters of a TransformerBridge or HookedTransformer (module docstring).

    Args:
        backend: The TransformerLens model (``blocks``, ``embed``, ``ln_final``, ``unembed``).
        n_layers, n_heads, n_kv_heads: Its shape facts.
        is_bridge: Whether ``backend`` is a ``TransformerBridge`` (attention as q/k/v/o
            linears) rather than a ``HookedTransformer`` (``W_Q``... with a head axis).

    Returns:
        The :class:`ParameterGroups`.
    """
    bld = _Builder()
    G = n_heads // n_kv_heads
    nodes = ["embed"]
    embed = bld.params(getattr(backend, "embed", None), "embed", "embed")
    embed += bld.params(getattr(backend, "pos_embed", None), "pos_embed", "embed")
    for l in range(n_layers):
        blk = backend.blocks[l]
        heads_l = [f"a{l}.h{h}" for h in range(n_heads)]
        nodes += heads_l + [f"m{l}"]
        attn = blk.attn
        split = _bridge_attention if is_bridge and hasattr(attn, "q") else _hooked_attention
        own, kv, b_o = split(attn, f"blocks.{l}.attn", n_heads, n_kv_heads)
        bld.taken.update(_storage(p.param) for parts in own + kv + [b_o] for p in parts)
        for h in range(n_heads):
            bld.add(f"a{l}.h{h}", [heads_l[h]], own[h])
        for g in range(n_kv_heads):
            bld.add(f"a{l}.kv{g}", heads_l[g * G : (g + 1) * G], kv[g])
        shared = b_o + bld.params(getattr(blk, "ln1", None), f"blocks.{l}.ln1", "ln1")
        shared += bld.params(getattr(blk, "ln1_post", None), f"blocks.{l}.ln1_post", "ln1_post")  # Gemma-2 post-norms
        shared += bld.params(attn, f"blocks.{l}.attn", "other")
        bld.add(f"a{l}", heads_l, shared)
        mlp = bld.params(getattr(blk, "ln2", None), f"blocks.{l}.ln2", "ln2") + bld.params(blk.mlp, f"blocks.{l}.mlp", "mlp")
        mlp += bld.params(getattr(blk, "ln2_post", None), f"blocks.{l}.ln2_post", "ln2_post")
        bld.add(f"m{l}", [f"m{l}"], mlp)
        rest = bld.params(blk, f"blocks.{l}", "other")
        if rest:
            bld.add(f"b{l}", heads_l + [f"m{l}"], rest)
    nodes.append("unembed")
    unembed = bld.params(getattr(backend, "ln_final", None), "ln_final", "ln_final")
    unembed += bld.params(getattr(backend, "unembed", None), "unembed", "unembed")
    embed += bld.params(backend, "", "other")  # anything else (rotary tables are buffers, not parameters)
    bld.groups.insert(0, ParamGroup("embed", ("embed",), tuple(embed)))
    bld.add("unembed", ["unembed"], unembed)
    return ParameterGroups(tuple(bld.groups), tuple(nodes), n_layers, n_heads, n_kv_heads)


def unique_parameter_count(backend: Any) -> int:
    """Parameter elements of ``backend``, counting tensors that share storage once.

    Args:
        backend: A torch module.

    Returns:
        The count (the largest tensor of each storage).
    """
    seen: dict[int, int] = {}
    for p in backend.parameters():
        s = _storage(p)
        seen[s] = max(seen.get(s, 0), int(p.numel()))
    return sum(seen.values())


class ParamsMixin:
    """Parameter counting of :class:`tlcap.models.Model` (see the class for attributes)."""

    backend: Any
    n_layers: int
    n_heads: int
    n_kv_heads: int
    is_bridge: bool

    def parameter_count(self) -> int:
        """Number of parameter elements (tensors that share storage, e.g. tied embeddings, once).

        Returns:
            The count.
        """
        return unique_parameter_count(self.backend)

    def parameter_groups(self) -> ParameterGroups:
        """The model's parameters grouped by the heads, MLPs and embeddings that use them.

        Every parameter element is in exactly one group. A head owns its slices of ``W_Q``,
        ``b_Q`` and ``W_O``; the ``W_K``/``W_V`` slices of a kv head are shared by the
        ``n_heads / n_kv_heads`` query heads of its group (grouped-query attention); ``b_O``
        and ``ln1`` are shared by all heads of the layer; an MLP owns its weights and ``ln2``.
        See :mod:`tlcap.models.params` for the exact counts per node and per set of nodes.

        Returns:
            The :class:`ParameterGroups`.

        Example:
            >>> pg = model.parameter_groups()
            >>> round(pg.count(["a1.h0", "m1"]) / pg.block_total, 3)   # share of block parameters
            0.376
        """
        return build_parameter_groups(self.backend, self.n_layers, self.n_heads, self.n_kv_heads, self.is_bridge)


__all__ = ["ParamGroup", "ParamPart", "ParameterGroups", "ParamsMixin", "build_parameter_groups", "unique_parameter_count"]
