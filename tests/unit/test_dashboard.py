"""``tlcap dashboard``: the page, its errors, and a real headless-browser click on a located cell."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest

import tlcap
from tests.cdp import Browser, find_chromium
from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.explore.explorer import explore_neurons
from tlcap.testing import planted_fact_model

PROMPT, TARGET = "The capital of France is", " Paris"


@pytest.fixture(scope="module")
def saved_attribution(tmp_path_factory):
    model = tlcap.load_model("gpt2-tiny")
    attr = tlcap.integrated_gradients(model, PROMPT, TARGET, steps=5, progress=False)
    folder = tmp_path_factory.mktemp("kn") / "result"
    attr.save(folder)
    return folder.parent, attr


@pytest.fixture(scope="module")
def page(saved_attribution, tmp_path_factory):
    folder, attr = saved_attribution
    out = tmp_path_factory.mktemp("page") / "page.html"
    run = run_cli(["dashboard", str(folder), "--out", str(out), "--model", "gpt2-tiny", "--top", "5"])
    assert run.code == 0, run.stderr[-3000:]
    return out, attr


def _cards(html: str) -> dict[str, str]:
    return json.loads(re.search(r'<script type="application/json" id="tlx-cards-\w+">(.*?)</script>', html, re.S)
                      .group(1).replace("<\\/", "</"))


def test_page_is_self_contained_and_cards_every_located_neuron(page):
    out, attr = page
    html = out.read_text()
    cards = _cards(html)
    located = attr.select(threshold=0.2)
    assert {f"{l},{j}" for l, j in located} <= set(cards) and len(cards) <= len(located) + 5
    l, j = located.neurons[0]
    assert f"Neuron L{l}/N{j}" in cards[f"{l},{j}"] and "On &#x27;The capital of France is&#x27;" in cards[f"{l},{j}"]
    assert "plotly.js" in html.lower() or "Plotly" in html  # plotly inlined
    assert not re.search(r"<script[^>]+src=\"http", html)  # nothing fetched from the network


def test_dashboard_errors_are_one_line_and_leave_no_page(saved_attribution, tmp_path):
    folder, _ = saved_attribution
    out = tmp_path / "p.html"
    assert_cli_error(["dashboard", str(folder), "--out", str(out), "--activations", "maybe"],
                     "unknown activations 'maybe' (--activations); choose one of: cached, build, none", out=out)
    assert_cli_error(["dashboard", str(folder), "--out", str(tmp_path / "p.txt")],
                     f"--out {tmp_path / 'p.txt'} must be an .html file path")
    assert_cli_error(["dashboard", str(tmp_path), "--out", str(out)],
                     f"{tmp_path} holds no saved result (result.json, or result/result.json as `tlcap kn --out` writes); "
                     "give a result folder", out=out)
    out.write_text("keep me")
    assert_cli_error(["dashboard", str(folder), "--out", str(out)],
                     f"{out} already exists; pass --overwrite to replace it or choose another --out", out=out)
    lens = tlcap.logit_lens(tlcap.load_model("gpt2-tiny"), PROMPT, TARGET)
    lens.save(tmp_path / "lens")
    assert_cli_error(["dashboard", str(tmp_path / "lens"), "--out", str(tmp_path / "q.html")],
                     "a neuron explorer shows neuron results (NeuronAttribution, KnowledgeNeurons, CNLLocation, "
                     "NeuronScores, DatasetScores or NeuronSet); got a LogitLens")


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium/Chrome found (scripts/ensure_chromium.sh installs "
                                                    "Debian's chromium; or set BROWSER_PATH)")
def test_clicking_a_located_cell_shows_its_card_in_a_real_browser(tmp_path):
    model, truth = planted_fact_model(seed=0)
    attr = tlcap.integrated_gradients(model, truth.prompt, truth.target, steps=5, progress=False)
    page = explore_neurons(model, attr, top=3).save(tmp_path / "planted.html")
    layer, neuron = truth.neurons.neurons[0]
    browser = Browser(find_chromium(), tmp_path / "profile")
    try:
        browser.open(page.as_uri())
        browser.wait_for("document.querySelector('[data-tlcap-ready]') !== null")
        x, y = browser.evaluate(f"""(() => {{
            const gd = document.querySelector('.js-plotly-plot'), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
            const r = gd.getBoundingClientRect();
            return [r.left + xa._offset + xa.l2p({neuron}), r.top + ya._offset + ya.l2p({layer})]; }})()""")
        browser.click(x, y)
        shown = browser.wait_for("document.querySelector('.tlcap-card-panel').getAttribute('data-neuron')")
        assert shown == f"{layer},{neuron}"
        text = browser.evaluate("document.querySelector('.tlcap-card-panel').innerText")
        assert f"Neuron L{layer}/N{neuron}" in text and "' Paris'" in text  # the planted neuron promotes " Paris"
        shot = browser.screenshot(tmp_path / "dashboard_click.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if os.environ.get("TLCAP_SCREENSHOT_DIR"):
            shutil.copy(shot, os.environ["TLCAP_SCREENSHOT_DIR"])
        other = (1, 200 if (1, 200) not in truth.neurons else 201)  # a cell without a precomputed card
        x, y = browser.evaluate(f"""(() => {{
            const gd = document.querySelector('.js-plotly-plot'), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
            const r = gd.getBoundingClientRect();
            return [r.left + xa._offset + xa.l2p({other[1]}), r.top + ya._offset + ya.l2p({other[0]})]; }})()""")
        time.sleep(0.5)  # past plotly's double-click window (300 ms), so this is a second single click
        browser.click(x, y)
        browser.wait_for(f"document.querySelector('.tlcap-card-panel').getAttribute('data-neuron') === '{other[0]},{other[1]}'")
        assert "No card precomputed for L1/N" in browser.evaluate("document.querySelector('.tlcap-card-panel').innerText")
    finally:
        browser.close()


def test_index_command_builds_once_then_finds_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TLCAP_CACHE", str(tmp_path))
    args = ["index", "--model", "gpt2-tiny", "--max-tokens", "300", "--context", "64", "--k", "3"]
    first = run_cli(args)
    assert first.code == 0, first.stderr[-2000:]
    assert re.search(r"activation_index/gpt2-tiny-random-seed0-\w+: 256 tokens, 2 x 256 neurons, top 3 \(built in \d+ s\)",
                     first.stdout)
    second = run_cli(args)
    assert second.code == 0 and second.stdout.strip().endswith("(found)")
    card = tlcap.inspect_neuron(tlcap.load_model("gpt2-tiny"), 1, 5, max_tokens=300, context=64, k=3)
    assert card.corpus == "wikitext2-test" and card.corpus_tokens == 256
    assert_cli_error(["index", "--model", "gpt2-tiny", "--k", "0"], "k (--k) must be >= 1, got 0")
