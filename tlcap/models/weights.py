"""Weight handles: MLP neuron slices, embeddings, and where each HF architecture keeps them.

:class:`tlcap.models.Model` mixes :class:`WeightsMixin` in. The HF module names of every
supported architecture live in the layout tables here (and in :mod:`tlcap.models.params`).
On a model dispatched over devices, a handle of an offloaded module holds the values accelerate
keeps for it (:func:`tlcap.models.placement.resident`), so edits through it reach every forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.errors import UnsupportedModelError
from tlcap.models.placement import is_offloaded, layer_devices, resident


@dataclass(frozen=True)
class WeightSlice:
    """A parameter together with the axis along which it is indexed by MLP neuron.

    Attributes:
        param: The parameter tensor (edited in place by interventions).
        neuron_dim: The axis of ``param`` that runs over the ``d_mlp`` neurons.
        role: ``"out"`` (down projection, neuron -> residual), ``"in"``/``"gate"``
            (residual -> neuron) or ``"bias"``.
        offloaded: The module is offloaded (:mod:`tlcap.models.placement`): edits work, training does not.
    """

    param: torch.nn.Parameter
    neuron_dim: int
    role: str
    offloaded: bool = False

    def neuron_view(self) -> Tensor:
        """The parameter with the neuron axis first (a view: writes go through).

        Returns:
            ``param.data`` with ``neuron_dim`` moved to axis 0.
        """
        return self.param.data.movedim(self.neuron_dim, 0)


# HF module names of each MLP part, by HF ``model_type``. (path of layer list, mlp attr, parts)
_HF_MLP_LAYOUT: dict[str, dict[str, Any]] = {
    "gpt2": {
        "layers": "transformer.h",
        "mlp": "mlp",
        "out": ("c_proj", 0),
        "in": [("c_fc", 1)],
        "bias": [("c_fc", 0)],
        "conv1d": True,
    },
    "llama": {
        "layers": "model.layers",
        "mlp": "mlp",
        "out": ("down_proj", 1),
        "in": [("up_proj", 0), ("gate_proj", 0)],
        "bias": [],
    },
    "mistral": {
        "layers": "model.layers",
        "mlp": "mlp",
        "out": ("down_proj", 1),
        "in": [("up_proj", 0), ("gate_proj", 0)],
        "bias": [],
    },
    "qwen2": {
        "layers": "model.layers",
        "mlp": "mlp",
        "out": ("down_proj", 1),
        "in": [("up_proj", 0), ("gate_proj", 0)],
        "bias": [],
    },
    "gemma": {
        "layers": "model.layers",
        "mlp": "mlp",
        "out": ("down_proj", 1),
        "in": [("up_proj", 0), ("gate_proj", 0)],
        "bias": [],
    },
    "gemma2": {
        "layers": "model.layers",
        "mlp": "mlp",
        "out": ("down_proj", 1),
        "in": [("up_proj", 0), ("gate_proj", 0)],
        "bias": [],
    },
    "gpt_neox": {
        "layers": "gpt_neox.layers",
        "mlp": "mlp",
        "out": ("dense_4h_to_h", 1),
        "in": [("dense_h_to_4h", 0)],
        "bias": [("dense_h_to_4h", 0)],
    },
    "gptj": {"layers": "transformer.h", "mlp": "mlp", "out": ("fc_out", 1), "in": [("fc_in", 0)], "bias": [("fc_in", 0)]},
}


def getattr_path(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` for ``path="a.b.c"``.

    Args:
        obj: The root object.
        path: Dotted attribute names.

    Returns:
        The attribute reached.
    """
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


class WeightsMixin:
    """Weight handles of :class:`tlcap.models.Model` (see the class for attributes)."""

    backend: Any
    hf_model: Any
    architecture: str
    cfg: Any
    device: torch.device

    def _hf_mlp(self, layer: int) -> tuple[Any, dict[str, Any]]:
        layout = _HF_MLP_LAYOUT.get(self.architecture)
        if layout is None:
            raise UnsupportedModelError(
                f"Weight edits are not mapped for architecture {self.architecture!r}; add it to "
                "tlcap.models.weights._HF_MLP_LAYOUT."
            )
        layers = getattr_path(self.hf_model, layout["layers"])
        return getattr(layers[layer], layout["mlp"]), layout

    def mlp_out_weight(self, layer: int) -> WeightSlice:
        """The down projection of ``layer`` (neuron -> residual), indexed by neuron.

        Args:
            layer: The layer.

        Returns:
            The :class:`WeightSlice` (role ``"out"``; the real parameter even when offloaded).
        """
        if self.hf_model is None:
            return WeightSlice(self.backend.blocks[layer].mlp.W_out, 0, "out")
        mlp, layout = self._hf_mlp(layer)
        name, dim = layout["out"]
        mod = getattr(mlp, name)
        return WeightSlice(resident(mod, "weight"), dim, "out", is_offloaded(mod))

    def mlp_in_weights(self, layer: int) -> list[WeightSlice]:
        """The weights that read the residual into ``layer``'s neurons (in, gate, biases).

        Args:
            layer: The layer.

        Returns:
            One :class:`WeightSlice` per reading weight (roles ``"in"``, ``"gate"``, ``"bias"``), present ones only.
        """
        if self.hf_model is None:
            mlp = self.backend.blocks[layer].mlp
            out = [WeightSlice(mlp.W_in, 1, "in"), WeightSlice(mlp.b_in, 0, "bias")]
            if hasattr(mlp, "W_gate"):
                out.append(WeightSlice(mlp.W_gate, 1, "gate"))
            return out
        mlp, layout = self._hf_mlp(layer)
        out = []
        for name, dim in layout["in"]:
            mod = getattr(mlp, name)
            out.append(WeightSlice(resident(mod, "weight"), dim, "gate" if "gate" in name else "in", is_offloaded(mod)))
        for name, dim in layout["bias"]:
            mod = getattr(mlp, name)
            if mod.bias is not None:
                out.append(WeightSlice(resident(mod, "bias"), dim, "bias", is_offloaded(mod)))
        return out

    def mlp_down_matrix(self, layer: int) -> Float[Tensor, "d_model d_mlp"]:
        """The down projection as a ``[d_model, d_mlp]`` matrix (a view when possible).

        Args:
            layer: The layer.

        Returns:
            The ``[d_model, d_mlp]`` weight (a transpose view of the parameter when needed).
        """
        ws = self.mlp_out_weight(layer)
        w = ws.param.data
        return w if ws.neuron_dim == 1 else w.T

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        """Token embedding matrix."""
        if self.hf_model is not None:
            return resident(self.hf_model.get_input_embeddings(), "weight")
        return self.backend.W_E

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """Unembedding matrix (``d_model x d_vocab``)."""
        if self.hf_model is not None:
            return resident(self.hf_model.get_output_embeddings(), "weight").T
        return self.backend.W_U

    @property
    def layer_devices(self) -> list[torch.device]:
        """The device each layer runs on (:mod:`tlcap.models.placement`; one device unless the model is split)."""
        if self.hf_model is None:
            return [next(b.parameters()).device for b in self.backend.blocks]
        layout = _HF_MLP_LAYOUT.get(self.architecture)
        if layout is None or not getattr(self.hf_model, "hf_device_map", None):
            return [self.device] * int(self.cfg.n_layers)
        return layer_devices(self, getattr_path(self.hf_model, layout["layers"]))


__all__ = ["WeightSlice", "WeightsMixin", "getattr_path"]
