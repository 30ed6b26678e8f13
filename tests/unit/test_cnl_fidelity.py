"""CNL as the paper defines it (issue 10 items 10–11, issue 11 item 5), on tiny random models:

- "W/o located" enhance erases the located neurons (parameters set to 0) and trains all others;
- cross-dataset enhance fine-tunes A's neurons on A's training data and evaluates on B (App. G);
- ``tlcap cnl erase --sigma 3,6,12`` re-thresholds one saved scoring run without re-scoring.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.cli_helpers import run_cli
from tlcap.data.tasks import Sample
from tlcap.metrics.sets import NeuronSet

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.heavy]  # seconds per module: after the fast gate


def _toy(answer: str, offset: int = 0, k: int = 4) -> list[Sample]:
    words = ["red", "table", "blue", "chair", "green", "lamp", "sky", "door"]
    return [Sample(f"Is {words[(i + offset) % 8]} a colour? Answer:", answer, answer, f"{answer}{i + offset}")
            for i in range(k)]


@pytest.fixture(scope="module")
def toy_tasks():
    from tlcap.data.tasks import register_task

    register_task("toy_yes", lambda d, split: _toy(" yes"), kind="choice", choices=(" yes", " no"), overwrite=True)
    register_task("toy_no", lambda d, split: _toy(" no", 4), kind="choice", choices=(" yes", " no"), overwrite=True)
    return "toy_yes", "toy_no"


def _neurons(m, frac: float, seed: int) -> NeuronSet:
    g = torch.Generator().manual_seed(seed)
    return NeuronSet.from_mask(torch.rand(m.n_layers, m.d_mlp, generator=g) < frac)


def _rows(m, ns: NeuronSet, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out rows, in rows) of the layer's MLP weights along the neuron axis, as [d_mlp, -1]."""
    w_out = m.mlp_out_weight(layer)
    outs = w_out.param.data.movedim(w_out.neuron_dim, 0).reshape(m.d_mlp, -1)
    ins = torch.cat([w.param.data.movedim(w.neuron_dim, 0).reshape(m.d_mlp, -1) for w in m.mlp_in_weights(layer)], 1)
    return outs.clone(), ins.clone()


def test_wo_located_erases_the_located_neurons_and_trains_the_others(tiny_llama, toy_tasks, monkeypatch):
    """Paper Table 2: "mask the located neurons (set their parameter to 0) and fine-tune all other neurons".
    Fails before the fix: the mode did not exist and "except" kept the located neurons at their values."""
    from tlcap.experiments.cnl import enhance
    from tlcap.intervene.finetune import trained_fraction

    m = tiny_llama
    ns = NeuronSet(((0, 3), (0, 7), (1, 100)), (m.n_layers, m.d_mlp))
    before = {l: _rows(m, ns, l) for l in range(m.n_layers)}
    seen: dict[str, list] = {}
    real = enhance.task_accuracy

    def probe(model, task, samples, *a, **k):  # called for the base accuracy, then after epoch 1
        seen.setdefault(current["mode"], []).append({l: _rows(m, ns, l) for l in range(m.n_layers)})
        return real(model, task, samples, *a, **k)

    current = {"mode": ""}
    monkeypatch.setattr(enhance, "task_accuracy", probe)
    for mode in ("wo_located", "except_frozen"):
        current["mode"] = mode
        res = enhance.enhance_effect(m, "toy_yes", _toy(" yes"), _toy(" yes"), ns, epochs=1, lr=1e-2, modes=(mode,),
                                     progress=False)
        assert [(r.mode, r.epoch) for r in res.rows] == [(mode, 1)]
    by_layer = ns.by_layer()
    for l in range(m.n_layers):
        chosen = torch.zeros(m.d_mlp, dtype=torch.bool)
        chosen[by_layer.get(l, [])] = True
        out0, in0 = before[l]
        assert len(seen["wo_located"]) == 2
        out_w, in_w = seen["wo_located"][1][l]
        assert torch.all(out_w[chosen] == 0) and torch.all(in_w[chosen] == 0)  # erased, and stayed 0 while training
        assert (out_w[~chosen] != out0[~chosen]).any() and (in_w[~chosen] != in0[~chosen]).any()  # the others learn
        out_f, in_f = seen["except_frozen"][1][l]
        assert torch.equal(out_f[chosen], out0[chosen]) and torch.equal(in_f[chosen], in0[chosen])
        assert torch.equal(_rows(m, ns, l)[0], out0) and torch.equal(_rows(m, ns, l)[1], in0)  # restored afterwards
    assert res.trained_fraction["except_frozen"] == pytest.approx(1 - trained_fraction(m, ns))


def test_cross_enhance_trains_on_the_source_dataset(tiny_gpt2, toy_tasks):
    """App. G: A's neurons fine-tuned on A's training data, evaluated on B (not involved in training);
    fails before the fix (A's neurons were trained on B's data)."""
    from tlcap.experiments.cnl import cross_dataset
    from tlcap.experiments.cnl.enhance import tuned
    from tlcap.metrics.accuracy import task_accuracy

    m = tiny_gpt2
    yes, no = toy_tasks
    located = {yes: _neurons(m, 0.5, 1), no: _neurons(m, 0.5, 2)}
    evals = {yes: _toy(" yes", 8), no: _toy(" no", 12)}
    trains = {yes: _toy(" yes"), no: _toy(" no", 4)}
    kw = dict(epochs=3, lr=5e-2, n_random=0, modes=("located", "wo_located"))
    res = cross_dataset(m, located, evals, train_sets=trains, **kw)
    assert res.train_on == "source" and res.enhance_modes == ("located", "wo_located")
    assert res.enhance_delta.shape == (2, 2, 2)
    base = {b: task_accuracy(m, b, evals[b]).accuracy for b in (yes, no)}

    def after(train, neurons, mode, task):
        with tuned(m, train, neurons, mode, epochs=3, lr=5e-2, seed=0, progress=False):
            return task_accuracy(m, task, evals[task]).accuracy - base[task]

    for mi, mode in enumerate(("located", "wo_located")):
        for i, a in enumerate((yes, no)):
            for j, b in enumerate((yes, no)):
                assert float(res.enhance_delta[mi, i, j]) == pytest.approx(after(trains[a], located[a], mode, b))
    # the two readings differ here: trained on "yes" data the model answers yes, on "no" data no
    source = after(trains[yes], located[yes], "located", no)
    target = after(trains[no], located[yes], "located", no)
    assert source < target
    off = [float(res.enhance("located")[0, 1]), float(res.enhance("located")[1, 0])]
    assert res.transfer()["located"] == pytest.approx(sum(off) / 2)
    tgt = cross_dataset(m, located, evals, train_sets=trains, train_on="target", **kw)
    assert float(tgt.enhance("located")[0, 1]) == pytest.approx(target)
    assert tgt.transfer() == {} and tgt.summary()["enhance_transfer"] is None


def test_cli_erase_sigma_sweep_rethresholds_without_rescoring(tmp_path, monkeypatch):
    """Table 3 from one scoring run: no IG runs on the re-threshold path; each σ erases the set the
    saved scores give at that σ. Fails before (no --sigma on `cnl erase`)."""
    from tlcap.attribution import dataset, ig
    from tlcap.experiments.cnl import CNLLocation, erase_effect
    from tlcap.locate.selection import sigma_mask
    from tlcap.models import load_model

    loc_out, er_out = tmp_path / "loc", tmp_path / "sweep"
    run = run_cli(["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--n", "6", "--method", "grad_x_act",
                   "--max-answer-tokens", "1", "--convergence-points", "1", "--out", str(loc_out)])
    assert run.code == 0, run.stderr

    def no_ig(*a, **k):
        raise AssertionError("IG ran on the re-threshold path")

    monkeypatch.setattr(dataset, "integrated_gradients", no_ig)
    monkeypatch.setattr(ig, "integrated_gradients", no_ig)
    run = run_cli(["cnl", "erase", "--model", "gpt2-tiny", "--dataset", "emotion", "--neurons", str(loc_out),
                   "--sigma", "0.5,1,1000", "--n", "4", "--n-random", "1", "--out", str(er_out)])
    assert run.code == 0, run.stderr
    assert "warning: σ=1000: the located set is empty (0 neurons); nothing erased at this σ" in run.stderr
    s = json.loads((er_out / "summary.json").read_text())
    loc = CNLLocation.load(loc_out / "result")
    assert s["sigmas"] == [0.5, 1.0, 1000.0] and s["empty_sigmas"] == [1000.0]
    m = load_model("gpt2-tiny")
    from tlcap.data.tasks import load_task

    test = load_task("emotion", split="test", n=4, seed=0)
    for row, sigma in zip(s["rows"], (0.5, 1.0)):
        ns = sigma_mask(loc.scores, sigma, "std")
        assert row["n_neurons"] == len(ns) > 0
        er = erase_effect(m, "emotion", test, ns, n_random=1)
        assert row["located_accuracy"] == er.located_accuracy and row["random_accuracy"] == er.random_accuracy
    assert s["rows"][2]["empty"] and s["rows"][2]["located_accuracy"] is None
    assert (er_out / "erase_sweep.csv").exists() and s["provenance"]["config"]["sigmas"] == [0.5, 1.0, 1000.0]
