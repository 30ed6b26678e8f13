"""A model's shapes read from its configuration, without loading its weights (``model_spec``).

Commands check options whose valid range depends on the model (``--layers``, ``--layer``,
``--trace-k``, a ``--neurons`` file's layers and indices) before they load the model or scan any
data, so a bad value costs a second, not the load and the first item of the work. The shapes
come from what a model's configuration already says:

- the random test models and the real-shape models of the registry: the HF configs they are
  built from (:data:`tlcap.models.tiny.GPT2_SHAPES`, the tiny families, :data:`~tlcap.models.shapes.SHAPES`);
- ``smollm2-135m``: the ``config.json`` of its cached float32 conversion, else the real model's
  numbers (:data:`~tlcap.models.shapes.SHAPES` ``"smollm2-135m-shape"``);
- a local folder: its ``config.json``; a hub name: its ``config.json`` in the local HF cache
  (never the network, which could keep a bad option waiting).

``None`` means the shapes are not known without loading (a hub model not downloaded yet): the
checks then run after the load, before any work, as before.

Example:
    >>> model_spec("gpt2-tiny")
    ModelSpec(name='gpt2-tiny', n_layers=2, n_heads=4, d_mlp=256, n_ctx=128)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tlcap.models.families import FAMILIES, tiny_config
from tlcap.models.loading import _HUB_ALIASES, REGISTRY
from tlcap.models.paths import cache_dir
from tlcap.models.shapes import SHAPES
from tlcap.models.tiny import GPT2_SHAPES

_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads")
_WIDTH = ("hidden_size", "n_embd", "d_model")
_MLP = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
_CTX = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")


@dataclass(frozen=True)
class ModelSpec:
    """The shapes options are checked against: layers, attention heads, MLP width, context."""

    name: str
    n_layers: int
    n_heads: int
    d_mlp: int
    n_ctx: int | None = None


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    return None


def spec_from_config(name: str, config: dict[str, Any]) -> ModelSpec | None:
    """A :class:`ModelSpec` from an HF ``config.json`` dict (its text config for multimodal ones), or None.

    Args:
        name: Model name kept in the spec.
        config: The parsed ``config.json``.

    Returns:
        The :class:`ModelSpec` (``n_ctx`` None when unknown), or None when layers, heads or MLP width are missing.
    """
    config = dict(config.get("text_config") or config)
    layers, heads, width = _first(config, _LAYERS), _first(config, _HEADS), _first(config, _WIDTH)
    mlp = _first(config, _MLP)
    if mlp is None and width is not None:
        mlp = 4 * int(width)  # GPT-2 / GPT-J: n_inner None means 4 × d_model
    if not all(isinstance(v, int) for v in (layers, heads, mlp)):
        return None
    ctx = _first(config, _CTX)
    return ModelSpec(name, int(layers), int(heads), int(mlp), int(ctx) if isinstance(ctx, int) else None)


def _json_config(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _registered(name: str) -> dict[str, Any] | None:
    if name.startswith("gpt2-") and name in ("gpt2-tiny", "gpt2-small-random"):
        return dict(GPT2_SHAPES["tiny" if name == "gpt2-tiny" else "small"])
    if name.endswith("-tiny") and name[: -len("-tiny")] in FAMILIES:
        return tiny_config(name[: -len("-tiny")]).to_dict()
    if name in SHAPES:
        return dict(SHAPES[name])
    if name in ("smollm2-135m", "smollm2-135m-instruct"):
        cached = _json_config(cache_dir() / "smollm2-135m-f32" / "config.json")
        return cached or dict(SHAPES["smollm2-135m-shape"])
    return None


def _hub(name: str) -> dict[str, Any] | None:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import HfHubHTTPError
    except ImportError:  # pragma: no cover - transformers brings it
        return None
    try:  # the local HF cache only: asking the hub could wait on the network (the load asks it anyway)
        path = hf_hub_download(_HUB_ALIASES.get(name, name), "config.json", local_files_only=True)
    except (OSError, ValueError, HfHubHTTPError):
        return None
    return _json_config(Path(path))


def model_spec(model: Any) -> ModelSpec | None:
    """The shapes of ``model`` (a name or folder ``load_model`` takes) without loading weights (module docstring).

    Args:
        model: A registered name, a local HF model folder or a hub name; anything else (an
            already-loaded model) gives its own shapes.

    Returns:
        A :class:`ModelSpec`, or ``None`` when the shapes cannot be known without loading.
    """
    if hasattr(model, "n_layers") and hasattr(model, "d_mlp"):
        return ModelSpec(str(getattr(model, "name", "model")), int(model.n_layers), int(getattr(model, "n_heads", 0)),
                         int(model.d_mlp), getattr(model, "n_ctx", None))
    if not isinstance(model, (str, os.PathLike)):
        return None
    name = str(model)
    if name.lower() in REGISTRY:
        config = _registered(name.lower())
    elif Path(name).expanduser().is_dir():
        config = _json_config(Path(name).expanduser() / "config.json")
    elif "/" in name or name in _HUB_ALIASES or name.startswith(("gpt2", "pythia")):
        config = _hub(name)
    else:
        config = None
    return spec_from_config(name, config) if config else None


__all__ = ["ModelSpec", "model_spec", "spec_from_config"]
