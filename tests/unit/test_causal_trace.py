"""Causal tracing on the tiny random models: exact reproduction of clean/corrupted runs and
equality of the batched trace with the one-cell-at-a-time reference."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tlcap.errors import InvalidConfigError, UnknownNameError
from tlcap.locate.causal_trace import (
    KINDS,
    TOKEN_CLASSES,
    CausalTrace,
    DatasetTrace,
    SubjectNotFoundError,
    TraceConfig,
    causal_trace,
    known_subjects,
    late_chunks,
    prepare_trace,
    subject_noise_std,
    subject_span,
    token_classes,
    trace_batched,
    trace_dataset,
    trace_reference,
    window_layers,
)
from tlcap.locate.subjects import SubjectWarning
from tlcap.results import load_result

pytestmark = pytest.mark.heavy  # seconds per module: runs after the fast gate (make unit)

PROMPT = "The capital of France is"
SUBJECT = "capital of France"


def _close(a, b):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), rtol=1e-4, atol=1e-10)


def test_subject_span_from_offsets(tiny_gpt2):
    toks = tiny_gpt2.to_str_tokens(tiny_gpt2.to_tokens(PROMPT))
    s0, s1 = subject_span(tiny_gpt2, PROMPT, SUBJECT)
    assert "".join(toks[s0:s1]).strip() == SUBJECT
    assert subject_span(tiny_gpt2, PROMPT, "France") == (3, 4)
    with pytest.raises(SubjectNotFoundError):
        subject_span(tiny_gpt2, PROMPT, "Germany")


def test_window_layers_match_rome():
    assert window_layers(0, 30, 10) == list(range(0, 5))
    assert window_layers(15, 30, 10) == list(range(10, 20))
    assert window_layers(29, 30, 10) == list(range(24, 30))
    assert window_layers(3, 30, 1) == [3]


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_restore_all_is_clean_and_none_is_corrupted(fixture, request):
    model = request.getfixturevalue(fixture)
    setup = prepare_trace(model, PROMPT, SUBJECT, samples=3, window=2)
    T, L = setup.n_tokens, model.n_layers
    # Restoring every residual state reproduces the clean run exactly (up to float error).
    every = [("resid", t, l) for t in range(T) for l in range(L)]
    assert _close(setup.restored_prob(every), setup.clean_prob)
    # Restoring no state is the corrupted run, and corruption really changes the output.
    assert setup.restored_prob([]) == setup.corrupted_prob
    assert abs(setup.corrupted_prob - setup.clean_prob) > 1e-4 * setup.clean_prob
    # The last token's residual at the last layer alone determines the output.
    assert _close(setup.restored_prob([("resid", T - 1, L - 1)]), setup.clean_prob)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_batched_equals_per_cell_reference(fixture, request):
    model = request.getfixturevalue(fixture)
    kw = dict(samples=3, window=2, seed=1)
    ref = trace_reference(model, PROMPT, SUBJECT, **kw)
    # Small batches force several chunks per token and the corrupted-prefix cache.
    fast = causal_trace(model, PROMPT, SUBJECT, batch_rows=9, **kw)
    assert fast.scores.shape == (3, len(fast.tokens), model.n_layers)
    assert not torch.isnan(fast.scores).any()
    assert _close(fast.scores, ref.scores), (fast.scores - ref.scores).abs().max()
    assert fast.clean_prob == ref.clean_prob and fast.corrupted_prob == ref.corrupted_prob
    # Restoring the final-layer residual at the last token gives the clean probability.
    assert _close(fast.score("resid")[-1, -1], fast.clean_prob)


def test_auto_batch_is_the_default_and_halves_on_out_of_memory(tiny_llama, monkeypatch):
    # batch_rows="auto" (the default) equals a fixed batch; an injected out-of-memory above 4 rows
    # makes it rerun at half the size until the forwards fit, with the same scores
    assert TraceConfig().batch_rows == "auto"
    setup = prepare_trace(tiny_llama, PROMPT, SUBJECT, samples=2, window=1, seed=2)
    fixed = trace_batched(setup, batch_rows=4)
    assert torch.equal(trace_batched(setup), trace_batched(setup, batch_rows=10**6))  # all rows fit: one size
    cont, last, seen = tiny_llama.continue_rows, tiny_llama.last_logits, []

    def check(rows: int) -> None:
        seen.append(rows)
        if rows > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    def fake_cont(tokens, prefix, counts, *args, **kwargs):
        check(int(counts.sum()))
        return cont(tokens, prefix, counts, *args, **kwargs)

    def fake_last(tokens, *args, **kwargs):
        check(int(tokens.shape[0]))
        return last(tokens, *args, **kwargs)

    monkeypatch.setattr(tiny_llama, "continue_rows", fake_cont)
    monkeypatch.setattr(tiny_llama, "last_logits", fake_last)
    auto = trace_batched(setup)
    monkeypatch.undo()
    assert max(seen) > 4 and _close(auto, fixed), (auto - fixed).abs().max()
    big = TraceConfig(batch_rows="auto", max_memory="64KiB")  # a budget of a few rows still traces every cell
    assert _close(causal_trace(tiny_llama, PROMPT, SUBJECT, config=big, samples=2, window=1, seed=2).scores, fixed)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
@pytest.mark.parametrize("prompt,subject", [("France is where Paris is", "France"), (PROMPT, SUBJECT)])
def test_late_expansion_equals_full_runs(fixture, prompt, subject, request):
    # subject first and mid-prompt; window 1 so every cell's lowest restored layer is its own
    model = request.getfixturevalue(fixture)
    setup = prepare_trace(model, prompt, subject, samples=2, window=1, seed=2, warn=False)
    late = trace_batched(setup, batch_rows=6, late_expand=True)
    full = trace_batched(setup, batch_rows=6, late_expand=False)
    assert not torch.isnan(late).any()
    assert _close(late, full), (late - full).abs().max()
    cell = ("mlp", setup.subject_range[1] - 1, 1)  # the last subject token, layer 1: run from layer 1
    assert _close(late[1, cell[1], 1], setup.restored_prob([cell]))


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
@pytest.mark.parametrize("prompt,subject", [("France is where Paris is", "France"), (PROMPT, SUBJECT)])
def test_traced_token_rows_equal_the_full_trace(fixture, prompt, subject, request):
    model = request.getfixturevalue(fixture)
    kw = dict(kinds=("mlp", "resid"), samples=3, window=2, seed=1, warn=False)
    full = causal_trace(model, prompt, subject, **kw)
    last = full.subject_range[1] - 1
    one = causal_trace(model, prompt, subject, tokens="last_subject", **kw)
    assert _close(one.scores[:, last], full.scores[:, last])
    rest = [t for t in range(len(full.tokens)) if t != last]
    assert torch.isnan(one.scores[:, rest]).all()
    assert one.top_layers(2) == full.top_layers(2)
    assert one.summary()["top_layers"] == full.summary()["top_layers"]
    subj = causal_trace(model, prompt, subject, tokens="subject", **kw)
    s0, s1 = full.subject_range
    assert _close(subj.scores[:, s0:s1], full.scores[:, s0:s1]) and torch.isnan(subj.scores[:, s1:]).all()
    ends = causal_trace(model, prompt, subject, tokens=(0, -1), **kw)  # a pre-subject row is the corrupted run
    assert _close(ends.scores[:, [0, -1]], full.scores[:, [0, -1]])
    ref = trace_reference(model, prompt, subject, config=TraceConfig(tokens="last_subject"), kinds=("mlp", "resid"),
                          samples=3, window=2, seed=1, warn=False)
    assert _close(ref.scores[:, last], one.scores[:, last]) and torch.isnan(ref.scores[:, rest]).all()


def test_traced_token_rows_errors(tiny_gpt2):
    with pytest.raises(InvalidConfigError, match="tokens"):
        TraceConfig(tokens="first")
    with pytest.raises(InvalidConfigError, match="outside the prompt"):
        causal_trace(tiny_gpt2, PROMPT, SUBJECT, tokens=(40,), samples=1)
    tr = causal_trace(tiny_gpt2, PROMPT, SUBJECT, tokens=(-1,), samples=1, kinds=("mlp",))
    with pytest.raises(InvalidConfigError, match="was not traced"):
        tr.top_layers(3, token="last_subject")
    assert tr.summary()["top_layers_token"] == "max"
    with pytest.raises(InvalidConfigError, match="dataset mode"):
        trace_dataset(tiny_gpt2, [{"prompt": PROMPT, "subject": SUBJECT}], tokens="last_subject")


def test_late_chunks_minimise_the_layer_work():
    # one batch of 5 cells from layer 0: 5·10 + 0 + 10 = 60; cell 0 alone, then 4 cells from layer 8:
    # (10 + 0 + 10) + (4·2 + 8 + 10) = 46
    assert late_chunks([0, 8, 8, 8, 8], k_max=5, rows=1, n_layers=10) == [(0, 1), (1, 5)]
    # equal layers: as few batches as k_max allows, covering every cell in order
    ch = late_chunks([3, 3, 3, 3, 3], k_max=2, rows=4, n_layers=10)
    assert len(ch) == 3 and ch[0][0] == 0 and ch[-1][1] == 5 and all(b - a <= 2 for a, b in ch)
    assert all(ch[i][1] == ch[i + 1][0] for i in range(2))


def test_no_prefix_reuse_same_result_and_result_roundtrip(tiny_llama, tmp_path):
    kw = dict(kinds=("resid", "mlp"), layers=[1], samples=2, window=2)
    a = causal_trace(tiny_llama, PROMPT, SUBJECT, **kw)
    b = causal_trace(tiny_llama, PROMPT, SUBJECT, prefix_reuse=False, **kw)
    assert _close(a.scores, b.scores)
    assert a.scores.shape == (2, len(a.tokens), 1)
    a.save(tmp_path / "r")
    c = CausalTrace.load(tmp_path / "r")
    assert torch.equal(c.scores, a.scores) and c.subject_range == a.subject_range
    s = a.summary()
    assert set(s["scores"]) == set(KINDS) and s["scores"]["attn"] is None
    assert len(s["scores"]["resid"]) == len(a.tokens) and len(s["scores"]["resid"][0]) == 1
    assert s["top_layers"] == [1]
    df = a.to_frame()
    assert len(df) == 2 * len(a.tokens)
    fig = a.figure()
    assert len(fig.data) == 2


def test_token_classes():
    c = token_classes(8, (1, 4))
    assert c == {"first subject": [1], "middle subject": [2], "last subject": [3], "first subsequent": [4],
                 "further": [5, 6], "last": [7]}
    c1 = token_classes(3, (0, 1))
    assert c1["first subject"] == c1["last subject"] == [0] and c1["middle subject"] == [] and c1["last"] == [2]


def test_trace_config_fails_at_construction_before_any_forward(tiny_gpt2, monkeypatch):
    for kw, msg in [
        ({"samples": 0}, "samples (--samples) must be >= 1, got 0"),
        ({"window": 0}, "window (--window) must be >= 1, got 0"),
        ({"noise_std": 0.0}, "noise_std (--noise) must be > 0, got 0"),
        ({"kinds": ("resid", "foo")}, "unknown kind 'foo' (--kinds); choose one of: resid, mlp, attn"),
        ({"kinds": ()}, "kinds (--kinds) must hold at least 1 item, got 0"),
        ({"layers": (0, -1)}, "layers[1] (--layers) must be >= 0, got -1"),
        ({"batch_rows": 0}, "batch_rows (--batch-rows) must be >= 1, got 0"),
    ]:
        with pytest.raises(InvalidConfigError) as info:
            TraceConfig(**kw)
        assert str(info.value) == msg, kw
    cfg = TraceConfig(kinds=["mlp"], layers=[1, 0])
    assert cfg.kinds == ("mlp",) and cfg.layers == (1, 0)
    assert TraceConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg

    def no_forward(*a, **k):
        raise AssertionError("a forward pass ran before the layers were checked")

    monkeypatch.setattr(tiny_gpt2, "run_with_cache", no_forward)
    with pytest.raises(InvalidConfigError) as info:
        causal_trace(tiny_gpt2, PROMPT, SUBJECT, layers=[1, 2])
    assert str(info.value) == "layers (--layers) [2] out of range for gpt2-tiny-random-seed0 (2 layers: 0..1)"
    with pytest.raises(UnknownNameError):
        causal_trace(tiny_gpt2, PROMPT, SUBJECT, kinds=("mlpp",))


def test_results_meet_the_contract(tiny_llama, tmp_path):
    cfg = TraceConfig(kinds=("mlp", "attn"), samples=2, window=2, seed=3)
    tr = causal_trace(tiny_llama, PROMPT, "France", config=cfg)
    assert tr.provenance.config == cfg.to_dict() and tr.provenance.seed == 3
    assert tr.provenance.model_name == tiny_llama.name
    s = tr.summary()
    assert s["mode"] == "single" and s["model"] == tiny_llama.name and s["scores"]["resid"] is None
    df = tr.to_frame()
    assert list(df.columns) == ["kind", "token_idx", "token", "layer", "score", "effect"]
    assert len(df) == 2 * len(tr.tokens) * tiny_llama.n_layers
    # effect = score - corrupted, row by row
    assert (df["score"] - df["effect"]).sub(tr.corrupted_prob).abs().max() < 1e-6
    back = load_result(tr.save(tmp_path / "t"))
    assert isinstance(back, CausalTrace) and torch.equal(back.scores, tr.scores) and back.provenance.seed == 3
    assert back.tokens == tr.tokens and back.summary() == s

    facts = [{"prompt": PROMPT, "subject": "France"}, {"prompt": "Paris is the capital of", "subject": "Paris"}]
    ds = trace_dataset(tiny_llama, facts, config=cfg)
    s = ds.summary()
    assert s["mode"] == "dataset" and s["n_facts"] == 2 and ds.provenance.config["kinds"] == ["mlp", "attn"]
    df = ds.to_frame()
    assert list(df.columns) == ["kind", "token_class", "layer", "effect", "n_facts"]
    assert len(df) == 2 * len(TOKEN_CLASSES) * tiny_llama.n_layers
    # the per-class average is the mean over facts of each fact's class mean (recomputed here)
    trs = [causal_trace(tiny_llama, f["prompt"], f["subject"], config=cfg.replace(noise_std=ds.noise_std, seed=3 + i))
           for i, f in enumerate(facts)]
    last = torch.stack([t.effect("mlp")[t.subject_range[1] - 1] for t in trs]).mean(0)
    assert torch.allclose(ds.effect("mlp")[TOKEN_CLASSES.index("last subject")], last, atol=1e-6)
    back = load_result(ds.save(tmp_path / "d"))
    assert isinstance(back, DatasetTrace) and torch.equal(back.counts, ds.counts)
    assert json.dumps(back.summary()) == json.dumps(s)  # NaN for the class no fact has
    assert len(ds.figure().data) == 2 and len(ds.line_figure().data) == 2


def test_noise_is_rome_subject_embedding_std(tiny_gpt2):
    """ν = 3 × std of the subjects' token embeddings (ROME's collect_embedding_std); checked to fail
    before the fix (ν was 3 × std of all of W_E)."""
    W = tiny_gpt2.W_E.detach().float()
    subjects = ["France", "The Eiffel Tower", "France"]  # repeats count, as in ROME
    ids = [i for s in subjects for i in tiny_gpt2.encode(s, prepend_bos=False)]
    assert subject_noise_std(tiny_gpt2, subjects) == pytest.approx(3 * float(W[ids].std()), rel=1e-6)
    # one fact: the subjects of ROME's known facts, as ROME's notebook
    known = [i for s in known_subjects() for i in tiny_gpt2.encode(s, prepend_bos=False)]
    setup = prepare_trace(tiny_gpt2, PROMPT, SUBJECT, samples=2, window=1)
    assert setup.noise_std == pytest.approx(3 * float(W[known].std()), rel=1e-6)
    assert setup.noise_std != pytest.approx(3 * float(W.std()), rel=1e-3)
    # the literal W_E variant is kept
    emb = prepare_trace(tiny_gpt2, PROMPT, SUBJECT, samples=2, window=1, noise_from="embedding", noise_factor=2.0)
    assert emb.noise_std == pytest.approx(2 * float(W.std()), rel=1e-6)
    # dataset mode: the traced facts' subjects
    facts = [{"prompt": PROMPT, "subject": "France"}, {"prompt": "Paris is the capital of", "subject": "Paris"}]
    ds = trace_dataset(tiny_gpt2, facts, samples=1, window=1, kinds=("mlp",))
    assert ds.noise_std == pytest.approx(subject_noise_std(tiny_gpt2, ["France", "Paris"]), rel=1e-9)


def test_bos_prepends_the_token_and_the_sink_warning(tiny_llama):
    """bos=True: the BOS is token 0, the subject moves to 1, the clean run is the model's on the
    BOS-prefixed prompt; a subject at position 0 without it warns (dataset mode counts)."""
    prompt, subject = "France is a country in", "France"
    with pytest.warns(SubjectWarning, match=r"subject 'France' starts the prompt .* pass bos=True \(--bos\)"):
        plain = causal_trace(tiny_llama, prompt, subject, samples=2, window=1, kinds=("mlp",))
    assert plain.subject_range == (0, 1) and plain.subject_at_start and not plain.bos
    with warnings.catch_warnings():
        warnings.simplefilter("error", SubjectWarning)
        tr = causal_trace(tiny_llama, prompt, subject, samples=2, window=1, kinds=("mlp",), bos=True)
    bos_id = tiny_llama.special_token_id("bos")
    bos_id = tiny_llama.special_token_id("eos") if bos_id is None else bos_id
    ids = tiny_llama.encode(prompt, prepend_bos=True)
    assert ids[0] == bos_id and len(tr.tokens) == len(plain.tokens) + 1
    assert tr.subject_range == (1, 2) and not tr.subject_at_start and tr.bos
    probs = tiny_llama.last_logits(tiny_llama.encode_batch([ids]))[0].float().softmax(-1)
    assert tr.clean_prob == pytest.approx(float(probs[tr.target_id]), rel=1e-5)
    assert tr.summary()["bos"] is True and tr.summary()["subject_at_start"] is False
    facts = [{"prompt": prompt, "subject": subject}, {"prompt": PROMPT, "subject": "France"}]
    with pytest.warns(SubjectWarning, match=r"1 of 2 facts have the subject at the start"):
        ds = trace_dataset(tiny_llama, facts, samples=1, window=1, kinds=("mlp",))
    assert ds.n_subject_at_start == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", SubjectWarning)
        assert trace_dataset(tiny_llama, facts, samples=1, window=1, kinds=("mlp",), bos=True).n_subject_at_start == 0
