"""CNL unit tests on the tiny random GPT-2: streaming, resume, shards, torch.distributed, tasks,
accuracy, masked fine-tuning, experiments and the CLI contract."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

from tlcap.attribution.checkpoint import load_checkpoint
from tlcap.attribution.dataset import (
    CheckpointMismatchError,
    from_fixed,
    merge_scores,
    score_dataset,
    score_in_memory,
    to_fixed,
)
from tlcap.data.tasks import Sample, encode_sample, load_task
from tlcap.metrics.sets import NeuronSet
from tlcap.runtime.run_control import RunControl

KW = dict(max_answer_tokens=2, steps=4)


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.heavy]  # one torch thread; after the fast gate


def _samples(k: int = 4) -> list[Sample]:
    words = ["red", "blue", "green", "old", "tall", "soft", "dark"]
    return [Sample(f"Item {i} is", f" very {words[i % len(words)]} now", uid=str(i)) for i in range(k)]


@pytest.fixture(scope="module")
def full(tiny_gpt2):
    return score_dataset(tiny_gpt2, _samples(), **KW)


def test_fixed_point_roundtrip_and_exact_sum():
    x = torch.randn(3, 7) * torch.logspace(-9, 0, 7)
    assert torch.allclose(from_fixed(to_fixed(x)), x.double(), rtol=0, atol=1e-18)
    parts = [torch.randn(3, 7) * 1e-4 for _ in range(6)]
    a = sum(to_fixed(p) for p in parts)
    b = sum(to_fixed(p) for p in reversed(parts))
    assert torch.equal(a, b)


def test_streamed_equals_in_memory(tiny_gpt2, full):
    ref = score_in_memory(tiny_gpt2, _samples(), max_answer_tokens=2, steps=4)
    assert full.n_samples == 4 and full.n_tokens == 8
    assert ref.abs().max() > 0
    torch.testing.assert_close(full.scores, ref, rtol=0, atol=1e-15)


def test_resume_after_interruption_is_identical(tiny_gpt2, full, tmp_path):
    calls: list[int] = []

    def boom(pos, s):
        calls.append(pos)
        if pos == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score_dataset(tiny_gpt2, _samples(), on_sample=boom, **KW, run=RunControl(checkpoint_dir=tmp_path, checkpoint_every=1))
    _, state = load_checkpoint(tmp_path)
    assert state["n_seen"] == 3
    calls.clear()
    again = score_dataset(tiny_gpt2, _samples(),
                          on_sample=lambda p, s: calls.append(p), **KW,
                              run=RunControl(checkpoint_dir=tmp_path, checkpoint_every=1))
    assert calls == [3]  # finished samples are not redone
    assert torch.equal(again.sums, full.sums)
    assert again.n_samples == full.n_samples
    # a finished run resumes to the same result without scoring anything
    calls.clear()
    done = score_dataset(tiny_gpt2, _samples(), on_sample=lambda p, s: calls.append(p), **KW,
                         run=RunControl(checkpoint_dir=tmp_path))
    assert calls == [] and torch.equal(done.sums, full.sums)
    # other samples in the same folder are refused
    with pytest.raises(CheckpointMismatchError):
        score_dataset(tiny_gpt2, _samples(3), **KW, run=RunControl(checkpoint_dir=tmp_path))


def test_shards_merge_exactly(tiny_gpt2, full):
    parts = [score_dataset(tiny_gpt2, _samples(), **KW, run=RunControl(shard=f"{i}/3")) for i in range(3)]
    assert [p.n_samples for p in parts] == [2, 1, 1]
    merged = merge_scores(parts[::-1])
    assert torch.equal(merged.sums, full.sums)
    assert torch.equal(merged.scores, full.scores)
    assert merged.select(2.0) == full.select(2.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dist_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import torch.distributed as dist

    from tlcap.models import make_gpt2

    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = make_gpt2("tiny", seed=0)
    res = score_dataset(model, _samples(), **KW, run=RunControl(distributed=True, progress=False))
    if rank == 0:
        res.save(out + "/dist")
        # the single-process reference, computed in the same process settings (threads change float rounding)
        score_dataset(model, _samples(), **KW, run=RunControl(progress=False)).save(out + "/single")
    dist.barrier()  # both ranks leave the group together (rank 1 no longer exits while rank 0 still computes)
    dist.destroy_process_group()


def test_torch_distributed_gloo_equals_single(tmp_path):
    import torch.multiprocessing as mp

    from tlcap.attribution.dataset import DatasetScores

    mp.spawn(_dist_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    res = DatasetScores.load(tmp_path / "dist")
    single = DatasetScores.load(tmp_path / "single")
    assert res.n_samples == 4 and res.shard == (-1, 2) and res.meta["world_size"] == 2
    assert torch.equal(res.sums, single.sums)
    assert res.n_tokens == single.n_tokens


# --------------------------------------------------------------------------- tasks / accuracy
@pytest.mark.parametrize("name", ["gsm8k", "svamp", "mbpp", "emotion", "imdb"])
def test_task_loaders(name, tiny_gpt2):
    tr = load_task(name, split="train", n=20, seed=3)
    te = load_task(name, split="test", n=20, seed=3)
    assert len(tr) == 20 and len(te) == 20
    assert not {s.uid for s in tr} & {s.uid for s in te}
    assert [s.uid for s in load_task(name, split="train", n=20, seed=3)] == [s.uid for s in tr]
    for s in tr:
        assert s.prompt and s.answer and s.gold
        if len(tiny_gpt2.tokenizer(s.prompt + s.answer)["input_ids"]) >= tiny_gpt2.n_ctx:
            continue  # the tiny model has a 128-token context
        p, t = encode_sample(tiny_gpt2, s, 8)
        assert 1 <= len(t) <= 8
        assert tiny_gpt2.encode(s.prompt + s.answer)[: len(p)] == p
    if name in ("gsm8k", "svamp"):
        assert all(float(s.gold) == float(s.gold) for s in tr)
        assert all(f"The answer is {s.gold}." in s.answer for s in tr)
    if name == "emotion":
        labels = {s.gold.strip() for s in load_task(name, split="train", n=300)}
        assert labels <= {"sadness", "joy", "love", "anger", "fear", "surprise"}


def test_register_task_and_errors(tmp_path):
    from tlcap.data.tasks import register_task
    from tlcap.errors import TlcapError

    register_task("yesno_test", lambda d, split: [Sample("Q: sky blue?\nA:", " yes", " yes", "0")], kind="choice",
                  choices=(" yes", " no"), overwrite=True)
    assert load_task("yesno_test", tmp_path)[0].answer == " yes"
    with pytest.raises(TlcapError):
        load_task("no_such_task", tmp_path)
    with pytest.raises(TlcapError):
        load_task("emotion", tmp_path / "missing")


def test_extract_number():
    from tlcap.metrics.accuracy import extract_number

    assert extract_number(" 4 + 5 = 9. The answer is 9.") == "9"
    assert extract_number("so 1,200 apples #### 1,250") == "1250"
    assert extract_number("we get 3 then 7.5.") == "7.5"
    assert extract_number("no digits") is None


def test_greedy_cache_matches_full_recompute(tiny_llama, tiny_gpt2):
    from tlcap.metrics.accuracy import greedy_generate

    for m in (tiny_llama, tiny_gpt2):
        ids = m.encode("Alice went to the market and bought")
        a = greedy_generate(m, ids, 6)
        b = greedy_generate(m, ids, 6, use_cache=False)
        assert a == b
        # each generated token is the argmax of a full forward over everything before it
        full = m.logits(torch.tensor([ids + a[:-1]]))[0, len(ids) - 1 :].argmax(-1).tolist()
        assert full == a


def test_accuracy_kinds_and_erase_restores(tiny_gpt2):
    from tlcap.intervene import erase_neurons
    from tlcap.metrics.accuracy import choice_logprobs, task_accuracy

    emo = load_task("emotion", split="test", n=6)
    acc = task_accuracy(tiny_gpt2, "emotion", emo)
    manual = [float(["sadness", "joy", "love", "anger", "fear", "surprise"][int(choice_logprobs(
        tiny_gpt2, s.prompt, [" sadness", " joy", " love", " anger", " fear", " surprise"]).argmax())] == s.gold.strip())
        for s in emo]
    assert list(acc.scores) == manual
    code = task_accuracy(tiny_gpt2, "mbpp", load_task("mbpp", split="test", n=2), code_tokens=8)
    # 8 tokens of a random model pass no MBPP test: the harness must score every program 0 (a harness that
    # scored a crash or an empty program as a pass would give 1.0)
    assert list(code.scores) == [0.0, 0.0] and code.accuracy == 0.0
    num = task_accuracy(tiny_gpt2, "svamp", load_task("svamp", split="test", n=2), max_new_tokens=3)
    assert num.accuracy in (0.0, 0.5, 1.0)
    everything = NeuronSet.from_mask(torch.ones(tiny_gpt2.n_layers, tiny_gpt2.d_mlp, dtype=torch.bool))
    lp0 = choice_logprobs(tiny_gpt2, emo[0].prompt, [" joy", " fear"])
    with erase_neurons(tiny_gpt2, everything):
        assert not torch.equal(choice_logprobs(tiny_gpt2, emo[0].prompt, [" joy", " fear"]), lp0)
    assert torch.equal(choice_logprobs(tiny_gpt2, emo[0].prompt, [" joy", " fear"]), lp0)


# --------------------------------------------------------------------------- fine-tuning
def test_masked_finetune_changes_only_chosen_neurons(tiny_llama):
    from tlcap.intervene.finetune import masked_finetune, neuron_params, trained_fraction

    m = tiny_llama
    ns = NeuronSet(((0, 3), (0, 7), (1, 100)), (m.n_layers, m.d_mlp))
    before = {id(ws.param): ws.param.data.clone() for ws, _ in neuron_params(m, ns, "except")}
    data = [Sample("hello world", " foo bar", uid="a"), Sample("the cat", " sat down", uid="b")]
    edit = masked_finetune(m, data, ns, epochs=2, lr=1e-2, progress=False)
    changed_any = False
    for ws, _ in neuron_params(m, ns, "except"):
        diff = (ws.param.data - before[id(ws.param)]).movedim(ws.neuron_dim, 0)
        per_neuron = diff.reshape(m.d_mlp, -1).abs().sum(1)
        layer = next(
            l for l in range(m.n_layers) if any(w.param is ws.param for w in [m.mlp_out_weight(l), *m.mlp_in_weights(l)])
        )
        chosen = torch.zeros(m.d_mlp, dtype=torch.bool)
        chosen[ns.by_layer().get(layer, [])] = True
        assert per_neuron[~chosen].sum() == 0
        changed_any |= bool(per_neuron[chosen].sum() > 0)
    assert changed_any
    assert all(not p.requires_grad for p in m.backend.parameters())
    edit.undo()
    for ws, _ in neuron_params(m, ns, "except"):
        assert torch.equal(ws.param.data, before[id(ws.param)])
    # "except" leaves the chosen neurons untouched
    edit = masked_finetune(m, data, ns, mode="except", epochs=1, lr=1e-2, progress=False)
    w = m.mlp_out_weight(0)
    assert torch.equal(w.neuron_view()[[3, 7]], before[id(w.param)].movedim(w.neuron_dim, 0)[[3, 7]])
    assert not torch.equal(w.param.data, before[id(w.param)])
    edit.undo()
    # Llama MLPs have no biases: each neuron owns the same number of weights (a row of gate/up, a column of down)
    assert trained_fraction(m, ns) == pytest.approx(3 / (m.n_layers * m.d_mlp))
    assert trained_fraction(m, ns, "except") == pytest.approx(1 - 3 / (m.n_layers * m.d_mlp))
    # the masks are one value per neuron, broadcast along the parameter (not a copy of each matrix's size)
    assert all(mask.numel() == m.d_mlp for _, mask in neuron_params(m, ns, "except"))


# --------------------------------------------------------------------------- experiments + CLI
def test_cnl_locate_parts_merge_to_whole(tiny_gpt2, tmp_path):
    from tlcap.experiments.cnl import cnl_locate, finalize, merge_parts, score_parts

    S = _samples(6)
    loc = cnl_locate(tiny_gpt2, "toy", S, sigma=2.0, convergence_points=2, method="joint", **KW)
    whole = score_dataset(tiny_gpt2, S, method="joint", **KW)
    torch.testing.assert_close(loc.scores, whole.scores, rtol=0, atol=1e-15)
    assert loc.neuron_set() == whole.select(2.0)
    assert loc.n_samples == 6 and [r.n_half for r in loc.convergence] == [2, 3]
    assert 0 <= loc.split_iou <= loc.split_overlap <= 1
    runs = [score_parts(tiny_gpt2, S, convergence_points=2, method="joint", **KW, run=RunControl(shard=(i, 2))) for i in range(2)]
    again = finalize(merge_parts(runs), 2.0)
    assert torch.equal(again.scores, loc.scores) and again.neurons == loc.neurons
    loc.save(tmp_path / "loc")
    assert type(loc).load(tmp_path / "loc").neurons == loc.neurons


def test_cli_locate_and_erase_contract(tmp_path):
    from typer.testing import CliRunner

    from tlcap.cli import _load_commands, app

    _load_commands()
    r = CliRunner()
    out = tmp_path / "loc"
    res = r.invoke(app, ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion",
                         "--n", "4", "--sigma", "3", "--method", "grad_x_act", "--max-answer-tokens", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summ = json.loads((out / "summary.json").read_text())
    for key in ("n_neurons", "neuron_ratio", "split_overlap", "split_iou", "neurons"):
        assert key in summ
    assert summ["n_neurons"] == len(summ["neurons"])
    assert (out / "located_neurons.html").exists() and (out / "convergence.html").exists()
    out2 = tmp_path / "erase"
    res = r.invoke(app, ["cnl", "erase", "--model", "gpt2-tiny", "--dataset", "emotion",
                         "--neurons", str(out / "summary.json"), "--n", "4", "--n-random", "2", "--out", str(out2)])
    assert res.exit_code == 0, res.output
    summ2 = json.loads((out2 / "summary.json").read_text())
    for key in ("base_accuracy", "located_accuracy", "random_accuracy"):
        assert key in summ2
    assert len(summ2["random_accuracies"]) == 2


def test_enhance_and_cross_dataset(tiny_gpt2):
    from tlcap.data.tasks import register_task
    from tlcap.experiments.cnl import cross_dataset, enhance_effect, erase_effect

    m = tiny_gpt2
    toy = [Sample(f"Is {w} a colour? Answer:", " yes" if i % 2 == 0 else " no", " yes" if i % 2 == 0 else " no", str(i))
           for i, w in enumerate(["red", "table", "blue", "chair"])]
    register_task("toy_yesno", lambda d, split: toy, kind="choice", choices=(" yes", " no"), overwrite=True)
    emo = load_task("emotion", split="test", n=3)
    g = torch.Generator().manual_seed(0)
    a = NeuronSet.from_mask(torch.rand(m.n_layers, m.d_mlp, generator=g) < 0.05)
    b = NeuronSet.from_mask(torch.rand(m.n_layers, m.d_mlp, generator=g) < 0.05)
    enh = enhance_effect(m, "toy_yesno", toy, toy, a, epochs=2, eval_epochs=(1, 2), lr=1e-2, progress=False)
    assert [(r.mode, r.epoch) for r in enh.rows] == [(mo, e) for mo in ("located", "random", "wo_located") for e in (1, 2)]
    assert enh.table().shape == (3, 2)
    w0 = m.mlp_out_weight(0).param.data.clone()
    cr = cross_dataset(m, {"emotion": a, "toy_yesno": b}, {"emotion": emo, "toy_yesno": toy}, n_random=1)
    assert torch.equal(m.mlp_out_weight(0).param.data, w0)  # every edit undone
    assert cr.overlap.shape == (2, 2) and cr.overlap[0, 0] == 1 and cr.iou[0, 1] == a.iou(b)
    er = erase_effect(m, "toy_yesno", toy, a, n_random=1)
    assert float(cr.erase_delta[0, 1]) == pytest.approx(er.located_delta)
    assert len(cr.to_frame()) == 4
