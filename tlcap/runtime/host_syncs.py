"""Count the host round trips a call would make on an accelerator, on any device (a CPU included).

On a GPU, reading a value the device computed — ``float(t)``, ``t.item()``, ``t.tolist()``, ``t.cpu()``,
``t.numpy()``, a ``bool`` of a comparison — and every operator whose output shape depends on the values
(``nonzero``, boolean-mask indexing, ``unique``, ``bincount``, ...) waits for the launch queue to drain: the
GPU idles while the host then enqueues the next kernels. A profiler counts these (``cudaStreamSynchronize``,
device-to-host ``cudaMemcpyAsync``) only on a GPU; :func:`count_host_syncs` counts them anywhere, so a CPU
test can pin how many a method makes and where.

It follows values, not devices: a tensor counts as "on the device" when it was computed from the model's
parameters and buffers (the taint passes through every operator, in-place ones included; ``.cpu()``
returns an untainted copy, the host's). Index and bookkeeping tensors the code builds on the host are not
counted even where the code moves them to the device, so the count is a lower bound of a GPU's
synchronisations: a device tensor never touched by the weights and then read back is missed.

Example:
    >>> from tlcap.models import make_gpt2
    >>> model = make_gpt2("tiny", seed=0)
    >>> with count_host_syncs(model) as syncs:
    ...     logits = model.forward(torch.tensor([[1, 2, 3]]))
    ...     top = int(logits[0, -1].argmax())       # one scalar read: one round trip
    ...     _ = logits[0, -1].softmax(-1).tolist()  # one copy to the host
    >>> syncs.total, sorted(syncs.by_kind.items())
    (2, [('scalar', 1), ('to_host', 1)])
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

# operators whose output shape is data-dependent (the host waits for the values to size the output)
_SHAPE_OPS = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount",
              "argwhere", "nonzero_numpy", "equal", "is_nonzero"}
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../tlcap
_HERE = os.path.abspath(__file__)
_SKIP = ("/torch/", "/jaxtyping/", "/typeguard/", "contextlib.py")  # frames that only pass the call through


def _call_site() -> str:
    """``path:line (function)`` of the innermost tlcap frame outside this module (else the innermost frame outside
    torch and the type checkers' wrappers)."""
    f = sys._getframe(2)
    fallback = None
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if fn != _HERE and not any(part in fn for part in _SKIP):
            if fn.startswith(_PKG + os.sep):
                return f"{os.path.relpath(fn, os.path.dirname(_PKG))}:{f.f_lineno} ({f.f_code.co_name})"
            fallback = fallback or f"{os.path.basename(fn)}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return fallback or "?"


@dataclasses.dataclass
class HostSyncs:
    """Host round trips counted by :func:`count_host_syncs` (filled while its ``with`` block runs).

    Attributes:
        by_kind: ``scalar`` (``float``/``int``/``bool``/``item`` of a device value), ``to_host``
            (``cpu``/``tolist``/``numpy``), ``shape`` (an operator whose output shape depends on the values,
            e.g. ``shape:nonzero``).
        by_site: Per call site (``tlcap/path.py:line (function)``), its round trips.
    """

    by_kind: Counter = dataclasses.field(default_factory=Counter)
    by_site: Counter = dataclasses.field(default_factory=Counter)

    @property
    def total(self) -> int:
        """All round trips counted."""
        return sum(self.by_kind.values())

    def add(self, kind: str) -> None:
        """Count one round trip of ``kind`` at the caller's site.

        Args:
            kind: ``scalar``, ``to_host`` or ``shape:<operator>``.
        """
        self.by_kind[kind] += 1
        self.by_site[_call_site()] += 1

    def summary(self, top: int = 10) -> str:
        """The total, per kind, and the busiest call sites.

        Args:
            top: How many call sites to list.

        Returns:
            A few lines of text.
        """
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.by_kind.items()))
        lines = [f"host round trips: {self.total} ({kinds or 'none'})"]
        lines += [f"  {n:>6}  {site}" for site, n in self.by_site.most_common(top)]
        return "\n".join(lines)


class _Taint(TorchDispatchMode):
    """Marks every operator's outputs when an input is marked; counts the round trips on marked tensors."""

    def __init__(self, record: HostSyncs, seeds: list[torch.Tensor]) -> None:
        super().__init__()
        self.record = record
        self.marked: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for t in seeds:
            self.marked[t] = True

    def is_marked(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t in self.marked

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        flat_in, _ = tree_flatten((args, kwargs))
        marked = any(self.is_marked(t) for t in flat_in)
        name = func._schema.name.split("::")[-1]
        if marked:
            if name == "_local_scalar_dense":
                self.record.add("scalar")
            elif name in _SHAPE_OPS or name.startswith("unique") or (
                    name in ("index", "index_put", "index_put_") and _bool_index(args)):
                self.record.add(f"shape:{name}")
            elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
                self.record.add("shape:repeat_interleave")
        out = func(*args, **kwargs)
        if marked:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.marked[t] = True
        return out


def _bool_index(args: tuple) -> bool:
    idx = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (idx or ()))


@contextlib.contextmanager
def count_host_syncs(model: Any) -> Iterator[HostSyncs]:
    """Count the host round trips (synchronisations on a GPU) of the code in the ``with`` block.

    Values computed from ``model``'s parameters and buffers count as device values (module docstring):
    their scalar reads, copies to the host and data-dependent shapes are counted, per kind and call site.
    The model's outputs are unchanged; the block runs slower (every operator passes through Python).

    Args:
        model: A :class:`tlcap.models.Model` (or any ``torch.nn.Module``).

    Returns:
        A context manager yielding the :class:`HostSyncs` it fills.

    Example:
        >>> with count_host_syncs(model) as s:   # model: a tiny GPT-2
        ...     p = model.forward(torch.tensor([[1, 2]]))[0, -1].softmax(-1)
        ...     best = [float(p[i]) for i in range(3)]   # three round trips
        ...     host = p.cpu(); rest = float(host[3])      # one copy, then host reads are free
        >>> s.by_kind["scalar"], s.by_kind["to_host"]
        (3, 1)
    """
    mod = getattr(model, "backend", model)  # a tlcap Model's torch module, or the module itself
    if not isinstance(mod, torch.nn.Module):
        raise TypeError(f"count_host_syncs needs a tlcap Model or a torch.nn.Module, got {type(model).__name__}")
    seeds = [*mod.parameters(), *mod.buffers()]
    record = HostSyncs()
    mode = _Taint(record, seeds)
    originals = {name: getattr(torch.Tensor, name) for name in ("cpu", "tolist", "numpy")}

    def to_host(name: str) -> Any:
        orig = originals[name]

        def method(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            if not mode.is_marked(self):
                return orig(self, *a, **k)
            record.add("to_host")
            with _disable_current_modes():  # the host's copy: untainted
                out = orig(self.clone() if name == "cpu" else self, *a, **k)
            return out
        return method

    for name in originals:
        setattr(torch.Tensor, name, to_host(name))
    try:
        with mode:
            yield record
    finally:
        for name, orig in originals.items():
            setattr(torch.Tensor, name, orig)


__all__ = ["HostSyncs", "count_host_syncs"]
