"""Out-of-memory errors, as CUDA and the CPU allocator raise them."""

from __future__ import annotations

import torch


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (CUDA, or the CPU allocator).

    Args:
        exc: Any exception.

    Returns:
        ``True`` for ``torch.cuda.OutOfMemoryError``, ``MemoryError``, or a ``RuntimeError`` whose message says
        "out of memory" / "can't allocate memory".
    """
    oom_cls = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_cls is not None and isinstance(exc, oom_cls):
        return True
    if isinstance(exc, MemoryError):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


__all__ = ["is_oom"]
