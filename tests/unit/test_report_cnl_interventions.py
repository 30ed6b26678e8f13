"""CNL Tables 2, 3 and Fig. 5 of the report read the per-item scores the experiments keep.

Results are built by hand in the experiments' own formats (``EraseResult.located_scores`` /
``random_scores`` / ``ppl_nll``, ``EnhanceResult.item_scores``, ``CrossResult.erase_scores``), so each
row's test and numbers are checked against a computation done here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from tlcap.experiments.cnl.cross import CrossResult
from tlcap.experiments.cnl.enhance import EnhanceResult, EnhanceRow
from tlcap.experiments.cnl.erase import EraseResult
from tlcap.metrics.accuracy import TaskAccuracy
from tlcap.reproduce.report import RowBuilder
from tlcap.reproduce.report_cnl_interventions import fig5, table2, table3
from tlcap.reproduce.scales import ScaleConfig

SCALE = ScaleConfig(cnl_eval_datasets=("emotion",), enhance_epochs=(1,))


def _why(stage: str) -> str:
    return f"{stage} not run"


def _erase(rng: np.random.Generator, n: int = 40, k: int = 30) -> EraseResult:
    base = (rng.random(n) < 0.6).astype(float)
    loc = base * (rng.random(n) < 0.3)  # erasing the located set loses most correct items
    rnd = base[None] * (rng.random((k, n)) < 0.95)  # random sets lose few
    nll = torch.tensor([[100.0, 90.0], [104.0, 93.0]] + [[100.0 + d, 90.0 + d] for d in rng.random(k)], dtype=torch.float64)
    return EraseResult("emotion", float(base.mean()), float(loc.mean()), float(rnd.mean()),
                       tuple(rnd.mean(1).tolist()), n_neurons=12, n_eval=n, base_scores=torch.tensor(base),
                       located_scores=torch.tensor(loc), random_scores=torch.tensor(rnd),
                       ppl_nll=nll, ppl_count=torch.tensor([50.0, 40.0], dtype=torch.float64))


def test_table3_tests_located_against_every_random_set_and_reports_the_perplexity_control():
    er = _erase(np.random.default_rng(0))
    base = TaskAccuracy("emotion", "label", float(er.base_scores.mean()), tuple(er.base_scores.tolist()))
    results = {"cnl.erase.emotion": {"base": base, "sigma3": er}}
    rb = RowBuilder("smollm2-135m", papers=("cnl",))
    table3(rb, results.get, _why, SCALE, n_boot=200, seed=0)
    rows = {r.row: r for r in rb.finalize()}
    eff = rows["emotion · σ=3 (12 neurons) located − random"]
    loc, rnd = er.located_scores.numpy(), er.random_scores.numpy()
    assert eff.ours == pytest.approx(loc.mean() - rnd.mean())
    p_items = stats.ttest_1samp(loc - rnd.mean(0), 0.0).pvalue
    p_rank = 2 * 1 / (30 + 1)  # the located accuracy is below all 30 random sets
    assert eff.p_value == pytest.approx(max(p_items, p_rank))
    assert eff.n == 40 and eff.n_unit == "test items"
    ppl = rows["emotion · σ=3 (12 neurons) WikiText-2 perplexity change: located − random"]
    e = er.perplexities.numpy()
    assert e[0] == pytest.approx(np.exp(190 / 90)) and e[1] == pytest.approx(np.exp(197 / 90))
    assert ppl.kind == "control" and ppl.ours == pytest.approx((e[1] - e[0]) - (e[2:] - e[0]).mean())
    assert ppl.p_value == pytest.approx(2 / 31)  # the located erasure raises perplexity more than every random one
    # its interval is the spread over single random sets, and is named so (not "our 95 % CI")
    assert "ours minus each random set, middle 95 % [" in ppl.reason and "our 95 % CI" not in ppl.reason


def test_table2_pairs_located_and_random_on_the_same_items_with_mcnemar():
    rng = np.random.default_rng(1)
    n = 50
    rnd = (rng.random(n) < 0.3).astype(float)
    loc = np.maximum(rnd, (rng.random(n) < 0.3).astype(float))
    wo = (rng.random(n) < 0.3).astype(float)
    rows = (EnhanceRow("located", 1, float(loc.mean())), EnhanceRow("random", 1, float(rnd.mean())),
            EnhanceRow("wo_located", 1, float(wo.mean())))
    res = EnhanceResult("emotion", 0.3, rows, n_neurons=12, n_train=10, n_eval=n,
                        item_scores=torch.tensor(np.stack([loc, rnd, wo])), base_scores=torch.tensor(rnd))
    rb = RowBuilder("smollm2-135m", papers=("cnl",))
    table2(rb, {"cnl.enhance.emotion": {"enhance": res}}.get, _why, SCALE, n_boot=200, seed=0)
    out = {r.row: r for r in rb.finalize()}
    r = out["emotion · epoch 1 located − random (1 random set, as the paper)"]
    b, c = int(((loc == 1) & (rnd == 0)).sum()), int(((loc == 0) & (rnd == 1)).sum())
    assert c == 0 and r.ours == pytest.approx((b - c) / n)
    assert "McNemar" in r.test and r.p_value == pytest.approx(stats.binomtest(b, b + c).pvalue)
    assert r.test.endswith("conditional on the one random set drawn, not a test against random sets")
    assert "conditional" not in out["emotion · epoch 1 located − w/o located"].test


def test_fig5_compares_each_sources_own_dataset_item_by_item_with_the_others():
    rng = np.random.default_rng(2)
    k, sets, n = 2, 4, 30
    sc = torch.tensor((rng.random((k, k, sets, n)) < 0.5).astype(float))
    sc[0, 0, 0] = 0.0  # A's neurons erase every item of A
    z = torch.zeros(k, k)
    res = CrossResult(("a", "b"), z, z, z, z, torch.zeros(0, k, k), base_scores=torch.ones(k, n), erase_scores=sc,
                      n_items=(n, n))
    rb = RowBuilder("smollm2-135m", papers=("cnl",))
    fig5(rb, {"cnl.cross": {"cross": res}}.get, _why, n_boot=200, seed=0)
    out = {r.row: r for r in rb.finalize()}
    r = out["a neurons · (erase − random) Δ on a − on the other datasets' items pooled"]
    x = sc.numpy()
    own = x[0, 0, 0] - x[0, 0, 1:].mean(0)
    rest = x[0, 1, 0] - x[0, 1, 1:].mean(0)
    assert r.ours == pytest.approx(own.mean() - rest.mean())
    assert r.p_value == pytest.approx(stats.ttest_ind(own, rest, equal_var=False).pvalue) and r.n_unit == "test items"


def test_table2_with_several_random_fine_tunes_tests_located_against_random_sets_in_general():
    rng = np.random.default_rng(4)
    n, R = 60, 5
    draws = (rng.random((R, n)) < rng.uniform(0.2, 0.4, (R, 1))).astype(float)
    loc = (rng.random(n) < 0.55).astype(float)
    wo = (rng.random(n) < 0.3).astype(float)
    rows = (EnhanceRow("located", 1, float(loc.mean())), EnhanceRow("random", 1, float(draws[0].mean())),
            EnhanceRow("wo_located", 1, float(wo.mean())))
    res = EnhanceResult("emotion", 0.3, rows, n_neurons=12, n_train=10, n_eval=n,
                        item_scores=torch.tensor(np.stack([loc, draws[0], wo])), base_scores=torch.tensor(wo),
                        random_scores=torch.tensor(draws[:, None, :]))
    rb = RowBuilder("smollm2-135m", papers=("cnl",))
    table2(rb, {"cnl.enhance.emotion": {"enhance": res}}.get, _why, SCALE, n_boot=200, seed=0)
    out = {r.row: r for r in rb.finalize()}
    r = out["emotion · epoch 1 located − random (mean of 5 random sets)"]
    acc = draws.mean(1)
    t = (loc.mean() - acc.mean()) / (acc.std(ddof=1) * np.sqrt(1 + 1 / R))
    p = max(2 * stats.t.sf(abs(t), R - 1), stats.ttest_1samp(loc - draws.mean(0), 0.0).pvalue)
    assert r.ours == pytest.approx(loc.mean() - draws.mean(), abs=1e-12) and r.p_value == pytest.approx(p, rel=1e-9)
    assert "prediction t-test over 5 random draws" in r.test and "conditional" not in r.test
    assert "(5 sets)" in r.control
    assert "emotion · epoch 1 located − random (1 random set, as the paper)" not in out  # one row per claim
    mean_row = out["emotion · random, mean of 5 random sets · epoch 1"]
    assert mean_row.ours == pytest.approx(draws.mean(), abs=1e-12) and mean_row.low < mean_row.ours < mean_row.high
    assert out["emotion · random · epoch 1"].ours == pytest.approx(draws[0].mean(), abs=1e-12)  # the paper's one draw
