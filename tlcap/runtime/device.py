"""Device and precision: parse ``device=``/``--device`` and ``dtype=``/``--dtype`` once.

``device=None`` (or ``"auto"``) means CUDA when available, else CPU. ``dtype`` is one of
``float32`` (default), ``bfloat16``, ``float16`` (short spellings ``fp32``/``bf16``/``fp16``
and ``torch.dtype`` values are accepted). The model runs in that dtype; attributions,
completeness and dataset sums accumulate in float32 or wider whatever it is.

Example:
    >>> resolve_device(None) == default_device()   # device(type='cuda') on a GPU machine, else cpu
    True
    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_dtype("bf16")
    torch.bfloat16
"""

from __future__ import annotations

from typing import Any

import torch

from tlcap.errors import InvalidConfigError, UnknownNameError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
DTYPE_CHOICES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def one_pass_default(model: Any) -> bool:
    """Whether the independent forwards of several samples run as one right-padded pass by default.

    On an accelerator, yes: one pass's kernel launches and host round trips instead of one set per sample
    (right padding never changes a real position, attention being causal). On a CPU, no: the padding costs
    compute, and a sample's result then does not depend on the samples beside it to the last bit, which
    resumed runs rely on. The batched methods read it through this module (tests and
    ``benchmarks/count_host_syncs.py`` patch it to run the accelerator's path on a CPU).

    Args:
        model: The model (its device).

    Returns:
        ``True`` on an accelerator.
    """
    return model.device.type != "cpu"


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: Any = None) -> torch.device:
    """The ``torch.device`` for ``device`` (``None``/``"auto"``: :func:`default_device`).

    Raises:
        InvalidConfigError: not a device name (``"gpu"``), or a CUDA device on a machine
            without CUDA or with fewer GPUs.
    """
    if device is None or (isinstance(device, str) and device.strip().lower() in ("", "auto")):
        return default_device()
    try:
        dev = device if isinstance(device, torch.device) else torch.device(str(device).strip())
    except (RuntimeError, ValueError, TypeError):
        raise InvalidConfigError(
            f"device (--device) {device!r} is not a torch device; use auto, cpu, cuda or cuda:N"
        ) from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise InvalidConfigError(f"device (--device) {str(dev)!r} asked for but CUDA is not available here; use --device cpu")
        if dev.index is not None and dev.index >= n:
            raise InvalidConfigError(
                f"device (--device) {str(dev)!r} does not exist: {n} CUDA device(s); use cuda:0..cuda:{n - 1}"
            )
    elif dev.type not in ("cpu", "mps", "meta"):
        raise InvalidConfigError(f"device (--device) {str(dev)!r} is not supported; use auto, cpu, cuda or cuda:N")
    return dev


def resolve_dtype(dtype: Any = None) -> torch.dtype:
    """The ``torch.dtype`` for ``dtype`` (``None``: float32).

    Raises:
        UnknownNameError: not one of float32, bfloat16, float16 (an :class:`InvalidConfigError`).
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        raise UnknownNameError.of("dtype", str(dtype).replace("torch.", ""), DTYPE_CHOICES, option="--dtype")
    key = str(dtype).strip().lower().replace("torch.", "")
    if key not in DTYPES:
        raise UnknownNameError.of("dtype", dtype, DTYPE_CHOICES, option="--dtype")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")
