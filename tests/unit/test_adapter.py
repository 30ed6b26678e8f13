"""The model adapter's API on GPT-2 (MHA, fused qkv) and a tiny Llama (GQA, tied embeddings):
padded batches, last-position logits, early-stopping recording, multi-row prefix caches,
subject spans, greedy decoding, edge-hook flags and parameter groups."""

from __future__ import annotations

import pytest
import torch

from tlcap.errors import (
    EmptyDatasetError,
    ShapeMismatchError,
    SubjectNotFoundError,
    TlcapError,
)
from tlcap.models import TokenBatch, make_gpt2, make_llama
from tlcap.runtime import hooks as H

PROMPTS = ["The capital of France is", "Paris", "The Eiffel Tower is located in the city of"]


@pytest.fixture(params=["tiny_gpt2", "tiny_llama"])
def model(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def fresh(request):
    """A model of its own (these tests overwrite weights, then restore them)."""
    return make_gpt2("tiny", seed=3) if request.param == "gpt2" else make_llama(seed=3)


def _close(a, b, atol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


# ---------------------------------------------------------------------------- last_logits
def test_last_logits_equals_full_logits_last_position(model):
    toks = model.to_tokens(PROMPTS[2])
    hooks = [(model.hook_name("mlp_post", 0), H.scale(0.0, index=[1, 2, 3]))]
    for hk in ((), hooks):
        last = model.last_logits(toks.expand(3, -1), hooks=hk)
        assert last.shape == (3, model.d_vocab)
        _close(last, model.logits(toks.expand(3, -1), hooks=hk)[:, -1], atol=1e-6)
    # after a prefix cache, and with late expansion of a one-row prefix
    pc = model.prefix_cache(toks[:, :-1])
    _close(model.last_logits(toks[:, -1:], prefix=pc), model.logits(toks)[:, -1])
    scale1 = [(model.hook_name("mlp_post", 1), H.scale(torch.tensor([[0.5], [2.0]]), pos=-1, index=[4]))]
    late = model.last_logits(toks[:, -1:], hooks=scale1, prefix=pc, expand_at=1, batch=2)
    _close(late, model.logits(toks.expand(2, -1), hooks=scale1)[:, -1])
    assert (late[0] - late[1]).abs().max() > 0


# ---------------------------------------------------------------------------- encode_batch
@pytest.mark.parametrize("side", ["right", "left"])
def test_encode_batch_padding_matches_single_runs(model, side):
    batch = model.encode_batch(PROMPTS, side=side)
    rows = [model.encode(p) for p in PROMPTS]
    assert isinstance(batch, TokenBatch) and batch.side == side and len(batch) == 3
    assert batch.lengths.tolist() == [len(r) for r in rows]
    assert batch.tokens.shape == (3, max(map(len, rows)))
    assert [batch.row(i) for i in range(3)] == rows
    assert batch.attention_mask.sum(1).tolist() == batch.lengths.tolist()
    assert (batch.tokens[batch.attention_mask == 0] == model.pad_token_id).all()
    singles = [model.logits(model.to_tokens(p))[0] for p in PROMPTS]
    _close(model.last_logits(batch), torch.stack([s[-1] for s in singles]))
    # every real position, not only the last, sees exactly its own row's prefix
    full = model.logits(batch)
    for i, s in enumerate(singles):
        cols = torch.arange(int(batch.starts[i]), int(batch.starts[i]) + len(rows[i]))
        _close(full[i, cols], s)
    assert batch.last_positions.tolist() == batch.positions(-1).tolist()
    assert batch.positions(0).tolist() == batch.starts.tolist()


def test_encode_batch_ids_and_errors(tiny_gpt2):
    b = tiny_gpt2.encode_batch([[5, 6, 7], torch.tensor([8])], pad_id=0)
    assert b.tokens.tolist() == [[5, 6, 7], [8, 0, 0]] and b.last_positions.tolist() == [2, 0]
    assert not tiny_gpt2.encode_batch([[1, 2], [3, 4]]).is_padded
    with pytest.raises(EmptyDatasetError):
        tiny_gpt2.encode_batch([])
    with pytest.raises(EmptyDatasetError, match="no tokens"):
        tiny_gpt2.encode_batch(["Paris", []])
    with pytest.raises(TlcapError, match="side"):
        tiny_gpt2.encode_batch(["Paris"], side="middle")  # type: ignore[arg-type]
    toks = tiny_gpt2.encode_batch(["Paris is", "A"], side="left")
    with pytest.raises(TlcapError, match="left-padded"):
        tiny_gpt2.logits(toks, prefix=tiny_gpt2.prefix_cache(tiny_gpt2.to_tokens("Hi")))


def test_encode_options_and_special_tokens(tiny_gpt2):
    text = " word" * 300
    ids = tiny_gpt2.encode(text, check_length=False)
    assert len(ids) == 300 > tiny_gpt2.n_ctx
    assert tiny_gpt2.encode(text, max_tokens=7) == ids[:7]
    eos = tiny_gpt2.special_token_id("eos")
    assert eos == 50256 and tiny_gpt2.encode("Paris", prepend_bos=True) == [eos] + tiny_gpt2.encode("Paris")
    assert tiny_gpt2.special_token_id("mask") is None
    assert tiny_gpt2.pad_token_id == eos  # GPT-2 has no pad token: EOS pads
    assert tiny_gpt2.decode(tiny_gpt2.encode(PROMPTS[0])) == PROMPTS[0]
    with pytest.raises(TlcapError, match="special token"):
        tiny_gpt2.special_token_id("cls")


# ---------------------------------------------------------------------------- record
def test_record_equals_full_run_and_stops_early(model):
    toks = model.to_tokens(PROMPTS[0])
    names = [model.hook_name("mlp_post", 0), model.hook_name("resid_mid", 0)]
    _, full = model.run_with_cache(toks, names)
    later: list[int] = []
    spy = [(model.hook_name("resid_post", model.n_layers - 1), lambda act, hook: later.append(1))]
    with model.hooks(fwd=spy):
        got = model.record(toks, names)
    assert list(got) == names and all(torch.equal(got[n], full[n]) for n in names)
    assert later == []  # the pass stopped after the last recorded point
    # explicit stop point, positions, and interventions applied before recording
    stop = model.hook_name("mlp_out", 0)
    scaled = model.record(toks, names[:1], stop_after=stop, hooks=[(names[0], H.scale(2.0))], pos=[-1])
    assert torch.equal(scaled[names[0]], 2.0 * full[names[0]][:, [-1]])
    with model.hooks(fwd=spy):
        model.record(toks, names, stop_after=model.hook_name("resid_post", 0))
    assert later == []
    with pytest.raises(TlcapError, match="did not fire"):
        model.record(toks, [model.hook_name("mlp_post", 1)], stop_after=names[0])


# ---------------------------------------------------------------------------- prefix cache
def test_multi_row_prefix_cache_repeats_each_row(model):
    g = torch.Generator().manual_seed(0)
    pre = torch.randint(0, 1000, (3, 5), generator=g)
    suf = torch.randint(0, 1000, (6, 2), generator=g)
    pc = model.prefix_cache(pre)
    assert (pc.rows, pc.n_tokens) == (3, 5)
    got = model.logits(suf, prefix=pc)
    ref = model.logits(torch.cat([pre.repeat_interleave(2, 0), suf], 1))[:, 5:]  # row i continues prefix row i // 2
    _close(got, ref)
    _close(model.logits(suf[::2], prefix=pc), ref[::2])  # k = 1, and the cache is reusable
    with pytest.raises(ShapeMismatchError, match="multiple of 3"):
        model.logits(suf[:4], prefix=pc)


# ---------------------------------------------------------------------------- subject spans
def test_subject_span_occurrences(tiny_gpt2):
    m = tiny_gpt2
    prompt = "France is next to Spain, and France is large"
    first = m.subject_span(prompt, "France")
    assert (first.range, first.n_occurrences, first.occurrence, first.ambiguous) == ((0, 1), 2, 0, True)
    second = m.subject_span(prompt, "France", occurrence=1)
    assert second.range == m.subject_span(prompt, "France", occurrence=-1).range
    toks = m.to_str_tokens(m.encode(prompt))
    assert "".join(toks[second.start : second.end]).strip() == "France" and second.start > first.end
    assert (second.char_start, second.char_end) == (29, 35)
    # search from a character index (e.g. after a prefix), and a prepended BOS shifts by one
    assert m.subject_span(prompt, "France", start=1).range == second.range
    assert m.subject_span(prompt, "France", start=1).n_occurrences == 1
    assert m.subject_span(prompt, "Spain", prepend_bos=True).range == tuple(i + 1 for i in m.subject_span(prompt, "Spain").range)
    assert m.subject_span(prompt, "Spain").n_occurrences == 1 and not m.subject_span(prompt, "Spain").ambiguous
    with pytest.raises(SubjectNotFoundError, match="occurs 2 time"):
        m.subject_span(prompt, "France", occurrence=2)
    with pytest.raises(SubjectNotFoundError, match="does not occur"):
        m.subject_span(prompt, "Italy")
    # the offsets cover the text: GPT-2's " France" token includes the space before the word
    offs = m.token_offsets(prompt)
    assert len(offs) == len(toks) and [prompt[a:b] for a, b in offs] == toks


# ---------------------------------------------------------------------------- generate
def test_generate_cache_equals_recompute_with_hooks(model):
    ids = model.encode("Alice went to the market and bought")
    hooks = [(model.hook_name("mlp_post", 0), H.scale(3.0))]  # every position
    for hk in ((), hooks):
        a = model.generate(ids, 6, hooks=hk)
        assert a == model.generate(ids, 6, hooks=hk, use_cache=False)
        full = model.logits(torch.tensor([ids + a[:-1]]), hooks=hk)[0, len(ids) - 1 :].argmax(-1).tolist()
        assert full == a
    assert model.generate(ids, 6, hooks=hooks, stop_ids=[a[1]]) == a[: a.index(a[1]) + 1]
    # hooks see the prompt too: the cached path feeds it once, then one token per step
    seen: list[int] = []
    spy = [(model.hook_name("mlp_post", 0), lambda act, hook: seen.append(act.shape[1]))]
    model.generate(ids, 4, hooks=spy)
    assert seen == [len(ids) - 1] + [1] * 4
    seen.clear()
    model.generate(ids, 3, hooks=spy, use_cache=False)
    assert seen == [len(ids), len(ids) + 1, len(ids) + 2]
    assert model.generate("Alice went to the market and bought", 6, hooks=hooks) == a
    text = model.decode(a[:3])
    assert model.decode(model.generate(ids, 6, hooks=hooks, stop_text=[text])).startswith(text)


# ---------------------------------------------------------------------------- edge hooks
def test_edge_hooks_restore_flags(model):
    off = model.edge_hook_flags()
    assert not any(off.values())
    with pytest.raises(RuntimeError, match="boom"):
        with model.edge_hooks():
            assert all(model.edge_hook_flags().values())
            with pytest.raises(RuntimeError, match="inner"):
                with model.edge_hooks():
                    raise RuntimeError("inner")
            assert all(model.edge_hook_flags().values())  # the inner block restored "on"
            _, cache = model.run_with_cache(model.to_tokens("Paris"), [model.hook_name("k_input", 0)])
            assert cache[model.hook_name("k_input", 0)].shape[2] == model.n_kv_heads
            raise RuntimeError("boom")
    assert model.edge_hook_flags() == off


# ---------------------------------------------------------------------------- parameter groups
def _expected_counts(m):
    d, dh = m.d_model, m.d_head
    if m.architecture == "gpt2":  # q/k/v/o with biases, LayerNorm with bias
        return {
            "own": 2 * d * dh + dh,
            "kv": 2 * (d * dh + dh),
            "shared": d + 2 * d,
            "mlp": 2 * d * m.d_mlp + m.d_mlp + d + 2 * d,
        }
    return {"own": 2 * d * dh, "kv": 2 * d * dh, "shared": d, "mlp": 3 * d * m.d_mlp + d}  # SwiGLU, RMSNorm


def test_parameter_groups_counts_by_hand(model):
    pg = model.parameter_groups()
    e = _expected_counts(model)
    H, G = model.n_heads, model.n_heads // model.n_kv_heads
    assert pg.group("a1.h2").numel == e["own"] and pg.group("a1.kv0").numel == e["kv"]
    assert pg.group("a1.kv0").users == tuple(f"a1.h{h}" for h in range(G))
    assert pg.group("a0").numel == e["shared"] and pg.group("m0").numel == e["mlp"]
    layer = H * (e["own"]) + model.n_kv_heads * e["kv"] + e["shared"] + e["mlp"]
    assert pg.block_total == model.n_layers * layer
    assert pg.total == model.parameter_count() == pg.block_total + pg.group("embed").numel + pg.group("unembed").numel
    counts = pg.node_counts()
    assert sum(counts.values()) == pg.total
    assert sum(counts[f"a0.h{h}"] for h in range(H)) + counts["m0"] == layer
    assert counts["a0.h0"] == e["own"] + e["kv"] // G + e["shared"] // H
    # a set of heads needs each kv group and the shared attention parameters once
    assert pg.count(["a0.h0"]) == e["own"] + e["kv"] + e["shared"]
    if G > 1:  # two heads of one kv group
        assert pg.count(["a0.h0", "a0.h1"]) == 2 * e["own"] + e["kv"] + e["shared"]
    assert pg.count(["a0.h0", f"a0.h{G}"]) == 2 * e["own"] + 2 * e["kv"] + e["shared"]  # two kv groups
    assert pg.count(["m1", "embed"]) == e["mlp"] + pg.group("embed").numel
    with pytest.raises(KeyError):
        pg.count(["a9.h0"])


def test_parameter_groups_partition_every_element(fresh):
    """Zero every parameter, add 1 through every part: each element must end at exactly 1."""
    params = list(fresh.backend.parameters())
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.zero_()
            for g in fresh.parameter_groups().groups:
                for part in g.parts:
                    part.view().add_(1.0)
            assert all(bool((p == 1).all()) for p in params)
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


def test_head_slices_are_the_heads_weights(fresh):
    """Zeroing a head's W_O slice == zeroing its z; zeroing kv group g's V parts == zeroing z of its heads."""
    m, pg = fresh, fresh.parameter_groups()
    toks = m.to_tokens(PROMPTS[0])
    z = m.hook_name("head_z", 1)
    G = m.n_heads // m.n_kv_heads
    cases = [
        ([p for p in pg.group("a1.h2").parts if p.role == "W_O"], [2]),
        ([p for p in pg.group("a1.kv1").parts if p.role in ("W_V", "b_V")], list(range(G, 2 * G))),
    ]
    for parts, heads in cases:
        saved = [p.view().clone() for p in parts]
        with torch.no_grad():
            for p in parts:
                p.view().zero_()
            edited = m.logits(toks)
            for p, s in zip(parts, saved):
                p.view().copy_(s)
            hooked = m.logits(toks, hooks=[(z, H.set_to(0.0, head=heads))])
        _close(edited, hooked)
        assert (hooked - m.logits(toks)).abs().max() > 1e-4
