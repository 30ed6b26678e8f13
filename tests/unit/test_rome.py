"""ROME on the tiny random models: the rank-one update's closed-form property, exact undo,
covariance caching, and the value optimisation reducing its loss."""

from __future__ import annotations

import warnings

import pytest
import torch

from tlcap.errors import InvalidConfigError, SubjectNotFoundError
from tlcap.intervene.covariance import covariance_path, key_covariance, solve_key
from tlcap.intervene.rome import RomeConfig, RomeSweep, ValueRows, evaluate_rome, rome_edit, rome_sweep, subject_keys, value_loss
from tlcap.intervene.rome import evaluate as rome_evaluate
from tlcap.intervene.rome import measures as rome_measures
from tlcap.intervene.rome.config import DEFAULT_NEIGHBOURHOOD
from tlcap.locate.subjects import SubjectWarning
from tlcap.results import load_result
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site

PROMPT = "The capital of France is"
SUBJECT = "France"
CFG = RomeConfig(steps=4, cov_tokens=512, cov_seq_len=64, clamp_norm_factor=1e3, weight_decay=0.0,
                 prefixes=("", "Here is a fact. "))


def test_covariance_matches_direct_and_is_cached(tiny_llama):
    texts = ["The quick brown fox jumps over the lazy dog. " * 20]
    c = key_covariance(tiny_llama, [1], n_tokens=128, seq_len=64, texts=texts)[1]
    ids = tiny_llama.tokenizer(texts[0] + "\n", add_special_tokens=False)["input_ids"][:128]
    toks = torch.tensor(ids).reshape(2, 64)
    _, cache = tiny_llama.run_with_cache(toks, [get_site("mlp_post").hook_name(1)])
    k = cache[get_site("mlp_post").hook_name(1)].reshape(-1, tiny_llama.d_mlp).double()
    assert torch.allclose(c.double(), k.T @ k / k.shape[0], rtol=1e-5, atol=1e-8)
    # WikiText sample: written to the on-disk cache, read back identically.
    c1 = key_covariance(tiny_llama, [0], n_tokens=256, seq_len=64)[0]
    assert covariance_path(tiny_llama, 0, 256, 64).exists()
    c2 = key_covariance(tiny_llama, [0], n_tokens=256, seq_len=64)[0]
    assert torch.equal(c1, c2)


def test_rank_one_update_hits_value_and_undo_is_exact(tiny_gpt2):
    # Layer 0: the last layer's output at the subject token cannot reach the next-token logits.
    layer = 0
    W = tiny_gpt2.mlp_out_weight(layer).param
    before = {n: p.detach().clone() for n, p in tiny_gpt2.backend.named_parameters()}
    W_before = tiny_gpt2.mlp_down_matrix(layer).clone()
    _, v0 = subject_keys(tiny_gpt2, layer, [PROMPT], SUBJECT, [0])
    cov = key_covariance(tiny_gpt2, [layer], n_tokens=CFG.cov_tokens, seq_len=CFG.cov_seq_len)[layer]
    with rome_edit(tiny_gpt2, PROMPT, SUBJECT, " Rome", layer, config=CFG, cov=cov) as edit:
        dW = tiny_gpt2.mlp_down_matrix(layer) - W_before
        assert torch.linalg.matrix_rank(dW.double(), rtol=1e-4).item() == 1  # float32 rounding noise
        # Closed form: the edited layer now outputs v0 + delta at the prompt's subject token.
        _, v1 = subject_keys(tiny_gpt2, layer, [PROMPT], SUBJECT, [0])
        assert torch.allclose(v1[0], v0[0] + edit.delta, atol=1e-4, rtol=1e-4)
        assert edit.delta.norm() > 0
        # u = C^-1 k* (ridge-regularised).
        assert torch.allclose(edit.u, solve_key(cov, edit.key, CFG.cov_reg))
        assert edit.losses[-1] < edit.losses[0]
    for n, p in tiny_gpt2.backend.named_parameters():
        assert torch.equal(p, before[n]), n
    assert not W.requires_grad
    assert torch.equal(tiny_gpt2.mlp_down_matrix(layer), W_before)


def test_evaluate_restores_and_reports(tiny_llama, tmp_path):
    W0 = tiny_llama.mlp_out_weight(0).param.detach().clone()
    res = evaluate_rome(tiny_llama, PROMPT, SUBJECT, " Rome", 0, paraphrases=["Fact: " + PROMPT],
                        neighbourhood=["The sky is", "Water is"], config=CFG)
    assert torch.equal(tiny_llama.mlp_out_weight(0).param, W0)
    assert res.new_prob_after != res.new_prob_before
    assert 0.0 <= res.specificity <= 1.0 and len(res.neighbourhood_kept) == 2
    assert len(res.paraphrase_success) == 1 and isinstance(res.efficacy, bool)
    sweep = RomeSweep(results=(res,), prompt=PROMPT, subject=SUBJECT, target_new=" Rome")
    sweep.save(tmp_path / "s")
    again = RomeSweep.load(tmp_path / "s")
    assert again.results[0].new_prob_after == res.new_prob_after
    s = sweep.summary()
    for key in ("efficacy", "paraphrase", "specificity", "new_prob_before", "new_prob_after"):
        assert len(s[key]) == 1
    assert len(sweep.figure().data) >= 4


def test_weights_restored_on_every_exit_path(tiny_llama, monkeypatch):
    W = tiny_llama.mlp_out_weight(0).param
    W0 = W.detach().clone()
    # an exception inside the edit context
    with pytest.raises(KeyError):
        with rome_edit(tiny_llama, PROMPT, SUBJECT, " Rome", 0, config=CFG):
            assert not torch.equal(W, W0)  # the edit is in place here
            raise KeyError("inside the edit")
    assert torch.equal(W, W0)
    # a measurement of evaluate_rome failing while the model is edited
    calls = []
    real = rome_measures.target_logprobs

    def fail_second(model, items, bos=False, plan=None):
        calls.append(torch.equal(W, W0))
        if len(calls) == 2:
            raise RuntimeError("measurement failed")
        return real(model, items, bos, plan)

    monkeypatch.setattr(rome_measures, "target_logprobs", fail_second)
    with pytest.raises(RuntimeError, match="measurement failed"):
        evaluate_rome(tiny_llama, PROMPT, SUBJECT, " Rome", 0, config=CFG)
    assert calls == [True, False]  # the second measurement ran on the edited model
    assert torch.equal(W, W0)


def test_layer_and_config_errors_before_any_work(tiny_gpt2, monkeypatch):
    def no_forward(*a, **k):
        raise AssertionError("work started before the layer was checked")

    monkeypatch.setattr(tiny_gpt2, "logits", no_forward)
    with pytest.raises(InvalidConfigError) as info:
        rome_edit(tiny_gpt2, PROMPT, SUBJECT, " Rome", 2, config=CFG)
    assert str(info.value) == "layer (--layer) 2 out of range for gpt2-tiny-random-seed0 (2 layers: 0..1)"
    with pytest.raises(InvalidConfigError, match=r"layer \(--layer\) must be >= 0, got -1"):
        evaluate_rome(tiny_gpt2, PROMPT, SUBJECT, " Rome", -1, config=CFG)
    with pytest.raises(InvalidConfigError, match=r"clamp_norm_factor \(--clamp-norm-factor\) must be > 0, got 0"):
        rome_edit(tiny_gpt2, PROMPT, SUBJECT, " Rome", 0, clamp_norm_factor=0.0)


def test_edit_results_meet_the_contract(tiny_llama, tmp_path):
    res = evaluate_rome(tiny_llama, PROMPT, SUBJECT, " Rome", 1, neighbourhood=["The sky is"], config=CFG)
    assert res.provenance.config == CFG.to_dict() and res.provenance.model_name == tiny_llama.name
    s = res.summary()
    assert s["mode"] == "single" and s["model"] == tiny_llama.name and s["layer"] == 1
    assert s["losses"] == list(res.losses) and len(res.losses) >= 1
    assert res.to_frame().to_dict("records")[0]["new_prob_after"] == res.new_prob_after
    fig = res.figure()
    assert [t.name for t in fig.data] == ["before", "after", "loss"]
    assert list(fig.data[1].y) == [res.new_prob_after, res.old_prob_after]
    back = load_result(res.save(tmp_path / "r"))
    assert back == res and back.provenance.seed == CFG.seed


def _official_terms(model, layer, cfg, delta, kl_init=None):
    """ROME's compute_v objective written out by hand: rows, NLL per row, KL(current ‖ init), ‖δ‖/‖v₀‖²."""
    t_ids = model.target_ids(PROMPT, " Rome")
    texts = [p + PROMPT for p in cfg.prefixes]
    rows = [model.encode(t) + t_ids[:-1] for t in texts] + [model.encode(SUBJECT + " is a")]
    look = [model.subject_span(t, SUBJECT, start=len(p)).last for p, t in zip(cfg.prefixes, texts)]
    look.append(model.subject_span(SUBJECT + " is a", SUBJECT).last)
    batch = model.encode_batch(rows)
    hook = (model.hook_name("mlp_out", layer), H.add_rows(torch.arange(len(rows)), torch.tensor(look), delta))
    logp = model.logits(batch, hooks=[hook]).double().log_softmax(-1)
    start = [len(model.encode(t)) - 1 for t in texts]
    nll_each = [-sum(logp[r, start[r] + j, tid] for j, tid in enumerate(t_ids)) / len(t_ids) for r in range(len(texts))]
    nll = torch.stack(nll_each).mean()
    cur = logp[len(texts), look[-1]]
    init = cur.detach() if kl_init is None else kl_init
    kl = (cur.exp() * (cur - init)).sum()                    # KL(current ‖ init)
    kl_reverse = (init.exp() * (init - cur)).sum()           # KL(init ‖ current), the old direction
    _, v0 = subject_keys(model, layer, [PROMPT], SUBJECT, [0])
    wd = cfg.weight_decay * delta.norm() / v0[0].norm() ** 2
    return nll, kl, kl_reverse, wd, cur.detach(), v0[0]


def test_value_objective_is_the_official_compute_v(tiny_gpt2):
    """Checked to fail before the fix (KL(init ‖ current), wd·‖δ‖²/‖v₀‖², stop on the NLL, `steps` updates)."""
    layer = 0
    cfg = RomeConfig(steps=2, lr=0.5, kl_factor=0.7, weight_decay=0.5, clamp_norm_factor=1e3, stop_loss=0.0,
                     prefixes=("", "Here is a fact. "), cov_tokens=512, cov_seq_len=64)
    with rome_edit(tiny_gpt2, PROMPT, SUBJECT, " Rome", layer, config=cfg) as edit:
        pass
    # step 0 (δ = 0): the total is the NLL alone
    zero = torch.zeros(tiny_gpt2.d_model, requires_grad=True)
    nll0, kl0, _, wd0, kl_init, v0 = _official_terms(tiny_gpt2, layer, cfg, zero)
    assert float(kl0) == 0.0 and float(wd0) == 0.0
    assert edit.steps[0].total == pytest.approx(float(nll0), rel=1e-5)
    # steps=2: one Adam update from δ = 0 (the official loop's last iteration only evaluates)
    (nll0 + cfg.kl_factor * kl0 + wd0).backward()
    g = zero.grad
    delta1 = -cfg.lr * g / (g.abs() + 1e-8)  # Adam's first step
    assert len(edit.steps) == 2
    assert torch.allclose(edit.delta, delta1.float(), atol=1e-5)
    # step 1: every term by hand at δ₁
    nll1, kl1, kl1_rev, wd1, _, _ = _official_terms(tiny_gpt2, layer, cfg, edit.delta.double(), kl_init)
    s1 = edit.steps[1]
    assert s1.nll == pytest.approx(float(nll1), rel=1e-5)
    assert s1.kl == pytest.approx(float(kl1), abs=5e-6)
    assert abs(float(kl1) - float(kl1_rev)) > 2e-5  # KL(init ‖ current) is 4e-5 away: the test tells them apart
    assert s1.weight_decay == pytest.approx(0.5 * float(edit.delta.norm() / v0.norm() ** 2), rel=1e-5)
    assert s1.weight_decay == pytest.approx(float(wd1), rel=1e-5)
    assert float(wd1) != pytest.approx(0.5 * float(edit.delta.norm() ** 2 / v0.norm() ** 2), rel=1e-2)
    assert edit.losses == [edit.steps[0].total, s1.total]
    assert s1.total == pytest.approx(float(nll1 + cfg.kl_factor * kl1 + wd1), rel=1e-5)

    # early stop on the total loss, checked before the update. With a small weight decay the total
    # falls from step 0 to step 1 (the first update does not depend on the decay: its gradient is 0 at δ = 0)
    small = cfg.replace(weight_decay=1e-4)
    with rome_edit(tiny_gpt2, PROMPT, SUBJECT, " Rome", layer, config=small) as e:
        t0, t1 = e.steps
    assert t1.nll < t1.total < t0.total
    # a threshold just above the step-1 total stops there, with δ₁ (no update after the check)
    with rome_edit(tiny_gpt2, PROMPT, SUBJECT, " Rome", layer, config=small.replace(steps=5, stop_loss=t1.total + 1e-4)) as e:
        assert len(e.steps) == 2 and torch.allclose(e.delta, edit.delta)
    # a threshold between the step-1 NLL and total does not stop there (the NLL alone would have)
    with rome_edit(tiny_gpt2, PROMPT, SUBJECT, " Rome", layer,
                   config=small.replace(steps=3, stop_loss=(t1.nll + t1.total) / 2)) as e:
        assert len(e.steps) == 3


def test_value_loss_kl_direction_and_averaging_by_hand():
    """value_loss on hand-made logits: KL(current ‖ init), NLL per row / n tokens then mean, wd·‖δ‖/‖v₀‖²."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 6, generator=g) * 2  # rows 0-1 rewrite, row 2 the KL row
    rows = ValueRows(tokens=torch.zeros(3, 4, dtype=torch.long), look=torch.tensor([1, 1, 2]),
                     target_rows=torch.tensor([0, 0, 1, 1]), target_pos=torch.tensor([1, 2, 0, 1]),
                     target_ids=torch.tensor([3, 5, 3, 5]), n_rewrite=2, n_target=2)
    init = torch.log_softmax(torch.tensor([[2.0, -1.0, 0.5, 0.0, 3.0, -2.0]]), -1)
    delta = torch.tensor([3.0, 4.0])  # ‖δ‖ = 5
    cfg = RomeConfig(kl_factor=0.25, weight_decay=0.5)
    t = value_loss(logits, rows, init, delta, 2.0, cfg)
    lp = logits.log_softmax(-1)
    nll = -((lp[0, 1, 3] + lp[0, 2, 5]) / 2 + (lp[1, 0, 3] + lp[1, 1, 5]) / 2) / 2
    p, q = lp[2, 2].exp(), init[0].exp()
    kl = (p * (p / q).log()).sum()
    assert float(t.nll) == pytest.approx(float(nll), rel=1e-6)
    assert float(t.kl) == pytest.approx(float(kl), rel=1e-6)
    assert float(t.kl) != pytest.approx(float((q * (q / p).log()).sum()), rel=1e-2)
    assert float(t.weight_decay) == pytest.approx(0.5 * 5 / 4)
    assert float(t.total) == pytest.approx(float(nll + 0.25 * kl + 0.625), rel=1e-6)


def test_occurrence_bos_and_bad_facts(tiny_gpt2, monkeypatch):
    """Issue 15: an ambiguous subject warns and ``occurrence=`` picks the edited one; ``bos`` prepends the
    BOS (a subject at 0 without it warns); an absent subject / empty prompt fail before any forward."""
    prompt, cfg = "France is big and France is", RomeConfig(steps=1, mom2_adjustment=False, prefixes=("",))
    post = tiny_gpt2.hook_name("mlp_post", 0)

    def key_at(ids, pos):
        return tiny_gpt2.record(tiny_gpt2.encode_batch([ids]), [post])[post][0, pos]

    plain = tiny_gpt2.encode(prompt, prepend_bos=False)
    second = tiny_gpt2.subject_span(prompt, "France", occurrence=1).last
    with warnings.catch_warnings():
        warnings.simplefilter("error", SubjectWarning)
        with rome_edit(tiny_gpt2, prompt, "France", " Rome", 0, config=cfg, occurrence=1) as e:
            assert torch.allclose(e.prompt_key, key_at(plain, second))
        with rome_edit(tiny_gpt2, prompt, "France", " Rome", 0, config=cfg.replace(bos=True), occurrence=0) as e:
            with_bos = tiny_gpt2.encode(prompt, prepend_bos=True)
            assert len(with_bos) == len(plain) + 1
            assert torch.allclose(e.prompt_key, key_at(with_bos, 1))
            assert not torch.allclose(e.prompt_key, key_at(plain, 0))
    with pytest.warns(SubjectWarning) as rec:
        with rome_edit(tiny_gpt2, prompt, "France", " Rome", 0, config=cfg) as e:
            assert torch.allclose(e.prompt_key, key_at(plain, 0))
    assert [str(w.message) for w in rec if w.category is SubjectWarning] == [
        "subject 'France' occurs 2 times in the prompt 'France is big and France is'; using the first (occurrence 0); "
        "pass occurrence= (--occurrence) to choose another",
        "subject 'France' starts the prompt 'France is big and France is': its first token is at position 0, the "
        "model's attention sink, so a one-token subject's key and value are the attention sink's; pass bos=True "
        "(--bos) to prepend the BOS token"]

    def no_forward(*a, **k):
        raise AssertionError("a forward pass ran before the fact was checked")

    monkeypatch.setattr(tiny_gpt2, "logits", no_forward)
    monkeypatch.setattr(tiny_gpt2, "record", no_forward)
    with pytest.raises(SubjectNotFoundError) as info:
        evaluate_rome(tiny_gpt2, PROMPT, "Germany", " Rome", 0, config=cfg)
    assert str(info.value) == ("subject 'Germany' does not occur in the prompt 'The capital of France is'; pass the "
                               "subject exactly as it is written in the prompt (case and spacing included)")
    with pytest.raises(InvalidConfigError, match=r"^prompt \(--prompt\) must not be empty$"):
        rome_edit(tiny_gpt2, " ", "France", " Rome", 0, config=cfg)
    with pytest.raises(InvalidConfigError, match=r"^occurrence \(--occurrence\) must be in -2..1"):
        rome_sweep(tiny_gpt2, prompt, "France", " Rome", config=cfg, occurrence=2)
    with pytest.raises(InvalidConfigError, match=r"^layer \(--layer\) must be >= 0, got -1$"):
        rome_edit(tiny_gpt2, PROMPT, "France", " Rome", -1, config=cfg)


def test_default_neighbourhood_leaves_out_the_edited_fact(tiny_llama):
    """Specificity is measured on other facts: not the edited prompt, not prompts naming the subject."""
    eiffel = "The Eiffel Tower is located in the city of"
    assert eiffel in DEFAULT_NEIGHBOURHOOD and PROMPT in DEFAULT_NEIGHBOURHOOD
    neigh = rome_evaluate.default_neighbourhood(eiffel, "The Eiffel Tower")
    assert eiffel not in neigh and len(neigh) == len(DEFAULT_NEIGHBOURHOOD) - 1
    assert rome_evaluate.default_neighbourhood("Paris is the capital of", "France") == list(DEFAULT_NEIGHBOURHOOD[1:])
    res = evaluate_rome(tiny_llama, PROMPT, SUBJECT, " Rome", 0, paraphrases=[], config=CFG)
    assert PROMPT not in res.neighbourhood and len(res.neighbourhood) == len(DEFAULT_NEIGHBOURHOOD) - 1


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_rome_sweep_with_layers_as_rows_equals_one_edit_at_a_time(name):
    """``rome_sweep(layers_per_pass=b)``: every layer's keys from one pass, the layers' value optimisations sharing
    passes (each its own δ and Adam; a layer that reaches ``stop_loss`` leaves), each edit measured as a rank-one
    write of its rows. Every result equals the sweep of weight edits one at a time (losses, ‖δ‖, ‖ΔW‖, probabilities
    after; efficacy, paraphrase and specificity exactly) at b = 2 and 3 of 3 layers, in the counted passes."""
    from tlcap.intervene.covariance import key_covariance
    from tlcap.models import make_gpt2, make_llama

    m = make_gpt2("tiny", seed=0, n_layers=3) if name == "gpt2" else make_llama(seed=0, n_layers=3)
    prompt, paras, neigh = "The Eiffel Tower is located in the city of", ["Fact: The Eiffel Tower is in"], \
        ["Rome is the capital of", "Paris is in", "Madrid is in"]
    covs = key_covariance(m, [0, 1, 2], n_tokens=512, cache=False)
    # ROME's weight decay ‖δ‖/‖v₀‖² explodes on a random model's tiny v₀ (the norm clamp then makes the loss jump
    # chaotically); without it the optimisation is smooth, and the stop loss lies where layer 0 stops early and the
    # others never do (margins 2e-3 against rounding of 1e-6)
    stop = {"gpt2": 10.733, "llama": 10.571}[name]
    kw = dict(target_old=" Paris", paraphrases=paras, neighbourhood=neigh, covs=covs, steps=8, bos=True, lr=0.2,
              weight_decay=0.0, stop_loss=stop)
    runs = {}
    for b in (1, 2, 3):
        calls = []
        handle = m.backend.register_forward_pre_hook(lambda mod, args, c=calls: c.append(1))
        try:
            runs[b] = (rome_sweep(m, prompt, "The Eiffel Tower", " Rome", [0, 1, 2], layers_per_pass=b, **kw), len(calls))
        finally:
            handle.remove()
    alone = runs[1][0].results
    assert [len(r.losses) for r in alone] == [3 if name == "gpt2" else 2, 8, 8]  # layer 0 stopped early
    assert all(r.new_prob_after > 1.05 * r.new_prob_before for r in alone[:2])  # the edits move the target
    for b in (2, 3):
        for a, r in zip(alone, runs[b][0].results):
            assert (r.layer, r.efficacy, r.paraphrase_success, r.neighbourhood_kept) == \
                (a.layer, a.efficacy, a.paraphrase_success, a.neighbourhood_kept)
            assert r.losses == pytest.approx(a.losses, rel=1e-4)
            for f in ("delta_norm", "update_norm", "new_prob_after", "old_prob_after", "new_prob_before"):
                assert getattr(r, f) == pytest.approx(getattr(a, f), rel=1e-4), (b, a.layer, f)
    assert runs[1][1] == 2 + sum(2 + len(r.losses) + 2 for r in alone)
    assert runs[3][1] == 2 + 1 + 8 + 2  # unedited measures, keys, one pass per step, the two measure batches
    stopped = len(alone[0].losses)  # 3 layers: two passes per step until layer 0 stops, one after; 2 measure chunks
    assert runs[2][1] == 2 + 1 + 2 * stopped + (8 - stopped) + 2 * 2
