"""Long runs under faults: SIGKILL at random points, two processes on one cache, a full disk, a read-only cache.

Every run is a child forked from a pre-imported parent (``tests/fault_zygote.py``: torch at one
thread, the tiny models built), so a run costs its own work only. A run is killed with SIGKILL at
a random file-system event (before it, or with half of a write done: every state the disk can be
in after a kill), then rerun to the end. After every kill:

- every file at a final path is whole (results load and match their checksums, checkpoints and
  stage records too, JSON parses, CSV/HTML end where they should); only temporary files (``.tmp-``,
  ``.part``, ``.saving-``, ``.staging-``) may be cut, and the rerun never opens one;
- the rerun's results are bit-identical to an uninterrupted run's (tensors byte for byte, every
  JSON field but timings), so nothing was counted twice or lost.

The random points come from a seeded generator (``FAULT_SEED``, printed on failure): 5 per pipeline, 20 in
all, plus 2 kills from outside at a random time.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import tlcap
from tlcap.atomic import json_digest
from tlcap.attribution.checkpoint import load_checkpoint
from tlcap.reproduce.stage_store import read_record
from tlcap.results import load_result

pytestmark = pytest.mark.heavy  # over ~5 s per module: runs after the fast gate (make unit)

SEED = int(os.environ.get("FAULT_SEED", "28"))
MARKERS = (".tmp-", ".saving-", ".staging-", ".old-", ".tlcap-probe-")  # and the suffix ".part"
# what differs between two identical runs: timings, and the report's stage table (computed vs cached)
RUN_DEPENDENT = re.compile(r"(seconds|wall|created|per_s|peak|measured|predicted|calibration|_time|^time$|^stages$)")
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TLCAP_OFFLINE": "1"}
NOBODY = 65534

LOCATE = ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--n", "8", "--steps", "2",
          "--max-answer-tokens", "1", "--convergence-points", "2", "--checkpoint-every", "1"]
DECOUPLE = ["cnl", "decouple", "--model", "gpt2-tiny", "--n", "4", "--sources", "template", "--steps", "1", "--top-k", "4",
            "--checkpoint-every", "1"]


# ------------------------------------------------------------------ running children
@pytest.fixture(scope="module")
def ctx():
    """The forkserver context whose server has imported ``tests.fault_zygote`` (started once)."""
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)  # the server's own environment (torch reads it when the server imports it)
    try:
        c = multiprocessing.get_context("forkserver")
        c.set_forkserver_preload(["tests.fault_zygote"])
        from tests import fault_zygote

        warm = c.Process(target=time.sleep, args=(0,))
        warm.start()
        warm.join()
        assert fault_zygote.run_job  # importable here too (the target is pickled by reference)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return c


class Run:
    """One child run: its exit code (negative: killed by that signal), report and log."""

    def __init__(self, c: Any, job: dict[str, Any], where: Path) -> None:
        from tests import fault_zygote

        where.mkdir(parents=True, exist_ok=True)
        os.chmod(where, 0o777)
        self.report_path = where / f"report-{time.monotonic_ns()}.json"
        reader, writer = c.Pipe(duplex=False)
        self.proc = c.Process(target=fault_zygote.run_job, args=(job, str(self.report_path), writer))
        self.proc.start()
        writer.close()
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, args=(reader,), daemon=True)
        self._reader.start()

    def _read(self, reader: Any) -> None:
        while chunk := os.read(reader.fileno(), 1 << 16):
            self._chunks.append(chunk)
        reader.close()

    def wait(self, timeout: float = 300) -> Run:
        self.proc.join(timeout)
        if self.proc.exitcode is None:  # killed, so that a stalled child fails its test instead of hanging pytest's exit
            self.proc.kill()
            self.proc.join(30)
            raise AssertionError(f"a child ran longer than {timeout} s")
        self._reader.join(30)
        self.log = b"".join(self._chunks).decode(errors="replace")
        self.report = json.loads(self.report_path.read_text()) if self.report_path.exists() else None
        # the pipeline's exit code (the CLI's, or 2 for an error of reproduce); a killed child's is -9
        self.code = self.report["code"] if self.report is not None else self.proc.exitcode
        if self.report is not None:
            assert "traceback" not in self.report, self.report["traceback"]
        return self

    def kill(self) -> None:
        self.proc.kill()


def run(c: Any, where: Path, **job: Any) -> Run:
    return Run(c, job, where).wait()


# ------------------------------------------------------------------ what must hold after a kill
def _temporary(p: Path | str) -> bool:
    return any(m in part or part.endswith(".part") for part in Path(p).parts for m in MARKERS)


def assert_whole(*roots: Path) -> int:
    """Every file at a final path under ``roots`` is whole; returns how many files were checked."""
    n = 0
    for root in roots:
        if not root.exists():
            continue
        for p in sorted(root.rglob("*")):
            if not p.is_file() or _temporary(p.relative_to(root.parent)) or p.parent.name == ".locks":
                continue
            n += 1
            if p.name == "result.json":
                load_result(p.parent)
            elif p.name == "checkpoint.safetensors":
                assert load_checkpoint(p.parent) is not None
            elif p.name == "stage.json":
                read_record(p.parent)
            elif p.name == "items.json":
                data = json.loads(p.read_text())
                assert data["sha256"] == json_digest([data["fingerprint"], data["items"]]), p
            elif p.suffix == ".json":
                json.loads(p.read_text())
            elif p.suffix == ".csv":
                assert p.read_text().endswith("\n"), p
            elif p.suffix == ".html":
                assert p.read_text().rstrip().endswith("</html>"), p
    return n


def _norm(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items() if not RUN_DEPENDENT.search(str(k))}
    if isinstance(x, list):
        return [_norm(v) for v in x]
    return x


def results(*roots: Path) -> dict[str, Any]:
    """Every saved result under ``roots`` (checkpoints and temporary files aside): JSON fields but timings,
    and the sha256 of each tensor's bytes."""
    out: dict[str, Any] = {}
    for i, root in enumerate(roots):
        for meta in sorted(root.rglob("result.json")):
            rel = meta.parent.relative_to(root)
            if _temporary(meta.relative_to(root.parent)) or ".partial" in str(rel) or "checkpoints" in root.name:
                continue
            res = load_result(meta.parent)
            tensors = {k: hashlib.sha256(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                       for k, v in res._tensor_fields().items()}
            out[f"{i}:{rel}"] = {"type": type(res).__name__, "fields": _norm(res._json_fields()), "tensors": tensors}
    return out


def assert_never_read_a_temporary_file(r: Run) -> None:
    bad = [p for p in r.report["reads"] if _temporary(p) and ".tlcap-probe-" not in p]
    assert not bad, f"the rerun opened temporary files: {bad}"


def kill_points(events: int, n: int, rng: random.Random) -> list[tuple[int, str]]:
    """``n`` distinct random events of ``events``, each killed before it or halfway through a write."""
    ks = sorted(rng.sample(range(1, events + 1), min(n, events)))
    return [(k, rng.choice(("before", "torn"))) for k in ks]


def kill_and_rerun(c: Any, tmp: Path, job: dict[str, Any], paths: dict[str, str], reference: dict[str, Any],
                   points: list[tuple[int, str]], roots: tuple[str, ...]) -> list[str]:
    """Kill ``job`` at each point in a fresh folder, check the files, rerun, compare; returns one line per case."""
    lines = []
    for i, (k, mode) in enumerate(points):
        where = tmp / f"kill{i}"
        spec = {key: str(where / rel) for key, rel in paths.items()}
        live = {**job, **spec}
        if job["pipeline"] == "cli":
            live["args"] = [spec.get(a[2:-2], a) if a.startswith("{{") else a for a in job["args"]]
        killed = run(c, where / "runs", **live, kill_at=k, mode=mode)
        case = f"seed {SEED}: kill at event {k} ({mode})"
        assert killed.code in (-9, 0), f"{case}: exit {killed.code}\n{killed.log[-2000:]}"
        checked = assert_whole(*(where / r for r in roots))
        again = run(c, where / "runs", **live)
        finished = "already holds a finished run" in again.log  # killed after the outputs were in place
        assert again.code == 0 or (finished and again.code == 2), f"{case}: rerun exit {again.code}\n{again.log[-3000:]}"
        assert_never_read_a_temporary_file(again)
        got = results(*(where / r for r in roots))
        assert got == reference, f"{case}: the rerun differs from an uninterrupted run"
        lines.append(f"{case}: {'killed' if killed.code == -9 else 'finished first'}, {checked} files whole, "
                     f"rerun {'found it finished' if finished else 'resumed'}, results bit-identical")
    return lines


# ------------------------------------------------------------------ the pipelines
def _cli_job(args: list[str]) -> dict[str, Any]:
    return {"pipeline": "cli", "args": [*args, "--out", "{{out}}"]}


def _reference(c: Any, tmp: Path, job: dict[str, Any], paths: dict[str, str], roots: tuple[str, ...]) -> tuple[int, dict]:
    spec = {key: str(tmp / rel) for key, rel in paths.items()}
    live = {**job, **spec}
    if job["pipeline"] == "cli":
        live["args"] = [spec.get(a[2:-2], a) if a.startswith("{{") else a for a in job["args"]]
    ref = run(c, tmp / "runs", **live)
    assert ref.code == 0, ref.log[-3000:]
    return ref.report["events"], results(*(tmp / r for r in roots))


@pytest.fixture(scope="module")
def locate_reference(ctx, tmp_path_factory):
    """An uninterrupted ``cnl locate`` (shared by the cases that kill or starve it): events and results."""
    events, ref = _reference(ctx, tmp_path_factory.mktemp("locate_ref"), _cli_job(LOCATE), {"out": "loc"}, ("loc",))
    # nothing counted twice or lost: 8 samples in all, 2 in each of the 4 chunks, 1 answer token each
    assert ref["0:result"]["fields"]["n_samples"] == 8 and ref["0:result"]["fields"]["n_tokens"] == 8
    assert [ref[f"0:parts/{k}"]["fields"]["n_seen"] for k in ("A0", "A1", "B0", "B1")] == [2, 2, 2, 2]
    return events, ref


@pytest.mark.parametrize("name, job, paths, roots, n_kills", [
    ("CNL scoring (cnl locate)", _cli_job(LOCATE), {"out": "loc"}, ("loc", ".loc.checkpoints"), 5),
    ("CNL suite (cnl decouple)", _cli_job(DECOUPLE), {"out": "dec"}, ("dec", ".dec.checkpoints"), 5),
    ("reproduce stage (cnl.locate.emotion)", {"pipeline": "reproduce", "paper": "cnl", "only": ["cnl.locate.emotion"]},
     {"out": "rep", "cache": "cache"}, ("rep", "cache"), 5),
    ("QL localization (ql.localize.ig)", {"pipeline": "reproduce", "paper": "ql", "only": ["ql.localize.ig"]},
     {"out": "rep", "cache": "cache"}, ("rep", "cache"), 5),
])
def test_sigkill_at_random_points_then_rerun_gives_the_uninterrupted_result(ctx, tmp_path, name, job, paths, roots,
                                                                          n_kills, locate_reference):
    if job.get("args") == _cli_job(LOCATE)["args"]:
        events, reference = locate_reference
    else:
        events, reference = _reference(ctx, tmp_path / "ref", job, paths, roots)
    assert reference and events > 10
    rng = random.Random(f"{SEED}-{name}")
    lines = kill_and_rerun(ctx, tmp_path, job, paths, reference, kill_points(events, n_kills, rng), roots)
    print(f"\n{name}: {events} file-system events in an uninterrupted run", *lines, sep="\n  ")
    assert sum("killed" in ln for ln in lines) == n_kills  # every point was reached: 20 kills in all


def test_sigkill_from_outside_at_a_random_time(ctx, tmp_path, locate_reference):
    # the same through a kill the process does not choose: another process's SIGKILL after a random delay
    job = _cli_job(LOCATE)
    _, reference = locate_reference
    rng = random.Random(f"{SEED}-timer")
    for i in range(2):
        where = tmp_path / f"t{i}"
        args = [str(where / "loc") if a == "{{out}}" else a for a in job["args"]]
        r = Run(ctx, {"pipeline": "cli", "args": args}, where / "runs")
        time.sleep(rng.uniform(0.05, 1.0))
        r.kill()
        r.wait()
        assert_whole(where / "loc", where / ".loc.checkpoints")
        again = run(ctx, where / "runs", pipeline="cli", args=args)
        assert again.code == 0 or "already holds a finished run" in again.log, again.log[-3000:]
        assert results(where / "loc") == reference


def test_a_child_killed_holding_the_progress_lock_does_not_stall_the_next(ctx, tmp_path, locate_reference):
    """Every child has a progress-bar lock of its own: one killed holding it (as a kill can land while tqdm's monitor
    thread holds it) leaves the next run free (with the server's shared semaphore the next run waited forever)."""
    from tests import fault_zygote

    dead = ctx.Process(target=fault_zygote.die_holding_tqdm_lock)
    dead.start()
    dead.join(60)
    assert dead.exitcode == -9
    args = [str(tmp_path / "loc") if a == "{{out}}" else a for a in _cli_job(LOCATE)["args"]]
    r = Run(ctx, {"pipeline": "cli", "args": args}, tmp_path / "runs").wait(timeout=120)
    assert r.code == 0, r.log[-3000:]
    assert results(tmp_path / "loc") == locate_reference[1]


# ------------------------------------------------------------------ two processes, one cache
def test_two_processes_on_one_cache_compute_each_stage_once(ctx, tmp_path):
    job = {"pipeline": "reproduce", "paper": "ql", "only": ["ql.localize.ig"], "cache": str(tmp_path / "cache")}
    a = Run(ctx, {**job, "out": str(tmp_path / "a")}, tmp_path / "runs")
    b = Run(ctx, {**job, "out": str(tmp_path / "b")}, tmp_path / "runs")
    a.wait()
    b.wait()
    assert a.code == 0 and b.code == 0, a.log[-2000:] + b.log[-2000:]
    for stage in ("ql.facts", "ql.localize.ig"):
        statuses = sorted([a.report["records"][stage], b.report["records"][stage]])
        assert statuses == ["cached", "computed"], (stage, statuses)
    assert len([p for p in (tmp_path / "cache").iterdir() if p.name.startswith("ql.localize.ig-")]) == 1
    assert_whole(tmp_path / "cache")
    ref_job = {**job, "cache": str(tmp_path / "alone" / "cache"), "out": str(tmp_path / "alone" / "out")}
    alone = run(ctx, tmp_path / "runs", **ref_job)
    assert alone.code == 0
    assert results(tmp_path / "cache") == results(tmp_path / "alone" / "cache")
    assert results(tmp_path / "a" / "report") == results(tmp_path / "b" / "report")


def test_jobs_2_beside_another_run_on_the_same_cache(ctx, tmp_path):
    # a --jobs 2 run (two worker processes) and a sequential one share a cache: every stage computed once in all
    job = {"pipeline": "reproduce", "paper": "ql", "only": ["ql.localize.ig", "ql.localize.sig"],
           "cache": str(tmp_path / "cache")}
    par = Run(ctx, {**job, "jobs": 2, "out": str(tmp_path / "par")}, tmp_path / "runs")
    seq = Run(ctx, {**job, "out": str(tmp_path / "seq")}, tmp_path / "runs")
    par.wait(600)
    seq.wait(600)
    assert par.code == 0 and seq.code == 0, par.log[-2000:] + seq.log[-2000:]
    for stage in ("ql.facts", "ql.localize.ig", "ql.localize.sig"):
        statuses = sorted([par.report["records"][stage], seq.report["records"][stage]])
        assert statuses == ["cached", "computed"], (stage, statuses)
    assert_whole(tmp_path / "cache")
    assert results(tmp_path / "par" / "report") == results(tmp_path / "seq" / "report")


# ------------------------------------------------------------------ full disk, read-only cache
def _error_lines(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if ln.startswith("error: ")]


@pytest.mark.parametrize("fsize", [600, 10000])
def test_full_disk_is_one_clear_error_and_the_rerun_completes(ctx, tmp_path, fsize, locate_reference):
    # ulimit -f: 600 bytes fails at the first checkpoint (9.3 kB); 10000 lets every checkpoint through and fails at
    # the result's tensors (12.4 kB), after all the work
    job = _cli_job(LOCATE)
    _, reference = locate_reference
    out = tmp_path / "w" / "loc"
    args = [str(out) if a == "{{out}}" else a for a in job["args"]]
    full = run(ctx, tmp_path / "runs", pipeline="cli", args=args, fsize=fsize)
    assert full.code == 2, full.log[-3000:]
    assert "Traceback" not in full.log
    errors = _error_lines(full.log)
    assert len(errors) == 1 and errors[0].startswith("error: cannot write "), full.log[-3000:]
    assert "it would pass the file-size limit (ulimit -f) (File too large); raise the limit" in errors[0]
    kept = "rerun the same command to resume: the work done so far is kept in" if fsize > 600 else "nothing was kept"
    assert f"--out {out} is unchanged; {kept}" in errors[0]
    assert not out.exists()
    assert ("checkpoint.safetensors" in errors[0]) == (fsize == 600) and (".loc.staging-" in errors[0]) == (fsize > 600)
    assert_whole(tmp_path / "w")
    again = run(ctx, tmp_path / "runs", pipeline="cli", args=args)
    assert again.code == 0, again.log[-3000:]
    assert results(out) == reference
    print(f"\nulimit -f {fsize}: {errors[0]}")


def test_full_disk_during_a_reproduce_stage_keeps_the_cache_valid(ctx, tmp_path):
    job = {"pipeline": "reproduce", "paper": "ql", "only": ["ql.localize.ig"], "cache": str(tmp_path / "cache"),
           "out": str(tmp_path / "out")}
    full = run(ctx, tmp_path / "runs", **job, fsize=2500)
    assert full.code == 2 and full.report["error"] == "StorageError", full.log[-3000:]
    assert full.report["message"].startswith("cannot write ") and "ulimit -f" in full.report["message"]
    assert_whole(tmp_path / "cache")
    again = run(ctx, tmp_path / "runs", **job)
    assert again.code == 0, again.log[-3000:]
    assert run(ctx, tmp_path / "runs", **{**job, "cache": str(tmp_path / "ref"), "out": str(tmp_path / "ref_out")}).code == 0
    assert results(tmp_path / "cache") == results(tmp_path / "ref")


def _read_only(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        os.chmod(p, 0o555 if p.is_dir() else 0o444)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_read_only_cache_is_one_clear_error_and_stays_valid(ctx, tmp_path):
    # a cache holding ql.facts only, read-only: computing ql.localize.ig fails with one message naming the cache, and
    # the cache is byte for byte as before; a read-only cache holding every stage asked for serves the run
    user = NOBODY if os.geteuid() == 0 else None  # root ignores file modes: run as nobody
    if user is not None:  # nobody must be able to read the checkout, or every import fails with EACCES
        closed = [str(p) for p in Path(tlcap.__file__).resolve().parents if not os.stat(p).st_mode & 0o001]
        assert not closed, (f"the checkout is not readable by other users ({closed[0]} has no o+x), so the run as nobody "
                            f"cannot import tlcap; clone into a folder with mode 755 (mktemp -d makes 700)")
    tmp_path = Path(tempfile.mkdtemp(prefix="tlcap-read-only-"))  # pytest's folders are 0700: nobody cannot enter
    os.chmod(tmp_path, 0o755)
    cache, out = tmp_path / "cache", tmp_path / "out"
    job = {"pipeline": "reproduce", "paper": "ql", "cache": str(cache), "out": str(out)}
    assert run(ctx, tmp_path / "runs", **job, only=["ql.facts"]).code == 0
    _read_only(cache)
    before = _files(cache)
    out2 = tmp_path / "w"
    out2.mkdir(mode=0o777)
    os.chmod(out2, 0o777)
    ro = run(ctx, tmp_path / "runs", **{**job, "out": str(out2 / "o")}, only=["ql.localize.ig"], user=user)
    assert ro.code == 2 and ro.report["error"] == "StorageError", ro.log[-3000:]
    assert ro.report["message"].startswith(f"cannot write {cache}") and "permission denied" in ro.report["message"]
    assert _files(cache) == before
    assert_whole(cache)
    served = run(ctx, tmp_path / "runs", **{**job, "out": str(out2 / "p")}, only=["ql.facts"], user=user)
    assert served.code == 0 and served.report["records"] == {"ql.facts": "cached"}, served.log[-3000:]
    for p in [cache, *cache.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    shutil.rmtree(tmp_path)
