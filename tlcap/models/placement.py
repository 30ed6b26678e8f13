"""Models larger than one device: layers split over several GPUs, or partly offloaded (accelerate device maps).

``load_model(name, device="cuda", n_devices=k)`` places the HF model's blocks over ``k`` GPUs with
accelerate (balanced, whole decoder layers; under ``torchrun`` process r takes GPUs
``r·k … r·k + k − 1`` of its node, so ``--nproc-per-node c`` runs c copies of k GPUs each);
``device_map=`` takes any HF map (``{"model.layers.3": 1, "model.layers.4": "cpu", ...}``, with
``"disk"`` entries written to ``offload_folder``). The map is applied *before* the
TransformerBridge wraps the model (:func:`boot`), which is how TransformerLens 4.x reads it
(``cfg.n_devices``); accelerate's hooks move each layer's inputs to that layer's device.

What every method needs from a split model, and where it is:

- **where a layer runs** (:func:`layer_devices`): each block's execution device (an offloaded
  block runs on the main device). Activations of layer l live there, so hooks move what they
  insert to the activation's device (:mod:`tlcap.runtime.hooks`), packed rows give each layer
  its mask on its own device, and ``batch_rows="auto"`` fits its batch on every device
  (:func:`tlcap.runtime.batching.device_shares`);
- **the input device** (:func:`input_device`, ``Model.device``): the embedding's;
- **weights of offloaded modules** (:func:`resident`): accelerate keeps them in a weights map (CPU
  memory, or files on disk) and puts them into the module around each forward only. ``resident``
  returns the tensor of that map (read from disk once and then kept in memory) as a parameter that
  shares its storage, so a weight edit (erase, KN update, ROME) changes what every later forward
  uses and ``undo()`` restores it. Fine-tuning needs the weights in the module and refuses
  offloaded layers.

Example (``load_model("/models/Llama-2-70b-hf", device="cuda", dtype="bfloat16", n_devices=4)`` gives
``layer_devices`` ``[cuda:0, cuda:0, ..., cuda:3]``; a model on one device has every layer there):
    >>> model.layer_devices, input_device(model)
    ([device(type='cpu'), device(type='cpu')], device(type='cpu'))
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tlcap.errors import InvalidConfigError

PLACEMENT_KEYS = ("n_devices", "device_map", "offload_folder")
"""``load_model`` keywords that place a model over several devices."""


@dataclass(frozen=True)
class Placement:
    """Where the blocks of a model go.

    Attributes:
        device_map: An HF device map (module name → ``int`` GPU, ``"cuda:N"``, ``"cpu"``, ``"disk"``),
            ``"auto"`` / ``"balanced"``, or ``None`` with ``n_devices``.
        n_devices: Split over this many GPUs (under ``torchrun``: the GPUs of this local rank).
        offload_folder: Folder for ``"disk"`` entries.
        main_device: The device offloaded blocks run on (default: the first GPU of the map, else the CPU).
        max_memory: Per-device budget for ``"auto"`` / ``"balanced"`` maps (accelerate's ``max_memory``).
    """

    device_map: Any = None
    n_devices: int | None = None
    offload_folder: str | None = None
    main_device: str | None = None
    max_memory: Mapping[Any, Any] | None = field(default=None)

    @classmethod
    def of(cls, kwargs: dict[str, Any]) -> Placement | None:
        """The placement asked for in ``load_model``'s keywords (removed from ``kwargs``), or ``None``.

        Args:
            kwargs: Keyword arguments of ``load_model``; ``device_map``, ``n_devices``, ``offload_folder``, ... are popped.

        Returns:
            The :class:`Placement`, or None when no device map or ``n_devices`` is given.

        Raises:
            InvalidConfigError: a bad ``n_devices``, or ``offload_folder`` without a device map.
        """
        got = {k: kwargs.pop(k) for k in PLACEMENT_KEYS if k in kwargs}
        got = {k: v for k, v in got.items() if v is not None}
        n = got.get("n_devices")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidConfigError(f"n_devices (--device cuda*N) must be an int >= 1, got {n!r}")
        if not got.get("device_map") and not n:
            if got:
                raise InvalidConfigError("offload_folder needs a device_map with 'disk' entries")
            return None
        return cls(got.get("device_map"), n, got.get("offload_folder"))


def gpu_ids(n_devices: int) -> list[int]:
    """The ``n_devices`` GPUs of this process: ``r·n … r·n + n − 1`` for ``torchrun``'s local rank ``r`` (0 alone).

    Args:
        n_devices: GPUs per process.

    Returns:
        The CUDA device indices.

    Raises:
        InvalidConfigError: fewer GPUs than that on this machine.
    """
    rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ids = list(range(rank * n_devices, (rank + 1) * n_devices))
    if ids[-1] >= have:
        raise InvalidConfigError(f"n_devices={n_devices} for local rank {rank} needs GPUs {ids[0]}..{ids[-1]}, but "
                                 f"{have} CUDA device(s) are visible")
    return ids


def device_map_for(hf_model: Any, placement: Placement, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The concrete module → device map of ``placement`` for ``hf_model`` (whole decoder layers kept together).

    Args:
        hf_model: The HF model.
        placement: The placement (an explicit map, ``"auto"``/``"balanced"``/... or ``n_devices``).
        dtype: Parameter dtype used for the memory estimate.

    Returns:
        Module name → device (int GPU index, ``"cpu"`` or ``"disk"``).

    Raises:
        InvalidConfigError: an unknown device-map strategy.
    """
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    dm = placement.device_map
    if isinstance(dm, Mapping):
        return dict(dm)
    no_split = list(getattr(hf_model, "_no_split_modules", None) or [])
    budget = dict(placement.max_memory) if placement.max_memory else None
    if placement.n_devices:
        ids = gpu_ids(placement.n_devices)
        budget = budget or {i: int(torch.cuda.get_device_properties(i).total_memory * 0.9) for i in ids}
        dm = dm or "balanced"
    if dm not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise InvalidConfigError(f"device_map must be a dict or auto/balanced/balanced_low_0/sequential, got {dm!r}")
    if dm != "sequential":
        budget = get_balanced_memory(hf_model, budget, no_split_module_classes=no_split, dtype=dtype,
                                     low_zero=dm == "balanced_low_0")
    return infer_auto_device_map(hf_model, max_memory=budget, no_split_module_classes=no_split, dtype=dtype)


def dispatch(hf_model: Any, placement: Placement, dtype: torch.dtype | None = None) -> Any:
    """Place ``hf_model``'s modules per ``placement`` with accelerate (before a TransformerBridge wraps it).

    Args:
        hf_model: The HF model.
        placement: The placement.
        dtype: Parameter dtype used for the memory estimate.

    Returns:
        The dispatched model (accelerate hooks attached).

    Raises:
        InvalidConfigError: ``"disk"`` entries without ``offload_folder``.
    """
    from accelerate import dispatch_model

    dm = device_map_for(hf_model, placement, dtype)
    if "disk" in dm.values() and not placement.offload_folder:
        raise InvalidConfigError("a device_map with 'disk' entries needs offload_folder=")
    main = torch.device(placement.main_device) if placement.main_device else None
    return dispatch_model(hf_model, device_map=dm, main_device=main, offload_dir=placement.offload_folder)


def _own_module(module: Any) -> Any:
    """The module accelerate hooked: ``module`` itself, or the HF module a TransformerBridge component wraps."""
    seen = 0
    while "_hf_hook" not in module.__dict__ and seen < 8:
        inner = module.__dict__.get("_modules", {}).get("_original_component")
        if inner is None:
            break
        module, seen = inner, seen + 1
    return module


def _align_hook(module: Any, own: bool = False) -> Any:
    """The accelerate ``AlignDevicesHook`` on ``module`` (inside a ``SequentialHook`` too), or ``None``.

    With ``own`` only a hook set on ``module`` itself counts (a bridge component shows its wrapped
    module's hook as an attribute too).
    """
    hook = module.__dict__.get("_hf_hook") if own else _own_module(module).__dict__.get("_hf_hook")
    for h in [hook, *getattr(hook, "hooks", [])]:
        if h is not None and hasattr(h, "execution_device") and hasattr(h, "offload"):
            return h
    return None


def execution_device(module: Any) -> torch.device:
    """Where ``module`` runs: its accelerate hook's execution device, else its first parameter's device.

    Args:
        module: A torch module.

    Returns:
        The device (``cpu`` for a module without parameters or hook).
    """
    hook = _align_hook(module)
    if hook is not None and hook.execution_device is not None:
        dev = hook.execution_device
        return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def is_offloaded(module: Any) -> bool:
    """Whether ``module``'s own weights are offloaded (kept in accelerate's weights map, ``meta`` in the module).

    Args:
        module: A torch module.

    Returns:
        True when its weights live in the offload map.
    """
    hook = _align_hook(module)
    return bool(hook is not None and hook.offload and getattr(hook, "weights_map", None) is not None)


def resident(module: Any, name: str) -> torch.nn.Parameter:
    """``module.<name>`` as a parameter holding its real values (module docstring).

    The module's own parameter when it is not offloaded; else one parameter per (module, name),
    sharing the storage of the tensor in accelerate's weights map (loaded from disk once and pinned
    in the map), so in-place edits reach every later forward.

    Args:
        module: The module that owns the parameter.
        name: Parameter name, e.g. ``"weight"`` or ``"bias"``.

    Returns:
        The parameter (cached on the module when offloaded, not requiring grad).
    """
    if not is_offloaded(module):
        return getattr(module, name)
    module = _own_module(module)
    cache = module.__dict__.setdefault("_tlcap_resident", {})
    if name not in cache:
        wmap = _align_hook(module).weights_map
        value = wmap[name]
        loader, key = getattr(wmap, "dataset", None), f"{getattr(wmap, 'prefix', '')}{name}"
        store = getattr(loader, "state_dict", None)
        if isinstance(store, dict):  # an OffloadedWeightsLoader reading files: keep this copy as the map's value
            store[key] = value
        elif isinstance(loader, dict):
            loader[key] = value
        cache[name] = torch.nn.Parameter(value, requires_grad=False)
    return cache[name]


@contextlib.contextmanager
def resident_while_running(blocks: Sequence[Any]) -> Iterator[None]:
    """Keep each block's offloaded weights in its modules for the whole of the block's forward.

    accelerate puts a leaf module's weights in around that leaf's own forward only; code that reads
    a projection's weight directly (TransformerLens's per-head q/k/v inputs and head results, which
    edge patching switches on) sees ``meta`` otherwise. Within the block's forward its offloaded
    leaves are materialized once and their offloading paused; they go back to ``meta`` when the
    block returns, so one block's weights are in memory at a time.

    Args:
        blocks: The transformer blocks (a forward pre-hook and hook are put on each).

    Yields:
        None; the hooks are removed on exit, also when the body raises.
    """

    def pre(block: Any, args: Any) -> None:
        leaves = [(m, h) for m in block.modules() if (h := _align_hook(m, own=True)) is not None and h.offload
                  and getattr(h, "weights_map", None) is not None]
        for m, h in leaves:
            h.pre_forward(m)
            h.offload = False
        block.__dict__["_tlcap_resident_leaves"] = leaves

    def post(block: Any, args: Any, output: Any) -> None:
        for m, h in block.__dict__.pop("_tlcap_resident_leaves", []):
            h.offload = True
            h.post_forward(m, None)

    handles = [h for b in blocks for h in (b.register_forward_pre_hook(pre), b.register_forward_hook(post))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for b in blocks:  # a forward that raised left its leaves resident: offload them again
            post(b, None, None)


@contextlib.contextmanager
def materialized(module: Any) -> Iterator[Any]:
    """``module`` with every offloaded leaf under it holding its real weights for the body of a ``with`` block
    (tensors read there stay valid after it).

    Args:
        module: A torch module, possibly with offloaded leaves.

    Yields:
        ``module`` itself; its leaves go back to ``meta`` on exit.
    """
    leaves = [(m, h) for m in module.modules() if (h := _align_hook(m, own=True)) is not None and h.offload
              and getattr(h, "weights_map", None) is not None]
    for m, h in leaves:
        h.pre_forward(m)
    try:
        yield module
    finally:
        for m, h in leaves:
            h.post_forward(m, None)


def has_offloaded(module: Any) -> bool:
    """Whether any module under ``module`` is offloaded.

    Args:
        module: A torch module.

    Returns:
        True when ``module`` or a submodule has offloaded weights.
    """
    return any(is_offloaded(m) for m in module.modules())


def input_device(model: Any) -> torch.device:
    """Where a model's inputs go: the embedding's execution device on a dispatched HF model, else the first parameter's.

    Args:
        model: A :class:`tlcap.models.Model` (or an object with ``hf_model`` and ``backend``).

    Returns:
        The device token ids should be put on.
    """
    hf = getattr(model, "hf_model", None)
    if hf is not None and getattr(hf, "hf_device_map", None):
        return execution_device(hf.get_input_embeddings())
    return next(model.backend.parameters()).device


def layer_devices(model: Any, layers: Any) -> list[torch.device]:
    """The execution device of each block in ``layers`` (a module list).

    Args:
        model: The model (not read: the blocks carry their hooks).
        layers: The blocks, e.g. ``backend.blocks``.

    Returns:
        One device per block, in order.
    """
    return [execution_device(block) for block in layers]


__all__ = ["Placement", "PLACEMENT_KEYS", "dispatch", "device_map_for", "gpu_ids", "execution_device", "is_offloaded",
           "resident", "input_device", "layer_devices", "resident_while_running", "has_offloaded", "materialized"]
