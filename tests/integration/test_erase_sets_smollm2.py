"""Many neuron sets per forward pass on the real SmolLM2-135M (Llama, GQA): the batched rows, each with its own
set's activations zeroed, equal erasing that set's down-projection rows and running one set at a time."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]  # one_thread: tests/conftest.py




def _sets(m):
    from tlcap.metrics.sets import NeuronSet

    g = torch.Generator().manual_seed(0)
    loc = NeuronSet.from_mask(torch.rand(m.n_layers, m.d_mlp, generator=g) < 0.02)  # ~920 neurons in every layer
    return [NeuronSet((), loc.shape), loc, loc.random_like(seed=0)]


def test_batched_sets_equal_weight_erase_on_smollm2(smollm2):
    from tlcap.data.tasks import load_task
    from tlcap.intervene.set_rows import SetFactors
    from tlcap.intervene.weights import erase_neurons
    from tlcap.metrics.accuracy import choice_logprobs, task_accuracy
    from tlcap.metrics.set_scores import erased_scores, teacher_forced

    m = smollm2
    sets = _sets(m)
    emo = load_task("emotion", split="test", n=6, seed=0)
    labels = [" sadness", " joy", " love", " anger", " fear", " surprise"]
    ids = torch.tensor([m.encode(s.prompt + c)[-1] for s in emo[:1] for c in labels])  # one token each after "Emotion:"
    prompts = [m.encode(s.prompt) for s in emo]
    lp, _ = teacher_forced(m, SetFactors.of(m, sets), prompts, [[len(p) - 1] for p in prompts],
                           lambda lg, i: lg[:, 0].float().log_softmax(-1)[:, ids].sum(1))  # the instruction prefix is cached
    for k, s in enumerate(sets):
        with erase_neurons(m, s):
            ref = torch.stack([choice_logprobs(m, x.prompt, labels).sum() for x in emo]).double()
        torch.testing.assert_close(lp[k], ref, rtol=1e-4, atol=1e-3)
    assert (lp[1] - lp[0]).abs().max() > 0.1
    mbpp = load_task("mbpp", split="test", n=2, seed=0)
    sc = erased_scores(m, "mbpp", mbpp, sets, code_tokens=16)
    for k, s in enumerate(sets):
        with erase_neurons(m, s):
            assert sc.scores[k].tolist() == list(task_accuracy(m, "mbpp", mbpp, code_tokens=16).scores)
    assert sc.scores[0].min() > 0.2  # the unedited model predicts many reference tokens


def test_batched_perplexity_control_equals_weight_erase_on_smollm2(smollm2):
    from tlcap.data.wikitext import load_wikitext
    from tlcap.intervene.weights import erase_neurons
    from tlcap.metrics.perplexity import text_nll
    from tlcap.metrics.set_probs import erased_text_nll

    sets = _sets(smollm2)
    texts = load_wikitext(n_texts=2)
    nll, cnt = erased_text_nll(smollm2, texts, sets, max_tokens=64)
    for k, s in enumerate(sets):
        with erase_neurons(smollm2, s):
            ref, rc = text_nll(smollm2, texts, 64)
        torch.testing.assert_close(nll[k], ref, rtol=1e-5, atol=1e-3)
        assert torch.equal(cnt, rc)
    assert float(nll[1].sum()) > float(nll[0].sum()) + 1.0  # erasing 2 % of every layer costs likelihood
