"""CNL after the restructuring: configs validated at construction, results that meet the contract
(typed rows, provenance, load in a fresh form), weight edits undone on every exit path, and
``cnl locate`` checkpoints kept in the staged output's checkpoint folder."""

from __future__ import annotations

import json

import pytest
import torch

from tests.cli_helpers import run_cli
from tlcap.data.sample import Sample
from tlcap.errors import InvalidConfigError
from tlcap.metrics.sets import NeuronSet
from tlcap.results import load_result

KW = dict(max_answer_tokens=1, steps=2)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one torch thread per module


def _toy(answer: str = " yes", k: int = 4) -> list[Sample]:
    words = ["red", "table", "blue", "chair", "green", "lamp"]
    return [Sample(f"Is {words[i % 6]} {i} a colour? Answer:", answer, answer, f"{answer}{i}") for i in range(k)]


@pytest.fixture(scope="module")
def toy_task():
    from tlcap.data.tasks import register_task

    register_task("toy_contract", lambda d, split: _toy(), kind="choice", choices=(" yes", " no"), overwrite=True)
    return "toy_contract"


def _weights(m) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.backend.parameters()]


def _same(m, before) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, m.backend.parameters())) and not any(
        p.requires_grad for p in m.backend.parameters())


def _neurons(m, frac: float = 0.05, seed: int = 0) -> NeuronSet:
    g = torch.Generator().manual_seed(seed)
    return NeuronSet.from_mask(torch.rand(m.n_layers, m.d_mlp, generator=g) < frac)


# --------------------------------------------------------------------------- configs
def test_cnl_config_validates_and_routes_ig_fields():
    from tlcap.attribution.config import IGConfig
    from tlcap.experiments.cnl import CNLConfig, CrossConfig, EnhanceConfig, EraseConfig

    cfg = CNLConfig.resolve(None, sigma=6, steps=4, method="joint", layers=[0, 1])
    assert cfg.sigma == 6.0 and isinstance(cfg.sigma, float)
    assert cfg.ig == IGConfig(steps=4, method="joint", layers=(0, 1))
    assert CNLConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    for bad, msg in [
        (dict(sigma=0), "sigma (--sigma) must be > 0, got 0"),
        (dict(sigma=-3.0), "sigma (--sigma) must be > 0, got -3"),
        (dict(spread="mad"), "unknown spread 'mad' (--spread); choose one of: std, var"),
        (dict(max_answer_tokens=0), "max_answer_tokens (--max-answer-tokens) must be >= 1, got 0"),
        (dict(convergence_points=0), "convergence_points (--convergence-points) must be >= 1, got 0"),
        (dict(steps=0), "steps (--steps) must be >= 1, got 0"),
    ]:
        with pytest.raises(InvalidConfigError) as exc:
            CNLConfig.resolve(None, **bad)
        assert str(exc.value) == msg
    with pytest.raises(InvalidConfigError, match=r"eval_epochs\[1\] \(--eval-epochs\) must be between 1 and 2, got 5"):
        EnhanceConfig(epochs=2, eval_epochs=(1, 5))
    assert EnhanceConfig(epochs=3).evaluated_epochs == (1, 3) and EnhanceConfig().evaluated_epochs == (1, 5, 10)
    with pytest.raises(InvalidConfigError, match="lr .--lr. must be > 0, got 0"):
        EnhanceConfig(lr=0)
    with pytest.raises(InvalidConfigError, match="unknown mode 'except' .--modes.; choose one of: located, random, "
                                                 "wo_located, except_frozen"):
        EnhanceConfig(modes=("located", "except"))
    with pytest.raises(InvalidConfigError, match="n_random .--n-random. must be >= 0, got -1"):
        EraseConfig(n_random=-1)
    with pytest.raises(InvalidConfigError, match="unknown train_on 'both'"):
        CrossConfig(train_on="both")


# --------------------------------------------------------------------------- results
def test_results_meet_the_contract_and_round_trip(tiny_gpt2, toy_task, tmp_path):
    from tlcap.experiments.cnl import (
        CNLLocation,
        ConvergenceRow,
        EnhanceRow,
        cnl_locate,
        enhance_effect,
        erase_effect,
        erase_sweep,
    )

    m = tiny_gpt2
    loc = cnl_locate(m, toy_task, _toy(k=6), sigma=2.0, convergence_points=2, method="grad_x_act", **KW)
    assert all(isinstance(r, ConvergenceRow) for r in loc.convergence)
    assert loc.provenance is not None and loc.provenance.config["sigma"] == 2.0
    assert loc.provenance.config["ig"]["method"] == "grad_x_act" and loc.provenance.model_name == m.name
    back = load_result(loc.save(tmp_path / "loc"))
    assert isinstance(back, CNLLocation) and back.convergence == loc.convergence and back.neurons == loc.neurons
    assert torch.equal(back.scores, loc.scores) and back.provenance == loc.provenance
    s = loc.summary()
    assert [r["n_half"] for r in s["convergence"]] == [2, 3]
    assert s["data"]["used"] == 6 and s["skipped"] == {"too_long": 0, "empty_answer": 0, "bad_rows": 0, "unknown_labels": 0}
    assert list(loc.to_frame().columns) == ["n_half", "n_b", "overlap", "iou", "n_a", "n_b_neurons", "overlap_with_final"]
    assert loc.figure().data  # the located set on the canvas

    ns = _neurons(m)
    er = erase_effect(m, toy_task, _toy(), ns, n_random=0)
    assert er.summary()["random_accuracy"] is None and er.summary()["random_delta"] is None
    assert er.provenance.config == {"n_random": 0, "seed": 0, "include_input": False, "batched": True,
                                    "ppl_texts": 0, "ppl_n_random": 20, "ppl_max_tokens": 128}
    enh = enhance_effect(m, toy_task, _toy(), _toy(), ns, epochs=1, lr=1e-3, modes=("located",), progress=False)
    assert enh.rows == (EnhanceRow("located", 1, enh.rows[0].accuracy),)
    again = load_result(enh.save(tmp_path / "enh"))
    assert again.rows == enh.rows and isinstance(again.rows[0], EnhanceRow)
    sw = erase_sweep(m, toy_task, _toy(), loc, (0.5, 1.0), n_random=1)
    assert not any(r.empty for r in sw.rows)
    assert load_result(sw.save(tmp_path / "sw")).rows == sw.rows
    assert list(sw.to_frame()["sigma"]) == [0.5, 1.0]


# --------------------------------------------------------------------------- undo on every exit path
def test_masked_finetune_restores_weights_when_training_or_callback_raises(tiny_llama):
    from tlcap.intervene.finetune import masked_finetune

    m = tiny_llama
    before = _weights(m)
    data = [Sample("hello world", " foo bar", uid="a"), Sample("the cat", " sat down", uid="b")]

    def boom(epoch: int) -> None:
        raise RuntimeError("evaluation failed")

    with pytest.raises(RuntimeError, match="evaluation failed"):
        masked_finetune(m, data, _neurons(m), epochs=2, lr=1e-2, on_epoch=boom, progress=False)
    assert _same(m, before)
    calls = {"n": 0}
    orig = m.logits

    def flaky(*a, **k):  # the third training step fails
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return orig(*a, **k)

    m.logits = flaky
    try:
        with pytest.raises(KeyboardInterrupt):
            masked_finetune(m, data, _neurons(m), mode="except", epochs=3, lr=1e-2, progress=False)
    finally:
        del m.logits
    assert calls["n"] == 3 and _same(m, before)


def test_erase_edit_that_fails_half_way_is_undone(tiny_gpt2, monkeypatch):
    from tlcap.intervene import weights

    m = tiny_gpt2
    before = _weights(m)
    calls = {"n": 0}
    real = weights._set_neurons

    def fail_second(*a, **k):
        calls["n"] += 1
        real(*a, **k)
        if calls["n"] == 2:
            raise RuntimeError("disk full")

    monkeypatch.setattr(weights, "_set_neurons", fail_second)
    with pytest.raises(RuntimeError, match="disk full"):
        weights.erase_neurons(m, NeuronSet(((0, 1), (1, 2)), (m.n_layers, m.d_mlp)), include_input=True)
    assert calls["n"] == 2 and _same(m, before)


@pytest.mark.parametrize("where", ["enhance", "cross_source", "cross_target"])
def test_experiments_restore_weights_when_evaluation_raises(tiny_gpt2, toy_task, monkeypatch, where):
    from tlcap.experiments.cnl import cross, enhance

    m = tiny_gpt2
    before = _weights(m)
    mod = enhance if where == "enhance" else cross
    real = mod.task_accuracy
    calls = {"n": 0}
    fail_at = 2  # the first evaluation after the base accuracy: fine-tuned weights are in place

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError("evaluation failed")
        return real(*a, **k)

    monkeypatch.setattr(mod, "task_accuracy", flaky)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        if where == "enhance":
            enhance.enhance_effect(m, toy_task, _toy(), _toy(), _neurons(m), epochs=1, lr=1e-2, modes=("wo_located",),
                                   progress=False)
        else:
            cross.cross_dataset(m, {toy_task: _neurons(m)}, {toy_task: _toy()}, train_sets={toy_task: _toy()},
                                n_random=0, lr=1e-2, modes=("wo_located",), train_on=where.split("_")[1])
    assert calls["n"] == fail_at and _same(m, before)


# --------------------------------------------------------------------------- CLI: staged checkpoints
def test_cli_locate_checkpoints_in_stage_and_resume(tmp_path, monkeypatch):
    from tlcap.attribution import dataset

    out = tmp_path / "runs" / "loc"
    args = ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--n", "6", "--method", "grad_x_act",
            "--max-answer-tokens", "1", "--checkpoint-every", "1", "--convergence-points", "1", "--out", str(out)]
    real = dataset.integrated_gradients
    seen: list[str] = []

    def stop_after_four(model, prompt, *a, **k):
        if len(seen) == 4:
            raise KeyboardInterrupt
        seen.append(prompt)
        return real(model, prompt, *a, **k)

    monkeypatch.setattr(dataset, "integrated_gradients", stop_after_four)
    run = run_cli(args)
    assert run.code == 130 and not out.exists()  # interrupted: no (half-written) --out
    ck = tmp_path / "runs" / ".loc.checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["A0", "B0"]
    assert (ck / "A0" / "checkpoint.safetensors").exists()
    seen.clear()
    monkeypatch.setattr(dataset, "integrated_gradients", lambda model, prompt, *a, **k: (seen.append(prompt),
                                                                                         real(model, prompt, *a, **k))[1])
    run = run_cli(args)
    assert run.code == 0, run.stderr
    assert len(seen) == 2  # only the two samples not checkpointed are scored again
    assert not ck.exists() and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["loc"]
    s = json.loads((out / "summary.json").read_text())
    assert s["n_samples"] == 6 and s["provenance"]["config"]["ig"]["method"] == "grad_x_act"
    assert s["tables"] == ["convergence.csv"] and (out / "parts" / "A0" / "result.json").exists()
