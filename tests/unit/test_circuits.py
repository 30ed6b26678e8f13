"""Knowledge circuits on tiny random models: graph, exact circuit-only runs, EAP vs patching."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

from tlcap.errors import ShapeMismatchError
from tlcap.locate.circuits import (
    Circuit,
    EdgeGraph,
    EdgeScores,
    edge_attribution,
    edge_hooks_enabled,
    evaluate_circuit,
    evaluate_masks,
    make_task,
    prune_dead,
    size_sweep,
)
from tlcap.runtime import hooks as H

PROMPT, TARGET, CORRUPT = "The capital of France is", " Paris", "The capital of Italy is"


@pytest.fixture(params=["tiny_gpt2", "tiny_llama"])
def model(request):
    return request.getfixturevalue(request.param)


def test_graph_shapes_and_params(model):
    g = EdgeGraph.from_model(model)
    L, Hh, K = model.n_layers, model.n_heads, model.n_kv_heads
    assert g.n_upstream == 1 + L * (Hh + 1)
    assert g.n_readers == L * (Hh + 2 * K + 1) + 1
    # edges: each reader is fed by everything computed before it
    expected = 0
    for l in range(L):
        expected += (Hh + 2 * K) * (1 + l * (Hh + 1)) + (1 + l * (Hh + 1) + Hh)
    expected += g.n_upstream
    assert int(g.valid_mask().sum()) == expected
    # node parameters partition the model
    assert sum(g.node_params) == model.parameter_count()
    # the bridge's k/v reader inputs have n_kv_heads entries (GQA readers per kv group)
    toks = model.to_tokens(PROMPT)
    with edge_hooks_enabled(model):
        _, cache = model.run_with_cache(toks, ["blocks.0.hook_k_input", "blocks.0.hook_q_input"])
    assert cache["blocks.0.hook_k_input"].shape[2] == K
    assert cache["blocks.0.hook_q_input"].shape[2] == Hh
    if K != Hh:
        assert any("kv" in r for r in g.readers)
        assert g.reader_node_names("a0.kv1<k>") == [f"a0.h{h}" for h in range(Hh // K, 2 * Hh // K)]


@pytest.mark.parametrize("corrupt", [CORRUPT, None])
def test_full_circuit_reproduces_model_and_empty_equals_ablated(model, corrupt):
    task = make_task(model, PROMPT, TARGET, corrupt)
    g = EdgeGraph.from_model(model)
    full = g.valid_mask()
    r = evaluate_masks(model, g, task, torch.stack([full, torch.zeros_like(full)]), return_logits=True)
    clean = model.logits(task.clean)
    torch.testing.assert_close(r["logits"][0], clean[0], atol=1e-5, rtol=1e-5)
    if corrupt is not None:
        ablated = model.logits(task.corrupt)
    else:  # every node's output zeroed: input, every head's write and every MLP
        hooks = [("blocks.0.hook_resid_pre", H.set_to(0.0))]
        for l in range(model.n_layers):
            hooks += [(f"blocks.{l}.attn.hook_result", H.set_to(0.0)), (f"blocks.{l}.hook_mlp_out", H.set_to(0.0))]
        with edge_hooks_enabled(model):
            ablated = model.logits(task.clean, hooks=hooks)
    torch.testing.assert_close(r["logits"][1], ablated[0], atol=1e-5, rtol=1e-5)
    # the flags are restored after every run
    assert not model.backend.cfg.use_split_qkv_input


def test_removing_all_out_edges_equals_patching_the_node(model):
    """Independent check of circuit-only runs: no out-edges of u == u's output patched."""
    task = make_task(model, PROMPT, TARGET, CORRUPT)
    g = EdgeGraph.from_model(model)
    with edge_hooks_enabled(model):
        _, cache = model.run_with_cache(task.corrupt, ["blocks.0.attn.hook_result", "blocks.0.hook_mlp_out"])
    mask = g.valid_mask()
    m1, m2 = mask.clone(), mask.clone()
    m1[g.head_index(0, 1)] = False
    m2[g.mlp_index(0)] = False
    r = evaluate_masks(model, g, task, torch.stack([m1, m2]), return_logits=True)
    with edge_hooks_enabled(model):
        p1 = model.logits(task.clean, hooks=[("blocks.0.attn.hook_result", H.patch(cache["blocks.0.attn.hook_result"], head=1))])
        p2 = model.logits(task.clean, hooks=[("blocks.0.hook_mlp_out", H.patch(cache["blocks.0.hook_mlp_out"]))])
    torch.testing.assert_close(r["logits"][0], p1[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r["logits"][1], p2[0], atol=1e-5, rtol=1e-5)
    assert (p1 - model.logits(task.clean)).abs().max() > 1e-4  # the patch did something


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_eap_agrees_with_patching_every_edge(arch):
    """EAP vs actually patching each edge, on all edges, in the linear regime.

    A float64 tiny model whose corrupted subject embedding is 5% of the way from ' France'
    to ' Italy' keeps the perturbation small, so the first-order estimate should be close.
    """
    from tlcap.models import make_gpt2, make_llama

    m = make_gpt2("tiny", seed=1) if arch == "gpt2" else make_llama(seed=1)
    m.backend.to(torch.float64)
    a, b = m.encode(" France")[0], m.encode(" Italy")[0]
    with torch.no_grad():
        m.W_E[b] = m.W_E[a] + 0.05 * (m.W_E[b] - m.W_E[a])
    task = make_task(m, PROMPT, TARGET, CORRUPT)
    g = EdgeGraph.from_model(m)
    valid = g.valid_mask()
    idx = torch.nonzero(valid)
    masks = valid[None].repeat(len(idx), 1, 1)
    masks[torch.arange(len(idx)), idx[:, 0], idx[:, 1]] = False
    r = evaluate_masks(m, g, task, torch.cat([valid[None], masks]), batch=128)
    actual = (r["metric"][1:] - r["metric"][0]).double()
    errs = {}
    for steps in (1, 5):
        sc = edge_attribution(m, PROMPT, TARGET, CORRUPT, steps=steps)
        est = sc.scores[idx[:, 0], idx[:, 1]].double()
        rho = spearmanr(est.numpy(), actual.numpy()).statistic
        big = actual.abs() > 1e-3 * actual.abs().max()
        sign = (torch.sign(est) == torch.sign(actual))[big].float().mean().item()
        errs[steps] = ((est - actual).norm() / actual.norm()).item()
        print(f"{arch} steps={steps}: spearman {rho:.4f}, sign agreement {sign:.3f} on {int(big.sum())}/{len(idx)} edges, rel err {errs[steps]:.4f}")
        assert rho > 0.99
        assert sign >= (1.0 if steps == 1 else 0.97)
        assert errs[steps] < 0.05
    assert errs[5] < errs[1]  # EAP-IG is the better approximation


def test_denoising_matches_transformerlens_attribution_patch(tiny_gpt2):
    from importlib.metadata import version

    if int(version("transformer-lens").split(".")[0]) < 4:
        pytest.skip("TransformerLens < 4 has no edge-granularity attribution_patch")
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    from tlcap.locate.circuits.eap import tl_edge_matrix

    m = tiny_gpt2
    task = make_task(m, PROMPT, TARGET, CORRUPT)
    sc = edge_attribution(m, PROMPT, TARGET, CORRUPT, direction="denoising")
    m.W_E.requires_grad_(True)  # TL needs a graph to differentiate (tlcap freezes parameters)
    try:
        res = attribution_patch(m.backend, task.clean, task.corrupt, lambda lg: task.metric_rows(lg)[0],
                                EdgeAttributionConfig(granularity="edge"))
    finally:
        m.W_E.requires_grad_(False)
    ref = tl_edge_matrix(sc.graph, res.edge_scores)
    torch.testing.assert_close(sc.scores.double(), ref * sc.valid, atol=1e-6, rtol=1e-4)
    assert ref.abs().max() > 1e-4


def test_mismatched_lengths_raise(tiny_gpt2):
    with pytest.raises(ShapeMismatchError, match="same token length"):
        edge_attribution(tiny_gpt2, PROMPT, TARGET, "The capital of the United Kingdom is")


def test_selection_pruning_and_roundtrip(model, tmp_path):
    sc = edge_attribution(model, PROMPT, TARGET, None, steps=3)
    g = sc.graph
    assert sc.method == "eap-ig" and sc.scores.shape == (g.n_upstream, g.n_readers)
    assert (sc.scores[~sc.valid] == 0).all()
    # the full circuit survives pruning; a lone edge out of a head without inputs does not
    assert torch.equal(prune_dead(g, sc.valid), sc.valid)
    lone = torch.zeros_like(sc.valid)
    lone[g.head_index(0, 0), g.readers.index("logits")] = True
    assert not prune_dead(g, lone).any()
    lone[0, g.readers.index("a0.h0<q>")] = True  # now the head has an input: both edges stay
    assert int(prune_dead(g, lone).sum()) == 2
    c = sc.select(top_n=15)
    assert c.n_edges <= 15 and c.n_selected == 15
    assert all(abs(s) > 0 for _, _, s in c.edges)
    assert sc.select(top_n=sc.n_edges).param_fraction == pytest.approx(1.0)
    thr = sc.select(threshold=float(sc.scores.abs().max()) / 2, prune=False)
    assert thr.n_edges == int((sc.scores.abs() > sc.scores.abs().max() / 2).sum())
    ev = evaluate_circuit(model, sc.select(top_n=sc.n_edges))
    assert ev.circuit_nll == pytest.approx(ev.full_nll, abs=1e-5) and ev.recovered == pytest.approx(1.0, abs=1e-3)
    sc.save(tmp_path / "s")
    c.save(tmp_path / "c")
    s2, c2 = EdgeScores.load(tmp_path / "s"), Circuit.load(tmp_path / "c")
    assert torch.equal(s2.scores, sc.scores) and s2.graph == sc.graph
    assert c2.edges == c.edges and c2.nodes == c.nodes
    assert len(c.figure().data) > 0 and len(sc.heatmap().data) == 1


def test_size_sweep_monotone_ends(tiny_gpt2):
    sc = edge_attribution(tiny_gpt2, PROMPT, TARGET, CORRUPT, steps=2)
    sw = size_sweep(tiny_gpt2, sc, [0, 5, sc.n_edges])
    assert sw.nll[0] == pytest.approx(sw.ablated_nll, abs=1e-5)
    assert sw.nll[-1] == pytest.approx(sw.full_nll, abs=1e-5)
    assert len(sw.figure().data) >= 4 and len(sw.to_frame()) == 3


def test_logit_diff_metric(tiny_gpt2):
    sc = edge_attribution(tiny_gpt2, PROMPT, TARGET, CORRUPT, metric="logit_diff", corrupt_target=" Rome")
    task = make_task(tiny_gpt2, PROMPT, TARGET, CORRUPT, "logit_diff", " Rome")
    lg = tiny_gpt2.logits(task.clean)[0, -1]
    ids = tiny_gpt2.encode(" Paris")[0], tiny_gpt2.encode(" Rome")[0]
    assert sc.clean_metric == pytest.approx(float(lg[ids[0]] - lg[ids[1]]), abs=1e-4)


def test_cli_contract(tmp_path):
    import json

    from typer.testing import CliRunner

    from tlcap.cli import _load_commands, app

    _load_commands()
    res = CliRunner().invoke(app, ["circuit", "--model", "gpt2-tiny", "--prompt", PROMPT, "--target", TARGET,
                                   "--corrupt-prompt", CORRUPT, "--top-n", "20", "--ig-steps", "1",
                                   "--sweep", "5,20", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "summary.json").read_text())
    for k in ("n_edges", "n_nodes", "param_fraction", "full_nll", "circuit_nll", "circuit_target_rank", "edges"):
        assert k in s
    assert s["n_edges"] == len(s["edges"]) <= 20 and all(len(e) == 3 for e in s["edges"])
    for stem in ("circuit", "edge_scores", "size_sweep"):
        assert (tmp_path / f"{stem}.html").exists()
    assert (tmp_path / "circuit.png").exists()
