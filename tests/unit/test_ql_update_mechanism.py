"""Why a QL Update edit flips an answer or not (issue 24 item 11), pinned on tiny models.

Under the default rule (``activation``) the edit adds, at the edited query, one write ``ρ·δ`` whose
norm is ``size`` times what the KNs write there now: λ1 = λ2 only set δ's direction (their size drops
out), so o' overtakes o exactly when that fixed write moves o' by more than its logit gap to the top.
"""

from __future__ import annotations

import pytest
import torch

from tlcap.data.pararel import Fact
from tlcap.experiments.ql import FactKNs, modification_experiment
from tlcap.intervene.update import kn_write, update_neurons
from tlcap.metrics.sets import NeuronSet
from tlcap.runtime.hooks import add_rows
from tlcap.runtime.sites import get_site

QUERY = "The capital of France is"


def _acts(m, prompt):
    names = [get_site("mlp_post").hook_name(l) for l in range(m.n_layers)]
    return m.last_position_activations(m.to_tokens(prompt), names)[0][0].float()


def _last_layer_kns(m, acts, n=4):
    top = acts[-1].abs().topk(n).indices.tolist()
    return NeuronSet.from_list([(m.n_layers - 1, j) for j in top], (m.n_layers, m.d_mlp))


def test_update_at_the_query_is_one_write_of_size_times_the_kns_output_along_delta(tiny_llama):
    """KNs of the last layer: the edited model's logits at the query are the clean model's with ``ρ·δ`` added to the
    last MLP output at the last position, ``‖ρ·δ‖ = size·‖Σ a_p W_p‖`` — the edit's whole effect on the answer."""
    m = tiny_llama
    toks = m.to_tokens(QUERY)
    acts = _acts(m, QUERY)
    kns = _last_layer_kns(m, acts)
    clean = m.last_logits(toks)[0]
    old, new = int(clean.argmax()), int(clean.argsort(descending=True)[5])
    delta = (-2.0 * m.W_E[old] + 2.0 * m.W_E[new]).float()
    write = float(kn_write(m, kns, acts).norm())
    hook = get_site("mlp_out").hook_name(m.n_layers - 1)
    for size in (0.5, 1.0, 4.0):
        rho = size * write / float(delta.norm())
        with update_neurons(m, kns, old, new, 2.0, 2.0, rule="activation", activations=acts, size=size):
            edited = m.last_logits(toks)[0]
        ref = m.last_logits(toks, hooks=[(hook, add_rows(slice(None), -1, rho * delta))])[0]
        assert torch.allclose(edited, ref, atol=1e-4), size
        assert float((rho * delta).norm()) == pytest.approx(size * write, rel=1e-5)


def test_lambda_drops_out_of_the_activation_rule_and_scales_the_literal_one(tiny_llama):
    """λ1 = λ2 = 8 edits the columns as λ1 = λ2 = 2 under the default rule; under eq. 2 as printed it is 4× the edit."""
    m = tiny_llama
    acts = _acts(m, QUERY)
    kns = _last_layer_kns(m, acts)
    layer = m.n_layers - 1
    w0 = m.mlp_down_matrix(layer).clone()

    def change(rule, lam):
        with update_neurons(m, kns, 10, 20, lam, lam, rule=rule, activations=acts):
            return m.mlp_down_matrix(layer) - w0

    assert torch.allclose(change("activation", 8.0), change("activation", 2.0), atol=1e-6)
    assert torch.allclose(change("paper", 8.0), 4.0 * change("paper", 2.0), atol=1e-5)
    assert torch.equal(m.mlp_down_matrix(layer), w0)


def test_rel_of_an_update_is_whether_the_gap_to_the_top_closed(tiny_gpt2):
    """Each edit row's ``gap_new_*`` (top logit − logit of o'): Rel = 1 exactly when it is 0 after the edit, and a
    larger write moves o' further (here, for KNs of the last layer)."""
    m = tiny_gpt2
    qs = ["The capital of France is", "France's capital is", "The capital city of France is"]
    acts = _acts(m, qs[0])
    scores = torch.zeros(len(qs), m.n_layers, m.d_mlp)
    for j in acts[-1].abs().topk(6).indices.tolist():
        scores[:, -1, j] = 1.0
    fk = FactKNs(scores, (0.5,) * 3, Fact("P36", "France", "is", tuple(qs)))  # o = the model's answer " is"
    kw = dict(operations=("update",), sets=("local",), ppl_texts=["A short text about the weather today."],
              n_ppl_texts=1, edit_queries=1, new_objects={"P36": ["Paris"]}, progress=False)
    rows = {size: modification_experiment(m, [fk], ["K_I"], update_size=size, **kw).to_frame().iloc[0]
            for size in (0.5, 2.0, 50.0)}
    for r in rows.values():
        assert r.new_object == "Paris" and r.gap_new_before > 0
        assert (r.rel == 1.0) == (r.gap_new_after == 0.0)
    moved = {s: r.gap_new_before - r.gap_new_after for s, r in rows.items()}
    assert moved[0.5] < moved[2.0] < moved[50.0]
    assert rows[0.5].rel == 0.0 and rows[50.0].rel == 1.0  # a write far larger than the KNs' own closes any gap


def test_a_saved_edit_with_no_neighbor_query_loads_back_with_nan_gen(tmp_path):
    """NaN is saved as JSON null; the edit rows of a loaded result must still build their frame (gen NaN, not None)."""
    import math

    from tlcap.experiments.ql.modification_result import EditRow, ModificationResult
    from tlcap.results import load_result

    row = EditRow(fact=0, relation="P36", subject="France", object="Paris", new_object=None, group="K_I", query=0,
                  operation="erasure", set="N_i", n_neurons=3, rel=1.0, gen=math.nan, loc=1.0, avg=1.0, ppl_before=10.0,
                  ppl_after=11.0, dppl=0.1, p_before=0.5, p_after=0.1, p_new_before=math.nan, p_new_after=math.nan,
                  rule="erasure")
    res = ModificationResult((row,), 1.0, 1.0, 10.0, ("K_I",), "ig", "QL Table 2")
    back = load_result(res.save(tmp_path / "m"))
    f = back.to_frame()
    assert math.isnan(f.gen[0]) and f.rel[0] == 1.0 and f.new_object[0] is None
