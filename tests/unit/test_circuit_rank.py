"""The target's rank under ties: a degenerate circuit (all logits equal) must not count as a hit."""

from __future__ import annotations

import torch

from tlcap.locate.circuits import make_task


def test_rank_counts_ties_against_the_target(tiny_gpt2):
    task = make_task(tiny_gpt2, "The capital of France is", " Paris", None)
    n_pos = task.clean.shape[1]
    tid = int(task.target_ids[0, 0])
    vocab = tiny_gpt2.cfg.d_vocab
    flat = torch.zeros(1, n_pos, vocab)  # e.g. no circuit path reaches the logits: every logit equal
    tied = flat.clone()
    tied[..., tid] = 1.0
    tied[..., (tid + 1) % vocab] = 1.0  # one other token exactly as high as the target
    top = flat.clone()
    top[..., tid] = 1.0
    ranks = [int(task.target_stats(x)["rank"][0]) for x in (flat, tied, top)]
    assert ranks == [vocab, 2, 1]
