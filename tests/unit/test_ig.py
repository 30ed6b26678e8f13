"""Knowledge-neuron attribution: equality with the slow reference, completeness, determinism."""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution import integrated_gradients, quadrature, reference_ig
from tlcap.attribution.ig import NeuronAttribution
from tlcap.attribution.quadrature import RULES
from tlcap.locate import refine, sigma_mask, threshold_select, top_k_select
from tlcap.metrics import NeuronSet
from tlcap.results import load_result

PROMPT = "The capital of France is"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("rule", RULES)
def test_ig_equals_slow_reference(tiny_gpt2, rule):
    fast = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=6, rule=rule)
    slow = reference_ig(tiny_gpt2, PROMPT, " Paris", steps=6, rule=rule)
    assert _rel(fast.scores, slow) < 1e-5


def test_ig_equals_reference_on_llama_gqa(tiny_llama):
    ids = [5, 17, 300, 42, 7]
    model = tiny_llama
    if model.tokenizer is None:
        pytest.skip("tiny llama without tokenizer")
    prompt = model.tokenizer.decode(ids)
    target = " the"
    fast = integrated_gradients(model, prompt, target, steps=5)
    slow = reference_ig(model, prompt, target, steps=5)
    assert _rel(fast.scores, slow) < 1e-5


def test_multi_token_target_teacher_forcing(tiny_gpt2):
    fast = integrated_gradients(tiny_gpt2, PROMPT, " Parisian", steps=5)
    slow = reference_ig(tiny_gpt2, PROMPT, " Parisian", steps=5)
    assert fast.target_tokens == (" Paris", "ian")
    assert fast.layer_sums.shape[0] == 2
    assert _rel(fast.scores, slow) < 1e-5


def test_completeness_holds(tiny_gpt2):
    # midpoint rule, enough steps: Σ attributions ≈ P(w̄) − P(0) per layer
    attr = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=32)
    assert attr.completeness_rel_error < 1e-2
    coarse = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=1, rule="left")
    assert coarse.completeness_rel_error > attr.completeness_rel_error  # the check can fail


def test_batch_size_and_prefix_reuse_do_not_change_results(tiny_gpt2):
    ref = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=7)
    for kw in (dict(batch_rows=1), dict(batch_rows=5), dict(batch_rows=1000), dict(prefix_reuse=False)):
        other = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=7, **kw)
        assert _rel(other.scores, ref.scores) < 1e-5, kw


def test_same_seed_same_neurons():
    from tlcap.models import make_gpt2

    a = integrated_gradients(make_gpt2("tiny", seed=3), PROMPT, " Paris", steps=5).select(0.2)
    b = integrated_gradients(make_gpt2("tiny", seed=3), PROMPT, " Paris", steps=5).select(0.2)
    c = integrated_gradients(make_gpt2("tiny", seed=4), PROMPT, " Paris", steps=5).select(0.2)
    assert a == b
    assert a != c


def test_estimators_are_labelled_and_complete(tiny_gpt2):
    joint = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=32, method="joint")
    assert joint.method == "joint"
    assert joint.completeness_rel_error < 1e-2
    gxa = integrated_gradients(tiny_gpt2, PROMPT, " Paris", method="grad_x_act")
    exact = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=16)
    assert torch.corrcoef(torch.stack([gxa.scores.flatten(), exact.scores.flatten()]))[0, 1] > 0.5


def test_quadrature_weights_sum_to_one():
    for rule in RULES:
        a, w = quadrature(10, rule)
        total = 11 / 10 if rule == "cnl" else 1.0  # CNL eq. 7 as printed: S+1 points of weight 1/S
        assert abs(float(w.sum()) - total) < 1e-12, rule
        assert float(a.min()) >= 0 and float(a.max()) <= 1 and bool((a.diff() > 0).all())


def test_quadrature_rules_as_the_papers_print_them():
    a, w = quadrature(4, "right")  # Dai et al. / QL eq. 10: α = k/m, k = 1..m
    assert a.tolist() == [0.25, 0.5, 0.75, 1.0] and w.tolist() == [0.25] * 4
    a, w = quadrature(4, "cnl")  # CNL eq. 7: (1/S) Σ_{n=0}^{S} at α = n/S
    assert a.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0] and w.tolist() == [0.25] * 5
    a, w = quadrature(2, "gauss_legendre")  # nodes ½ ± 1/(2√3), weights ½ (captum's gausslegendre)
    assert a.tolist() == pytest.approx([0.5 - 0.5 / 3**0.5, 0.5 + 0.5 / 3**0.5], abs=1e-15)
    assert w.tolist() == pytest.approx([0.5, 0.5], abs=1e-15)
    # Gauss-Legendre with m points integrates polynomials up to degree 2m - 1 exactly
    a, w = quadrature(3, "gauss_legendre")
    assert float((w * a**5).sum()) == pytest.approx(1 / 6, abs=1e-14)
    assert float((w * a**6).sum()) != pytest.approx(1 / 7, abs=1e-6)


def test_save_load_roundtrip(tiny_gpt2, tmp_path):
    attr = integrated_gradients(tiny_gpt2, PROMPT, " Paris", steps=4)
    attr.save(tmp_path / "a")
    back = NeuronAttribution.load(tmp_path / "a")
    assert torch.equal(back.scores, attr.scores)
    assert back.layers == attr.layers and back.target_tokens == attr.target_tokens
    assert isinstance(load_result(tmp_path / "a"), NeuronAttribution)
    df = attr.to_frame(top=10)
    assert list(df.columns) == ["layer", "neuron", "score", "activation"] and len(df) == 10


def test_selection_rules():
    s = torch.zeros(3, 10)
    s[0, 1], s[1, 2], s[2, 3] = 1.0, 0.5, 0.1
    assert threshold_select(s, 0.2).neurons == ((0, 1), (1, 2))
    assert top_k_select(s, 1).neurons == ((0, 1),)
    a = NeuronSet.from_list([(0, 1), (1, 2)], (3, 10))
    b = NeuronSet.from_list([(0, 1), (2, 3)], (3, 10))
    c = NeuronSet.from_list([(0, 1)], (3, 10))
    assert refine([a, b, c], p=0.5).neurons == ((0, 1),)
    assert refine([a, b], p=0.3).neurons == ((0, 1), (1, 2), (2, 3))
    noisy = torch.randn(4, 200, generator=torch.Generator().manual_seed(0))
    noisy[1, 7] = 50.0
    assert (1, 7) in sigma_mask(noisy, 6).neurons


def test_overlap_and_iou():
    a = NeuronSet.from_list([(0, 1), (0, 2), (1, 3), (1, 4)], (2, 8))
    b = NeuronSet.from_list([(0, 1), (1, 3)], (2, 8))
    assert a.overlap(b) == pytest.approx((2 / 4 + 2 / 2) / 2)
    assert a.iou(b) == pytest.approx(2 / 4)
    r = a.random_like(seed=1)
    assert len(r) == len(a) and r.by_layer().keys() == a.by_layer().keys()
    assert not set(r.neurons) & set(a.neurons)
    assert a.random_like(seed=1) == r


def test_attribution_contract_summary_figure_rows_and_provenance(tiny_gpt2):
    from tlcap.attribution import IGConfig
    from tlcap.metrics import target_prob

    cfg = IGConfig(steps=4, rule="left")
    attr = integrated_gradients(tiny_gpt2, PROMPT, " Paris", config=cfg)
    s = attr.summary()
    assert s["target_prob"] == pytest.approx(target_prob(tiny_gpt2, PROMPT, " Paris"), rel=1e-5)
    assert s["completeness_rel_error"] == attr.completeness_rel_error and s["rule"] == "left" and s["steps"] == 4
    top = attr.to_frame(top=10)
    assert s["top_neurons"] == [[int(r.layer), int(r.neuron), float(r.score)] for r in top.itertuples()]
    assert s["top_neurons"][0][2] == pytest.approx(float(attr.scores.max()))
    assert s["n_located"] == len(attr.select(0.2))
    full = attr.to_frame()
    assert list(full.columns) == ["layer", "neuron", "score", "activation"] and len(full) == attr.scores.numel()
    l, j = int(full.layer[3]), int(full.neuron[3])
    assert full.score[3] == pytest.approx(float(attr.scores[l, j])) and full.score.is_monotonic_decreasing
    comp = attr.completeness()
    assert list(comp.columns) == ["layer", "sum_attr", "delta_p", "abs_error"]
    assert comp.sum_attr[1] == pytest.approx(float(attr.layer_sums[:, 1].mean()))
    fig = attr.figure()
    ringed = sorted(zip(fig.data[1].y, fig.data[1].x))
    assert ringed == sorted(attr.select(0.2).neurons)
    assert attr.provenance is not None and attr.provenance.config == cfg.to_dict()
    assert attr.provenance.model_name == tiny_gpt2.name
