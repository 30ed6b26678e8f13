"""Located sets of MLP neurons, with the overlap measures the papers use."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool
from torch import Tensor

from tlcap.errors import ShapeMismatchError
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.heatmaps import located_heatmap
from tlcap.viz.html import neuron_set_html

Neuron = tuple[int, int]


@dataclass(frozen=True)
class NeuronRow:
    """One row of :meth:`NeuronSet.to_frame`."""

    layer: int
    neuron: int


@dataclass(frozen=True)
class NeuronSet(Result):
    """A set of MLP neurons ``(layer, index)`` of a model of shape ``(n_layers, d_mlp)``.

    Example:
        >>> a = NeuronSet.from_list([(3, 10), (5, 7)], shape=(12, 3072))
        >>> b = NeuronSet.from_list([(3, 10), (4, 1), (5, 8)], shape=(12, 3072))
        >>> a.overlap(b), a.iou(b)             # (1/2 + 1/3) / 2; 1 / 4
        (0.41666666666666663, 0.25)
    """

    neurons: tuple[tuple[int, int], ...]
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        canon = tuple(sorted({(int(l), int(j)) for l, j in self.neurons}))
        object.__setattr__(self, "neurons", canon)
        object.__setattr__(self, "shape", (int(self.shape[0]), int(self.shape[1])))
        for l, j in canon:
            if not (0 <= l < self.shape[0] and 0 <= j < self.shape[1]):
                raise ShapeMismatchError(
                    f"neuron {(l, j)} is outside a model of shape {self.shape} (layers x d_mlp); "
                    "use neurons located on the same model"
                )

    @classmethod
    def from_list(cls, neurons: Iterable[Iterable[int]], shape: tuple[int, int]) -> "NeuronSet":
        """A set from ``(layer, neuron)`` pairs.

        Args:
            neurons: The pairs (lists or tuples).
            shape: ``(n_layers, d_mlp)`` of the model.

        Returns:
            The set.
        """
        return cls(tuple((int(a), int(b)) for a, b in neurons), shape)

    @classmethod
    def from_mask(cls, mask: Bool[Tensor, "layer d_mlp"]) -> "NeuronSet":
        """A set from a boolean ``[layer, d_mlp]`` mask.

        Args:
            mask: True where a neuron is in the set.

        Returns:
            The set (its shape is the mask's).
        """
        idx = mask.nonzero().tolist()
        return cls(tuple((a, b) for a, b in idx), (mask.shape[0], mask.shape[1]))

    def __len__(self) -> int:
        return len(self.neurons)

    def __iter__(self) -> Iterator[Neuron]:
        return iter(self.neurons)

    def __contains__(self, item: object) -> bool:
        return item in set(self.neurons)

    def mask(self) -> Bool[Tensor, "layer d_mlp"]:
        """The set as a boolean mask.

        Returns:
            ``[n_layers, d_mlp]``, True for the set's neurons.
        """
        m = torch.zeros(self.shape, dtype=torch.bool)
        for l, j in self.neurons:
            m[l, j] = True
        return m

    def by_layer(self) -> dict[int, list[int]]:
        """The set's neurons grouped by layer.

        Returns:
            Layer → neuron indices (layers without neurons left out).
        """
        out: dict[int, list[int]] = {}
        for l, j in self.neurons:
            out.setdefault(l, []).append(j)
        return out

    def layers(self) -> list[int]:
        """The layers that hold at least one neuron of the set.

        Returns:
            Sorted layer indices.
        """
        return sorted(self.by_layer())

    def _check(self, other: "NeuronSet") -> None:
        if self.shape != other.shape:
            raise ShapeMismatchError(
                f"cannot compare neuron sets of shapes {self.shape} and {other.shape}; both must come from one model"
            )

    def __and__(self, other: "NeuronSet") -> "NeuronSet":
        self._check(other)
        return NeuronSet(tuple(set(self.neurons) & set(other.neurons)), self.shape)

    def __or__(self, other: "NeuronSet") -> "NeuronSet":
        self._check(other)
        return NeuronSet(tuple(set(self.neurons) | set(other.neurons)), self.shape)

    def overlap(self, other: "NeuronSet") -> float:
        """(|a∩b|/|a| + |a∩b|/|b|) / 2, the CNL paper's overlap; 0 if either set is empty.

        Args:
            other: A set of the same shape.

        Returns:
            The overlap, in ``[0, 1]``.
        """
        self._check(other)
        if not self.neurons or not other.neurons:
            return 0.0
        inter = len(set(self.neurons) & set(other.neurons))
        return 0.5 * (inter / len(self) + inter / len(other))

    def iou(self, other: "NeuronSet") -> float:
        """|a∩b| / |a∪b|; 1.0 for two empty sets.

        Args:
            other: A set of the same shape.

        Returns:
            The intersection over union, in ``[0, 1]``.
        """
        self._check(other)
        union = len(set(self.neurons) | set(other.neurons))
        return 1.0 if union == 0 else len(set(self.neurons) & set(other.neurons)) / union

    def ratio(self) -> float:
        """Share of all MLP neurons in the set.

        Returns:
            ``len(self) / (n_layers · d_mlp)``.
        """
        return len(self) / (self.shape[0] * self.shape[1])

    def random_like(self, seed: int = 0, exclude_self: bool = True) -> "NeuronSet":
        """A random set with the same number of neurons in each layer (the fair control).

        Args:
            seed: Seed of the draw.
            exclude_self: Draw only neurons outside this set.

        Returns:
            A set of the same shape and per-layer counts.
        """
        g = torch.Generator().manual_seed(seed)
        out: list[Neuron] = []
        for l, idx in self.by_layer().items():
            pool = torch.ones(self.shape[1], dtype=torch.bool)
            if exclude_self:
                pool[idx] = False
            cand = pool.nonzero().flatten()
            pick = cand[torch.randperm(len(cand), generator=g)[: len(idx)]]
            out.extend((l, int(j)) for j in pick)
        return NeuronSet(tuple(out), self.shape)

    def to_list(self) -> list[list[int]]:
        """The set as JSON-ready pairs.

        Returns:
            ``[[layer, neuron], ...]`` in the set's order.
        """
        return [[l, j] for l, j in self.neurons]

    def summary(self) -> dict[str, Any]:
        """``n_neurons``, ``ratio``, ``shape``, ``per_layer`` counts and the ``neurons`` list.

        Returns:
            A JSON-ready dict.
        """
        return {
            "n_neurons": len(self),
            "ratio": self.ratio(),
            "shape": list(self.shape),
            "per_layer": {str(l): len(js) for l, js in sorted(self.by_layer().items())},
            "neurons": self.to_list(),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`NeuronRow` (``layer``, ``neuron``) per neuron, sorted.

        Returns:
            A DataFrame with columns ``layer`` and ``neuron``.
        """
        return frame([NeuronRow(l, j) for l, j in self.neurons], NeuronRow)

    def _repr_html_(self) -> str:
        """Jupyter: size, share of the model's neurons and the neurons of each layer."""
        return neuron_set_html(self.by_layer(), self.shape)

    def figure(self, title: str | None = None) -> go.Figure:
        """The neurons on the layer × neuron plane.

        Args:
            title: The figure title (default: the set's size).

        Returns:
            A plotly ``Figure``.
        """
        return located_heatmap({"located": self}, title=title or f"{len(self)} located neurons", shape=self.shape)
