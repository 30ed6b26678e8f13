"""QL Table 1's per-method KN selection (issue 10 item 8): AMIG's eq. 18 word sum and eq. 19 threshold."""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution.amig import amig, eos_baselines, word_attributions
from tlcap.attribution.quadrature import quadrature
from tlcap.data.pararel import Fact
from tlcap.errors import InvalidConfigError, UnknownNameError
from tlcap.experiments.ql import FactKNs, QLConfig
from tlcap.locate.selection import absolute_select, method_select
from tlcap.runtime import hooks as H

PROMPT, TARGET = "The capital of France is", " Paris"
RULE = "gauss_legendre"  # exact enough at 4 points for the completeness check
# two queries' normalised scores, [query, layer, neuron]; max 0.5 and 0.12
SCORES = torch.tensor([[[0.5, 0.02, 0.005, 0.0], [0.12, 0.011, -0.3, 0.009]],
                       [[0.05, 0.2, 0.0, 0.0], [0.0, 0.03, 0.01, 0.004]]])


def _fk(method: str, **kw) -> FactKNs:
    f = Fact("P36", "France", "Paris", ("q0", "q1"))
    return FactKNs(SCORES, (0.9, 0.8), f, method, **kw)


def test_each_method_selects_with_its_own_rule():
    # AMIG, eq. 19: score > τ = 0.01 (hand: 0.5, 0.02, 0.12, 0.011 | 0.05, 0.2, 0.03)
    assert set(_fk("amig").sets()[0]) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert set(_fk("amig").sets()[1]) == {(0, 0), (0, 1), (1, 1)}
    assert set(_fk("amig", tau=0.04).sets()[1]) == {(0, 0), (0, 1)}
    # IG and SIG: score > 0.2 · max (hand: > 0.1 | > 0.04)
    for m in ("ig", "sig"):
        assert set(_fk(m).sets()[0]) == {(0, 0), (1, 0)}
        assert set(_fk(m).sets()[1]) == {(0, 0), (0, 1)}
    # the shared rule stays available, by name, for every method
    assert set(_fk("amig", selection="relative").sets()[0]) == {(0, 0), (1, 0)}
    assert set(method_select(SCORES[0], "amig", "relative", t=0.5)) == {(0, 0)}
    assert set(absolute_select(SCORES[0], 0.1)) == {(0, 0), (1, 0)}
    assert _fk("amig").summary()["selection"] == "own" and _fk("amig").summary()["tau"] == 0.01
    with pytest.raises(InvalidConfigError):
        absolute_select(SCORES[0], 0.0)
    with pytest.raises(UnknownNameError):
        method_select(SCORES[0], "amig", "top")
    with pytest.raises(UnknownNameError):
        QLConfig(selection="max")
    with pytest.raises(InvalidConfigError):
        QLConfig(amig_tau=-1.0)


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    """Equal up to ``rel`` of the larger one's largest entry (tiny-model attributions are ~1e-8)."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max()) <= rel * max(float(a.abs().max()), float(b.abs().max()))


def _slow_word_ig(model, pos: int, layer: int, steps: int) -> torch.Tensor:
    """Eq. 17 for word ``pos`` of one layer: full-sequence runs, one α at a time (no cache, no batching)."""
    toks = model.to_tokens(PROMPT)
    tid = model.target_ids(PROMPT, TARGET)[0]
    name = f"blocks.{layer}.mlp.hook_post"
    store: dict = {}
    model.logits(toks, hooks=[(name, H.record(store, "a"))])
    clean = store["a"][0, pos].float()
    base = eos_baselines(model, toks.shape[1])[pos, layer]
    alphas, weights = quadrature(steps, RULE)
    acc = torch.zeros_like(clean, dtype=torch.float64)
    for a, w in zip(alphas.tolist(), weights.tolist()):
        leaf = (base + a * (clean - base)).detach().requires_grad_(True)
        with torch.enable_grad():
            p = model.last_logits(toks, hooks=[(name, H.replace_rows(slice(None), pos, leaf[None]))])[0].softmax(-1)[tid]
            g = torch.autograd.grad(p, leaf)[0]
        acc += w * g.double()
    return (clean - base).double() * acc


def test_amig_sums_over_words_eq18(tiny_llama):
    m = tiny_llama
    n = len(m.encode(PROMPT))
    attr, p_base, p_clean = word_attributions(m, PROMPT, TARGET, steps=4, rule=RULE)
    assert attr.shape == (1, n, m.n_layers, m.d_mlp)
    assert float(attr[0, :-1, -1].abs().max()) == 0.0  # last layer, earlier words: no path to the answer
    # every word's IG against the slow full-sequence loop (the fast path is batched, prefix-cached and
    # late-expanded); a non-last word of the last layer cannot reach the answer, so use layer 0 for those
    for pos, layer in ((0, 0), (n // 2, 0), (n - 1, m.n_layers - 1)):
        ref = _slow_word_ig(m, pos, layer, 4)
        assert float(ref.abs().max()) > 0 and _close(attr[0, pos, layer], ref), (pos, layer)
    # per word and layer, completeness: Σ_j Attr_i ≈ P(clean) − P(word i of layer l at its eos baseline)
    assert _close(attr[0].double().sum(-1), p_clean[0].double() - p_base[0].double(), 1e-3)
    # eq. 18: the sum over words, normalised over all neurons; the last word alone is "last" mode's IG
    a = amig(m, PROMPT, TARGET, steps=4, rule=RULE)
    assert a.meta["words"] == "all" and a.meta["n_words"] == n and a.completeness_rel_error < 1e-3
    tot = attr[0].double().sum(0)
    assert _close(a.scores.double() * a.meta["denominator"], tot)
    if a.meta["normaliser"] == "sum":
        assert float(a.scores.double().sum()) == pytest.approx(1.0, rel=1e-5)
    last = amig(m, PROMPT, TARGET, steps=4, rule=RULE, words="last", normalize=False)
    assert _close(last.scores, attr[0, -1])
    assert not _close(tot, last.scores, 0.05)  # the other words count
    with pytest.raises(UnknownNameError):
        amig(m, PROMPT, TARGET, steps=2, words="first")
    with pytest.raises(InvalidConfigError):
        amig(m, PROMPT, TARGET, steps=2, method="joint")
