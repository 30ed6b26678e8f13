"""figure() of the statistics results: each figure shows the result's own numbers."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest

from tlcap.metrics import (
    Estimate,
    coincidence_rates,
    located_vs_random,
    mean_pairwise_overlap,
)


def test_estimate_figure_draws_the_interval():
    e = Estimate(0.373, 0.31, 0.44, n=50, method="percentile")
    fig = e.figure()
    (tr,) = fig.data
    assert isinstance(fig, go.Figure) and list(tr.x) == [0.373]
    assert tr.error_x.array[0] == pytest.approx(0.44 - 0.373) and tr.error_x.arrayminus[0] == pytest.approx(0.373 - 0.31)
    assert list(tr.y) == ["percentile 95% CI (n=50)"] and fig.layout.title.text == "0.373 [0.31, 0.44] (n=50)"
    alone = Estimate(0.5, math.nan, math.nan, n=1).figure()
    assert list(alone.data[0].y) == ["no CI (n=1)"] and list(alone.data[0].error_x.array) == [0.0]


def test_coincidence_rates_figure_holds_the_three_variants():
    r = coincidence_rates([{(0, 1), (1, 2)}], [{(0, 1)}], n_layers=2, d_mlp=4)
    fig = r.figure()
    bars = {t.name: list(t.y) for t in fig.data}
    assert bars == {
        "literal (poster)": [r.c12, r.c11, r.c22],
        "overlap-normalised": [r.c12_overlap, r.c11_overlap, r.c22_overlap],
        "IoU": [r.c12_iou, r.c11_iou, r.c22_iou],
    }
    assert bars["literal (poster)"][0] == 0.125 and bars["overlap-normalised"][0] == 0.75
    assert list(fig.data[0].x) == ["C^{1,2}", "C^{1,1}", "C^{2,2}"]


def test_pairwise_overlap_figure_is_the_symmetric_pair_matrix():
    r = mean_pairwise_overlap([{1, 2}, {2, 3}, {2}])
    z = np.array(r.figure().data[0].z, dtype=float)
    assert z.shape == (3, 3) and np.isnan(np.diag(z)).all()
    for (i, j), v in zip(r.pairs, r.values):
        assert z[i, j] == z[j, i] == pytest.approx(v)
    assert z[0, 1] == pytest.approx(0.5) and z[1, 2] == pytest.approx(0.75)


def test_random_control_figure_marks_the_observed_value():
    nulls = [0.1 * i for i in range(20)]
    t = located_vs_random(2.5, nulls, statistic="drop")
    hist, line = t.figure().data
    assert list(hist.x) == pytest.approx(nulls) and list(line.x) == [2.5, 2.5]
    assert "p = 0.0952, two-sided" in t.figure().layout.title.text  # 0 of 20 as extreme: 2 · 1/21
