"""MLP-neuron nodes: EAP neuron scores vs patching every neuron alone (slow reference), KN overlap arithmetic."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

from tlcap.locate.circuits import CircuitDataset, CircuitItem, make_task
from tlcap.locate.circuits.neurons import NeuronScores, neuron_attribution, neuron_overlap
from tlcap.metrics.sets import NeuronSet
from tlcap.models import make_gpt2, make_llama
from tlcap.runtime import hooks as H

PROMPT, TARGET, CORRUPT = "The capital of France is", " Paris", "The capital of Italy is"


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_neuron_scores_agree_with_patching_each_neuron(arch):
    """Float64 tiny model, corrupted subject 5% of the way from ' France' to ' Italy' (the linear regime)."""
    m = make_gpt2("tiny", seed=1) if arch == "gpt2" else make_llama(seed=1)
    m.backend.to(torch.float64)
    a, b = m.encode(" France")[0], m.encode(" Italy")[0]
    with torch.no_grad():
        m.W_E[b] = m.W_E[a] + 0.05 * (m.W_E[b] - m.W_E[a])
    ns = neuron_attribution(m, CircuitDataset((CircuitItem(PROMPT, TARGET, CORRUPT),), "one"))
    task = make_task(m, PROMPT, TARGET, CORRUPT)
    names = [m.hook_name("mlp_post", layer) for layer in range(m.n_layers)]
    _, cache = m.run_with_cache(task.corrupt, names)
    base = float(task.metric_rows(m.logits(task.clean))[0])
    d = m.d_mlp
    actual = torch.zeros(m.n_layers, d, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    for layer, name in enumerate(names):  # row j patches neuron j of this layer to its corrupted value, alone
        cor = cache[name][0]

        def delta(act, cor=cor):
            return eye[:, None, :] * (cor[None] - act)

        lg = m.logits(task.clean.expand(d, -1), hooks=[(name, H.add_computed(delta))])
        actual[layer] = task.metric_rows(lg, torch.zeros(d, dtype=torch.long)).double() - base
    est, act = ns.scores.double().flatten(), actual.flatten()
    rho = spearmanr(est.numpy(), act.numpy()).statistic
    big = act.abs() > 1e-3 * act.abs().max()
    sign = (torch.sign(est) == torch.sign(act))[big].float().mean().item()
    err = ((est - act).norm() / act.norm()).item()
    print(f"{arch}: spearman {rho:.4f}, sign {sign:.3f} on {int(big.sum())}/{act.numel()} neurons, rel err {err:.4f}")
    assert rho > 0.99 and sign == 1.0 and err < 0.05


def test_overlap_counts_by_hand():
    s = torch.zeros(3, 4)
    s[0, 1], s[1, 2], s[2, 3], s[2, 0] = 5.0, -4.0, 3.0, 0.5
    ns = NeuronScores(scores=s)
    kn = NeuronSet.from_list([(1, 2), (2, 0), (0, 0)], (3, 4))
    o = neuron_overlap(ns, kn)  # top-3: (0,1), (1,2), (2,3) -> shares (1,2)
    assert (o["k"], o["n_kn"], o["overlap"], o["shared"]) == (3, 3, 1, [[1, 2]])
    assert o["jaccard"] == pytest.approx(1 / 5) and o["kn_recall"] == pytest.approx(1 / 3)
    assert o["chance_overlap"] == pytest.approx(3 * 3 / 12)
    o2 = neuron_overlap(ns, kn, k=2, layers=[2])  # only layer 2: (2,3), (2,0)
    assert o2["shared"] == [[2, 0]] and o2["chance_overlap"] == pytest.approx(2 * 3 / 4)
