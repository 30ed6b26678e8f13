"""Host round trips: the counter (:mod:`tlcap.runtime.host_syncs`) on hand-built cases, and the batched methods'
round trips per call, which must not grow with the facts or the batches of a call (on a GPU each one drains the
launch queue)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from tlcap.attribution import integrated_gradients_facts
from tlcap.attribution.amig import amig_facts
from tlcap.attribution.dataset import score_dataset
from tlcap.data.sample import Sample
from tlcap.locate.causal_trace import causal_trace_facts
from tlcap.models.unembedding import _readout_linear
from tlcap.runtime import device
from tlcap.runtime.fixed import once, weights_fixed
from tlcap.runtime.host_syncs import count_host_syncs
from tlcap.runtime.run_control import RunControl

FACTS = [("The capital of France is", " Paris", "France"), ("Michael Jordan plays the sport of", " basketball", "Michael Jordan"),
         ("The official language of Italy is", " Italian", "Italy"), ("Toko Yasuda plays the", " guitar", "Toko Yasuda")]


def test_counter_counts_reads_of_device_values_only(tiny_gpt2):
    m = tiny_gpt2
    host = torch.arange(6.0)
    with count_host_syncs(m) as s:
        logits = m.forward(torch.tensor([[1, 2, 3]]))[0]
        p = logits[-1].softmax(-1)
        float(p[0]), int(p.argmax()), bool((p > 0).all())           # three scalar reads
        p.tolist()                                                   # a copy to the host
        on_host = p.cpu()                                            # another
        float(on_host[1]), on_host.tolist(), on_host.numpy()         # the host's copy: free
        p[p > p.mean()], (p > 0.5).nonzero(), torch.unique(logits)   # three data-dependent shapes
        float(host.sum()), host.tolist(), host[host > 2], host.nonzero()  # host values: free
    assert s.by_kind == {"scalar": 3, "to_host": 2, "shape:index": 1, "shape:nonzero": 1, "shape:_unique2": 1}
    assert s.total == 8
    here = [site for site in s.by_site if "test_host_syncs.py" in site]
    assert here and sum(s.by_site[x] for x in here) == 8  # attributed to this file's lines
    assert "host round trips: 8" in s.summary()


def test_counter_restores_the_tensor_methods_on_error(tiny_gpt2):
    before = {n: getattr(torch.Tensor, n) for n in ("cpu", "tolist", "numpy")}
    with pytest.raises(RuntimeError, match="boom"):
        with count_host_syncs(tiny_gpt2):
            raise RuntimeError("boom")
    assert {n: getattr(torch.Tensor, n) for n in before} == before
    with pytest.raises(TypeError, match="nn.Module"):
        with count_host_syncs(object()):
            pass


def test_once_computes_once_per_block_and_every_time_outside():
    calls = []

    def value():
        calls.append(1)
        return len(calls)

    assert once("k", value) == 1 and once("k", value) == 2  # no block: every call
    with weights_fixed():
        assert [once("k", value), once("k", value), once("j", value)] == [3, 3, 4]
        with weights_fixed():  # nested: the outer block's values
            assert once("k", value) == 3
    assert once("k", value) == 5


def test_readout_bias_is_read_again_outside_a_block(tiny_gpt2):
    """The bias check is cached only inside a block: an edit between two calls is seen."""
    bias = _readout_linear(tiny_gpt2)
    if bias is None:
        pytest.fail("tiny GPT-2 should have a plain linear read-out")
    head = tiny_gpt2.hf_model.get_output_embeddings()
    head = getattr(head, "original_component", head)
    assert head.bias is not None and not bool(head.bias.any()) and bias[1] is None  # the bridge's zero bias
    old = head.bias.data.clone()
    try:
        with weights_fixed():
            assert _readout_linear(tiny_gpt2)[1] is None
            head.bias.data[0] = 1.0  # an edit inside a block is not seen (documented: do not edit in one)
            assert _readout_linear(tiny_gpt2)[1] is None
        assert _readout_linear(tiny_gpt2)[1] is head.bias  # outside: read again
    finally:
        head.bias.data.copy_(old)


@pytest.fixture()
def accelerator_path():
    """The code path an accelerator runs (the samples' clean forwards as one padded pass)."""
    with mock.patch.object(device, "one_pass_default", lambda m: True):
        yield


def _count(model, fn):
    with count_host_syncs(model) as s:
        fn()
    return s


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama"])
def test_kn_over_facts_round_trips_do_not_grow_with_facts_or_batches(request, name, accelerator_path):
    m = request.getfixturevalue(name)
    counts = {(k, b): _count(m, lambda k=k, b=b: integrated_gradients_facts(
        m, [(p, t) for p, t, _ in FACTS[:k]], steps=4, fact_batch=k, batch_rows=b)).total
        for k in (1, 4) for b in (8, 64)}
    # one copy each: the clean probabilities, the bias check, the baseline probabilities, the attribution, the
    # clean activations (before: two per fact and two per batch, benchmarks/results/host_syncs_before.json)
    assert counts == {(1, 8): 5, (1, 64): 5, (4, 8): 5, (4, 64): 5}


def test_other_batched_methods_round_trips_per_call(tiny_llama, accelerator_path):
    m = tiny_llama
    amig = {k: _count(m, lambda k=k: amig_facts(m, [(p, t) for p, t, _ in FACTS[:k]], steps=2, words="all",
                                               fact_batch=k, batch_rows=16)).total for k in (1, 3)}
    # per call, not per fact or per word length (before: one per length and per fact; then 8, with the one-step IG that
    # labelled the results)
    assert amig[1] == amig[3] == 4
    traces = {(k, b): _count(m, lambda k=k, b=b: causal_trace_facts(m, [(p, s, t) for p, t, s in FACTS[:k]], samples=2,
                                                                     fact_batch=k, batch_rows=b, warn=False))
              for k in (1, 3) for b in (6, 60)}
    for b in (6, 60):  # the facts' clean probabilities, ν, their corrupted probabilities and the cells' scores
        assert traces[(1, b)].total == traces[(3, b)].total == 4
    samples = [Sample(p, t, uid=str(i)) for i, (p, t, _) in enumerate(FACTS)]
    cnl = {k: _count(m, lambda k=k: score_dataset(m, samples[:k], steps=3, sample_batch=k, batch_rows=8,
                                                  run=RunControl(progress=False))).total for k in (2, 3)}
    assert cnl[2] == cnl[3] == 4  # (one sample alone runs the one-fact path: 5, as KN above)
