"""Per-item and per-set data the statistics need (issue 24): enhance keeps every (mode, epoch)'s per-item
correctness, the cross-dataset matrix every cell's per-item scores, reliability's batched KN sets equal its
one-run-per-set path, and the reproduce erase stage saves what the report reads."""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution import IGConfig
from tlcap.data.tasks import Sample, load_task, register_task
from tlcap.errors import InvalidConfigError
from tlcap.experiments.cnl import cross_dataset, enhance_effect
from tlcap.experiments.cnl_eval import reliability
from tlcap.intervene.weights import erase_neurons
from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.sets import NeuronSet

TOY = [Sample(f"Is {w} a colour? Answer:", " yes" if i % 2 == 0 else " no", " yes" if i % 2 == 0 else " no", str(i))
       for i, w in enumerate(["red", "table", "blue", "chair", "green", "lamp"])]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one torch thread per module


def _set(m, share: float = 0.05, seed: int = 0) -> NeuronSet:
    g = torch.Generator().manual_seed(seed)
    return NeuronSet.from_mask(torch.rand(m.n_layers, m.d_mlp, generator=g) < share)


def test_enhance_keeps_per_item_scores_of_every_mode_and_epoch(tiny_gpt2):
    m = tiny_gpt2
    register_task("toy_yesno2", lambda d, split: TOY, kind="choice", choices=(" yes", " no"), overwrite=True)
    res = enhance_effect(m, "toy_yesno2", TOY, TOY, _set(m), epochs=2, eval_epochs=(1, 2), lr=1e-2, progress=False)
    assert res.item_scores.shape == (6, 6) and res.items == tuple(range(6))
    assert res.base_scores.tolist() == list(task_accuracy(m, "toy_yesno2", TOY).scores)
    for k, r in enumerate(res.rows):
        assert float(res.item_scores[k].mean()) == pytest.approx(r.accuracy)
        assert torch.equal(res.scores(r.mode, r.epoch), res.item_scores[k])
    assert set(res.item_scores.unique().tolist()) <= {0.0, 1.0}


def test_cross_keeps_per_item_scores_of_every_cell(tiny_gpt2):
    m = tiny_gpt2
    register_task("toy_yesno2", lambda d, split: TOY, kind="choice", choices=(" yes", " no"), overwrite=True)
    emo = load_task("emotion", split="test", n=3)
    a, b = _set(m, 0.3, 0), _set(m, 0.3, 1)
    cr = cross_dataset(m, {"emotion": a, "toy_yesno2": b}, {"emotion": emo, "toy_yesno2": TOY}, n_random=2)
    assert cr.erase_scores.shape == (2, 2, 3, 6) and cr.n_items == (3, 6) and cr.base_scores.shape == (2, 6)
    assert torch.isnan(cr.erase_scores[:, 0, :, 3:]).all() and not torch.isnan(cr.erase_scores[:, 1]).any()
    with erase_neurons(m, a):  # cell (emotion's neurons, toy) row 0: the located set erased
        assert cr.erase_scores[0, 1, 0].tolist() == list(task_accuracy(m, "toy_yesno2", TOY).scores)
    with erase_neurons(m, b.random_like(seed=1)):  # cell (toy's neurons, emotion), random draw 1
        assert cr.erase_scores[1, 0, 2, :3].tolist() == list(task_accuracy(m, "emotion", emo).scores)
    base = cr.base_scores[1, :6].mean()
    assert float(cr.erase_scores[0, 1, 0].mean() - base) == pytest.approx(float(cr.erase_delta[0, 1]))


def test_reliability_batched_kn_sets_equal_one_run_per_set(tiny_gpt2):
    from tlcap.data.rewrites import RewriteFact

    facts = [RewriteFact("France", " Paris", ("The capital of France is", "France's capital is"), uid="f0")]
    kw = dict(parts=("kn",), n_random=6, ig=IGConfig(steps=2))
    fast = reliability(tiny_gpt2, facts, **kw)
    slow = reliability(tiny_gpt2, facts, batched=False, **kw)
    a, b = fast.kn_records(), slow.kn_records()
    assert [(r.set, r.draw, r.n_neurons) for r in a] == [(r.set, r.draw, r.n_neurons) for r in b]
    assert len(a) == 7 and a[0].set == "located"
    for x, y in zip(a, b):
        assert x.base_prob == pytest.approx(y.base_prob, rel=1e-5)
        assert x.enhanced_prob == pytest.approx(y.enhanced_prob, rel=1e-4)
        assert x.suppressed_prob == pytest.approx(y.suppressed_prob, rel=1e-4)
    assert len({round(r.enhanced_prob / r.base_prob, 6) for r in a}) > 1  # the sets differ in effect


def test_erase_stage_saves_per_set_scores_and_the_perplexity_control(tiny_llama, tmp_path):
    from tlcap.reproduce.run import build_stages
    from tlcap.reproduce.scales import ScaleConfig
    from tlcap.reproduce.stages import Runner

    scale = ScaleConfig(cnl_datasets=("emotion",), cnl_eval_datasets=("emotion",), cnl_eval_n=3, n_random=5,
                        cnl_ppl_texts=2, cnl_ppl_n_random=2)
    runner = Runner(build_stages(("cnl",), scale), tmp_path, tiny_llama)
    runner.run(runner.plan(["cnl.erase.emotion"]))
    out = runner.outputs("cnl.erase.emotion")
    samples = load_task("emotion", split="test", n=3, seed=0)
    loc = runner.outputs("cnl.locate.emotion")["location"]
    done = [s for s in (3.0, 6.0, 12.0) if f"sigma{s:g}" in out]  # an empty σ-set is not erased (the report says so)
    assert done
    for s in done:
        er = out[f"sigma{s:g}"]
        assert er.random_scores.shape == (5, 3) and er.ppl_nll.shape == (4, 2) and er.random_seeds == (0, 1, 2, 3, 4)
        assert torch.equal(er.base_scores, torch.tensor(out["base"].scores, dtype=torch.float64))
        assert out[f"sigma{s:g}_located"].scores == tuple(er.located_scores.tolist())
        with erase_neurons(tiny_llama, loc.reselect(s)):
            assert er.located_scores.tolist() == list(task_accuracy(tiny_llama, "emotion", samples).scores)


def test_enhance_fine_tunes_every_random_draw_on_the_same_samples(tiny_gpt2):
    from tlcap.experiments.cnl import tuned

    m = tiny_gpt2
    register_task("toy_yesno2", lambda d, split: TOY, kind="choice", choices=(" yes", " no"), overwrite=True)
    ns = _set(m, 0.3)
    res = enhance_effect(m, "toy_yesno2", TOY, TOY, ns, epochs=2, eval_epochs=(1, 2), lr=5e-2, n_random=3,
                         modes=("located", "random"), progress=False)
    assert res.n_random == 3 and res.random_scores.shape == (3, 2, 6) and len(res.rows) == 4  # rows: draw 0 only
    for e in (1, 2):  # draw 0 is the paper's one random set: the 'random' rows
        assert torch.equal(res.random_draws(e)[0], res.scores("random", e))
    # draw 2 is a random set drawn with seed + 2, trained on the same samples in the same order (seed 0's)
    with tuned(m, TOY, ns, "random", epochs=2, lr=5e-2, seed=0, draw=2, progress=False):
        assert res.random_draws(2)[2].tolist() == list(task_accuracy(m, "toy_yesno2", TOY).scores)
    assert ns.random_like(seed=2) != ns.random_like(seed=0)
    assert res.summary()["random_draw_accuracy"]["2"] == pytest.approx(res.random_scores[:, 1].mean(1).tolist(), abs=0)
    # the figure: every draw beyond 0 and their mean, from epoch 0 (the base accuracy)
    fig = res.figure()
    assert [t.name for t in fig.data] == ["located", "random", "random set 1", "random set 2", "random, mean of 3 sets"]
    assert list(fig.data[3].y) == pytest.approx([res.base_accuracy, *[float(res.random_draws(e)[2].mean()) for e in (1, 2)]])
    assert list(fig.data[4].y)[1:] == pytest.approx([float(res.random_draws(e).mean()) for e in (1, 2)])
    assert res.random_epochs == (1, 2)
    one = enhance_effect(m, "toy_yesno2", TOY, TOY, ns, epochs=1, lr=5e-2, modes=("located",), progress=False)
    assert one.n_random == 0 and not one.random_scores.numel()
    with pytest.raises(InvalidConfigError):
        one.random_draws(1)
