"""CNL fidelity experiment: the per-fact overlap, chance overlap and CI against hand computations,
the located sets against the methods' own public APIs, and checkpoint / resume."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pytest

from tlcap.attribution import IGConfig, integrated_gradients
from tlcap.data.rewrites import RewriteFact, load_rewrites, rewrite_facts, save_rewrites
from tlcap.errors import CheckpointMismatchError, DataFormatError, EmptyDatasetError, MissingFileError
from tlcap.experiments.cnl_eval import FidelityResult, fidelity
from tlcap.experiments.cnl_eval.common import edge_ids, neuron_ids, neurons_from_ids
from tlcap.experiments.cnl_eval.fidelity import chance_overlap
from tlcap.locate.causal_trace import causal_trace
from tlcap.locate.circuits import edge_attribution
from tlcap.locate.selection import top_k_select
from tlcap.results import load_result
from tlcap.runtime.run_control import RunControl

FACTS = [
    RewriteFact("France", " Paris", ("The capital of France is", "France's capital is", "The capital city of France is"),
                "P36", "a", " Rome"),
    RewriteFact("Germany", " Berlin", ("The capital of Germany is", "Germany's capital is"), "P36", "b", " Paris"),
]
IG = IGConfig(steps=2)
OPTS = dict(ig=IG, kn__top_k=6, trace__top_k=1, trace__samples=1, trace__window=1, kc__top_n=12, kc__steps=1)


def _hand_overlap(sets):
    vals = []
    for a, b in combinations(sets, 2):
        a, b = set(a), set(b)
        inter = len(a & b)
        vals.append(0.5 * (inter / len(a) + inter / len(b)) if a and b else 0.0)
    return sum(vals) / len(vals)


@pytest.fixture(scope="module")
def fid(tiny_llama):
    return fidelity(tiny_llama, FACTS, **OPTS)


def test_chance_overlap_by_hand():
    # per layer (d_mlp = 4): a has 2 neurons in layer 0 and 1 in layer 1, b has 1 and 2;
    # E|A∩B| = (2·1 + 1·2) / 4 = 1, overlap = (1/3 + 1/3) / 2
    assert chance_overlap([0, 1, 5], [2, 6, 7], 8, per_layer=4) == pytest.approx(1 / 3)
    # uniform over 10: E|A∩B| = 3·2/10 = 0.6, overlap = (0.6/3 + 0.6/2) / 2
    assert chance_overlap([0, 1, 2], [3, 4], 10) == pytest.approx(0.25)
    assert chance_overlap([], [3], 10) == 0.0


def test_neuron_ids_round_trip(tiny_llama):
    ns = top_k_select(integrated_gradients(tiny_llama, FACTS[0].rewrites[0], FACTS[0].target, config=IG).scores, 6)
    ids = neuron_ids(ns)
    assert ids == tuple(sorted(l * tiny_llama.d_mlp + j for l, j in ns))
    assert set(neurons_from_ids(ids, ns.shape)) == set(ns)


def test_fidelity_rows_match_hand_overlaps(fid, tiny_llama):
    df = fid.to_frame()
    assert len(df) == len(FACTS) * 3
    for m in ("kn", "trace", "kc"):
        for f, fact in enumerate(FACTS):
            sets = fid.sets[m][f]
            assert len(sets) == len(fact.rewrites)
            row = df[(df.method == m) & (df.fact == f)].iloc[0]
            assert row.overlap == pytest.approx(_hand_overlap(sets))
            per = tiny_llama.d_mlp if m == "kn" else None
            ch = [chance_overlap(a, b, fid.universe[m], per) for a, b in combinations(sets, 2)]
            assert row.chance == pytest.approx(sum(ch) / len(ch))
            assert row.mean_size == pytest.approx(np.mean([len(s) for s in sets]))
        vals = [_hand_overlap(fid.sets[m][f]) for f in range(len(FACTS))]
        assert fid.estimate(m).value == pytest.approx(np.mean(vals))
        assert fid.summary()[m]["overlap"]["paper"] == {"kn": 0.373, "trace": 0.327, "kc": 0.072}[m]
    assert all(len(s) == 6 for s in fid.sets["kn"][0])  # top_k
    assert all(len(s) == 1 for s in fid.sets["trace"][0])  # top-1 of 2 layers (top-k >= the layers is refused)
    fid.figure()


def test_fidelity_sets_come_from_the_methods(fid, tiny_llama):
    fact, prompt = FACTS[0], FACTS[0].rewrites[1]
    attr = integrated_gradients(tiny_llama, prompt, fact.target, config=IG)
    assert list(fid.sets["kn"][0][1]) == list(neuron_ids(top_k_select(attr.scores, 6)))
    tr = causal_trace(tiny_llama, prompt, fact.subject, fact.target, kinds=("mlp",), samples=1, window=1, seed=0)
    assert list(fid.sets["trace"][0][1]) == tr.top_layers(1, kind="mlp", token="last_subject")
    circ = edge_attribution(tiny_llama, prompt, fact.target, None, steps=1).select(top_n=12)  # zero ablation, pruned
    assert list(fid.sets["kc"][0][1]) == list(edge_ids(circ))


def test_fidelity_result_round_trip(fid, tmp_path):
    fid.save(tmp_path / "r")
    back = load_result(tmp_path / "r")
    assert isinstance(back, FidelityResult)
    assert back.to_frame().equals(fid.to_frame())
    assert back.rewrite_frame().equals(fid.rewrite_frame())  # KC rows hold a NaN probability
    assert back.summary()["kn"]["overlap"] == fid.summary()["kn"]["overlap"]


def test_fidelity_checkpoint_resume(tiny_llama, tmp_path):
    opts = dict(OPTS, methods=("kn",))
    full = fidelity(tiny_llama, FACTS, **opts)

    def boom(i):
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fidelity(tiny_llama, FACTS, on_item=boom, **opts, run=RunControl(checkpoint_dir=tmp_path, checkpoint_every=1))
    seen = []
    res = fidelity(tiny_llama, FACTS, on_item=seen.append, **opts, run=RunControl(checkpoint_dir=tmp_path))
    assert seen == [1]  # the first fact came from the checkpoint
    assert res.to_frame().equals(full.to_frame())
    with pytest.raises(CheckpointMismatchError):
        fidelity(tiny_llama, FACTS, **dict(opts, kn__top_k=5), run=RunControl(checkpoint_dir=tmp_path))


def test_fidelity_errors(tiny_llama):
    with pytest.raises(EmptyDatasetError):
        fidelity(tiny_llama, [], run=RunControl(progress=False))


def test_rewrites_json_round_trip_and_errors(tmp_path):
    p = save_rewrites(FACTS, tmp_path / "f.json")
    assert load_rewrites(p) == FACTS
    bad = tmp_path / "bad.json"
    bad.write_text('[{"subject": "Spain", "target": " Madrid", "rewrites": ["The capital is", "Spain: capital"]}]')
    with pytest.raises(DataFormatError, match="not in the rewrite"):
        load_rewrites(bad)
    bad.write_text(json.dumps([{"subject": "Spain", "object": "Madrid", "rewrites": ["Spain's capital is"]}]))
    with pytest.raises(DataFormatError, match="at least 2"):
        load_rewrites(bad)
    with pytest.raises(MissingFileError):
        load_rewrites(tmp_path / "none.json")
    bad.write_text(json.dumps([{"subject": "Spain", "object": "Madrid", "rewrites": ["Spain's capital is", "Spain:"]}]))
    f = load_rewrites(bad)[0]
    assert f.target == " Madrid" and f.uid == "0"


def test_rewrite_facts_from_pararel_without_model():
    facts = rewrite_facts(None, n=4, known_top_k=None, single_token=False, relations=["P36", "P103"], n_rewrites=3)
    assert len(facts) == 4 and {f.relation for f in facts} <= {"P36", "P103"}
    for f in facts:
        assert len(f.rewrites) == 3 and len(set(f.rewrites)) == 3
        assert all(f.subject in r for r in f.rewrites)
        assert f.target_new is not None and f.target_new != f.target
    assert rewrite_facts(None, n=4, known_top_k=None, single_token=False, relations=["P36", "P103"], n_rewrites=3) == facts


def test_fidelity_bos_reaches_the_trace(tiny_llama):
    # bos=True: every rewrite is traced with the BOS prepended; its located layers and clean
    # probability are those of the trace with bos=True, and the probability differs from bos=False
    fact = FACTS[1]
    res = fidelity(tiny_llama, [fact], **dict(OPTS, methods=("trace",), bos=True))
    assert res.config["trace"]["bos"] is True
    rows = res.rewrite_frame()
    opts = dict(kinds=("mlp",), samples=1, window=1, seed=0)
    for r, prompt in enumerate(fact.rewrites):
        tr = causal_trace(tiny_llama, prompt, fact.subject, fact.target, bos=True, **opts)
        assert list(res.sets["trace"][0][r]) == tr.top_layers(1, kind="mlp", token="last_subject")
        assert rows.prob[r] == pytest.approx(tr.clean_prob)
    plain = causal_trace(tiny_llama, fact.rewrites[1], fact.subject, fact.target, **opts)
    assert tr.bos and len(tr.tokens) == len(plain.tokens) + 1
    assert rows.prob[1] != pytest.approx(plain.clean_prob)
