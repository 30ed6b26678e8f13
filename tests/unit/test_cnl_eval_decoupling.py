"""CNL decoupling: the comparative-pair generator, coincidence rates of the result against hand
computations, and the tiny-model run against KN's own API."""

from __future__ import annotations

import pytest

from tlcap.attribution import IGConfig
from tlcap.data.comparative import comparative_pairs, load_pairs, make_pair, problem_numbers, save_pairs
from tlcap.errors import EmptyDatasetError, InvalidConfigError
from tlcap.experiments.cnl_eval import DecouplingResult, decoupling
from tlcap.experiments.cnl_eval.common import kn_neurons, neuron_ids
from tlcap.experiments.knowledge_neurons import KNConfig
from tlcap.results import load_result
from tlcap.runtime.run_control import RunControl

IG = IGConfig(steps=2)


def test_make_pair_framings():
    p = make_pair(17, "+", 25)
    assert p.main == "17+25=?" and p.result == 42
    assert p.framing(1) == ("Provide the correct answer for 17+25=?\nAnswer:", " 42")
    assert p.framing(2) == ("Write Python code for 17+25=?\nCode:", " print(17+25)")
    assert make_pair(9, "*", 7).result == 63 and make_pair(9, "-", 7).result == 2
    with pytest.raises(InvalidConfigError):
        make_pair(1, "/", 2)
    with pytest.raises(InvalidConfigError):
        p.framing(3)


def test_problem_numbers_by_hand():
    assert problem_numbers("Tom has 12 apples, buys 3.5 kg and 12 more for $1,200 then 7.", 99) == [12, 7]


def test_comparative_pairs_seeded_unique_and_correct(tmp_path):
    pairs = comparative_pairs(30, seed=3)
    assert pairs == comparative_pairs(30, seed=3) and pairs != comparative_pairs(30, seed=4)
    assert len({p.main for p in pairs}) == 30
    assert {p.source for p in pairs} == {"template", "gsm8k", "svamp"}
    for p in pairs:
        assert p.result == eval(f"{p.a}{p.op}{p.b}") and p.result >= 0  # noqa: S307 - two ints and an operator
        assert 1 <= p.a <= 99 and 1 <= p.b <= 99
    assert load_pairs(save_pairs(pairs, tmp_path / "p.json")) == pairs
    with pytest.raises(EmptyDatasetError):
        comparative_pairs(10, sources=("template",), ops=("+",), max_operand=2)
    with pytest.raises(InvalidConfigError, match="--sources"):
        comparative_pairs(3, sources=("mmlu",))


@pytest.fixture(scope="module")
def hand():
    # L = 2, J = 4: neuron (l, j) has id 4l + j
    return DecouplingResult(pairs=(("a", "template", "1+1=?"), ("b", "template", "2+2=?")),
                            sets1=((0, 1, 5), (1, 5)), sets2=((1, 2), (1, 5, 6)), probs1=(0.5, 0.25),
                            probs2=(0.1, 0.3), n_layers=2, d_mlp=4, model_name="hand")


def test_rates_by_hand(hand, tmp_path):
    r = hand.rates()
    assert r.c12 == pytest.approx((1 + 2) / (2 * 8))  # |∩| of the pairs: 1, 2
    assert r.c11 == pytest.approx(2 / 8) and r.c22 == pytest.approx(1 / 8)  # ⋂ framing 1 = {1, 5}; framing 2 = {1}
    assert r.c12_overlap == pytest.approx(((1 / 3 + 1 / 2) / 2 + (2 / 2 + 2 / 3) / 2) / 2)
    assert list(hand.cross_overlaps()) == pytest.approx([2 / 3, 1 / 2])
    s = hand.summary()
    assert s["c12"]["overlap"]["value"] == pytest.approx(0.625) and s["c12"]["literal"]["paper"] == 0.156
    assert s["c11"]["literal"] == pytest.approx(0.25) and s["c22"]["paper"] == 0.086
    assert s["c12_cross_pair_overlap"]["value"] == pytest.approx(7 / 12)
    df = hand.to_frame()
    assert list(df.intersection) == [1, 2] and list(df.size2) == [2, 3]
    hand.figure()
    hand.save(tmp_path / "r")
    assert load_result(tmp_path / "r").to_frame().equals(df)


def test_decoupling_sets_come_from_kn(tiny_llama, tmp_path):
    pairs = [make_pair(2, "+", 3, uid="0"), make_pair(4, "*", 5, uid="1")]
    res = decoupling(tiny_llama, pairs, top_k=4, ig=IG, run=RunControl(progress=False))
    prompt, target = pairs[1].framing(2)
    ns, p = kn_neurons(tiny_llama, prompt, target, KNConfig(ig=IG, top_k=4))
    assert res.sets2[1] == neuron_ids(ns) and res.probs2[1] == pytest.approx(p)
    assert all(len(s) == 4 for s in res.sets1 + res.sets2)

    def boom(i):
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        decoupling(tiny_llama, pairs, top_k=4, ig=IG,
                   on_item=boom, run=RunControl(progress=False, checkpoint_dir=tmp_path, checkpoint_every=1))
    seen = []
    again = decoupling(tiny_llama, pairs, top_k=4, ig=IG, on_item=seen.append,
                       run=RunControl(progress=False, checkpoint_dir=tmp_path))
    assert seen == [1] and again.to_frame().equals(res.to_frame())
    with pytest.raises(EmptyDatasetError):
        decoupling(tiny_llama, [], run=RunControl(progress=False))
