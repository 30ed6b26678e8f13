"""Knowledge circuits on tiny random models: graph, exact circuit-only runs, EAP vs patching."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy.stats import spearmanr
from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

import tlcap
from benchmarks.tl_compat import tl_edge_matrix
from tests.cli_helpers import run_cli
from tlcap.errors import InvalidConfigError, ShapeMismatchError, UnknownNameError
from tlcap.locate.circuits import (
    Circuit,
    CircuitTask,
    CorruptedAblation,
    EAPConfig,
    EdgeGraph,
    EdgeScores,
    KnowledgeCircuit,
    edge_attribution,
    evaluate_circuit,
    evaluate_masks,
    knowledge_circuit,
    make_task,
    prune_dead,
    run_pass,
    size_sweep,
)
from tlcap.models import make_gpt2, make_llama, make_tiny
from tlcap.results import load_result
from tlcap.runtime import hooks as H

pytestmark = pytest.mark.heavy  # over ~5 s per module: runs after the fast gate (make unit)

PROMPT, TARGET, CORRUPT = "The capital of France is", " Paris", "The capital of Italy is"


@pytest.fixture(scope="module")
def tiny_neox():
    return make_tiny("neox", seed=0)


@pytest.fixture(scope="module")
def tiny_qwen2():
    return make_tiny("qwen2", seed=0)


@pytest.fixture(scope="module")
def tiny_gemma2():
    return make_tiny("gemma2", seed=0)


@pytest.fixture(scope="module")
def tiny_gptj():
    return make_tiny("gptj", seed=0)


@pytest.fixture(params=["tiny_gpt2", "tiny_llama"])
def model(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(params=["tiny_gpt2", "tiny_llama", "tiny_neox", "tiny_qwen2", "tiny_gemma2", "tiny_gptj"])
def arch_model(request):
    """Every architecture family circuits support: sequential (GPT-2, Llama/GQA, Qwen2), parallel (NeoX; GPT-J with
    split inputs rebuilt by the adapter) and post-norm (Gemma-2) blocks."""
    return request.getfixturevalue(request.param)


def test_graph_shapes_and_params(arch_model):
    model = arch_model
    g = EdgeGraph.from_model(model)
    L, Hh, K = model.n_layers, model.n_heads, model.n_kv_heads
    assert g.n_upstream == 1 + L * (Hh + 1)
    assert g.n_readers == L * (Hh + 2 * K + 1) + 1
    # edges: each reader is fed by everything computed before it
    expected = 0
    for l in range(L):  # parallel blocks (NeoX): the MLP reads the block input, not its own layer's heads
        expected += (Hh + 2 * K) * (1 + l * (Hh + 1)) + (1 + l * (Hh + 1) + (0 if model.parallel_attn_mlp else Hh))
    expected += g.n_upstream
    assert int(g.valid_mask().sum()) == expected
    # node parameters partition the model
    assert sum(g.node_params) == model.parameter_count()
    # the bridge's k/v reader inputs have n_kv_heads entries (GQA readers per kv group)
    toks = model.to_tokens(PROMPT)
    with model.edge_hooks():
        _, cache = model.run_with_cache(toks, ["blocks.0.hook_k_input", "blocks.0.hook_q_input"])
    assert cache["blocks.0.hook_k_input"].shape[2] == K
    assert cache["blocks.0.hook_q_input"].shape[2] == Hh
    if K != Hh:
        assert any("kv" in r for r in g.readers)
        assert g.reader_node_names("a0.kv1<k>") == [f"a0.h{h}" for h in range(Hh // K, 2 * Hh // K)]


@pytest.mark.parametrize("corrupt", [CORRUPT, None])
def test_full_circuit_reproduces_model_and_empty_equals_ablated(arch_model, corrupt):
    model = arch_model
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
        with model.edge_hooks():
            ablated = model.logits(task.clean, hooks=hooks)
    torch.testing.assert_close(r["logits"][1], ablated[0], atol=1e-5, rtol=1e-5)
    # the flags are restored after every run
    assert not model.backend.cfg.use_split_qkv_input


def _post_norm_head_share_patch(model, task, head):
    """Hook adding (corrupt − clean) share of ``head`` to layer 0's post-normed attention output.

    Gemma-2's RMSNorm outputs ``x / sqrt(mean(x²) + ε) · (1 + w)``; a head's share is its
    ``hook_result`` through that map with the RMS of the whole sum (written out here, not taken
    from the library).
    """
    norm = model.backend.blocks[0].ln1_post.original_component
    names = ["blocks.0.attn.hook_result"]
    share = {}
    for key, toks in (("clean", task.clean), ("corrupt", task.corrupt)):
        with model.edge_hooks():
            _, c = model.run_with_cache(toks, names)
        r = c["blocks.0.attn.hook_result"].double()
        rms = (r.sum(2).pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        share[key] = (r[:, :, head] / rms * (1 + norm.weight.double())).float()
    diff = share["corrupt"] - share["clean"]
    return "blocks.0.hook_attn_out", lambda act, hook=None: act + diff


def test_removing_all_out_edges_equals_patching_the_node(arch_model):
    """Independent check of circuit-only runs: no out-edges of u == u's output patched."""
    model = arch_model
    task = make_task(model, PROMPT, TARGET, CORRUPT)
    g = EdgeGraph.from_model(model)
    with model.edge_hooks():
        _, cache = model.run_with_cache(task.corrupt, ["blocks.0.attn.hook_result", "blocks.0.hook_mlp_out"])
    mask = g.valid_mask()
    m1, m2 = mask.clone(), mask.clone()
    m1[g.head_index(0, 1)] = False
    m2[g.mlp_index(0)] = False
    r = evaluate_masks(model, g, task, torch.stack([m1, m2]), return_logits=True)
    if model.post_norm_blocks:  # Gemma-2: head 1's share of ln1_post's output, each run with its own RMS
        head1 = _post_norm_head_share_patch(model, task, head=1)
    elif model.emulated_split_inputs:  # GPT-J: head 1's slice of the output projection's input, not via hook_result
        _, zc = model.run_with_cache(task.corrupt, ["blocks.0.attn.o.hook_in"])
        assert zc["blocks.0.attn.o.hook_in"].shape[2] == model.n_heads  # [batch, pos, head, d_head]
        z1 = zc["blocks.0.attn.o.hook_in"][:, :, 1].clone()

        def patch_z(act, hook=None):
            act = act.clone()
            act[:, :, 1] = z1
            return act

        head1 = ("blocks.0.attn.o.hook_in", patch_z)
    else:
        head1 = ("blocks.0.attn.hook_result", H.patch(cache["blocks.0.attn.hook_result"], head=1))
    with model.edge_hooks():
        p1 = model.logits(task.clean, hooks=[head1])
        p2 = model.logits(task.clean, hooks=[("blocks.0.hook_mlp_out", H.patch(cache["blocks.0.hook_mlp_out"]))])
    torch.testing.assert_close(r["logits"][0], p1[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r["logits"][1], p2[0], atol=1e-5, rtol=1e-5)
    assert (p1 - model.logits(task.clean)).abs().max() > 1e-4  # the patch did something


@pytest.mark.parametrize("arch", ["gpt2", "llama", "neox", "qwen2", "gemma2", "gptj"])
def test_eap_agrees_with_patching_every_edge(arch):
    """EAP vs actually patching each edge, on all edges, in the linear regime.

    A float64 tiny model whose corrupted subject embedding is 5% of the way from ' France'
    to ' Italy' keeps the perturbation small, so the first-order estimate should be close.
    """
    m = make_gpt2("tiny", seed=1) if arch == "gpt2" else make_llama(seed=1) if arch == "llama" else make_tiny(arch, seed=1)
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
        print(f"{arch} steps={steps}: spearman {rho:.4f}, sign agreement {sign:.3f} on {int(big.sum())}/{len(idx)} edges, "
              f"rel err {errs[steps]:.4f}")
        assert rho > 0.99
        assert sign >= (1.0 if steps == 1 else 0.97)
        assert errs[steps] < 0.05
    assert errs[5] < errs[1]  # EAP-IG is the better approximation


def test_denoising_matches_transformerlens_attribution_patch(tiny_gpt2):
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
    with pytest.raises(ShapeMismatchError, match="same number of tokens"):
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
    assert sw.provenance.config == {"sweep_sizes": [0, 5, sc.n_edges], "batch": 8} and sw.provenance.seed == 0
    ev = evaluate_circuit(tiny_gpt2, sc.select(top_n=5))
    assert ev.provenance.model_name == tiny_gpt2.name and ev.provenance.config == {"batch": 8, "metric": "nll"}


def test_logit_diff_metric(tiny_gpt2):
    sc = edge_attribution(tiny_gpt2, PROMPT, TARGET, CORRUPT, metric="logit_diff", corrupt_target=" Rome")
    task = make_task(tiny_gpt2, PROMPT, TARGET, CORRUPT, "logit_diff", " Rome")
    lg = tiny_gpt2.logits(task.clean)[0, -1]
    ids = tiny_gpt2.encode(" Paris")[0], tiny_gpt2.encode(" Rome")[0]
    assert sc.clean_metric == pytest.approx(float(lg[ids[0]] - lg[ids[1]]), abs=1e-4)


def test_cli_contract(tmp_path):
    out = tmp_path / "run"
    run = run_cli(["circuit", "--model", "gpt2-tiny", "--prompt", PROMPT, "--target", TARGET, "--corrupt-prompt", CORRUPT,
                   "--top-n", "20", "--ig-steps", "1", "--sweep", "5,20", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    res = KnowledgeCircuit.load(out / "result")
    assert s == json.loads(json.dumps({**res.summary(), "figures": s["figures"], "tables": ["circuit_edges.csv"],
                                       "provenance": res.provenance.to_dict()}))
    assert s["n_edges"] == len(s["edges"]) <= 20 and all(len(e) == 3 for e in s["edges"])
    assert s["provenance"]["config"]["steps"] == 1 and s["provenance"]["config"]["sweep_sizes"] == [5, 20]
    assert s["sweep"]["top_n"] == [5, 20] and s["method"] == "eap"
    for stem in ("circuit", "edge_scores", "size_sweep"):
        assert (out / f"{stem}.html").exists()
    assert (out / "circuit.png").exists()
    assert len((out / "circuit_edges.csv").read_text().splitlines()) == s["n_edges"] + 1
    assert f"{s['n_edges']} edges" in run.stdout
    # what the CLI wrote loads in a fresh process (no tlcap.locate.circuits import beforehand)
    code = "import sys, tlcap; r = tlcap.load_result(sys.argv[1]); print(type(r).__name__, r.circuit.n_edges)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    fresh = subprocess.run([sys.executable, "-c", code, str(out / "result")], capture_output=True, text=True, env=env,
                           timeout=300)
    assert fresh.stdout.split() == ["KnowledgeCircuit", str(s["n_edges"])], fresh.stderr[-2000:]


# ---------------------------------------------------------------------------- config, results, structure
def test_eap_config_validates_at_construction():
    cases = [
        (dict(steps=0), "steps (--ig-steps) must be >= 1, got 0"),
        (dict(top_n=0), "top_n (--top-n) must be >= 1, got 0"),
        (dict(top_n=-3), "top_n (--top-n) must be >= 1, got -3"),
        (dict(threshold=0.0), "threshold (--threshold) must be > 0, got 0"),
        (dict(threshold=float("nan")), "threshold (--threshold) must be a finite number, got nan"),
        (dict(top_n=5, threshold=0.1), "give --top-n or --threshold, not both"),
        (dict(sweep_sizes=(10, -1)), "sweep_sizes[1] (--sweep) must be >= 0, got -1"),
        (dict(seed=-1), "seed (--seed) must be >= 0, got -1"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidConfigError) as exc:
            EAPConfig(**kwargs)
        assert str(exc.value) == message
    with pytest.raises(UnknownNameError, match=r"^unknown metric 'kl' \(--metric\); choose one of: nll, logit-diff$"):
        EAPConfig(metric="kl")
    with pytest.raises(UnknownNameError,
                       match=r"^unknown ablation 'median'; choose one of: corrupt, zero, mean, mean-positional$"):
        EAPConfig(ablation="median")
    cfg = EAPConfig(steps=5, metric="logit-diff", sweep_sizes=[0, 10])
    assert cfg.metric == "logit_diff" and cfg.sweep_sizes == (0, 10) and cfg.selection == ("top_n", 300)
    assert EAPConfig.from_dict(cfg.to_dict()) == cfg
    assert EAPConfig.resolve(None, threshold=0.5).selection == ("threshold", 0.5)


def test_knowledge_circuit_composes_the_pieces_and_round_trips(tiny_gpt2, tmp_path):
    m = tiny_gpt2
    cfg = EAPConfig(steps=2, top_n=20, sweep_sizes=(0, 5, 20))
    res = knowledge_circuit(m, PROMPT, TARGET, CORRUPT, config=cfg)
    # the same numbers as the pieces called one by one
    sc = edge_attribution(m, PROMPT, TARGET, CORRUPT, steps=2)
    assert torch.equal(res.scores, sc.scores) and res.clean_metric == sc.clean_metric
    circ = sc.select(top_n=20)
    assert torch.equal(res.mask, circ.mask) and res.circuit.edges == circ.edges
    ev = evaluate_circuit(m, circ)
    assert res.evaluation == ev
    assert res.sweep is not None and res.sweep.top_n == (0, 5, 20) and res.sweep.nll[0] == pytest.approx(ev.ablated_nll)
    assert res.random_evaluation.n_edges == circ.n_edges and res.random_evaluation.selection == "random(seed=0)"
    s = res.summary()
    old_cli_keys = {  # the summary.json keys tlcap circuit wrote before the results owned them
        "model", "prompt", "target", "corrupt_prompt", "ablation", "method", "ig_steps", "metric", "selection",
        "n_selected", "n_edges", "n_nodes", "total_edges", "param_fraction", "full_nll",
        "circuit_nll", "ablated_nll", "full_target_rank", "circuit_target_rank", "ablated_target_rank", "hit_at_1",
        "hit_at_10", "logit_diff_vs_full", "recovered", "full_metric", "circuit_metric", "random_circuit_nll",
        "random_circuit_target_rank", "nodes", "edges", "sweep"}
    assert old_cli_keys <= set(s)
    assert s["param_fraction"] == circ.param_fraction and s["n_block_params"] == circ.n_block_params
    assert s["param_fraction_with_embeddings"] == circ.param_fraction_with_embeddings
    assert s["ablation"] == "corrupt" and s["method"] == "eap-ig" and s["n_edges"] == circ.n_edges
    assert s["circuit_nll"] == ev.circuit_nll and s["sweep"]["top_n"] == [0, 5, 20]
    assert res.provenance is not None and res.provenance.config == cfg.replace(ablation="corrupt").to_dict()
    assert res.config == res.provenance.config
    # every result meets the contract
    for r in (res, res.edge_scores, res.circuit, res.evaluation, res.sweep, res.graph):
        assert isinstance(r.summary(), dict) and len(r.to_frame()) > 0 and len(r.figure().data) > 0
        json.dumps(r.summary())
    assert list(res.circuit.to_frame().columns) == ["upstream", "reader", "score"]
    # saved, then loaded in a fresh process
    path = res.save(tmp_path / "kc")
    code = ("import sys, json, tlcap; r = tlcap.load_result(sys.argv[1]); "
            "print(type(r).__name__, json.dumps(r.summary()['edges']), r.sweep.nll[1], r.provenance.seed)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    name, rest = out.stdout.split(" ", 1)
    edges_json, nll1, seed = rest.rsplit(" ", 2)
    assert name == "KnowledgeCircuit" and json.loads(edges_json) == s["edges"]
    assert float(nll1) == pytest.approx(res.sweep.nll[1]) and seed.strip() == "0"
    back = load_result(path)
    assert isinstance(back, KnowledgeCircuit) and torch.equal(back.scores, res.scores) and torch.equal(back.mask, res.mask)
    assert back.graph == res.graph and back.evaluation == res.evaluation and back.sweep == res.sweep
    assert back.summary() == s


def test_edge_graph_result(model):
    g = EdgeGraph.from_model(model)
    s = g.summary()
    assert s["n_edges"] == int(g.valid_mask().sum()) and s["n_params"] == model.parameter_count()
    pg = model.parameter_groups()
    assert s["n_block_params"] == pg.block_total
    df = g.to_frame()
    assert list(df["node"]) == list(g.nodes) and df["params"].sum() == model.parameter_count()
    assert df["out_edges"].sum() == s["n_edges"]
    # a kv reader's edges count for each head of its group
    kv_edges = int(g.valid_mask()[:, [i for i, r in enumerate(g.readers) if ".kv" in r]].sum())
    assert (kv_edges > 0) == (model.n_kv_heads < model.n_heads)
    assert df["in_edges"].sum() == s["n_edges"] + (g.group_size - 1) * kv_edges
    assert df.loc[df.node == "logits", "in_edges"].item() == g.n_upstream
    assert len(g.figure().data) == 4  # input, heads, MLPs, logits


def test_pass_engine_runs_a_batch_of_items(tiny_llama):
    """Rows of different items in one pass give each item's own metric (the engine is item-general)."""
    m = tiny_llama
    a = make_task(m, PROMPT, TARGET, CORRUPT)
    b = make_task(m, CORRUPT, " Rome", PROMPT)
    both = CircuitTask(
        clean=torch.cat([a.clean, b.clean]), corrupt=torch.cat([a.corrupt, b.corrupt]),
        positions=torch.cat([a.positions, b.positions]), target_ids=torch.cat([a.target_ids, b.target_ids]),
        target_mask=torch.cat([a.target_mask, b.target_mask]),
    )
    g = EdgeGraph.from_model(m)
    out = run_pass(m, g, both, both.clean, record_upstream=True)
    one_a, one_b = run_pass(m, g, a, a.clean), run_pass(m, g, b, b.clean)
    torch.testing.assert_close(out.metric, torch.cat([one_a.metric, one_b.metric]), atol=1e-5, rtol=1e-5)
    # the corrupted rows of item 1 are item 0's clean rows: its ablated run is item 0's clean run
    abl = CorruptedAblation().run(m, g, both)
    torch.testing.assert_close(abl.upstream[1], out.upstream[0], atol=1e-5, rtol=1e-5)


def test_mean_grads_is_the_mean_of_the_per_row_reader_gradients(tiny_llama):
    """EAP-IG keeps one averaged gradient per reader (taken in the backward hook): equal to averaging the rows."""
    m = tiny_llama
    task = make_task(m, PROMPT, TARGET, CORRUPT)
    g = EdgeGraph.from_model(m)
    emb = run_pass(m, g, task, task.clean, record_upstream=True).upstream[0, 0]
    x = emb[None] * torch.tensor([0.25, 0.5, 1.0])[:, None, None]  # three different rows
    rows = task.clean.expand(3, -1)
    full = run_pass(m, g, task, rows, input_value=x, grads=True).reader_grads
    mean = run_pass(m, g, task, rows, input_value=x, grads=True, mean_grads=3).reader_grads
    assert full.shape[0] == 3 and mean.shape[0] == 1
    assert (full[0] - full[2]).abs().max() > 1e-4  # the rows really differ
    torch.testing.assert_close(mean[0], full.mean(0), atol=1e-7, rtol=1e-6)
    # grouped: rows (0, 1, 2) and (3, 4, 5) are two items' points: one mean gradient row per item
    x6 = torch.cat([x, x.flip(0) * 0.5])
    full6 = run_pass(m, g, task, task.clean.expand(6, -1), input_value=x6, grads=True).reader_grads
    grouped = run_pass(m, g, task, task.clean.expand(6, -1), input_value=x6, grads=True, mean_grads=3).reader_grads
    assert grouped.shape[0] == 2
    assert (grouped[0] - grouped[1]).abs().max() > 1e-4
    torch.testing.assert_close(grouped, full6.unflatten(0, (2, 3)).mean(1), atol=1e-7, rtol=1e-6)

def test_no_function_level_imports_and_no_tl_compat_in_the_library():
    pkg = Path(tlcap.__file__).resolve().parent
    files = [*sorted((pkg / "locate" / "circuits").glob("*.py")), pkg / "viz" / "circuit.py", pkg / "cli" / "circuit.py"]
    nested = re.compile(r"^\s+(import \w|from [\w.]+ import )")
    hits = [f"{p.name}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1) if nested.match(line)]
    assert hits == []
    assert not [p for p in pkg.rglob("*.py") if "tl_compat" in p.read_text() or "tl_edge_matrix" in p.read_text()]
    viz = (pkg / "viz" / "circuit.py").read_text()
    assert "import tlcap.locate" not in viz and "from tlcap.locate" not in viz  # viz takes values
    # no import cycle among the circuit modules (module-level imports, the package __init__ aside)
    deps = {}
    for f in (pkg / "locate" / "circuits").glob("*.py"):
        if f.stem == "__init__":
            continue
        mods = {n.module for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ImportFrom) and n.module}
        deps[f.stem] = {m.rsplit(".", 1)[1] for m in mods if m.startswith("tlcap.locate.circuits.")}
    done: list[str] = []
    while len(done) < len(deps):  # topological order exists <=> no cycle
        ready = sorted(m for m in deps if m not in done and deps[m] <= set(done))
        assert ready, f"import cycle among {sorted(set(deps) - set(done))}"
        done += ready
    assert deps["circuit"] == {"graph", "run"} and deps["graph"] == deps["run"] == set() and "eap" not in deps["passes"]


def _hand_circuit(model, edges):
    g = EdgeGraph.from_model(model)
    mask = torch.zeros(g.n_upstream, g.n_readers, dtype=torch.bool)
    for u, v in edges:
        mask[g.upstream.index(u), g.readers.index(v)] = True
    return Circuit(mask=mask, scores=mask.float(), graph=g)


def test_circuit_size_is_the_share_of_block_parameters_gpt2(tiny_gpt2):
    # gpt2-tiny: 2 layers, d_model 64, 4 heads of 16, d_mlp 256, biases and LayerNorm weight + bias.
    head = 4 * 64 * 16 + 3 * 16  # W_Q/W_K/W_V/W_O slices + b_Q/b_K/b_V slices
    layer_attn = 64 + 2 * 64  # b_O + ln1 (shared by the layer's heads, counted once)
    mlp = 64 * 256 + 256 + 256 * 64 + 64 + 2 * 64  # W_in, b_in, W_out, b_out, ln2
    blocks = 2 * (4 * head + layer_attn + mlp)
    c = _hand_circuit(tiny_gpt2, [("input", "a0.h1<q>"), ("a0.h1", "m1"), ("m1", "logits")])
    assert c.graph.block_params == blocks == 99968
    assert c.block_nodes == ("a0.h1", "m1")
    assert c.n_block_params == head + layer_attn + mlp
    assert c.param_fraction == (head + layer_attn + mlp) / blocks
    # a second head of the same layer adds only its own slices
    c2 = _hand_circuit(tiny_gpt2, [("input", "a0.h1<q>"), ("input", "a0.h2<q>"), ("a0.h1", "m1"), ("a0.h2", "m1"),
                                   ("m1", "logits")])
    assert c2.n_block_params == 2 * head + layer_attn + mlp
    # the old number (embeddings and unembedding included, over all parameters) stays, under its own name
    g = c.graph
    params = dict(zip(g.nodes, g.node_params))
    assert c.param_fraction_with_embeddings == sum(params[n] for n in ("input", "a0.h1", "m1", "logits")) / sum(
        g.node_params)
    assert c.param_fraction_with_embeddings > 0.9  # the tied 50257 x 64 embedding dominates gpt2-tiny
    s = c.summary()
    assert (s["param_fraction"], s["n_block_params"], s["block_params"]) == (c.param_fraction, head + layer_attn + mlp,
                                                                            blocks)


def test_circuit_size_counts_a_gqa_kv_group_once(tiny_llama):
    # make_llama: 2 layers, d_model 64, 4 query heads of 16 in 2 kv groups, d_mlp 128, no biases, RMSNorm.
    head = 2 * 64 * 16  # W_Q and W_O slices
    kv = 2 * 64 * 16  # the kv group's W_K and W_V slices
    mlp = 3 * 64 * 128 + 64  # gate, up, down + ln2
    blocks = 2 * (4 * head + 2 * kv + 64 + mlp)
    c = _hand_circuit(tiny_llama, [("input", "a0.h0<q>"), ("input", "a0.h1<q>"), ("a0.h0", "m1"), ("a0.h1", "m1"),
                                   ("m1", "logits")])
    assert c.graph.block_params == blocks
    assert c.n_block_params == 2 * head + kv + 64 + mlp  # h0 and h1 share kv group 0: counted once
    assert c.param_fraction == c.n_block_params / blocks


def test_circuit_results_share_one_run_and_load_the_flat_format(tiny_gpt2, tmp_path):
    from tlcap.atomic import json_digest
    from tlcap.locate.circuits.run import RUN_FIELDS, CircuitRun

    sc = edge_attribution(tiny_gpt2, PROMPT, TARGET, CORRUPT, steps=2)
    circ = sc.select(top_n=10)
    assert isinstance(sc.run, CircuitRun) and circ.run == sc.run and circ.random_like(0).run == sc.run
    assert (sc.prompt, sc.target, sc.corrupt_prompt, sc.method, sc.steps) == (PROMPT, TARGET, CORRUPT, "eap-ig", 2)
    assert load_result(sc.save(tmp_path / "new")).run == sc.run
    # a result saved before the run was one value holds its fields flat: it loads into the same run
    path = sc.save(tmp_path / "old")
    doc = json.loads((path / "result.json").read_text())
    run = doc["fields"].pop("run")
    doc["fields"].update({k: run[k] for k in RUN_FIELDS})
    doc.pop("json_sha256")
    doc["json_sha256"] = json_digest(doc)
    (path / "result.json").write_text(json.dumps(doc))
    assert load_result(path).run == sc.run
