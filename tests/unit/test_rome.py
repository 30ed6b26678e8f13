"""ROME on the tiny random models: the rank-one update's closed-form property, exact undo,
covariance caching, and the value optimisation reducing its loss."""

from __future__ import annotations

import pytest
import torch

from tlcap.errors import InvalidConfigError
from tlcap.intervene.covariance import covariance_path, key_covariance, solve_key
from tlcap.intervene.rome import RomeConfig, RomeSweep, evaluate_rome, rome_edit, subject_keys
from tlcap.intervene.rome import evaluate as rome_evaluate
from tlcap.results import load_result
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
    real = rome_evaluate.target_logprobs

    def fail_second(model, items):
        calls.append(torch.equal(W, W0))
        if len(calls) == 2:
            raise RuntimeError("measurement failed")
        return real(model, items)

    monkeypatch.setattr(rome_evaluate, "target_logprobs", fail_second)
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
