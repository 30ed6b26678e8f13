"""Many neuron sets per forward pass (issue 24): the batched evaluators equal the one-set weight-edit path.

Every batched quantity is compared with its slow reference on tiny random GPT-2 and Llama (GQA)
models: logits read per row against full forward passes inside ``erase_neurons``, task scores
against ``task_accuracy``, greedy generations against ``Model.generate``, perplexity NLLs against
``text_nll``, reliability probabilities against ``target_prob`` with ``scale_neurons``; and the
erase experiment's per-item tensors, its perplexity control and its resume.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

import tlcap.experiments.cnl.erase_sets as erase_sets_mod
import tlcap.metrics.set_scores as set_scores_mod
from tlcap.data.tasks import Sample, encode_sample, load_task, register_task
from tlcap.errors import ShapeMismatchError
from tlcap.experiments.cnl import EraseResult, erase_effect
from tlcap.intervene.activations import scale_neurons
from tlcap.intervene.set_rows import SetFactors, set_major_rows
from tlcap.intervene.weights import WeightEdit, erase_neurons
from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.perplexity import text_nll
from tlcap.metrics.probs import target_prob
from tlcap.metrics.set_probs import erased_text_nll, scaled_target_probs
from tlcap.metrics.set_scores import _generate_rows, erased_scores, teacher_forced
from tlcap.metrics.sets import NeuronSet
from tlcap.results import load_result
from tlcap.runtime.hooks import scale_rows
from tlcap.runtime.run_control import RunControl

WORDS = ["red", "table", "blue", "chair", "green", "lamp", "old", "river"]
PREFIX = "Decide whether the word names a colour.\nWord:"


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.heavy]  # seconds per module: after the fast gate


@pytest.fixture(params=["gpt2", "llama"])
def model(request, tiny_gpt2, tiny_llama):
    return tiny_gpt2 if request.param == "gpt2" else tiny_llama


def _sets(m, k: int = 4, share: float = 0.3, seed: int = 1) -> list[NeuronSet]:
    g = torch.Generator().manual_seed(seed)
    shape = (m.n_layers, m.d_mlp)
    return [NeuronSet((), shape)] + [NeuronSet.from_mask(torch.rand(*shape, generator=g) < share) for _ in range(k)]


def test_scale_rows_hand_computed():
    act = torch.arange(24.0).reshape(2, 3, 4)
    f = torch.tensor([[1.0, 0.0, 2.0, 1.0], [0.0, 1.0, 1.0, 3.0]])
    out = scale_rows(f)(act)
    assert out[0, 2].tolist() == [8.0, 0.0, 20.0, 11.0] and out[1, 0].tolist() == [0.0, 13.0, 14.0, 45.0]
    last = scale_rows(f, pos="last")(act)
    assert torch.equal(last[:, :2], act[:, :2]) and last[1, 2].tolist() == [0.0, 21.0, 22.0, 69.0]
    with pytest.raises(ShapeMismatchError):
        scale_rows(f)(torch.zeros(3, 2, 4))
    assert set_major_rows(3, 2).tolist() == [0, 0, 1, 1, 2, 2]


def test_teacher_forced_reads_equal_full_logits(model, monkeypatch):
    """The core: log-probs read at chosen positions of prefix-sharing, right-padded rows of many sets, in
    several set groups and item chunks, equal full forward passes with each set's weights erased."""
    monkeypatch.setattr(set_scores_mod, "ROW_TOKENS", 48)  # several set groups and item chunks
    seqs = [model.encode(f"{PREFIX} {w}" + " and more" * (i % 3)) for i, w in enumerate(WORDS[:5])]
    reads = [[len(s) - 3 - i % 2, len(s) - 1] for i, s in enumerate(seqs)]
    tgt = torch.tensor([[7, 11], [13, 17], [19, 23], [29, 31], [37, 41]])
    sets = _sets(model)

    def read(logits, idx):
        lp = logits.float().log_softmax(-1)
        return lp[torch.arange(len(idx))[:, None], torch.arange(lp.shape[1])[None, :], tgt[idx][:, : lp.shape[1]]].sum(1)

    got, tokens = teacher_forced(model, SetFactors.of(model, sets), seqs, reads, read)
    ref = torch.zeros(len(sets), len(seqs), dtype=torch.float64)
    for k, s in enumerate(sets):
        with erase_neurons(model, s):
            for i, q in enumerate(seqs):
                lp = model.logits(torch.tensor([q]))[0].float().log_softmax(-1)
                ref[k, i] = sum(float(lp[p, tgt[i, j]]) for j, p in enumerate(reads[i]))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    assert (ref[1:] - ref[0]).abs().max() > 1e-3  # the sets change what is read
    pre = set_scores_mod.common_prefix(seqs, min(r[0] for r in reads))
    assert pre >= set_scores_mod.MIN_PREFIX  # the shared prefix was cached per set
    assert tokens == len(sets) * (pre + sum(len(q) - pre for q in seqs))


def test_choice_scores_equal_task_accuracy_with_weights_erased(tiny_llama):
    m = tiny_llama
    prompts = [f"{PREFIX} {w}\nAnswer:" for w in WORDS]
    plain = [Sample(p, " yes", " yes", str(i)) for i, p in enumerate(prompts)]
    register_task("_pick3", lambda d, split: plain, kind="choice", choices=(" yes", " no", " maybe"), overwrite=True)
    picks = task_accuracy(m, "_pick3", plain).predictions
    planted = [Sample(p, " " + k, " " + k, str(i)) for i, (p, k) in enumerate(zip(prompts, picks))]  # gold = own pick
    sets = _sets(m, 4, 0.5)
    sc = erased_scores(m, "_pick3", planted, sets)
    refs = []
    for s in sets:
        with erase_neurons(m, s):
            refs.append(task_accuracy(m, "_pick3", planted))
    assert torch.equal(sc.scores, torch.tensor([r.scores for r in refs], dtype=torch.float64))
    assert sc.predictions == tuple(r.predictions for r in refs)
    assert sc.scores[0].tolist() == [1.0] * len(WORDS) and sc.scores[1:].min() == 0  # planted base, sets that flip
    # multi-token labels: teacher-forced rows per label, the same picks
    register_task("_pick_long", lambda d, split: planted, kind="choice", choices=(" yes indeed", " no", " not at all"),
                  overwrite=True)
    assert any(len(encode_sample(m, Sample(prompts[0], c))[1]) > 1 for c in (" yes indeed", " not at all"))
    sc2 = erased_scores(m, "_pick_long", planted, sets)
    refs2 = []
    for s in sets:
        with erase_neurons(m, s):
            refs2.append(task_accuracy(m, "_pick_long", planted).predictions)
    assert sc2.predictions == tuple(refs2)


def test_emotion_and_code_scores_equal_task_accuracy(model):
    sets = _sets(model, 3)
    for task, n, kw in (("emotion", 6, {}), ("mbpp", 3, {"code_tokens": 8})):
        samples = load_task(task, split="test", n=n)
        sc = erased_scores(model, task, samples, sets, **kw)
        ref = []
        for s in sets:
            with erase_neurons(model, s):
                ref.append(task_accuracy(model, task, samples, **kw).scores)
        assert torch.equal(sc.scores, torch.tensor(ref, dtype=torch.float64)), task
        assert sc.items == tuple(range(n)) and sc.n_skipped == 0


@contextmanager
def _mlp_dominated(m, gain: float = 100.0):
    """The model with every MLP's write amplified (restored on exit): a tiny random model whose greedy
    generations depend on which neurons are erased (unamplified, each repeats one token whatever is erased)."""
    with WeightEdit() as e:
        for l in range(m.n_layers):
            e.touch(m.mlp_out_weight(l).param).mul_(gain)
        yield m


def test_generation_rows_equal_generate_with_weights_erased(model):
    sets = _sets(model, 3, 0.5)
    ids = model.encode("Question: 12 + 30 =")
    plan, rows = SetFactors.of(model, sets), torch.arange(len(sets))
    with _mlp_dominated(model):
        outs, tokens = _generate_rows(model, plan, rows, ids, 6, set(), ())
        assert tokens == len(sets) * (len(ids) - 1 + 6)
        for s, got in zip(sets, outs):
            with erase_neurons(model, s):
                assert got == model.generate(ids, 6)
        assert len({tuple(o) for o in outs}) == len(sets)
        stop = {outs[1][2]}  # each row stops at its own stop token, included
        cut, _ = _generate_rows(model, plan, rows, ids, 6, stop, ())
        assert len(cut[1]) == 3
        for s, got in zip(sets, cut):
            with erase_neurons(model, s):
                assert got == model.generate(ids, 6, stop_ids=list(stop))
    svamp = load_task("svamp", split="test", n=2)
    sc = erased_scores(model, "svamp", svamp, sets[:2], max_new_tokens=3)
    for k, s in enumerate(sets[:2]):
        with erase_neurons(model, s):
            acc = task_accuracy(model, "svamp", svamp, max_new_tokens=3)
        assert sc.scores[k].tolist() == list(acc.scores) and sc.predictions[k] == acc.predictions


def test_rows_of_several_items_decode_like_each_item_alone_with_weights_erased(model, monkeypatch):
    """On an accelerator a number task's (set, item) rows of several prompts share each decoding step (issue 25: one
    item's sets per step was launch-bound on a GPU) and rows that have stopped leave the batch: every row equals
    ``generate`` of its prompt with its set's weights erased, token for token, whatever batch it landed in."""
    from tlcap.metrics.set_scores import decode_batches

    sets = _sets(model, 3, 0.5)
    prompts = [model.encode(p) for p in ("Question: 12 + 30 =", "Hi", "The old river runs past the lamp and the")]
    assert len({len(p) for p in prompts}) == 3
    plan = SetFactors.of(model, sets)
    with _mlp_dominated(model):
        alone = {}
        for k, s in enumerate(sets):
            with erase_neurons(model, s):
                for j, p in enumerate(prompts):
                    alone[k, j] = model.generate(p, 8)
        stop = {alone[k, 1][2] for k in range(len(sets))}  # rows stop at different steps: the batches compact
        want = {}
        for k, s in enumerate(sets):
            with erase_neurons(model, s):
                for j, p in enumerate(prompts):
                    want[k, j] = model.generate(p, 8, stop_ids=sorted(stop))
        assert len({len(w) for w in want.values()}) > 1
        lens = [len(p) for p in prompts]
        batches = decode_batches(lens, len(sets), 8, budget=6 * (max(lens) + 8))  # 6 rows per batch: items mixed
        assert len(batches) == 2 and {j for _, j in batches[0]} != {j for _, j in batches[1]}
        saved = 0
        for batch in batches:
            row_set = torch.tensor([k for k, _ in batch])
            full = model.decode_rows([prompts[j] for _, j in batch], 8, sorted(stop),
                                     row_hooks=lambda held, rs=row_set: plan.hooks(model, rs[held]))
            d = model.decode_rows([prompts[j] for _, j in batch], 8, sorted(stop), compact=True,
                                  row_hooks=lambda held, rs=row_set: plan.hooks(model, rs[held]))
            assert d.tokens == full.tokens == [want[kj] for kj in batch]
            assert d.passes == full.passes
            saved += full.tokens_run - d.tokens_run
        assert saved > 0  # finished rows left their batch
        # the whole task, accelerator path (patched onto the CPU) against one item at a time: the generated texts
        monkeypatch.setattr(set_scores_mod, "extract_number", lambda text: text)
        monkeypatch.setattr(set_scores_mod, "same_number", lambda a, b: a == b)
        gsm = load_task("gsm8k", split="test", n=4, seed=2)
        cpu = erased_scores(model, "gsm8k", gsm, sets, max_new_tokens=6)
        monkeypatch.setattr(set_scores_mod, "one_pass_default", lambda m: True)
        monkeypatch.setattr(set_scores_mod, "GEN_TOKENS", 5 * (max(len(model.encode(s.prompt)) for s in gsm) + 6))
        acc = erased_scores(model, "gsm8k", gsm, sets, max_new_tokens=6)
        assert acc.predictions == cpu.predictions and len({p for row in cpu.predictions for p in row}) > 4


def test_text_nll_and_target_probs_equal_slow_paths(model):
    texts = ["The river runs through the old town and past the stone bridge.", "A short one.",
             "Colours of the evening sky are red, blue and green over the lamp-lit street."]
    sets = _sets(model, 3, 0.2)
    nll, cnt = erased_text_nll(model, texts, sets, max_tokens=16)
    for k, s in enumerate(sets):
        with erase_neurons(model, s):
            ref, rc = text_nll(model, texts, 16)
        torch.testing.assert_close(nll[k], ref, rtol=1e-5, atol=1e-4)
        assert torch.equal(cnt, rc)
    assert (nll[1:] - nll[0]).abs().max() > 1e-3
    for target in (" Paris", " New York City"):
        base, p = scaled_target_probs(model, "The capital of France is", target, sets[1:], (2.0, 0.0))
        assert base == pytest.approx(target_prob(model, "The capital of France is", target), rel=1e-5)
        ref = torch.tensor([[target_prob(model, "The capital of France is", target, hooks=scale_neurons(model, s, f))
                             for s in sets[1:]] for f in (2.0, 0.0)], dtype=torch.float64)
        torch.testing.assert_close(p, ref, rtol=1e-4, atol=0)
        assert ((p - base).abs() / base).max() > 1e-3


def test_erase_effect_keeps_every_set_and_equals_the_weight_path(tiny_llama, tmp_path):
    m = tiny_llama
    loc = _sets(m, 1, 0.3)[1]
    emo = load_task("emotion", split="test", n=6)
    kw = dict(n_random=4, seed=3, ppl_texts=2, ppl_n_random=2, ppl_max_tokens=16)
    fast = erase_effect(m, "emotion", emo, loc, **kw)
    slow = erase_effect(m, "emotion", emo, loc, batched=False, **kw)
    assert fast.random_scores.shape == (4, 6) and fast.random_seeds == (3, 4, 5, 6)
    for k in range(4):  # random set k is random_like(seed=seed + k), as before per-item scores were kept
        with erase_neurons(m, loc.random_like(seed=3 + k)):
            assert fast.random_scores[k].tolist() == list(task_accuracy(m, "emotion", emo).scores)
    assert torch.equal(fast.random_scores, slow.random_scores) and torch.equal(fast.located_scores, slow.located_scores)
    assert torch.equal(fast.base_scores, slow.base_scores) and fast.random_accuracies == slow.random_accuracies
    assert fast.located_accuracy == float(fast.located_scores.mean())
    assert fast.ppl_nll.shape == (4, 2) and fast.ppl_texts["n_texts"] == 2 and fast.ppl_texts["n_random"] == 2
    torch.testing.assert_close(fast.ppl_nll, slow.ppl_nll, rtol=1e-5, atol=1e-4)
    with erase_neurons(m, loc.random_like(seed=4)):  # row 3 of the control: the second random set
        torch.testing.assert_close(fast.ppl_nll[3], text_nll(m, erase_sets_mod.load_wikitext(n_texts=2), 16)[0],
                                   rtol=1e-5, atol=1e-4)
    s = fast.summary()
    assert s["ppl_located"] == pytest.approx(float(fast.perplexities[1])) and len(s["ppl_random"]) == 2
    fast.save(tmp_path / "er")
    back = load_result(tmp_path / "er")
    assert isinstance(back, EraseResult) and torch.equal(back.random_scores, fast.random_scores)
    assert back.ppl_texts == fast.ppl_texts and back.items == tuple(range(6))


def test_erase_resumes_after_the_last_saved_chunk(tiny_gpt2, tmp_path, monkeypatch):
    m = tiny_gpt2
    loc = _sets(m, 1, 0.3)[1]
    emo = load_task("emotion", split="test", n=4)
    whole = erase_effect(m, "emotion", emo, loc, n_random=5)
    real = erase_sets_mod.erased_scores
    calls: list[int] = []

    def flaky(model, task, samples, sets, **kw):
        calls.append(len(sets))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(model, task, samples, sets, **kw)

    monkeypatch.setattr(erase_sets_mod, "erased_scores", flaky)
    with pytest.raises(KeyboardInterrupt):
        erase_effect(m, "emotion", emo, loc, n_random=5, run=RunControl(checkpoint_dir=tmp_path, checkpoint_every=2))
    calls.clear()
    again = erase_effect(m, "emotion", emo, loc, n_random=5, run=RunControl(checkpoint_dir=tmp_path, checkpoint_every=2))
    assert calls == [2, 1]  # sets: base, located, 5 random = 7 → chunks 2, 2, 2, 1; two were saved before the interrupt
    assert torch.equal(again.random_scores, whole.random_scores) and torch.equal(again.base_scores, whole.base_scores)


def test_erase_cost_counts_the_tokens_the_engine_runs(tiny_llama):
    from tlcap.reproduce.cnl_stages import erase_sets_work
    from tlcap.reproduce.cost import ModelShape

    m = tiny_llama
    sets = _sets(m, 2)
    shape = ModelShape.of(m)
    for task, n in (("emotion", 5), ("mbpp", 2)):
        samples = load_task(task, split="test", n=n)
        sc = erased_scores(m, task, samples, sets)
        w = erase_sets_work(m, task, samples, len(sets))
        assert w.units["set_token"] == sc.tokens, task  # each set's shared prefix once, every item's own tokens
        reads = len(sets) * (n if task == "emotion" else sum(len(encode_sample(m, s, 64)[1]) for s in samples))
        ctx = w.flops["set_token"] - reads * shape.unembed_flops() - sc.tokens * shape.set_token_flops(0)
        assert ctx > 0  # attention over the context, on top of the blocks and one unembedding per scored position


def test_erase_cost_counts_the_generation_calls_of_a_number_task(tiny_llama, monkeypatch):
    """GSM8K's erased generation runs one forward call per decoding step of each group of sets (and a prefix pass):
    the cost model prices those calls (it had priced the tokens only, as if in 4096-token passes)."""
    from tlcap.data.tasks import get_task
    from tlcap.metrics import set_scores
    from tlcap.reproduce.cnl_stages import erase_sets_work, number_set_passes

    m = tiny_llama
    samples = load_task("gsm8k", split="test", n=2)
    sets = _sets(m, 3)
    calls = []
    real_forward, real_prefix = type(m).forward, type(m).prefix_cache

    def counted(real):
        def call(self, *a, **k):
            calls.append(real.__name__)
            return real(self, *a, **k)
        return call

    monkeypatch.setattr(set_scores, "ends_generation", lambda *a, **k: False)  # no row stops: every step runs
    monkeypatch.setattr(type(m), "forward", counted(real_forward))
    monkeypatch.setattr(type(m), "prefix_cache", counted(real_prefix))
    erased_scores(m, "gsm8k", samples, sets)
    monkeypatch.setattr(type(m), "forward", real_forward)
    monkeypatch.setattr(type(m), "prefix_cache", real_prefix)
    assert calls.count("prefix_cache") == 2  # one prefix pass per item (the 4 sets are one group)
    t = get_task("gsm8k")
    lens = [len(p) for _, _, p in set_scores.scored_items(m, t, samples)]
    assert len(calls) == number_set_passes(lens, len(sets), t.max_new_tokens) == 2 * (1 + t.max_new_tokens)
    w = erase_sets_work(m, "gsm8k", samples, len(sets))
    assert w.passes["fwd_token"] == len(calls)
    assert number_set_passes(lens, 30, 4) == 2 * 2 * 5  # two chunks of sets (25 + 5), one group each
    # on an accelerator (patched onto the CPU) the items' rows share batches of GEN_TOKENS keys/values: counted
    # backend calls (prefix passes and steps) against the cost model's accelerator count
    import tlcap.models.generate as generate_mod
    import tlcap.reproduce.cnl_stages as stages

    budget = 3 * (max(lens) + t.max_new_tokens)  # 3 rows per batch: 8 rows, 3 batches
    monkeypatch.setattr(generate_mod, "ends_generation", lambda *a, **k: False)
    monkeypatch.setattr(set_scores, "one_pass_default", lambda model: True)
    monkeypatch.setattr(set_scores, "GEN_TOKENS", budget)
    monkeypatch.setattr(stages, "GEN_TOKENS", budget)
    n_calls = []
    handle = m.backend.register_forward_pre_hook(lambda *a: n_calls.append(1))
    try:
        erased_scores(m, "gsm8k", samples, sets)
    finally:
        handle.remove()
    assert len(n_calls) == number_set_passes(lens, len(sets), t.max_new_tokens, budget=budget) == 3 * (1 + t.max_new_tokens)
    w = erase_sets_work(m, "gsm8k", samples, len(sets))
    assert w.passes["fwd_token"] + w.accelerator_passes["fwd_token"] == len(n_calls)
    assert w.gen_bytes == 3 * (max(lens) + t.max_new_tokens) * stages.ModelShape.of(m).kv_token_bytes()
