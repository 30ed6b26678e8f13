"""Issue 25, item 3: every method once on a Llama-3-8B shape in bf16 on an emulated 80 GB card.

``gpu_goals.py --only llama3_8b_shape`` runs these sections (one per method, each its own budget): the
model (``load_model("llama3-8b-shape")``: GQA 32/8, d_mlp 14,336, the full 128,256-token vocabulary), then
every registered method (:func:`tlcap.methods`: ``kn``, ``ig``, ``sig``, ``amig``, ``trace``, ``eap``,
``eap-ig``, ``cnl`` on 8 GSM8K samples) through :func:`tlcap.localize` with its defaults, then the batched paths and the
weight edits (KN over 8 facts, AMIG over 3, traces of 4 facts, CNL scoring of 8 GSM8K samples per call,
a ROME edit, CNL's masked fine-tuning in its largest mode). On a card larger than 80 GB the process is
capped at :data:`CARD_GIB` (``torch.cuda.set_per_process_memory_fraction``) and the batch sizing sees that
cap as the card (``batching.free_memory``), so an allocation beyond an 80 GB card's raises there as it
would on one. Each section records its status (``"ran"``, or ``"oom"`` where an out-of-memory error
escaped the method's own halving), seconds, and the allocator's peak. ``--device cpu --tiny`` runs the
same code on a tiny random Llama (no peaks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import tlcap
import tlcap.runtime.batching as batching
from tlcap.attribution import integrated_gradients_facts
from tlcap.attribution.amig import amig_facts
from tlcap.attribution.dataset import score_dataset
from tlcap.data.tasks import load_task
from tlcap.intervene.covariance import key_covariance
from tlcap.intervene.rome.edit import rome_edit
from tlcap.locate.causal_trace import causal_trace_facts
from tlcap.runtime.oom import is_oom
from tlcap.runtime.run_control import RunControl

CARD_GIB = 79.0
"""The memory an 80 GB H100 gives a process (GiB; ``torch.cuda.mem_get_info`` reports 79.2 there)."""

KEY = "llama3_8b_shape"
"""The JSON key of these sections."""

FACTS = [("The capital of France is", " Paris", "France"),
         ("The Eiffel Tower is located in the city of", " Paris", "The Eiffel Tower"),
         ("The mother tongue of Danielle Darrieux is", " French", "Danielle Darrieux"),
         ("Michael Jordan plays the sport of", " basketball", "Michael Jordan"),
         ("The official language of Italy is", " Italian", "Italy"),
         ("Toko Yasuda plays the", " guitar", "Toko Yasuda"),
         ("The headquarters of Google are in", " Mountain", "Google"),
         ("Barack Obama was born in", " Hawaii", "Barack Obama")]


@contextlib.contextmanager
def card_of(device: torch.device, gib: float = CARD_GIB) -> Iterator[float | None]:
    """Cap this process at ``gib`` of ``device`` where the card is larger, and size batches against the cap.

    Args:
        device: The device (a CPU: nothing changes).
        gib: The emulated card's memory.

    Yields:
        The cap in GiB (``None`` on a CPU or a card not larger than it).
    """
    if device.type != "cuda":
        yield None
        return
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(gib * 2**30)
    if total <= cap:
        yield None
        return
    real = batching.free_memory
    index = device.index if device.index is not None else torch.cuda.current_device()  # the call takes no bare "cuda"
    torch.cuda.set_per_process_memory_fraction(cap / total, index)

    def capped(dev: torch.device | str) -> int:
        d = torch.device(dev)
        if d.type != "cuda":
            return real(d)
        return max(0, min(real(d), cap - torch.cuda.memory_allocated(d)))

    batching.free_memory = capped
    try:
        yield gib
    finally:
        batching.free_memory = real
        torch.cuda.set_per_process_memory_fraction(1.0, index)


def peak_of(fn: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """Run ``fn`` once: its status, seconds and the allocator's peak (GiB) above what was allocated before.

    Args:
        fn: The call.
        device: Where it runs.

    Returns:
        ``status`` (``"ran"`` or ``"oom"``), ``seconds``, ``base_gib``, ``peak_gib``, ``fits_80gb_card``.
    """
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) / 2**30 if cuda else None
    t0 = time.perf_counter()
    status, error = "ran", None
    try:
        fn()
    except Exception as exc:  # an OOM the method's own halving did not absorb is the finding; others propagate
        if not is_oom(exc):
            raise
        status, error = "oom", str(exc).splitlines()[0][:300]
    if cuda:
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    out = {"status": status, "seconds": time.perf_counter() - t0, "base_gib": base, "peak_gib": peak,
           "fits_80gb_card": status == "ran" and (peak is None or peak <= CARD_GIB)}
    return out | ({"error": error} if error else {})


def calls(model: tlcap.Model) -> dict[str, Callable[[], Any]]:
    """One call per method and path (module docstring), each with the method's defaults.

    Args:
        model: The model.

    Returns:
        Section name → the call.
    """
    p, t, s = FACTS[0]
    data: dict[str, Any] = {"kn": (p, t), "ig": (p, t), "sig": (p, t), "amig": (p, t), "trace": (p, s),
                            "eap": (p, t), "eap-ig": (p, t), "cnl": {"task": "gsm8k", "n": 8}}
    out: dict[str, Callable[[], Any]] = {}
    for m in tlcap.methods():
        if m.name not in data:
            raise KeyError(f"memory_8b has no data for the registered method {m.name!r}; add it to calls()")
        out[m.name] = lambda name=m.name: tlcap.localize(model, data[name], method=name)
    out["kn_facts_b8"] = lambda: integrated_gradients_facts(model, [(a, b) for a, b, _ in FACTS], fact_batch=8)
    out["amig_facts_b3"] = lambda: amig_facts(model, [(a, b) for a, b, _ in FACTS[:3]])
    out["trace_facts_b4"] = lambda: causal_trace_facts(model, [(a, c, b) for a, b, c in FACTS[:4]], warn=False)
    gsm = load_task("gsm8k", split="train", n=8, seed=5)
    out["cnl_score_b8"] = lambda: score_dataset(model, gsm, sample_batch=8, run=RunControl(progress=False))

    def rome() -> None:
        layer = model.n_layers // 4
        cov = key_covariance(model, [layer], n_tokens=2048, cache=False)[layer]
        with rome_edit(model, FACTS[2][0], FACTS[2][2], " English", layer, cov=cov):
            pass

    out["rome_edit"] = rome
    return out


__all__ = ["CARD_GIB", "FACTS", "KEY", "calls", "card_of", "peak_of"]
