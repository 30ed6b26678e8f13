"""Static figure export: the exporter choice (kaleido >= 1 with a Chrome, kaleido 0.2 under
plotly < 7, else HTML only with a one-line warning), checked by monkeypatching versions; the
bounded child process (a failing, hanging or growing exporter falls back to HTML with one warning,
its browser killed too); the installed pins writing real PNGs."""

from __future__ import annotations

import os
import time
import warnings

import plotly.graph_objects as go
import pytest

from tlcap.viz import export, export_bounds

pytestmark = pytest.mark.heavy  # seconds per module: runs after the fast gate (make unit)


@pytest.fixture()
def fig():
    return go.Figure(go.Scatter(x=[0, 1], y=[1, 0]))


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(export, "_WARNED", set())


@pytest.mark.parametrize(
    "kaleido, plotly, chrome, expected",
    [
        (None, (5, 24, 1), "/usr/bin/chromium", None),
        ((1, 0, 0), (6, 1, 0), "/usr/bin/chromium", "kaleido"),
        ((1, 0, 0), (7, 0, 0), "/usr/bin/chromium", "kaleido"),
        ((1, 0, 0), (6, 1, 0), None, None),
        ((0, 2, 1), (5, 24, 1), None, "kaleido-legacy"),
        ((0, 2, 1), (6, 1, 0), None, "kaleido-legacy"),
        ((0, 2, 1), (7, 0, 0), "/usr/bin/chromium", None),
    ],
)
def test_exporter_choice(monkeypatch, kaleido, plotly, chrome, expected):
    monkeypatch.setattr(export, "kaleido_version", lambda: kaleido)
    monkeypatch.setattr(export, "plotly_version", lambda: plotly)
    monkeypatch.setattr(export, "find_chrome", lambda: chrome)
    exporter, reason = export.static_exporter()
    assert exporter == expected
    assert (reason == "") == (expected is not None)


def test_reasons_say_what_to_do(monkeypatch):
    monkeypatch.setattr(export, "kaleido_version", lambda: None)
    assert export.static_exporter()[1] == "kaleido is not installed (pip install 'tlcap[png]')"
    monkeypatch.setattr(export, "kaleido_version", lambda: (1, 2, 0))
    monkeypatch.setattr(export, "find_chrome", lambda: None)
    assert "needs Chrome/Chromium" in export.static_exporter()[1]
    monkeypatch.setattr(export, "kaleido_version", lambda: (0, 2, 1))
    monkeypatch.setattr(export, "plotly_version", lambda: (7, 0, 0))
    assert "does not work with plotly" in export.static_exporter()[1]


def test_html_only_with_one_line_warning_once(monkeypatch, tmp_path, fig):
    monkeypatch.setattr(export, "kaleido_version", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = export.save_figure(fig, tmp_path, "a")
        paths += export.save_figure(fig, tmp_path, "b")
    assert [p.name for p in paths] == ["a.html", "b.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "b.html"]
    msgs = [str(w.message) for w in caught if issubclass(w.category, export.StaticExportWarning)]
    assert msgs == ["static figures (png) not written: kaleido is not installed (pip install 'tlcap[png]'); HTML only"]


def _worker(monkeypatch, tmp_path, body: str) -> None:
    """Replace the export worker by a script that reads its first job (``job``) and does ``body``."""
    script = tmp_path / "worker.py"
    script.write_text("import json, os, subprocess, sys, time\njob = json.load(open(sys.stdin.readline().strip()))\n" + body)
    monkeypatch.setattr(export_bounds, "WORKER", script)
    monkeypatch.setattr(export_bounds, "_CURRENT", {})  # a worker of its own (the real one is kept for later tests)
    monkeypatch.setattr(export, "static_exporter", lambda: ("kaleido", ""))


def test_failing_export_falls_back_to_html(monkeypatch, tmp_path, fig):
    _worker(monkeypatch, tmp_path, "raise RuntimeError('Chrome crashed')\n")
    with pytest.warns(export.StaticExportWarning, match=r"could not write c.png with kaleido \(RuntimeError: Chrome crashed\)"):
        paths = export.save_figure(fig, tmp_path / "out", "c")
    assert [p.name for p in paths] == ["c.html"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c.html"]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie left for a parent that is gone)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def test_a_hanging_export_is_cut_at_its_time_bound_with_its_browser(monkeypatch, tmp_path, fig):
    # the worker writes half an image, starts a "browser" (a child process) and hangs: after the time bound both are
    # killed, no partial image is left, and the figure is HTML only with one warning
    pid_file = tmp_path / "browser.pid"
    _worker(monkeypatch, tmp_path, f"""
open(job['figures'][0]['path'] + '.part', 'wb').write(b'half a png')
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
open({str(pid_file)!r}, 'w').write(str(child.pid))
time.sleep(600)
""")
    monkeypatch.setenv("TLCAP_FIGURE_TIMEOUT", "3")
    t0 = time.monotonic()
    with pytest.warns(export.StaticExportWarning, match=r"could not write h.png with kaleido \(the export took longer than "
                                                         r"3 s \(TLCAP_FIGURE_TIMEOUT\)\); HTML only"):
        paths = export.save_figure(fig, tmp_path / "out", "h")
    assert time.monotonic() - t0 < 30
    assert [p.name for p in paths] == ["h.html"] and sorted(os.listdir(tmp_path / "out")) == ["h.html"]
    assert not _alive(int(pid_file.read_text()))


def test_a_growing_export_is_cut_at_its_memory_bound(monkeypatch, tmp_path, fig):
    _worker(monkeypatch, tmp_path, "block = bytearray(400 * 2**20)\nfor i in range(0, len(block), 4096): block[i] = 1\n"
                                   "time.sleep(600)\n")
    monkeypatch.setenv("TLCAP_FIGURE_MEMORY", "200MiB")
    monkeypatch.setenv("TLCAP_FIGURE_TIMEOUT", "120")
    t0 = time.monotonic()
    with pytest.warns(export.StaticExportWarning,
                      match=r"\(the export used \d+ MiB, more than 200 MiB \(TLCAP_FIGURE_MEMORY\)\)"):
        paths = export.save_figure(fig, tmp_path / "out", "m")
    assert [p.name for p in paths] == ["m.html"] and time.monotonic() - t0 < 60


def test_figures_html_skips_static_export(monkeypatch, tmp_path, fig):
    _worker(monkeypatch, tmp_path, "raise SystemExit('must not run')\n")
    monkeypatch.setenv("TLCAP_FIGURES", "html")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [p.name for p in export.save_figure(fig, tmp_path, "s")] == ["s.html"]


def test_find_chrome_prefers_browser_path(monkeypatch, tmp_path):
    chrome = tmp_path / "chrome"
    chrome.write_text("")
    monkeypatch.setenv("BROWSER_PATH", str(chrome))
    assert export.find_chrome() == str(chrome)
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "missing"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert export.find_chrome() is None


def test_installed_pins_write_png(tmp_path, fig):
    # constraints.txt pins plotly 6.9.0 + kaleido 1.5.0, driving the Chromium `make setup` installs
    # (scripts/ensure_chromium.sh): every figure of one call goes through one bounded export
    assert export.static_exporter() == ("kaleido", "")
    written = export.save_figures({"d": fig, "e": go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))}, tmp_path)
    assert {k: [p.name for p in v] for k, v in written.items()} == {"d": ["d.html", "d.png"], "e": ["e.html", "e.png"]}
    for name in ("d.png", "e.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert not list(tmp_path.glob("*.part"))


def test_one_worker_serves_every_export_of_a_process(tmp_path, fig):
    # the worker (and its browser) started by the first export serves the next ones; a killed one is replaced
    export.save_figure(fig, tmp_path, "a")
    w = export_bounds._CURRENT["w"]
    export.save_figure(fig, tmp_path, "b")
    assert export_bounds._CURRENT["w"] is w and w.proc.poll() is None
    w.proc.kill()
    w.proc.wait()
    assert [p.name for p in export.save_figure(fig, tmp_path, "c")] == ["c.html", "c.png"]
    assert export_bounds._CURRENT["w"] is not w


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
