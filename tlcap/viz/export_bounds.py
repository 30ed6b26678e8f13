"""Static figure export in a child process under a time and a memory bound.

kaleido drives a headless browser; a browser that does not start, hangs, or grows without
limit (kaleido 0.2.1 was seen growing a Python process to 24 GB) must not hang or kill a run
whose results are already computed. So the export runs in a worker process in its own session
(``tlcap/viz/export_worker.py``, which imports plotly and kaleido only, started at the first
export of a process and kept, with its browser, for the next ones; it ends when this process
does), and each export is watched every 0.1 s:

- **time**: ``TLCAP_FIGURE_TIMEOUT`` seconds (default 60 + 10 per figure);
- **memory**: the resident memory of every process of the session (the worker and the browser
  it starts) summed, at most ``TLCAP_FIGURE_MEMORY`` (default ``4GiB``; read from ``/proc``,
  so on systems without it only the time is bounded).

Past either bound, or when the worker fails, every process of its session is killed (a new
worker starts at the next export) and the figures not written yet stay HTML only; the caller
warns once. ``TLCAP_FIGURES=html`` skips static export altogether.

Example (a job lists ``{fig, path, format, scale}`` per figure, ``fig`` as plotly JSON;
:func:`tlcap.viz.export.save_figures` builds it; an empty one shows the call and what comes back):

    >>> bounds(3)                                # (seconds, bytes) for 3 figures, with the defaults above
    (90.0, 4294967296)
    >>> job = {"exporter": "kaleido", "chrome": None, "figures": []}
    >>> done, why = run_bounded(job, n_figures=0)     # (paths written, why the rest were not, or None)
    >>> done, why
    (set(), None)
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parent / "export_worker.py"
_RUN = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20, "g": 1e9, "gb": 1e9,
          "gib": 2**30}
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _size(text: str) -> int | None:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def bounds(n_figures: int) -> tuple[float, int]:
    """``(seconds, bytes)`` allowed to export ``n_figures`` (environment overrides in the module docstring).

    Args:
        n_figures: How many static files the export writes.

    Returns:
        ``(seconds, bytes)``: ``TLCAP_FIGURE_TIMEOUT`` or 60 s plus 10 s per figure, and ``TLCAP_FIGURE_MEMORY``
        or 4 GiB of resident memory.
    """
    try:
        seconds = float(os.environ.get("TLCAP_FIGURE_TIMEOUT", ""))
    except ValueError:
        seconds = 60.0 + 10.0 * n_figures
    memory = _size(os.environ.get("TLCAP_FIGURE_MEMORY", "")) or 4 * 2**30
    return seconds, memory


def _session_pids(sid: int) -> list[int]:
    """Processes whose session is ``sid`` (Linux ``/proc``; empty elsewhere)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            out.append(int(name))
    return out


def session_rss(sid: int) -> int:
    """Resident bytes of every process in session ``sid`` (0 where ``/proc`` is missing).

    Args:
        sid: The session id (the exporter's pid, as it starts its own session).

    Returns:
        The summed resident set size in bytes.
    """
    total = 0
    for pid in _session_pids(sid):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def _kill_session(proc: subprocess.Popen) -> None:
    pids = set(_session_pids(proc.pid)) | {proc.pid}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    proc.wait()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):  # their memory is given back
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its parent does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return not Path("/proc").is_dir()
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class _Worker:
    """The export worker of this process: its pipes, and a thread reading its stdout into a queue."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", _RUN, str(WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, start_new_session=True, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def last_log_line(self) -> str:
        self.log.seek(0)
        lines = [ln for ln in self.log.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else f"the exporter exited with code {self.proc.returncode}"

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # end of jobs: the worker stops its browser and exits
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _kill_session(self.proc)


_CURRENT: dict[str, _Worker] = {}


def _worker() -> _Worker:
    w = _CURRENT.get("w")
    if w is None or w.pid != os.getpid() or w.proc.poll() is not None:  # none yet, forked, or gone
        w = _CURRENT["w"] = _Worker()
    return w


def _drop(w: _Worker) -> None:
    _kill_session(w.proc)
    if _CURRENT.get("w") is w:
        del _CURRENT["w"]


@atexit.register
def _stop_at_exit() -> None:
    w = _CURRENT.pop("w", None)
    if w is not None and w.pid == os.getpid():
        w.stop()


def run_bounded(job: dict[str, Any], n_figures: int) -> tuple[set[str], str | None]:
    """Export ``job`` through this process's worker under :func:`bounds`.

    Args:
        job: The worker's job (``exporter``, ``chrome``, ``figures``: ``{fig, path, format, scale}``).
        n_figures: How many figures the job holds (for the default time bound).

    Returns:
        ``(paths written, why the rest were not)`` — the reason is ``None`` when all were.
    """
    seconds, memory = bounds(n_figures)
    written: set[str] = set()
    why: str | None = None
    with tempfile.TemporaryDirectory(prefix="tlcap-export-") as tmp:
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps(job), encoding="utf-8")
        w = _worker()
        ok = False
        try:
            assert w.proc.stdin is not None
            w.proc.stdin.write(f"{job_file}\n")
            w.proc.stdin.flush()
            t0 = time.monotonic()
            while True:
                try:
                    line = w.lines.get(timeout=0.1)
                except queue.Empty:
                    if time.monotonic() - t0 > seconds:
                        why = f"the export took longer than {seconds:g} s (TLCAP_FIGURE_TIMEOUT)"
                        break
                    used = session_rss(w.proc.pid)
                    if used > memory:
                        why = f"the export used {_fmt_bytes(used)}, more than {_fmt_bytes(memory)} (TLCAP_FIGURE_MEMORY)"
                        break
                    continue
                if line is None:
                    w.proc.wait()
                    why = w.last_log_line()[:200]
                    break
                if line.startswith("wrote "):
                    written.add(line[len("wrote "):])
                elif line.startswith("error: "):
                    why = line[len("error: "):][:200]
                    break
                elif line == "done":
                    ok = True
                    break
        except OSError as exc:  # the worker's pipe closed under us
            why = f"the exporter stopped ({exc})"
        finally:  # a bound passed, an error, or Ctrl-C: the worker and its browser go
            if not ok:
                _drop(w)
    for it in job["figures"]:  # a half-written image of a killed export
        Path(it["path"] + ".part").unlink(missing_ok=True)
    return {p for p in written if Path(p).exists()}, why


__all__ = ["bounds", "run_bounded", "session_rss", "WORKER"]
