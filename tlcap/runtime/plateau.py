"""``batch_rows="auto"`` on an accelerator: the smallest batch that reaches the throughput plateau.

Memory says how many rows *fit*, not how many are *useful*. On a GPU, rows per second grow with
the batch until the matrix products fill the device and then stay flat, or fall (a larger batch
copies more: CNL scoring at 7B ran slower per sample with 16 samples' rows than with 8). Sizing a
batch by free memory gave SmolLM2-135M's CNL scoring a 54.8 GiB peak on an H200 with no gain, and
left no room for a second job on the card. So on an accelerator ``batch_rows="auto"`` takes the
memory fit only as a cap and picks the batch from a short timed probe:

1. rows per second are measured at ``start``, ``2·start``, ``4·start``, … rows (and the cap), each
   size once to warm up, then timed (:func:`timed_rate`);
2. the probe stops at the cap, or once ``patience`` doublings in a row each gain less than ``tol``
   over the best rate so far, or after ``budget_s`` seconds;
3. the batch is the smallest measured size whose rate is within ``tol`` of the best
   (:func:`find_plateau`).

The rows probed are the method's own (:func:`rows_probe`: one scaled neuron layer per row at the
last position after a cached prefix, through ``Model.last_logits``, the path IG, CNL scoring and
AMIG take; forward and backward for ``"ig"``, forward only for ``"trace"``), on a random context of
the run's length rounded up to a power of two. The choice is cached per model, device, dtype, kind
and context bucket for the life of the process (:func:`plateau_rows`), so a dataset of thousands
of samples probes once; a probe that was still rising at its cap (the rows one call had) is
continued, not redone, when a later call has more rows (only the larger sizes are measured: at 7B
a probe costs 6–9 s on an H200). ``batch_rows="auto"`` does not probe on a CPU
(:func:`tlcap.runtime.batching.auto_batch_rows` uses the fixed cap
:data:`tlcap.runtime.batching.CPU_MAX_ROWS` there); :func:`plateau_rows` called directly probes on
any device.

Results do not depend on the batch (every caller is exact at any size); only speed and memory do.

Example:
    >>> rows = plateau_rows(model, "ig", context_len=40, cap=4096)     # e.g. 128 on an H100 at 135M
    >>> find_plateau(lambda b: min(b, 100.0), cap=600).rows              # launch-bound below 100 rows
    128
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tlcap.runtime import hooks as H
from tlcap.runtime.oom import is_oom

START = 8
"""Smallest batch the probe measures."""
TOL = 0.1
"""A doubling that gains less than this share of throughput is on the plateau."""
PATIENCE = 2
"""Doublings in a row without a ``TOL`` gain before the probe stops."""
BUDGET_S = 20.0
"""Most seconds one probe spends measuring."""
PROBE_DEVICE_TYPES = ("cuda", "mps", "xpu")
"""Device types where ``batch_rows="auto"`` probes (a CPU keeps its fixed cap)."""
KINDS = ("ig", "trace")


@dataclass(frozen=True)
class Plateau:
    """The outcome of a probe.

    Attributes:
        rows: The chosen batch: the smallest measured size within ``tol`` of the best rate.
        rates: ``((rows, rows per second), ...)`` in the order measured.
        cap: The largest size the probe was allowed (memory fit, rows there were).
        limited: Whether the rate was still rising at the cap (a larger cap might choose more).
        seconds: Wall time of the probe.
    """

    rows: int
    rates: tuple[tuple[int, float], ...]
    cap: int
    limited: bool
    seconds: float = 0.0


def candidates(cap: int, start: int = START) -> list[int]:
    """``start, 2·start, 4·start, …`` below ``cap``, then ``cap`` itself (``[cap]`` when ``cap <= start``).

    Args:
        cap: Largest batch size (at least 1).
        start: First batch size (at least 1).

    Returns:
        The increasing batch sizes a probe measures, ending with ``cap``.
    """
    cap = max(1, int(cap))
    out, b = [], max(1, int(start))
    while b < cap:
        out.append(b)
        b *= 2
    return out + [cap]


def find_plateau(rate_of: Callable[[int], float], cap: int, *, start: int = START, tol: float = TOL,
                 patience: int = PATIENCE, budget_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 prior: tuple[tuple[int, float], ...] = ()) -> Plateau:
    """The smallest batch whose throughput is within ``tol`` of the best measured (module docstring).

    Args:
        rate_of: Rows per second at a batch size (e.g. :func:`timed_rate` of a probe). An
            out-of-memory error at a size ends the probe; the sizes before it remain.
        cap: Largest batch to try (the memory fit).
        start: First size measured.
        tol: Relative gain below which a doubling counts as the plateau, and the slack of the choice.
        patience: Doublings in a row without such a gain before stopping.
        budget_s: Stop measuring after this many seconds (by ``clock``); ``None``: no limit.
        clock: The clock of the budget (a fake one in tests).
        prior: Rates an earlier probe of the same rows measured (a probe that was still rising at a
            smaller cap): kept, and only sizes above the largest of them are measured.

    Returns:
        A :class:`Plateau` (``rows == cap`` without measuring when ``cap <= start``).
    """
    sizes = candidates(cap, start)
    if len(sizes) == 1 and not prior:
        return Plateau(sizes[0], (), int(cap), False)
    t0 = clock()
    rates: list[tuple[int, float]] = [(int(b), float(r)) for b, r in prior]
    done = max((b for b, _ in rates), default=0)
    flat = 0  # a prior probe was still rising at its end (else it is not continued)
    for b in (x for x in sizes if x > done):
        try:
            r = float(rate_of(b))
        except (RuntimeError, MemoryError) as exc:
            if not is_oom(exc) or not rates:
                raise
            break
        best = max((x for _, x in rates), default=0.0)
        flat = flat + 1 if rates and r < best * (1 + tol) else 0
        rates.append((b, r))
        if flat >= patience or (budget_s is not None and clock() - t0 > budget_s):
            break
    within = [(b, x) for b, x in rates if b <= cap] or [(int(cap), 0.0)]  # a prior may have measured above cap
    best = max(x for _, x in within)
    rows = min(b for b, x in within if x * (1 + tol) >= best)
    limited = rates[-1][0] == sizes[-1] and len(rates) >= 2 and rates[-1][1] >= rates[-2][1] * (1 + tol)
    return Plateau(rows, tuple(rates), int(cap), bool(limited), clock() - t0)


def timed_rate(run: Callable[[int], Any], rows: int, *, repeat: int = 2, clock: Callable[[], float] = time.perf_counter,
               sync: Callable[[], None] | None = None) -> float:
    """Rows per second of ``run(rows)``: one warm-up call, then ``repeat`` timed calls.

    Args:
        run: Runs one batch of ``rows`` rows.
        rows: The batch size.
        repeat: Timed calls.
        clock: The clock (a fake one in tests).
        sync: Waits for the device (``torch.cuda.synchronize``) before the clock is read.

    Returns:
        Rows per second over the timed calls (``rows * repeat`` over their elapsed time).
    """
    wait = sync or (lambda: None)
    run(rows)
    wait()
    t0 = clock()
    for _ in range(repeat):
        run(rows)
    wait()
    return rows * repeat / max(clock() - t0, 1e-9)


def context_bucket(context_len: int) -> int:
    """The probe's context length for a run of ``context_len`` tokens: the next power of two, at least 16.

    Args:
        context_len: Tokens of the run's context.

    Returns:
        The bucket length: the smallest power of two ``>= context_len``, at least 16.
    """
    n = 16
    while n < int(context_len):
        n *= 2
    return n


def rows_probe(model: Any, kind: str, context_len: int, seed: int = 0) -> Callable[[int], Any]:
    """A function running ``b`` rows of ``kind`` on ``model`` (module docstring).

    Row r sets the ``mlp_post`` neurons of layer ``r · L // b`` to zero at the last position of a
    random context of :func:`context_bucket` tokens (a cached prefix, packed rows where they apply,
    the batch expanded at the lowest layer); ``"ig"`` adds the backward pass to the set values.
    The function returns each row's probability of token 0 (``[b]``, detached).

    Args:
        model: A :class:`tlcap.models.Model`.
        kind: ``"ig"`` (forward and backward rows) or ``"trace"`` (forward only).
        context_len: Tokens of the run's context (rounded up by :func:`context_bucket`, capped at ``n_ctx``).
        seed: Seed of the random context.

    Returns:
        ``run(b)`` running one batch of ``b`` rows and returning the ``[b]`` probabilities of token 0.

    Raises:
        ValueError: ``kind`` is not a probe kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown probe kind {kind!r}; use one of {KINDS}")
    T = min(context_bucket(context_len), int(getattr(model, "n_ctx", 2**31)))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, int(model.d_vocab), (1, T), generator=g).to(model.device)
    prefix = model.prefix_cache(ids[:, :-1])
    names = [model.hook_name("mlp_post", l) for l in range(model.n_layers)]
    grad = kind == "ig"

    def run(b: int) -> Any:
        leaf = torch.zeros(b, model.d_mlp, device=model.device, dtype=model.dtype, requires_grad=grad)
        layer_of = torch.arange(b) * model.n_layers // b
        hooks = []
        for l in layer_of.unique().tolist():
            sel = (layer_of == l).nonzero().flatten()
            hooks.append((names[l], H.replace_rows(sel, -1, leaf[sel])))
        with torch.set_grad_enabled(grad):
            logits = model.last_logits(ids[:, -1:], hooks=hooks, prefix=prefix, expand_at=0, batch=b)
            p = logits.float().softmax(-1)[:, 0]
            if grad:
                torch.autograd.grad(p.sum(), leaf)
        return p.detach()

    return run


_CACHE: dict[tuple, Plateau] = {}


def plateau_key(model: Any, kind: str, context_len: int) -> tuple:
    """The cache key: model name and shape, device (its name on CUDA), dtype, kind, context bucket.

    Args:
        model: A :class:`tlcap.models.Model`.
        kind: ``"ig"`` or ``"trace"``.
        context_len: Tokens of the run's context (only its :func:`context_bucket` enters the key).

    Returns:
        A hashable tuple ``(name, (n_layers, d_model, d_mlp, d_vocab), device, device name, dtype, kind, bucket)``.
    """
    dev = torch.device(model.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    shape = (model.n_layers, model.d_model, model.d_mlp, model.d_vocab)
    return (str(getattr(model, "name", "")), shape, str(dev), name, str(model.dtype), kind, context_bucket(context_len))


def plateau_rows(model: Any, kind: str, context_len: int, cap: int, *,
                 rate_of: Callable[[int], float] | None = None) -> int:
    """The batch for ``kind`` rows on ``model``: the cached plateau, or a new probe (module docstring).

    Args:
        model: A :class:`tlcap.models.Model`.
        kind: ``"ig"`` (forward and backward rows) or ``"trace"`` (forward only).
        context_len: Tokens of the run's context.
        cap: Largest allowed batch (memory fit, rows there are).
        rate_of: The throughput measurement (default: :func:`timed_rate` of :func:`rows_probe`).

    Returns:
        At most ``cap`` rows.
    """
    cap = max(1, int(cap))
    if cap <= START:
        return cap
    key = plateau_key(model, kind, context_len)
    hit = _CACHE.get(key)
    if hit is not None and (not hit.limited or cap <= hit.cap):
        return min(hit.rows, cap)
    if rate_of is None:
        run = rows_probe(model, kind, context_len)
        dev = torch.device(model.device)
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
        rate_of = lambda b: timed_rate(run, b, sync=sync)  # noqa: E731
    # a limited probe is continued above its cap, not redone: its smaller sizes were measured already
    found = find_plateau(rate_of, cap, budget_s=BUDGET_S, prior=hit.rates if hit is not None else ())
    _CACHE[key] = found
    if torch.device(model.device).type == "cuda":
        torch.cuda.empty_cache()  # give back the probe's largest batch
    return found.rows


def cached_plateaus() -> dict[tuple, Plateau]:
    """The probes of this process (key → :class:`Plateau`), e.g. for a benchmark's record.

    Returns:
        A copy of the cache, ``{plateau_key(...): Plateau}``.
    """
    return dict(_CACHE)


def clear_plateaus() -> None:
    """Forget every probe (the next ``batch_rows="auto"`` measures again)."""
    _CACHE.clear()


__all__ = ["Plateau", "find_plateau", "timed_rate", "rows_probe", "plateau_rows", "plateau_key", "candidates",
           "context_bucket", "cached_plateaus", "clear_plateaus", "START", "TOL", "PATIENCE", "BUDGET_S",
           "PROBE_DEVICE_TYPES"]
