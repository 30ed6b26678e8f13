"""``batch_rows="auto"``: a batch that fits the memory budget and reaches the throughput plateau, halved on out-of-memory.

A method whose batch size does not change its result (exact IG, tracing, EAP: rows are
independent) takes ``batch_rows="auto"`` and calls :func:`run_auto_batched`:

1. the memory fit is the largest number of rows whose estimated memory (``row_bytes`` each)
   fits the budget: ``max_memory`` (bytes or ``"8GiB"``/``"500MB"``; default: the device's free
   memory), less a safety margin, capped at the rows there are. A model whose layers sit on
   several devices is fitted on each: a device holding a share ``s`` of the layers holds ``s`` of
   every row's activations, so rows = min over devices of budget / (``s`` · ``row_bytes``);
2. the start size is that fit on a CPU (at most :data:`CPU_MAX_ROWS`, where larger batches measured
   no faster); on an accelerator, given the model and the rows' kind, the smallest batch within
   the fit that reaches the throughput plateau, measured once per model, device, dtype and context
   length by a short timed probe (:mod:`tlcap.runtime.plateau`), so a small model takes the memory
   it can use, not all that is free;
3. the whole computation runs at that size; on an out-of-memory error (CUDA's
   ``torch.cuda.OutOfMemoryError``, CPU ``MemoryError`` or a ``RuntimeError`` saying "out of
   memory") it is rerun from the start at half the size, down to one row.

The rerun starts from scratch, so the result is exactly the result of a fixed batch of the
final size (no partial sums from the failed size are kept).

Example (``device="cuda"`` on a GPU; on a CPU the start size is capped at :data:`CPU_MAX_ROWS`):
    >>> from tlcap import integrated_gradients
    >>> rows = auto_batch_rows(row_bytes=2_000_000, total_rows=630, max_memory="1GiB", device="cpu")
    >>> rows
    256
    >>> p, t = "The capital of France is", " Paris"
    >>> res = run_auto_batched(lambda b: integrated_gradients(model, p, t, steps=2, batch_rows=b), rows, device="cpu")
    >>> type(res).__name__
    'NeuronAttribution'
    >>> def fits_4(b):                    # a computation that runs out of memory above 4 rows
    ...     if b > 4:
    ...         raise RuntimeError("CUDA out of memory")
    ...     return b
    >>> run_auto_batched(fits_4, 16, on_retry=lambda rows, msg: print("retry at", rows))
    retry at 8
    retry at 4
    4
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from tlcap.errors import InvalidConfigError
from tlcap.runtime.oom import is_oom
from tlcap.runtime.plateau import PROBE_DEVICE_TYPES, plateau_rows

T = TypeVar("T")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SAFETY = 0.8  # use at most this share of the budget (allocator fragmentation, estimate error)
# On a CPU a batch larger than this is no faster (SmolLM2, one thread: KN IG 630 rows 5.7-6.0 s vs
# 256 rows 5.9-6.1 s; CNL scoring of 6 Emotion samples, auto vs 256: 15.0-16.7 s vs 14.2-14.5 s) and
# the memory it takes is the machine's RAM, where running out kills the process instead of raising.
CPU_MAX_ROWS = 256
# EAP dataset items per pass on a CPU: the measured default (SmolLM2, ParaRel P36: 0.30 s per
# prompt at 8 items vs 0.51 s one at a time; benchmarks/results/bench_circuit_dataset.json).
CPU_MAX_ITEMS = 8


def parse_memory(value: Any) -> int:
    """Bytes of a memory budget: an int/float of bytes or a string such as ``"8GiB"``, ``"500MB"``.

    Raises:
        InvalidConfigError: not a positive size.
    """
    if isinstance(value, bool):
        raise InvalidConfigError(f"max_memory (--max-memory) must be a size such as 8GiB or 500MB, got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise InvalidConfigError(f"max_memory (--max-memory) must be a size such as 8GiB or 500MB, got {value!r}")
        n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not n > 0:
        raise InvalidConfigError(f"max_memory (--max-memory) must be > 0, got {value!r}")
    return int(n)


def free_memory(device: torch.device | str) -> int:
    """Free bytes on ``device``: on CUDA the driver's free memory (``torch.cuda.mem_get_info``) plus what
    PyTorch's caching allocator holds unused (reserved - allocated: freed by the previous batch, reusable
    without asking the driver); ``MemAvailable`` on the CPU.

    Without the second term a long run that sizes its batches again and again (dataset scoring sizes
    every window of samples) would see the previous window's peak as used and shrink every later batch.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free + max(int(cached), 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def device_shares(model: Any) -> dict[torch.device, float]:
    """Share of ``model``'s layers on each device they run on (``{model.device: 1.0}`` on one device).

    Uses ``model.layer_devices`` (the execution device of each layer, :class:`tlcap.models.Model`)
    when the model has it.
    """
    layer_devices = list(getattr(model, "layer_devices", None) or [])
    if not layer_devices:
        return {torch.device(model.device): 1.0}
    out: dict[torch.device, float] = {}
    for d in layer_devices:
        out[torch.device(d)] = out.get(torch.device(d), 0.0) + 1.0 / len(layer_devices)
    return out


def auto_batch_rows(row_bytes: int, total_rows: int, max_memory: Any = None, device: torch.device | str = "cpu",
                    cpu_max: int = CPU_MAX_ROWS, *, model: Any = None, kind: str | None = None,
                    context_len: int = 0) -> int:
    """The start size of ``batch_rows="auto"`` (module docstring), in ``[1, total_rows]``.

    Args:
        row_bytes: Estimated bytes one row needs (activations kept for the backward pass).
        total_rows: Rows there are (no point in a larger batch).
        max_memory: Budget per device (see :func:`parse_memory`); default each device's free memory.
        device: The device the rows run on (``model``'s devices when ``model`` is given); on a
            CPU the batch is at most ``cpu_max`` rows (larger batches are no faster there and take
            the machine's RAM).
        cpu_max: The CPU cap (default :data:`CPU_MAX_ROWS`).
        model: The model the rows run on: the fit is taken on each of its devices, and with
            ``kind`` an accelerator's batch is the throughput plateau's.
        kind: ``"ig"`` (rows with a backward pass) or ``"trace"`` (forward only) for the plateau probe;
            ``None``: the memory fit.
        context_len: Tokens of the rows' context (the probe's context length).
    """
    shares = device_shares(model) if model is not None else {torch.device(device): 1.0}
    fit = None
    for dev, share in shares.items():
        budget = parse_memory(max_memory) if max_memory is not None else free_memory(dev)
        n = int(budget * SAFETY / share) // max(int(row_bytes), 1)
        fit = n if fit is None else min(fit, n)
    assert fit is not None
    on_cpu = all(d.type == "cpu" for d in shares)
    if on_cpu:
        fit = min(fit, int(cpu_max))
    rows = max(1, min(int(total_rows), fit))
    if model is not None and kind is not None and any(d.type in PROBE_DEVICE_TYPES for d in shares):
        rows = plateau_rows(model, kind, context_len, rows)
    return rows


def run_auto_batched(fn: Callable[[int], T], batch_rows: int, device: torch.device | str = "cpu",
                     on_retry: Callable[[int, str], None] | None = None, asked: Any = None) -> T:
    """Run ``fn(batch_rows)``; on out-of-memory rerun it from scratch at half the rows, down to 1.

    Args:
        fn: The whole computation at a given batch size (its result must not depend on it).
        batch_rows: The start size (e.g. :func:`auto_batch_rows`).
        device: Its device (the CUDA cache is emptied before a retry).
        on_retry: Called as ``on_retry(new_rows, error_message)`` before each retry.
        asked: The settings the caller was given (``"auto"`` included): a result with a
            ``provenance`` records them instead of the size they resolved to, so a run asked
            for ``auto`` says so whatever the machine picked.

    Returns:
        ``fn``'s result at the first size that fits: exactly the result of that fixed size.

    Raises:
        The out-of-memory error when even one row does not fit; any other error at once.
    """
    rows = max(1, int(batch_rows))
    while True:
        try:
            return _record_asked(fn(rows), asked)
        except (RuntimeError, MemoryError) as exc:
            if not is_oom(exc) or rows == 1:
                raise
            rows, message = max(1, rows // 2), f"{type(exc).__name__}: {exc}"
        gc.collect()  # outside the except block: the traceback's frames (and tensors) are gone
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        if on_retry is not None:
            on_retry(rows, message)


def _record_asked(result: T, asked: Any) -> T:
    if isinstance(result, list):  # one result per fact
        return [_record_asked(r, asked) for r in result]  # type: ignore[return-value]
    prov = getattr(result, "provenance", None)
    if asked is None or prov is None:
        return result
    return dataclasses.replace(result, provenance=prov.with_config(asked))  # type: ignore[type-var]


def ig_row_bytes(model: Any, context_len: int) -> int:
    """Estimated bytes of one exact-IG row (one position through every layer, kept for backward).

    Per layer: the residual stream and attention/MLP intermediates (~12·d_model + 4·d_mlp
    values) and one attention row over the context per head (scores and pattern, 2·n_heads·T);
    plus the logits in the model dtype and in float32 for the softmax (3·d_vocab). Counted in the
    model's parameter dtype, then doubled for the backward pass's gradients.
    """
    elem = torch.empty((), dtype=model.dtype).element_size()
    return int(2 * _position_values(model, context_len) * max(elem, 2))


def _position_values(model: Any, context_len: int) -> int:
    """Values one position keeps through every layer (the count :func:`ig_row_bytes` documents)."""
    per_layer = 12 * model.d_model + 4 * model.d_mlp + 2 * model.n_heads * max(int(context_len), 1)
    return model.n_layers * per_layer + 3 * model.d_vocab


def trace_row_bytes(model: Any, context_len: int) -> int:
    """Estimated bytes of one causal-trace row (a forward pass without gradients).

    The row's keys and values over the context at every layer (``2·n_kv_heads·d_head`` per
    position and layer, kept by the prefix cache), one layer's live intermediates per position
    (~12·d_model + 4·d_mlp values and an attention row of 2·n_heads·T), and the last position's
    logits (3·d_vocab), in the model's parameter dtype.
    """
    elem = torch.empty((), dtype=model.dtype).element_size()
    T = max(int(context_len), 1)
    per_pos = model.n_layers * 2 * model.n_kv_heads * model.d_head + 12 * model.d_model + 4 * model.d_mlp + 2 * model.n_heads * T
    return int((T * per_pos + 3 * model.d_vocab) * max(elem, 2))


def _edge_graph_sizes(model: Any) -> tuple[int, int, int]:
    """``(q/k/v reader heads per layer, readers, upstream nodes)`` of the model's edge graph (its shapes only)."""
    heads = model.n_heads + 2 * model.n_kv_heads
    return heads, model.n_layers * (heads + 1) + 1, 1 + model.n_layers * (model.n_heads + 1)


def circuit_row_bytes(model: Any, context_len: int) -> int:
    """Estimated bytes of one circuit-only row (a no-grad forward of :func:`tlcap.locate.circuits.evaluate_masks`).

    The row's upstream outputs (``n_upstream·d_model`` per position, kept for the readers downstream) three times
    (as recorded, concatenated for a reader, and their difference from the ablated outputs), one layer's split
    q/k/v reader inputs (``(n_heads + 2·n_kv_heads)·d_model`` per position, ~4 live intermediates) and
    intermediates, in the model dtype, its float32 edge mask (``n_upstream·n_readers``) and the logits, doubled
    for the other temporaries of the masked sums.
    """
    elem = max(torch.empty((), dtype=model.dtype).element_size(), 2)
    T = max(int(context_len), 1)
    heads, n_readers, n_upstream = _edge_graph_sizes(model)
    per_pos = (3 * n_upstream + 4 * heads + 12) * model.d_model + 4 * model.d_mlp
    return int(2 * (T * per_pos * elem + 4 * n_upstream * n_readers + 3 * model.d_vocab * elem))


def eap_item_bytes(model: Any, context_len: int, steps: int, split: bool = True) -> int:
    """Estimated bytes of one dataset item in an EAP / EAP-IG pass (:func:`tlcap.locate.circuits.edge_attribution`).

    Each of the item's ``max(steps, 2)`` rows is a whole sequence kept for the backward pass: per
    position the values :func:`ig_row_bytes` counts for one position (every layer's
    intermediates, one attention row per head, the logits in two dtypes), in the model dtype.
    With ``split`` (circuit-only runs, and gradients on models without grouped reader gradients)
    a row also holds the split q/k/v inputs of the per-head ln1 at every layer
    (``(n_heads + 2·n_kv_heads)·d_model`` values per position, ~4 stored intermediates). The item
    adds its reader gradients and upstream outputs (``(n_readers + n_upstream)·d_model`` per
    position, float32), three times: as captured, stacked, and in the score product. Against the
    peaks measured with grouped reader gradients (``benchmarks/results/bench_eap_memory_grouped.json``,
    16 tokens) this gives, SmolLM2: EAP 156 MB (measured 111), EAP-IG(5) 261 MB (129); the 1B
    Llama shape: EAP 655 MB (405), EAP-IG(5) 862 MB (432): on the safe side.
    """
    elem = max(torch.empty((), dtype=model.dtype).element_size(), 2)
    T = max(int(context_len), 1)
    heads, n_readers, n_upstream = _edge_graph_sizes(model)
    sequence = T * _position_values(model, T) * elem
    split_bytes = model.n_layers * heads * model.d_model * 4 * T * elem if split else 0
    grads = 3 * (n_readers + n_upstream) * T * model.d_model * 4
    return int(max(int(steps), 2) * (split_bytes + sequence) + grads)
