"""The report's located-vs-random machinery on a model whose answer is known (issue 24 item 10).

A tiny GPT-2 carries a toy sentiment task through 12 planted neurons (:func:`planted_capability_model`).
CNL locates on half the prompts; the located set is erased on the *other* half (no claim tested on
the data that defined it) against 200 matched random sets, and the row goes through the report's
verdict layer (two-sided rank p-value, Benjamini–Hochberg, the claim's sign). The planted capability
is found ("agrees"). With the labels shuffled across prompts — no task for the neurons to carry — and
on the same model without the wiring, the same pipeline finds nothing ("undecided").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tlcap.experiments.cnl import cnl_locate
from tlcap.experiments.cnl.erase import erase_effect
from tlcap.reproduce.registry import paper_claim
from tlcap.reproduce.report import RowBuilder
from tlcap.reproduce.report_cnl_interventions import erase_effect_row
from tlcap.reproduce.verdict import AGREES, UNDECIDED
from tlcap.runtime.run_control import RunControl
from tlcap.testing.planted import planted_capability_model

pytestmark = pytest.mark.heavy  # over ~5 s per module: runs after the fast gate (make unit)

R = 200


def _run(variant: str) -> tuple[str, float, set, set]:
    model, truth = planted_capability_model(seed=0, wired=variant != "unwired")
    samples = list(truth.samples)
    if variant == "shuffled":
        golds = [s.gold for s in samples]
        perm = np.random.default_rng(0).permutation(len(golds))
        samples = [dataclasses.replace(s, answer=golds[j], gold=golds[j]) for s, j in zip(samples, perm)]
    locate, held_out = samples[0::2], samples[1::2]
    torch.manual_seed(0)
    loc = cnl_locate(model, truth.task, locate, run=RunControl(progress=False))
    er = erase_effect(model, truth.task, held_out, loc.neuron_set(), n_random=R, seed=0)
    located = er.located_scores.double().numpy()
    rnd = er.random_scores.double().numpy()  # [random set, item]
    assert rnd.shape == (R, len(located))
    eff = erase_effect_row(located, rnd, np.asarray(er.random_accuracies, dtype=float),
                           n_boot=1000, seed=0)
    rb = RowBuilder("gpt2-tiny", papers=("cnl",))
    rb.effect("CNL Table 3", variant, paper_claim("cnl.table3.located-vs-random"), eff.estimate, eff.p_value, eff.test,
              p_floor=eff.p_floor, differences=rb.model_difference("cnl"))
    (row,) = rb.finalize()
    return row.verdict, row.p_value, set(loc.neuron_set()), set(truth.neurons)


@pytest.mark.parametrize("variant, word", [("wired", AGREES), ("shuffled", UNDECIDED), ("unwired", UNDECIDED)])
def test_located_vs_random_finds_the_planted_capability_and_nothing_without_it(variant, word):
    verdict, p, located, planted = _run(variant)
    assert verdict == word, (variant, p)
    if variant == "wired":
        assert located == planted                      # the located set is the planted one
        assert p == pytest.approx(2 / (R + 1))         # beyond every one of the 200 random sets
    else:
        assert p > 0.05
