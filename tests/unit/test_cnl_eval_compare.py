"""Table 4 (compare): every cell against the result it is read from or a hand computation,
the paper's row beside ours, and missing inputs as NaN with a note."""

from __future__ import annotations

import math

import pytest

from tests.reliability_rows import REL, _fid, _kc_rows, _kn_rows, _rome_rows
from tlcap.experiments.cnl_eval import CompareResult, ReliabilityResult, compare
from tlcap.experiments.cnl_eval.common import ParamCounts
from tlcap.results import load_result

COUNTS = ParamCounts(block_total=1000, per_neuron=3, per_mlp=(100, 100))
ERASE = {"located_accuracy": 0.2, "random_accuracies": [0.5, 0.45, 0.6, 0.4, 0.55]}


def test_table4_cells_by_hand(tmp_path):
    tab = compare(_fid(), REL, cnl_locate={"split_overlap": 0.9, "n_neurons": 10}, cnl_erase=ERASE, counts=COUNTS)
    r = {row.method: row for row in tab.records()}
    assert r["kn"].overlap == pytest.approx(0.3) and r["rome"].overlap == pytest.approx(0.8)
    assert r["kc"].neuron == pytest.approx((0.02 + 0.04) / 2)
    assert r["kn"].ipp == pytest.approx(REL.kn_ipp("double").value)
    assert r["kn"].ipp == pytest.approx((0.3 + 0.1 + 0.4) / 3 - 0.25)  # best draw: 4 (0.25 everywhere)
    assert r["kc"].ipp == pytest.approx(0.25) and r["rome"].ipp == pytest.approx(REL.rome_ipp().value)
    assert r["cnl"].overlap == 0.9 and r["cnl"].neuron == pytest.approx(10 * 3 / 1000)
    assert r["cnl"].ipp == pytest.approx(0.4 - 0.2) and r["cnl"].n_draws == 5
    assert (r["kn"].paper_overlap, r["kn"].paper_neuron, r["kn"].paper_ipp) == (37.3, 0.2, 11.4)
    s = tab.summary()
    assert s["cnl"]["ipp"]["value"] == pytest.approx(20.0) and s["cnl"]["ipp"]["paper"] == 20.0
    assert "doubled" in s["kn"]["performance"] and all(not row.note for row in tab.records())
    tab.figure()
    tab.save(tmp_path / "t")
    back = load_result(tmp_path / "t")
    assert isinstance(back, CompareResult) and back.to_frame().equals(tab.to_frame())


def test_table4_missing_inputs_are_nan_with_a_note():
    tab = compare(_fid(), None, cnl_locate={"split_overlap": 0.9, "n_neurons": 10},
                  cnl_erase={"located_accuracy": 0.2, "random_accuracies": [0.5, 0.4, 0.3]})
    r = {row.method: row for row in tab.records()}
    assert math.isnan(r["kn"].ipp) and "no reliability result" in r["kn"].note
    assert math.isnan(r["cnl"].ipp) and "5" in r["cnl"].note  # 3 draws < the 5 an IPP needs
    assert math.isnan(r["cnl"].neuron) and "parameter counts" in r["cnl"].note


def test_rome_ipp_with_only_the_traced_layer_edited_is_none_not_an_error():
    # Each fact edited at its traced layer only (a one-layer --rome-layers run): no random layer to draw.
    only_traced = tuple(r for r in _rome_rows() if r[4])
    rel = ReliabilityResult(kn_rows=_kn_rows(), rome_rows=only_traced, kc_rows=_kc_rows(), parts=("kn", "rome", "kc"),
                            n_facts=4, n_layers=3, model_name="hand", config={"n_random": 5})
    assert rel.rome_ipp() is None
    # One fact with other layers, one without: the IPP uses the first fact only.
    mixed = only_traced + tuple(r for r in _rome_rows() if r[0] == 0 and not r[4])
    rel = ReliabilityResult(kn_rows=_kn_rows(), rome_rows=mixed, kc_rows=_kc_rows(), parts=("kn", "rome", "kc"),
                            n_facts=4, n_layers=3, model_name="hand", config={"n_random": 5})
    est = rel.rome_ipp()
    # fact 0: efficacy 0 at its traced layer 1; other layers 0 and 2 both have efficacy 1 -> IPP = 0 - 1
    assert est is not None and est.value == pytest.approx(-1.0)
