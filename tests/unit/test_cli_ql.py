"""The ``tlcap ql`` commands on a tiny random model: contracts checked from the written files."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tlcap.cli import _load_commands, app

COMMON = ["--model", "gpt2-tiny", "--relations", "P36,P103", "--n-facts", "3", "--known-top-k", "0",
          "--steps", "3", "--max-queries", "3"]


@pytest.fixture(scope="module")
def runner():
    _load_commands()
    return CliRunner()


def _run(runner, cmd, out):
    res = runner.invoke(app, ["ql", cmd, *COMMON, "--out", str(out)])
    assert res.exit_code == 0, res.output[-3000:]
    assert list(out.glob("*.html")) and list(out.glob("*.png")), cmd
    return json.loads((out / "summary.json").read_text())


def test_ql_consistency_contract(runner, tmp_path):
    s = _run(runner, "consistency", tmp_path / "c")
    for key in ["n_facts", "k1_ratio", "k2_ratio", "mean_cs2_k1", "mean_cs2_k2", "threshold", "welch_t", "welch_p", "facts"]:
        assert key in s, key
    assert s["n_facts"] == 3 and len(s["facts"]) == 3
    assert abs(s["k1_ratio"] + s["k2_ratio"] - 1.0) < 1e-9
    for f in s["facts"]:
        assert {"relation", "subject", "object", "cs1", "cs2", "group"} <= set(f)
        assert f["cs1"] == pytest.approx(f["intersection"] / f["union"] if f["union"] else 0.0)  # CS1 = |∩| / |∪|
        if f["n_queries"] >= 3:  # K_I iff CS2 > the static threshold (QL Table 4: 0.1)
            assert f["group"] == ("K_I" if f["cs2"] > 0.1 else "K_II") and f["cs2"] >= f["cs1"]


@pytest.mark.parametrize("cmd", ["modify", "mapping", "synapses", "cas"])
def test_ql_sibling_commands_write_their_analyses(runner, tmp_path, cmd):
    s = _run(runner, cmd, tmp_path / cmd)
    assert s, cmd
