"""Static figure export: the exporter choice (kaleido >= 1 with a Chrome, kaleido 0.2 under
plotly < 7, else HTML only with a one-line warning), checked by monkeypatching versions."""

from __future__ import annotations

import warnings

import plotly.graph_objects as go
import pytest

from tlcap.viz import export


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


def test_failing_export_falls_back_to_html(monkeypatch, tmp_path, fig):
    monkeypatch.setattr(export, "static_exporter", lambda: ("kaleido", ""))

    def broken(*a, **k):
        raise RuntimeError("Chrome crashed\nwith details")

    monkeypatch.setattr(go.Figure, "write_image", broken)
    with pytest.warns(export.StaticExportWarning, match=r"could not write c.png with kaleido \(Chrome crashed with details\)"):
        paths = export.save_figure(fig, tmp_path, "c")
    assert [p.name for p in paths] == ["c.html"]


def test_find_chrome_prefers_browser_path(monkeypatch, tmp_path):
    chrome = tmp_path / "chrome"
    chrome.write_text("")
    monkeypatch.setenv("BROWSER_PATH", str(chrome))
    assert export.find_chrome() == str(chrome)
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "missing"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert export.find_chrome() is None


def test_installed_pins_write_png(tmp_path, fig):
    # constraints.txt pins plotly 5.24.1 + kaleido 0.2.1: the legacy exporter, PNG written
    assert export.static_exporter() == ("kaleido-legacy", "")
    assert [p.name for p in export.save_figure(fig, tmp_path, "d")] == ["d.html", "d.png"]
