"""Peak memory of a stage: the process's resident set, or CUDA's allocator peak when the model is on a GPU.

On Linux the kernel's high-water mark ``VmHWM`` (``/proc/self/status``) is reset per stage by
writing ``5`` to ``/proc/self/clear_refs``, so each stage gets its own peak. Elsewhere the peak
falls back to ``resource.getrusage``'s ``ru_maxrss``, the process's peak so far (labelled
``"process"``, not per stage). Reset with a CUDA device, the peak is
``torch.cuda.max_memory_allocated`` of that device since the reset (scope ``"cuda"``): the memory
that decides whether a stage fits the card.

Example:
    >>> meter = PeakMemory()
    >>> meter.reset()
    >>> x = torch.ones(10_000_000)             # run a stage (here: 40 MB of floats)
    >>> meter.peak_bytes() > x.numel() * 4, meter.scope      # "stage" on Linux
    (True, 'stage')
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _hwm_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    """The current resident set size (0 when it cannot be read).

    Returns:
        The ``VmRSS`` of this process in bytes, read from ``/proc/self/status``.
    """
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakMemory:
    """Per-stage peak memory (module docstring). ``scope`` is ``"stage"``, ``"process"`` or ``"cuda"``."""

    def __init__(self) -> None:
        self.scope = "stage"
        self.device: torch.device | None = None

    def reset(self, device: torch.device | str | None = None) -> None:
        """Start a new peak; with a CUDA ``device`` the peak is that device's allocator peak.

        Args:
            device: The device the stage runs on (``None`` or a CPU device: resident memory is tracked).
        """
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        if self.scope == "cuda":
            self.scope = "stage"
        try:
            _CLEAR.write_text("5")
        except OSError:
            self.scope = "process"
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def peak_bytes(self) -> int:
        """Peak bytes since :meth:`reset`: resident (since the process started, for ``"process"``) or CUDA's.

        Returns:
            The peak in bytes; :attr:`scope` then says which peak it is.
        """
        if self.device is not None and self.device.type == "cuda":
            self.scope = "cuda"
            return int(torch.cuda.max_memory_allocated(self.device))
        hwm = _hwm_bytes() if self.scope == "stage" else None
        if hwm is not None:
            return hwm
        self.scope = "process"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)

    def cuda_peak_bytes(self) -> int | None:
        """CUDA allocator peak since :meth:`reset` (``None`` without CUDA).

        Returns:
            ``torch.cuda.max_memory_allocated()`` of the current device in bytes, or ``None``.
        """
        return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None


__all__ = ["PeakMemory", "rss_bytes"]
