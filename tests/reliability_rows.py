"""Hand-made reliability rows (KN, ROME, KC) shared by the reliability and Table 4 (compare) tests.

3 facts with located (base, doubled, zeroed) probabilities and 5 random draws per fact; the
expected shares, hits and p-values are computed by hand in the tests that use them.
"""

from __future__ import annotations

from dataclasses import astuple

import numpy as np

from tlcap.experiments.cnl_eval import FidelityResult, FidelityRow, ReliabilityResult
from tlcap.experiments.cnl_eval.reliability_result import KCRow, KNRow, RomeRow

# 3 facts; located (base, doubled, zeroed) and 5 random draws per fact.
LOC = [(0.2, 0.3, 0.1), (0.2, 0.1, 0.1), (0.2, 0.4, 0.3)]
RND = np.array([  # [draw][fact] doubled prob; zeroed prob = 0.25 everywhere (rises in every fact)
    [0.1, 0.1, 0.1], [0.3, 0.1, 0.1], [0.3, 0.3, 0.1], [0.1, 0.1, 0.1], [0.25, 0.25, 0.25],
])


def _kn_rows():
    rows = []
    for f, (b, up, down) in enumerate(LOC):
        rows.append(KNRow(f, str(f), "located", -1, 4, 0.01, b, up, down))
        for d in range(RND.shape[0]):
            rows.append(KNRow(f, str(f), "random", d, 4, 0.01, b, float(RND[d, f]), 0.25))
    return tuple(astuple(r) for r in rows)


def _rome_rows():
    # fact 0 traced to layer 1, fact 1 to layer 2; efficacy / paraphrase per layer
    eff = {0: [1, 0, 1], 1: [0, 1, 1]}
    par = {0: [0.5, 1.0, 0.0], 1: [0.0, 0.5, 1.0]}
    traced = {0: 1, 1: 2}
    return tuple(astuple(RomeRow(f, str(f), l, traced[f], l == traced[f], True, bool(eff[f][l]), par[f][l], 1.0,
                                 0.1, 0.5, 0.2)) for f in (0, 1) for l in range(3))


def _kc_rows():
    hits = [True, False, True, False]
    shares = [0.02, 0.03, 0.04, 0.05]
    rows = [KCRow(f, str(f), "located", -1, 10, 5, shares[f], 1 if hits[f] else 3, hits[f], True, 1.0) for f in range(4)]
    for f in range(4):
        for d in range(5):
            hit = (f + d) % 5 == 0  # draw d hits fact f iff f + d ≡ 0 (mod 5)
            rows.append(KCRow(f, str(f), "random", d, 10, 6, 0.03, 1 if hit else 7, hit, hit, 2.0))
    return tuple(astuple(r) for r in rows)


def _fid():
    rows = []
    vals = {"kn": (0.4, 0.2, 0.01), "trace": (1.0, 0.6, 0.1), "kc": (0.1, 0.3, 0.02)}
    for f in range(2):
        for m, (o, o2, share) in vals.items():
            rows.append(astuple(FidelityRow(f, str(f), "P36", "s", " t", m, o if f == 0 else o2, 0.1, 0.05, 5.0, 4, 6,
                                            share * (f + 1))))
    return FidelityResult(rows=tuple(rows), rewrite_rows=(), methods=("kn", "trace", "kc"), n_facts=2, model_name="hand")


REL = ReliabilityResult(kn_rows=_kn_rows(), rome_rows=_rome_rows(), kc_rows=_kc_rows(), parts=("kn", "rome", "kc"),
                        n_facts=4, n_layers=3, model_name="hand", config={"n_random": 5})
