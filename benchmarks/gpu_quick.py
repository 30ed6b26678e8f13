"""``python benchmarks/bench_gpu.py --quick``: the whole GPU verification in one short run (issue 25, item 6).

Sections in priority order (what matters most runs first, so a run cut short keeps it):

1. ``matmul``: the measured bf16 matmul peak (the denominator of every fraction of peak);
2. ``cuda_tests``: ``pytest -m cuda`` on the test files that hold ``cuda``-marked tests (a subprocess
   with its own timeout; ``--tiny`` only collects them);
3. SmolLM2-135M shape, bf16: model, ``kn_exact_ig``, ``cnl_exact_ig_batched`` (``batch_rows="auto"``:
   the plateau batch and its peak memory);
4. Llama-2-7B shape, bf16: model, ``kn_exact_ig``, ``cnl_exact_ig_batched``;
5. ``calibration``: the ``tlcap reproduce`` probe on both shapes, written to
   ``<out>.calibration.json`` (replay it anywhere: ``tlcap reproduce ... --dry-run --calibration FILE``);
6. the batched-across-facts sections of ``bench_gpu`` when it has them (``kn_facts_batched``,
   ``ql_amig_batched``, ``trace_facts_batched``, ``accuracy_batched``: called by name with the arguments their signatures
   ask for), on both shapes;
7. ``cnl_exact_ig`` (one sample at a time) on both shapes; ``causal_trace``, ``eap``, ``eap_ig5`` on
   the SmolLM2 shape;
8. ``plateaus``: the batches ``batch_rows="auto"`` chose (rows, measured rows/s);
9. ``reproduce_check``: four cheap ``reproduce`` stages on the 7B shape with the probe just taken,
   predicted vs measured time and peak memory;
10. ``causal_trace`` and ``eap_ig5`` on the 7B shape, when time is left.

Every section has a time budget: timed sections stop sampling at their cap, and an alarm stops a
section at its budget (recorded as an error); a section whose minimum does not fit in what is
left of ``--max-wall`` is recorded as skipped. The JSON is rewritten after every section.
``--device cpu --tiny`` runs every code path with tiny models on a CPU in a minute or two.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import tlcap.runtime.batching as batching
from tlcap.attribution.config import IGConfig
from tlcap.models import Model
from tlcap.reproduce.cost import save_calibrations
from tlcap.reproduce.probe import calibrate
from tlcap.reproduce.run import reproduce
from tlcap.reproduce.scales import ScaleConfig
from tlcap.rows import row_dict
from tlcap.runtime.plateau import cached_plateaus

ROOT = Path(__file__).resolve().parent.parent
BATCHED_SECTIONS = ("kn_facts_batched", "ql_amig_batched", "trace_facts_batched", "accuracy_batched")


class SectionTimeout(Exception):
    """A section ran past its budget."""


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`SectionTimeout` in the main thread after ``seconds`` (between Python bytecodes)."""

    def fire(signum: int, frame: Any) -> None:
        raise SectionTimeout(f"stopped at its budget of {seconds:.3g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, float(seconds)))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Budget:
    """Runs sections of a ``bench_gpu.Report`` within a total wall-clock budget."""

    def __init__(self, rep: Any, max_wall: float) -> None:
        self.rep, self.max_wall, self.t0 = rep, float(max_wall), time.perf_counter()

    def left(self) -> float:
        return self.max_wall - (time.perf_counter() - self.t0)

    def run(self, key: tuple[str, ...], fn: Callable[[], dict[str, Any]], budget: float,
            need: float | None = None) -> dict[str, Any] | None:
        """Run section ``key`` with at most ``budget`` seconds, if at least ``need`` (default budget / 3) are left."""
        left = self.left()
        need = budget / 3 if need is None else need
        if left < need:
            return self.rep.section(key, lambda: {"skipped": f"out of time: {left:.0f} s left of --max-wall "
                                                              f"{self.max_wall:.0f}, the section needs {need:.0f}"})
        try:
            with alarm(min(budget, left)):
                return self.rep.section(key, fn)
        except SectionTimeout as exc:  # fired outside the section's own try (while the JSON was written)
            msg = str(exc)
            return self.rep.section(key + ("late",), lambda: {"error": msg})


def cuda_test_files() -> list[str]:
    """Test files holding ``@pytest.mark.cuda`` tests (relative to the project root)."""
    out = []
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        if re.search(r"^\s*@pytest\.mark\.cuda\b", p.read_text(errors="ignore"), re.MULTILINE):
            out.append(str(p.relative_to(ROOT)))
    return out


def cuda_tests(collect_only: bool, timeout: float) -> dict[str, Any]:
    """``pytest -m cuda`` on :func:`cuda_test_files` in a subprocess: counts, the summary line, the output's tail."""
    files = cuda_test_files()
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "-rfE", *files]
    if collect_only:
        cmd.append("--collect-only")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        raw = (exc.stdout or b"") + (exc.stderr or b"")
        out, code = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)), "timeout"
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed)", out)}
    if collect_only:
        m = re.search(r"(\d+)(?:/\d+)? tests? collected", out)
        counts["collected"] = int(m.group(1)) if m else len(re.findall(r"::test_", out))
    summary = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|error|deselected)|collected", ln)]
    return {"files": files, "command": " ".join(cmd[1:]), "returncode": code, "counts": counts,
            "summary": summary[-1] if summary else "", "seconds": time.perf_counter() - t0, "output_tail": out[-4000:]}


def call_section(fn: Callable[..., dict[str, Any]], values: dict[str, Any]) -> dict[str, Any]:
    """Call a ``bench_gpu`` section function with the arguments its signature names (from ``values``)."""
    kw = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in values:
            kw[name] = values[name]
        elif p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{fn.__name__} needs {name!r}, which the quick run does not provide "
                            f"(it provides {sorted(values)})")
    res = fn(**kw)
    return res if isinstance(res, dict) else {"result": res}


def batched_sections(bg: ModuleType) -> dict[str, Callable[..., dict[str, Any]]]:
    """The batched-across-facts sections ``bench_gpu`` defines (``bench_<name>`` or ``<name>``)."""
    out = {}
    for name in BATCHED_SECTIONS:
        fn = getattr(bg, f"bench_{name}", None) or getattr(bg, name, None)
        if callable(fn):
            out[name] = fn
    return out


def probe(model: Model, path: Path, store: dict[str, Any]) -> dict[str, Any]:
    """The ``reproduce`` calibration probe on ``model`` (two sizes per unit), added to the calibration file at ``path``."""
    cal = calibrate(model, two_sizes=True)
    save_calibrations(path, [cal])
    store[model.name] = cal
    return {"file": path.name, **cal.to_dict()}


def repro_check(model: Model, cal_path: Path, tiny: bool) -> dict[str, Any]:
    """Cheap ``reproduce`` stages on ``model`` with the replayed probe: predicted vs measured per stage (CNL's
    location, QL's IG and AMIG localization — AMIG dominates the ``full`` plan — and Figs. 5-7's synapse rows)."""
    scale = ScaleConfig(name="smoke", cnl_datasets=("emotion",), cnl_eval_datasets=(), cnl_locate_n=8 if not tiny else 4,
                        cnl_ig=IGConfig(steps=20), cnl_max_answer_tokens=1, cnl_groups=4, ql_relations=("P36",), ql_n_facts=4,
                        ql_max_queries=3, ql_known_top_k=None, ql_ig=IGConfig(steps=20), ql_sig_facts=1, ql_amig_facts=1,
                        n_boot=200)
    only = ["cnl.locate.emotion", "ql.localize.ig", "ql.localize.amig", "ql.fig5-7"]
    with tempfile.TemporaryDirectory() as tmp:
        run = reproduce(model, Path(tmp) / "repro", papers=("cnl", "ql"), scale=scale, only=only, calibration=cal_path)
        stages = [row_dict(s) for s in run.report.stages]
    for s in stages:
        p, m = s.get("predicted_s"), s.get("measured_s")
        s["measured_over_predicted"] = m / p if p and m is not None else None
    return {"scale": "smoke + emotion locate of 8 samples at 20 steps, ql.localize.ig of 4 P36 facts, ql.localize.amig "
                     "of 1 fact, ql.fig5-7 of the 4 facts", "only": only,
            "stages": stages}


def plateau_record() -> dict[str, Any]:
    """The batches ``batch_rows="auto"`` chose in this process."""
    return {"probes": [{"model": k[0], "device": k[3], "dtype": k[4], "kind": k[5], "context_bucket": k[6],
                        "rows": p.rows, "cap": p.cap, "limited": p.limited, "seconds": p.seconds,
                        "rates_rows_per_s": [[b, r] for b, r in p.rates]} for k, p in cached_plateaus().items()]}


def keeps_probe_types(fn: Any) -> Any:
    """``fn`` with ``batching.PROBE_DEVICE_TYPES`` restored when it returns (a CPU smoke run adds ``"cpu"`` to it;
    left there, every later run in the process, a test's included, would probe its batch on a CPU)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        saved = batching.PROBE_DEVICE_TYPES
        try:
            return fn(*args, **kwargs)
        finally:
            batching.PROBE_DEVICE_TYPES = saved
    return run


@keeps_probe_types
def run_quick(args: Any, bg: ModuleType) -> dict[str, Any]:
    """The quick run (module docstring); ``bg`` is the ``bench_gpu`` module (its sections and helpers)."""
    device = bg.resolve_device(args.device)
    tiny = bool(args.tiny)
    if device.type == "cpu":  # the dry run takes the accelerator's path: batch_rows="auto" probes its plateau
        batching.PROBE_DEVICE_TYPES = (*batching.PROBE_DEVICE_TYPES, "cpu")
    dt = torch.bfloat16
    peak_box: dict[str, float | None] = {"tflops": None}
    payload: dict[str, Any] = {
        "quick": True, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "device_type": device.type, "tiny": tiny, "dtype": "bfloat16", "env": bg.env_info(),
        "date": time.strftime("%Y-%m-%d"),
        "settings": {k: (v.name if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "flops_note": "FLOPs counted by torch.utils.flop_counter.FlopCounterMode on one call (matmuls, forward and "
                      "backward as executed); fraction_of_matmul_peak = flops_per_sample * samples_per_s / matmul.tflops",
    }
    rep = bg.Report(args.out, payload)
    q = Budget(rep, args.max_wall)
    cal_path = args.out.with_name(args.out.stem + ".calibration.json")
    cal_path.unlink(missing_ok=True)
    models: dict[str, Model] = {}
    cals: dict[str, Any] = {}
    steps, cap = args.steps, args.section_seconds
    n_matmul = args.matmul_n or (8192 if device.type == "cuda" else 256)
    shapes = {"smollm2_shape": "smollm2-135m-shape", "llama7b_shape": "llama-7b-shape"}

    def matmul() -> dict[str, Any]:
        res = bg.matmul_tflops(device, n_matmul, seconds=2.0)
        peak_box["tflops"] = res["tflops"]
        return res

    def load(key: str) -> Callable[[], dict[str, Any]]:
        def fn() -> dict[str, Any]:
            bg.reset_peak(device)
            t0 = time.perf_counter()
            big = key == "llama7b_shape"  # tiny: two different shapes, as the real ones (one probe each in the file)
            m = models[key] = (bg.make_llama(seed=int(big), n_layers=2 + int(big), device=device, dtype=dt) if tiny
                               else bg.load_model(shapes[key], device=device, dtype=dt))
            bg.sync(device)
            return {"model": m.name, "params": sum(p.numel() for p in m.backend.parameters()), "n_layers": m.n_layers,
                    "d_mlp": m.d_mlp, "load_seconds": time.perf_counter() - t0, "weights_gib": bg.peak_gib(device)}
        return fn

    def with_model(key: str, fn: Callable[[Model], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            if key not in models:
                return {"skipped": f"no {key} model (its load failed or was skipped)"}
            return fn(models[key])
        return run

    big_n = 1 if not tiny else 2
    q.run(("matmul",), matmul, 15, 5)
    q.run(("cuda_tests",), lambda: cuda_tests(tiny, min(args.test_seconds, max(q.left() - 150, 30))), args.test_seconds + 10,
          40)
    for key in ("smollm2_shape", "llama7b_shape"):
        n_kn = args.samples if key == "smollm2_shape" else max(2, args.samples // 3)
        q.run((key, "bfloat16", "model"), load(key), 60, 15)
        q.run((key, "bfloat16", "kn_exact_ig"), with_model(key, lambda m, n=n_kn: bg.bench_kn(
            m, n, steps, cap / 2, peak_box["tflops"])), cap + 20, 10)
        q.run((key, "bfloat16", "cnl_exact_ig_batched"), with_model(key, lambda m, k=key: bg.bench_cnl_batched(
            m, 1 if k == "llama7b_shape" else max(1, args.samples // args.cnl_batch), steps, args.cnl_batch, cap,
            peak_box["tflops"])), 2 * cap + 40, 20)
    for key in ("llama7b_shape", "smollm2_shape"):
        q.run(("calibration", key), with_model(key, lambda m: probe(m, cal_path, cals)), 90 if key == "llama7b_shape" else 60,
              30)
    sections = batched_sections(bg)
    payload["batched_sections_found"] = sorted(sections)
    for key in ("llama7b_shape", "smollm2_shape"):
        for name, fn in sections.items():
            n = big_n if key == "llama7b_shape" else args.samples // 2
            values = {"n": n, "n_facts": n, "steps": steps, "cap": cap, "peak": peak_box["tflops"],
                      "peak_tflops": peak_box["tflops"], "device": device, "dtype": dt,
                      **dict.fromkeys(("batch", "facts", "batch_size", "fact_batch", "facts_per_batch", "sample_batch"),
                                      args.cnl_batch),
                      **dict.fromkeys(("trace_samples", "samples", "noise_samples"), args.trace_samples)}
            q.run((key, "bfloat16", name), with_model(key, lambda m, fn=fn, values=values: call_section(
                fn, {"model": m, **values})), cap + 40, 15)
    q.run(("llama7b_shape", "bfloat16", "cnl_exact_ig"), with_model("llama7b_shape", lambda m: bg.bench_cnl(
        m, big_n, steps, cap / 2, peak_box["tflops"])), cap + 25, 15)
    q.run(("smollm2_shape", "bfloat16", "cnl_exact_ig"), with_model("smollm2_shape", lambda m: bg.bench_cnl(
        m, 2, steps, cap / 2, peak_box["tflops"])), cap + 25, 15)
    q.run(("smollm2_shape", "bfloat16", "causal_trace"), with_model("smollm2_shape", lambda m: bg.bench_trace(
        m, 1, args.trace_samples, cap / 2)), cap + 20, 10)
    for name, s in (("eap", 1), ("eap_ig5", 5)):
        q.run(("smollm2_shape", "bfloat16", name), with_model("smollm2_shape", lambda m, s=s: bg.bench_eap(
            m, 2, s, cap / 2)), cap, 5)
    q.run(("plateaus",), plateau_record, 5, 0)
    if cal_path.exists():
        q.run(("reproduce_check",), with_model("llama7b_shape", lambda m: repro_check(m, cal_path, tiny)), 100, 45)
    # last, when time is left: the forward-only and edge methods at 7B (do they fit the card?)
    q.run(("llama7b_shape", "bfloat16", "causal_trace"), with_model("llama7b_shape", lambda m: bg.bench_trace(
        m, 1, args.trace_samples, cap / 2)), cap + 20, 15)
    q.run(("llama7b_shape", "bfloat16", "eap_ig5"), with_model("llama7b_shape", lambda m: bg.bench_eap(
        m, 1, 5, cap / 2)), cap + 10, 10)
    payload["calibration_file"] = cal_path.name if cal_path.exists() else None
    payload["wall_seconds_total"] = time.perf_counter() - q.t0
    rep.write()
    print(f"[bench_gpu --quick] wrote {args.out} ({payload['wall_seconds_total']:.0f} s)"
          + (f" and {cal_path}" if cal_path.exists() else ""), flush=True)
    return payload


__all__ = ["run_quick", "cuda_tests", "cuda_test_files", "call_section", "batched_sections", "Budget", "alarm",
           "SectionTimeout", "BATCHED_SECTIONS"]
