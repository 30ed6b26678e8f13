"""Stages in parallel: ``jobs`` worker processes share one stage cache (``tlcap reproduce --jobs N``).

A 135M-parameter model keeps a CPU core busy with one thread but gains little from a second
(small matrices: intra-op threads wait for each other at every operator), while the stages of a
reproduction are mostly independent (five CNL locates, three QL localizations, the evaluation
suite). So ``jobs`` processes of ``cpus // jobs`` threads each run different stages at once.

The parent keeps the plan: a stage is dispatched when every stage it depends on is in the cache,
the one heading the longest chain of predicted work first (critical path: its own time plus the
longest chain of stages that need it); pending, blocked and cached stages are resolved by the parent as in a
sequential run. Each worker loads the model once (``load``, a picklable zero-argument callable
such as ``functools.partial(load_model, "smollm2-135m")``), builds the same stages, computes one
stage at a time and saves it into the shared cache (content-addressed: the key is the same in
every process, and a finished folder is renamed into place atomically). A worker whose model
gives other keys than the parent's (another model) is an error, not a silent recomputation.
Results are the sequential run's: each stage is computed by exactly one process from the same
inputs and seeds (tested).

Example:
    >>> import tempfile
    >>> from functools import partial
    >>> from tlcap.models import make_gpt2
    >>> from tlcap.reproduce.run import reproduce
    >>> run = reproduce(model, tempfile.mkdtemp(), papers=("ql",), scale="smoke", only=["ql.facts"], jobs=2,
    ...                 load=partial(make_gpt2, "tiny", seed=0))       # the same model as ``model``
    >>> run.computed
    ['ql.facts']

With SmolLM2: ``reproduce(model, "runs/repro", scale="cpu", jobs=2, load=partial(load_model, "smollm2-135m"))``.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tlcap.reproduce.stages import Runner, Stage, StageError, StageRecord

_WORKER: dict[str, Runner] = {}


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs to rebuild the parent's runner (every field picklable).

    Attributes:
        load: Zero-argument callable returning the model (the parent's model, loaded again).
        stages: Zero-argument callable returning the stages (the parent's :func:`build_stages` call).
        cache_dir: The shared stage cache.
        threads: torch intra-op threads of the worker.
    """

    load: Callable[[], Any]
    stages: Callable[[], Sequence[Stage]]
    cache_dir: str
    threads: int
    keep_going: bool = True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _init_worker(spec: WorkerSpec) -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # the parent's kill: stop like Ctrl-C, keeping the stage's checkpoint
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops the workers
    torch.set_num_threads(spec.threads)
    _WORKER["runner"] = Runner(spec.stages(), spec.cache_dir, spec.load(), keep_going=spec.keep_going)


def _run_in_worker(name: str) -> StageRecord:
    runner = _WORKER["runner"]
    return runner.run_stage(runner.stage(name))


def threads_per_job(jobs: int, cpus: int | None = None) -> int:
    """torch threads of each of ``jobs`` workers on ``cpus`` cores (at least one).

    Args:
        jobs: Worker processes.
        cpus: Cores to share (default: ``multiprocessing.cpu_count()``).

    Returns:
        ``cpus // jobs``, at least 1.
    """
    return max(1, (cpus or multiprocessing.cpu_count()) // jobs)


def critical_path(plan: Sequence[Stage], seconds: Mapping[str, float | None]) -> dict[str, float]:
    """Per stage, its predicted seconds plus the longest chain of planned stages that depend on it.

    Dispatching the ready stage with the largest value first starts long chains early (a short
    stage that gates an hour of work is not left for last).

    Args:
        plan: Stages in dependency order.
        seconds: Predicted seconds per stage (``None`` or missing: 0, e.g. cached).

    Returns:
        ``{stage name: seconds}`` for every stage of ``plan``.
    """
    names = {s.name for s in plan}
    users: dict[str, list[str]] = {s.name: [] for s in plan}
    for s in plan:
        for d in s.deps:
            if d in names:
                users[d].append(s.name)
    out: dict[str, float] = {}
    for s in reversed(plan):  # dependents come later in the plan
        out[s.name] = float(seconds.get(s.name) or 0.0) + max((out[u] for u in users[s.name]), default=0.0)
    return out


def makespan(plan: Sequence[Stage], seconds: Mapping[str, float | None], jobs: int) -> float:
    """Wall time of ``plan`` on ``jobs`` workers with :func:`run_parallel`'s policy (an event simulation).

    Whenever a worker is free, the stage whose dependencies have finished and whose
    :func:`critical_path` is longest starts (plan order on ties).

    Args:
        plan: Stages in dependency order.
        seconds: Predicted seconds per stage (``None`` or missing: 0, e.g. cached).
        jobs: Workers.

    Returns:
        The simulated wall time in seconds.
    """
    cost = {s.name: float(seconds.get(s.name) or 0.0) for s in plan}
    names = {s.name for s in plan}
    deps = {s.name: [d for d in s.deps if d in names] for s in plan}
    prio = critical_path(plan, seconds)
    todo = [s.name for s in plan]
    done: set[str] = set()
    running: list[tuple[float, str]] = []
    t = 0.0
    while todo or running:
        free = [n for n in todo if cost[n] == 0.0 and all(d in done for d in deps[n])]
        while free:  # cached / pending stages: resolved by the parent at once, no worker needed
            done |= set(free)
            todo = [n for n in todo if n not in done]
            free = [n for n in todo if cost[n] == 0.0 and all(d in done for d in deps[n])]
        if not todo and not running:
            break
        ready = sorted((n for n in todo if all(d in done for d in deps[n])), key=lambda n: -prio[n])
        for n in ready[: max(1, jobs) - len(running)]:
            running.append((t + cost[n], n))
            todo.remove(n)
        if not running:
            raise StageError(f"stages {todo} wait for stages that are not planned")
        t = min(f for f, _ in running)
        done |= {n for f, n in running if f <= t}
        running = [(f, n) for f, n in running if f > t]
    return t


def run_parallel(
    runner: Runner,
    plan: Sequence[Stage],
    spec: WorkerSpec,
    jobs: int,
    seconds: Mapping[str, float | None] | None = None,
    on_stage: Callable[[Stage, str], None] | None = None,
) -> list[StageRecord]:
    """Run ``plan`` on ``jobs`` worker processes (module docstring); returns the records in plan order.

    Args:
        runner: The parent's runner (its records are filled; its outputs load from the cache).
        plan: Stages in dependency order (:meth:`Runner.plan`).
        spec: How the workers rebuild the model and the stages.
        jobs: Worker processes, ``>= 1``.
        seconds: Predicted seconds per stage: the ready stage with the longest :func:`critical_path` goes first.
        on_stage: ``on_stage(stage, "start" | status)``, as :meth:`Runner.run`.

    Returns:
        One :class:`StageRecord` per stage of ``plan``, in plan order.

    Raises:
        StageError: a worker's model gives other cache keys than the parent's.
        Exception: a stage's own error when the runner does not ``keep_going``.
    """
    seconds = seconds or {}
    prio = critical_path(plan, seconds)
    names = {s.name for s in plan}
    todo = list(plan)
    running: dict[Future, Stage] = {}
    note = on_stage or (lambda _s, _st: None)

    def settled(s: Stage) -> bool:
        return all(d in runner.records or d not in names for d in s.deps)

    def resolve_in_parent() -> None:
        """Pending, blocked and cached stages, until none is left whose dependencies are settled."""
        changed = True
        while changed:
            changed = False
            for s in [s for s in todo if settled(s)]:
                bad = any(runner.records[d].status in ("pending", "blocked", "failed") for d in s.deps if d in names)
                if s.pending or bad or runner.is_cached(s.name):
                    note(s, "start")
                    note(s, runner.run_stage(s).status)
                    todo.remove(s)
                    changed = True

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(spec,)) as pool:
        try:
            while todo or running:
                resolve_in_parent()
                ready = sorted((s for s in todo if settled(s)), key=lambda s: -prio[s.name])
                for s in ready[: jobs - len(running)]:
                    note(s, "start")
                    running[pool.submit(_run_in_worker, s.name)] = s
                    todo.remove(s)
                if not running:
                    if todo:  # nothing runs and nothing is ready: a dependency outside the plan
                        raise StageError(f"stages {[s.name for s in todo]} wait for stages that are not planned")
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    s = running.pop(fut)
                    rec = fut.result()  # a stage that raised with keep_going=False re-raises here
                    if rec.key != runner.key(s.name):
                        raise StageError(f"a worker ran {s.name} under another key ({rec.key}, parent "
                                         f"{runner.key(s.name)}): the workers' model, data or tlcap's code differ "
                                         "from the parent's (was the code edited during the run?); rerun: finished "
                                         "stages are cached")
                    runner.records[s.name] = rec
                    note(s, rec.status)
        except BaseException:
            procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:  # stop the running stages too
                if proc.is_alive():
                    proc.terminate()  # SIGTERM: the worker stops like Ctrl-C, keeping the stage's checkpoint
            raise
    return [runner.records[s.name] for s in plan]


def worker_spec(load: Callable[[], Any], stages: Callable[[], Sequence[Stage]], cache_dir: str | Path,
                jobs: int, keep_going: bool = True) -> WorkerSpec:
    """A :class:`WorkerSpec` with ``cpus // jobs`` threads per worker.

    Args:
        load: Zero-argument callable returning the model (picklable: the workers call it again).
        stages: Zero-argument callable returning the stages.
        cache_dir: The shared stage cache.
        jobs: Worker processes (sets the threads per worker).
        keep_going: Whether a failed stage lets the others run (as :class:`Runner`'s ``keep_going``).

    Returns:
        The :class:`WorkerSpec` to pass to :func:`run_parallel`.
    """
    return WorkerSpec(load=load, stages=stages, cache_dir=str(cache_dir), threads=threads_per_job(jobs),
                      keep_going=keep_going)


__all__ = ["WorkerSpec", "critical_path", "makespan", "run_parallel", "threads_per_job", "worker_spec"]
