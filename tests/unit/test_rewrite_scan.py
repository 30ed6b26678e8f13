"""The rewrite draw of the fidelity test (tlcap.data.rewrites / rewrite_scan): the batched, staged,
cached draw equals a one-fact-at-a-time, one-query-at-a-time draw, and the cache replaces the scan."""

from __future__ import annotations

import random

import pytest
import torch

from tlcap.data.pararel import iter_facts
from tlcap.data.rewrite_scan import RewriteScan, fact_outcomes, scan_cache_path
from tlcap.data.rewrites import RewriteFact, _new_object, rewrite_facts
from tlcap.data.sample import DataWarning
from tlcap.errors import InvalidConfigError, TargetTokenizationError

RELS = ["P36", "P37", "P1376"]
TOP_K = 20000  # on the tiny random llama: about a third of P36's / P1376's facts pass, a tenth of P37's


def slow_draw(model, n, *, n_rewrites=5, relations=RELS, known_top_k=TOP_K, seed=0, max_scan=300, max_misses=None):
    """The draw as specified: round-robin, one fact at a time, all its queries asked."""
    pools = {}
    for r in relations:
        pool = list(iter_facts(None, r, min_queries=n_rewrites))
        random.Random(f"{seed}:{r}").shuffle(pool)
        pools[r] = pool[:max_scan]
    rng, objs, out = random.Random(seed), {}, []
    while pools and len(out) < n:
        for r in list(pools):
            if len(out) >= n:
                break
            misses = 0
            while pools[r]:
                f = pools[r].pop(0)
                asked = []
                for q in f.queries:
                    try:
                        asked.append((q, model.target_ids(q, f.target, single_token=True)[0]))
                    except TargetTokenizationError:
                        continue
                qs = []
                if asked:
                    with torch.no_grad():  # the fact's queries in one padded forward (the draw before batching)
                        logits = model.last_logits(model.encode_batch([q for q, _ in asked]))
                    qs = [q for (q, t), row in zip(asked, logits) if int((row > row[t]).sum()) < known_top_k]
                if len(qs) >= n_rewrites:
                    out.append(RewriteFact(f.subject, f.target, tuple(qs[:n_rewrites]), f.relation, f.uuid,
                                           _new_object(None, f.relation, f.object, rng, objs)))
                    break
                misses += 1
                if max_misses is not None and misses >= max_misses:
                    pools[r] = []
            if not pools[r]:
                del pools[r]
    return out


@pytest.mark.parametrize("max_misses", [None, 4])
def test_batched_draw_equals_one_fact_at_a_time(tiny_llama, tmp_path, max_misses):
    slow = slow_draw(tiny_llama, 12, max_scan=30, max_misses=max_misses)
    fast = rewrite_facts(tiny_llama, 12, relations=RELS, known_top_k=TOP_K, max_scan=30, max_misses=max_misses,
                         chunk=16, scan_cache=tmp_path, progress=False)
    assert fast == slow
    # the draw really exercises both branches: facts kept, and facts that fail (P37 passes rarely)
    assert {f.relation for f in fast} == ({"P36", "P1376"} if max_misses else {"P36", "P37", "P1376"})
    assert all(len(f.rewrites) == 5 and f.target_new for f in fast)
    assert len(fast) == 12 if max_misses is None else len(fast) < 12  # the cut ended relations early


def test_staged_outcomes_equal_all_queries_asked(tiny_llama):
    facts = list(iter_facts(None, "P36", min_queries=5))[:12]
    asked = []
    real = tiny_llama.last_logits

    def counting(tokens, *a, **k):
        asked.append(tokens.tokens.shape[0])
        return real(tokens, *a, **k)

    staged = fact_outcomes(tiny_llama, facts, 5, TOP_K, True, chunk=8)
    ref = []
    for f in facts:  # every query asked, then the first 5 that pass
        qs = []
        for q in f.queries:
            try:
                tid = tiny_llama.target_ids(q, f.target, single_token=True)[0]
            except TargetTokenizationError:
                continue
            logits = tiny_llama.last_logits(tiny_llama.to_tokens(q))[0]
            if int((logits > logits[tid]).sum()) < TOP_K:
                qs.append(q)
        ref.append(tuple(qs[:5]) if len(qs) >= 5 else ())
    assert staged == ref and any(staged) and not all(staged)
    tiny_llama.last_logits = counting
    try:
        fact_outcomes(tiny_llama, facts, 5, TOP_K, True, chunk=8)
    finally:
        del tiny_llama.last_logits
    assert max(asked) <= 8 and sum(asked) < sum(len(f.queries) for f in facts)  # stops asking decided facts


def test_scan_cache_replaces_the_scan_and_grows(tiny_llama, tmp_path, monkeypatch):
    opts = dict(relations=RELS, known_top_k=TOP_K, max_scan=40, chunk=16, scan_cache=tmp_path, progress=False)
    small = rewrite_facts(tiny_llama, 4, **opts)
    path = scan_cache_path(tiny_llama, 5, TOP_K, True, 0, tmp_path)
    assert path.exists()

    def no_forward(*a, **k):
        raise AssertionError("a cached outcome was recomputed")

    monkeypatch.setattr(tiny_llama, "last_logits", no_forward)
    assert rewrite_facts(tiny_llama, 4, **opts) == small  # every outcome from the cache
    monkeypatch.undo()
    big = rewrite_facts(tiny_llama, 10, **opts)  # scans on from where the cache stops
    assert big[:4] == small and big == rewrite_facts(tiny_llama, 10, **{**opts, "scan_cache": False})
    scan = RewriteScan(tiny_llama, RELS, n_rewrites=5, known_top_k=TOP_K, single_token=True, cache=tmp_path)
    frame = scan.to_frame().set_index("relation")
    assert (frame["from_cache"] > 0).all() and (frame["scanned_now"] == 0).all()
    other = RewriteScan(tiny_llama, RELS, n_rewrites=5, known_top_k=TOP_K, single_token=True, seed=1, cache=tmp_path)
    assert (other.to_frame()["from_cache"] == 0).all()  # another seed: another fact order, another file


def test_fewer_facts_than_asked_warns_with_rates(tiny_llama, tmp_path):
    with pytest.warns(DataWarning, match=r"30 rewrite facts requested, \d+ found .*P37 \d+/\d+"):
        facts = rewrite_facts(tiny_llama, 30, relations=RELS, known_top_k=TOP_K, max_scan=10, scan_cache=False,
                              progress=False)
    assert 0 < len(facts) < 30


@pytest.mark.parametrize("opts, message", [
    ({"max_scan": 0}, r"max_scan \(--max-scan\) must be >= 1, got 0"),
    ({"max_misses": 0}, r"max_misses \(--max-misses\) must be >= 1, got 0"),
    ({"n_rewrites": 1}, r"n_rewrites \(--n-rewrites\) must be >= 2, got 1"),
])
def test_draw_option_errors(tiny_llama, opts, message):
    with pytest.raises(InvalidConfigError, match=message):
        rewrite_facts(tiny_llama, 3, scan_cache=False, progress=False, **opts)
