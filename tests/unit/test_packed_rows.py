"""Packed rows (:mod:`tlcap.models.packed_rows`) equal the batch-row layout and each context run alone.

On every architecture family (GPT-2, Llama/GQA, NeoX and GPT-J parallel blocks, Qwen2, Gemma-2 with a
sliding window shorter than the prefixes): logits of rows after padded prefixes, with hooks that set
different neurons in different rows, and the gradients through those hooks; the one-prefix path of
``Model.last_logits`` likewise; hooks at sites that are not position-major fall back to batch rows.
"""

from __future__ import annotations

import pytest
import torch

from tlcap.errors import TlcapError
from tlcap.models import make_tiny
from tlcap.models.packed_rows import attention_windows, packable, pieces
from tlcap.runtime import hooks as H

FAMILIES = ["gpt2", "llama", "neox", "qwen2", "gemma2", "gptj"]


@pytest.fixture(scope="module", params=FAMILIES)
def fam_model(request, tiny_gpt2, tiny_llama):
    if request.param == "gpt2":
        return tiny_gpt2
    if request.param == "llama":
        return tiny_llama
    return make_tiny(request.param, seed=0)


CASES = {  # context lengths, rows per context
    "long": ([75, 3, 40, 70], [3, 0, 2, 1]),  # two prefixes beyond the tiny Gemma-2's sliding window (64)
    "short": ([30, 3, 20, 12], [3, 0, 2, 1]),
    "many_rows": ([5, 3, 4, 2], [20, 0, 9, 1]),  # more rows than a piece holds (W = 8): split into pieces
}


def _ctxs(model, case="long"):
    g = torch.Generator().manual_seed(0)
    lens = CASES[case][0]
    return [torch.randint(0, model.d_vocab, (n,), generator=g).tolist() for n in lens]


def _both(model, fn):  # (packed, batch rows)
    old = model.packed_rows
    try:
        model.packed_rows = True
        a = fn()
        model.packed_rows = False
        b = fn()
    finally:
        model.packed_rows = old
    return a, b


def _hooked(model, counts):
    """Rows that overwrite neurons of layer 1 (rows layout, one value per row); returns (leaf, hooks)."""
    rows = int(counts.sum())
    leaf = torch.randn(rows, model.d_mlp, generator=torch.Generator().manual_seed(1)).to(model.device).requires_grad_(True)
    return leaf, [(model.hook_name("mlp_post", 1), H.replace_rows(slice(None), -1, leaf))]


def _rows_and_grads(model, ctxs, prefix, counts, expand_at):
    """``continue_rows`` with :func:`_hooked` rows: the logits and d log p(token 7) / d the set neurons."""
    leaf, hooks = _hooked(model, counts)
    with torch.enable_grad():
        out = model.continue_rows([c[-1] for c in ctxs], prefix, counts, hooks=hooks, expand_at=expand_at)
        g = torch.autograd.grad(out.float().log_softmax(-1)[:, 7].sum(), leaf)[0]
    return out.detach(), g


@pytest.mark.parametrize("case", list(CASES))
def test_continue_rows_packed_equals_batch_rows_and_each_context(fam_model, case):
    model = fam_model
    ctxs = _ctxs(model, case)
    prefix = model.padded_prefix([c[:-1] for c in ctxs])
    counts = torch.tensor(CASES[case][1])  # unequal counts (padding positions), one context left out
    ref = torch.cat([model.logits(torch.tensor([c]))[:, -1].expand(int(k), -1) for c, k in zip(ctxs, counts) if k])
    # batch rows see the sliding window from the padded position: refused where that differs
    windowed = case == "long" and model.hf_model.config.model_type == "gemma2"
    for expand_at in (None, 1):
        def run(expand_at=expand_at):
            return model.continue_rows([c[-1] for c in ctxs], prefix, counts, expand_at=expand_at)

        torch.testing.assert_close(run(), ref, rtol=1e-4, atol=1e-4)
        la, ga = _rows_and_grads(model, ctxs, prefix, counts, expand_at)
        assert not torch.allclose(la, ref)  # the hook changed the rows
        model.packed_rows = False
        try:
            if windowed:
                with pytest.raises(TlcapError, match="sliding attention window"):
                    run()
                continue
            torch.testing.assert_close(run(), ref, rtol=1e-4, atol=1e-4)
            lb, gb = _rows_and_grads(model, ctxs, prefix, counts, expand_at)
        finally:
            model.packed_rows = True
        torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("case", ["long", "many_rows"])
def test_one_prefix_last_logits_packed_equals_batch_rows(fam_model, case):
    model = fam_model
    ctx = _ctxs(model, case)[0]
    prefix = model.prefix_cache(torch.tensor([ctx[:-1]]))
    run = torch.tensor([ctx[-1:]])
    rows = 5 if case == "long" else 19  # many_rows: 3 pieces of at most 8
    for expand_at in (None, 1):
        def go(expand_at=expand_at):
            leaf, hooks = _hooked(model, torch.tensor([rows]))
            with torch.enable_grad():
                out = model.last_logits(run, hooks=hooks, prefix=prefix, expand_at=expand_at, batch=rows)
                g = torch.autograd.grad(out.float().softmax(-1)[:, 3].sum(), leaf)[0]
            return out.detach(), g

        (la, ga), (lb, gb) = _both(model, go)
        assert la.shape == (rows, model.d_vocab)
        torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-7)
    # the stored prefix is left intact by the calls above: the rows equal the context run alone
    alone = model.logits(torch.tensor([ctx]))[0, -1]
    torch.testing.assert_close(model.last_logits(run, prefix=prefix, batch=2)[1], alone, rtol=1e-4, atol=1e-4)


def test_packing_applies_to_position_major_sites_only(tiny_llama):
    model = tiny_llama
    noop = lambda act, hook=None: act  # noqa: E731
    assert packable(model, [(model.hook_name("mlp_post", 0), noop), (model.hook_name("resid_pre", 1), noop)], 1)
    assert not packable(model, [(model.hook_name("mlp_post", 0), noop)], 2)  # two new tokens
    assert not packable(model, [("blocks.0.attn.hook_pattern", noop)], 1)  # [batch, head, q, k]: not rows-major
    model.packed_rows = False
    try:
        assert not packable(model, [], 1)
    finally:
        model.packed_rows = True


def test_pieces_split_rows_by_prefix_length():
    ctx, rows, width = pieces(torch.tensor([20, 9, 1]), n=4)
    assert width == 8  # MIN_WIDTH
    assert ctx.tolist() == [0, 0, 0, 1, 1, 2] and rows.tolist() == [8, 8, 4, 8, 1, 1]
    ctx, rows, width = pieces(torch.tensor([20, 9, 1]), n=30)
    assert width == 20 and ctx.tolist() == [0, 1, 2] and rows.tolist() == [20, 9, 1]


def test_attention_windows_follow_the_config():
    class C:
        sliding_window = 8
        layer_types = ["sliding_attention", "full_attention", "sliding_attention"]

    assert attention_windows(C(), 3) == [8, None, 8]
    C.layer_types = None
    assert attention_windows(C(), 2) == [8, 8]
    C.sliding_window = None
    assert attention_windows(C(), 2) == [None, None]


def _tiny_bloom():
    """A tiny random Bloom (ALiBi positions) through the bridge, as `make_tiny` builds the other families."""
    import transformers as tf

    from tlcap.models.adapter import Model, transformer_bridge_class
    from tlcap.models.tiny import gpt2_tokenizer

    torch.manual_seed(0)
    hf = tf.BloomForCausalLM(tf.BloomConfig(vocab_size=50257, hidden_size=64, n_layer=2, n_head=4)).eval()
    tok = gpt2_tokenizer()
    return Model(transformer_bridge_class().boot_transformers("bigscience/bloom-560m", hf_model=hf, tokenizer=tok), tok,
                 name="bloom-tiny")


def test_alibi_models_are_not_packed_and_stay_exact():
    model = _tiny_bloom()
    assert not packable(model, [], 1)  # ALiBi biases by key index: a packed position would sit at n + i
    ctxs = _ctxs(model, "short")
    prefix = model.padded_prefix([c[:-1] for c in ctxs])
    counts = torch.tensor([3, 0, 2, 1])
    ref = torch.cat([model.logits(torch.tensor([c]))[:, -1].expand(int(k), -1) for c, k in zip(ctxs, counts) if k])
    torch.testing.assert_close(model.continue_rows([c[-1] for c in ctxs], prefix, counts), ref, rtol=1e-4, atol=1e-4)


def test_packing_is_used_and_outer_hooks_fall_back(tiny_llama, monkeypatch):
    import tlcap.models.rows as rows_module

    model = tiny_llama
    calls = []
    real = rows_module.continue_packed
    monkeypatch.setattr(rows_module, "continue_packed", lambda *a, **k: calls.append(1) or real(*a, **k))
    ctxs = _ctxs(model, "short")
    prefix = model.padded_prefix([c[:-1] for c in ctxs])
    counts = torch.tensor([2, 1, 2, 1])
    last = [c[-1] for c in ctxs]
    model.continue_rows(last, prefix, counts)
    assert calls == [1]  # the plain call is packed
    # a hook from an enclosing block would see the packed layout: such calls run as batch rows, same result
    outer = [(model.hook_name("mlp_post", 1), H.scale(0.0, pos=-1))]
    with model.hooks(fwd=outer):
        inside = model.continue_rows(last, prefix, counts)
    assert calls == [1]
    direct = model.continue_rows(last, prefix, counts, hooks=outer)  # the same hook given to the call: packed
    assert calls == [1, 1]
    torch.testing.assert_close(inside, direct, rtol=1e-5, atol=1e-5)
    assert int(model.continue_rows(last, prefix, torch.zeros(4, dtype=torch.long)).shape[0]) == 0


@pytest.mark.parametrize("site,expand_at", [("mlp_post", None), ("resid_pre", 1)])
def test_in_place_hooks_returning_none_act_as_in_batch_rows(tiny_llama, site, expand_at):
    model = tiny_llama
    ctx = _ctxs(model, "many_rows")[0]
    prefix = model.prefix_cache(torch.tensor([ctx[:-1]]))

    def zero_some(act, hook=None):
        act[..., :5] = 0.0  # edited in place, nothing returned (TransformerLens allows it)

    hooks = [(model.hook_name(site, 1), zero_some)]
    a, b = _both(model, lambda: model.last_logits(torch.tensor([ctx[-1:]]), hooks=hooks, prefix=prefix,
                                                  expand_at=expand_at, batch=19))  # pieces padded to 8
    plain = model.last_logits(torch.tensor([ctx[-1:]]), prefix=prefix, batch=19)
    assert not torch.allclose(a, plain)  # the edit took effect
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_attention_windows_read_the_text_config_of_multimodal_configs():
    class Text:
        sliding_window = 16
        layer_types = ["sliding_attention", "full_attention"]

    class Multi:
        sliding_window = None
        layer_types = None

        def get_text_config(self):
            return Text()

    assert attention_windows(Multi(), 2) == [16, None]


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
@pytest.mark.parametrize("case", ["long", "many_rows"])
def test_packed_rows_on_cuda_equal_each_context_and_batch_rows(family, case):
    model = make_tiny(family, seed=0, device="cuda")
    ctxs = _ctxs(model, case)
    prefix = model.padded_prefix([c[:-1] for c in ctxs])
    counts = torch.tensor(CASES[case][1])
    ref = torch.cat([model.logits(torch.tensor([c], device="cuda"))[:, -1].expand(int(k), -1)
                     for c, k in zip(ctxs, counts) if k])
    for expand_at in (None, 1):
        out = model.continue_rows([c[-1] for c in ctxs], prefix, counts, expand_at=expand_at)
        assert out.device.type == "cuda"
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        a, ga = _rows_and_grads(model, ctxs, prefix, counts, expand_at)
        if case == "long" and family == "gemma2":
            continue  # batch rows refuse prefixes padded beyond the sliding window (tested on the CPU)
        model.packed_rows = False
        try:
            b, gb = _rows_and_grads(model, ctxs, prefix, counts, expand_at)
        finally:
            model.packed_rows = True
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)
