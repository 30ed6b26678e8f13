"""Dataset circuits on tiny random models: streamed scores are the mean of per-item scores, for any batch size."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from tlcap.errors import DataFormatError, EmptyDatasetError, InvalidConfigError, ShapeMismatchError
from tlcap.locate.circuits import (
    CircuitDataset,
    CircuitItem,
    EdgeGraph,
    edge_attribution,
    load_circuit_dataset,
    make_items_task,
)
from tlcap.locate.circuits import eap as eap_mod
from tlcap.locate.circuits.ablation import ablation_source
from tlcap.locate.circuits.config import EAPConfig
from tlcap.locate.circuits.dataset import dataset_batch_size, pair_corruptions, read_items
from tlcap.locate.circuits.dataset_eval import circuit_metrics, ready_source
from tlcap.locate.circuits.scoring import batch_scores
from tlcap.runtime import hooks as H
from tlcap.runtime.batching import SAFETY, eap_item_bytes

pytestmark = pytest.mark.heavy  # over ~5 s per module: runs after the fast gate (make unit)

# prompts of 5 and 6 tokens, a two-token target: batches mix row lengths (right padding)
ITEMS = (
    CircuitItem("The capital of France is", " Paris", "The capital of Italy is"),
    CircuitItem("The capital city of Germany is", " Berlin city", "The capital city of Spain is"),
    CircuitItem("London is the capital of", " England", "Paris is the capital of"),
    CircuitItem("The language of France is", " French", "The language of Italy is"),
)


@pytest.mark.parametrize(("name", "steps"), [("tiny_gpt2", 1), ("tiny_llama", 3)])  # EAP on MHA, EAP-IG on GQA
def test_dataset_scores_are_the_mean_of_item_scores_for_any_batch_size(request, name, steps):
    model = request.getfixturevalue(name)
    ds = CircuitDataset(ITEMS, "four")
    assert len({model.encode(it.prompt).__len__() for it in ITEMS}) > 1  # padding is exercised
    per_item = [edge_attribution(model, it.prompt, it.target, it.corrupt_prompt, steps=steps) for it in ITEMS]
    mean = torch.stack([s.scores for s in per_item]).double().mean(0)
    scale = float(mean.abs().max())
    assert scale > 1e-4
    for bs in (1, 3, "auto"):  # auto (the default): all 4 items fit in one pass on a CPU (at most 8)
        sc = edge_attribution(model, ds, steps=steps, batch_size=bs)
        assert sc.n_items == 4 and sc.dataset == "four" and sc.ablation == "corrupt"
        torch.testing.assert_close(sc.scores.double(), mean, atol=1e-5 * scale, rtol=1e-4)
        assert sc.clean_metric == pytest.approx(sum(s.clean_metric for s in per_item) / 4, rel=1e-5)
        assert sc.corrupt_metric == pytest.approx(sum(s.corrupt_metric for s in per_item) / 4, rel=1e-5)


def test_auto_batch_size_counts_split_inputs_only_where_a_pass_splits(tiny_llama):
    m = tiny_llama
    assert m.grouped_reader_grads  # gradient passes take q/k/v reader gradients without split inputs
    L, heads, d = m.n_layers, m.n_heads + 2 * m.n_kv_heads, m.d_model
    plain, split = eap_item_bytes(m, 10, 5, split=False), eap_item_bytes(m, 10, 5, split=True)
    assert split - plain == 5 * L * heads * d * 4 * 10 * 4  # 5 rows x layers x split copies x 4 intermediates x T x fp32
    ds = CircuitDataset(ITEMS, "four")
    longest = max(len(m.encode(it.prompt + it.target)) for it in ITEMS)
    budget = int(3 * eap_item_bytes(m, longest, 5, split=False) / SAFETY) + 64  # three unsplit items fit
    assert dataset_batch_size(m, ds, "auto", 5, max_memory=budget) == 3
    assert dataset_batch_size(m, ds, "auto", 5, max_memory=budget, circuit_runs=True) == max(
        1, int(budget * SAFETY) // eap_item_bytes(m, longest, 5, split=True)) < 3


def test_auto_batch_size_halves_on_out_of_memory(tiny_gpt2, monkeypatch):
    # an injected out-of-memory for passes of more than one item: edge_attribution, the
    # faithfulness curve and neuron_attribution rerun at half the size until it fits, same values
    import tlcap.locate.circuits.ablation as ablation_mod  # noqa: PLC0415
    import tlcap.locate.circuits.neurons as neurons_mod  # noqa: PLC0415
    import tlcap.locate.circuits.scoring as scoring_mod  # noqa: PLC0415
    from tlcap.locate.circuits.faithfulness import faithfulness_curve  # noqa: PLC0415
    from tlcap.locate.circuits.neurons import neuron_attribution  # noqa: PLC0415

    ds = CircuitDataset(ITEMS, "four")
    assert EAPConfig().batch_size == "auto" and dataset_batch_size(tiny_gpt2, ds, "auto") == 4
    assert dataset_batch_size(tiny_gpt2, CircuitDataset(ITEMS * 5, "twenty"), "auto") == 8  # the CPU cap
    fixed = edge_attribution(tiny_gpt2, ds, batch_size=1)
    curve1 = faithfulness_curve(tiny_gpt2, fixed, ds, sizes=[0, 5], batch_size=1)
    neur1 = neuron_attribution(tiny_gpt2, ds, batch_size=1)
    seen: list[int] = []

    def limit(real):
        def wrapped(model, graph, task, *args, **kwargs):
            seen.append(int(task.clean.shape[0]))
            if seen[-1] > 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
            return real(model, graph, task, *args, **kwargs)
        return wrapped

    for mod in (ablation_mod, scoring_mod, neurons_mod):
        monkeypatch.setattr(mod, "run_pass", limit(mod.run_pass))
    auto = edge_attribution(tiny_gpt2, ds)
    assert 4 in seen and seen[-1] == 1
    torch.testing.assert_close(auto.scores, fixed.scores, atol=1e-6, rtol=1e-5)
    seen.clear()
    neur = neuron_attribution(tiny_gpt2, ds)
    assert 4 in seen and seen[-1] == 1
    torch.testing.assert_close(neur.scores, neur1.scores, atol=1e-6, rtol=1e-5)
    # the provenance records what was asked ("auto"), not the size the machine resolved it to
    assert auto.provenance.config["batch_size"] == neur.provenance.config["batch_size"] == "auto"
    assert fixed.provenance.config["batch_size"] == 1
    monkeypatch.undo()
    curve = faithfulness_curve(tiny_gpt2, fixed, ds, sizes=[0, 5])
    assert curve.provenance.config["batch_size"] == "auto" and curve1.provenance.config["batch_size"] == 1
    a, b = curve.to_frame(), curve1.to_frame()  # float rounding differs with the batch size
    assert list(a.columns) == list(b.columns)
    for c in a.columns:
        if a[c].dtype.kind == "f":
            assert a[c].to_numpy() == pytest.approx(b[c].to_numpy(), rel=1e-5, abs=1e-6), c
        else:
            assert a[c].tolist() == b[c].tolist(), c


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama"])
def test_eap_ig_batch_of_three_items_equals_three_one_item_batches(request, name):
    """EAP-IG's in-hook gradient mean is per item in a multi-item batch (padding included)."""
    model = request.getfixturevalue(name)
    g = EdgeGraph.from_model(model)
    cfg = EAPConfig(steps=4, ablation="corrupt")
    src = ablation_source("corrupt")
    three = batch_scores(model, g, make_items_task(model, list(ITEMS[:3])), cfg, src)
    ones = [batch_scores(model, g, make_items_task(model, [it]), cfg, src) for it in ITEMS[:3]]
    ref = sum(o.scores for o in ones)
    assert float(ref.abs().max()) > 1e-4 and (ones[0].scores - ones[1].scores).abs().max() > 1e-5
    torch.testing.assert_close(three.scores, ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)
    torch.testing.assert_close(three.clean_metric, torch.cat([o.clean_metric for o in ones]), atol=1e-5, rtol=1e-5)


def _live_tensors() -> tuple[int, int]:
    """Live torch tensors: their number and the bytes of their distinct storages."""
    gc.collect()
    ts = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts if t.device.type != "meta"}
    return len(ts), sum(storages.values())


@pytest.mark.parametrize("steps", [1, 3])
def test_dataset_scoring_keeps_nothing_per_batch(tiny_gpt2, monkeypatch, steps):
    """Equal-length batches: what is alive when batch k starts is what was alive when batch 2 started.

    Only running sums cross batches, so a dataset's memory does not grow with its number of items
    (batch 1 is the baseline's exception: the previous batch's result is not yet held).
    """
    seen: list[tuple[int, int]] = []
    real = eap_mod.batch_scores

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(_live_tensors())
        return real(*args, **kwargs)

    monkeypatch.setattr(eap_mod, "batch_scores", spy)
    ds = CircuitDataset((ITEMS[0],) * 10, "same")  # 5 batches of 2 equal-length items
    sc = edge_attribution(tiny_gpt2, ds, batch_size=2, steps=steps)
    assert len(seen) == 5
    assert seen[1:] == [seen[1]] * 4, seen
    one = edge_attribution(tiny_gpt2, ITEMS[0].prompt, ITEMS[0].target, ITEMS[0].corrupt_prompt, steps=steps)
    torch.testing.assert_close(sc.scores, one.scores, atol=1e-5 * float(one.scores.abs().max()), rtol=1e-5)  # float32 order
    assert sc.clean_metric == pytest.approx(one.clean_metric, rel=1e-6)
    assert sc.corrupt_metric == pytest.approx(one.corrupt_metric, rel=1e-6)


def test_zero_ablation_dataset_mean_and_padding(tiny_gpt2):
    ds = CircuitDataset(ITEMS, "four").without_corrupt()
    per_item = [edge_attribution(tiny_gpt2, it.prompt, it.target, None) for it in ITEMS]
    mean = torch.stack([s.scores for s in per_item]).double().mean(0)
    sc = edge_attribution(tiny_gpt2, ds, batch_size=3)
    assert sc.ablation == "zero"
    torch.testing.assert_close(sc.scores.double(), mean, atol=1e-5 * float(mean.abs().max()), rtol=1e-4)
    task = make_items_task(tiny_gpt2, list(ITEMS[:2]))
    assert task.lengths.tolist() == [len(tiny_gpt2.encode(it.prompt)) + len(tiny_gpt2.target_ids(it.prompt, it.target)) - 1
                                     for it in ITEMS[:2]]
    assert task.real_positions().sum().item() == sum(task.lengths.tolist())


def test_unequal_clean_and_corrupt_lengths_name_the_item(tiny_gpt2):
    bad = CircuitItem("The capital of France is", " Paris", "The capital of the United Kingdom is")
    with pytest.raises(ShapeMismatchError, match=r"^item 1 \('The capital of France is'\): the corrupted prompt is 7 tokens"):
        edge_attribution(tiny_gpt2, CircuitDataset((ITEMS[0], bad)), batch_size=2)
    with pytest.raises(InvalidConfigError, match="has no corrupted prompts"):
        edge_attribution(tiny_gpt2, CircuitDataset(ITEMS).without_corrupt(), ablation="corrupt")
    with pytest.raises(InvalidConfigError, match="needs a target"):
        edge_attribution(tiny_gpt2, "The capital of France is")


def test_pairing_and_user_files(tiny_gpt2, tmp_path):
    plain = [CircuitItem(it.prompt, it.target, relation="r") for it in ITEMS]
    paired, dropped = pair_corruptions(tiny_gpt2, plain)
    # item 1 (6 tokens) has no same-length partner; the others pair with the next same-length item
    assert dropped == 1 and [p.prompt for p in paired] == [ITEMS[0].prompt, ITEMS[2].prompt, ITEMS[3].prompt]
    assert [p.corrupt_prompt for p in paired] == [ITEMS[2].prompt, ITEMS[3].prompt, ITEMS[0].prompt]
    rows = [{"prompt": it.prompt, "target": it.target, "relation": "r"} for it in ITEMS]
    (tmp_path / "d.json").write_text(json.dumps({"items": rows}))
    (tmp_path / "d.csv").write_text("prompt,target,relation\n" + "".join(f'"{r["prompt"]}",{r["target"]},r\n' for r in rows))
    for name in ("d.json", "d.csv"):
        ds = load_circuit_dataset(tmp_path / name, model=tiny_gpt2)
        assert [it.prompt for it in ds.items] == [p.prompt for p in paired] and ds.dropped == 1
        assert ds.items[0].target == " Paris" and ds.has_corrupt
        assert not load_circuit_dataset(tmp_path / name, model=tiny_gpt2, corrupt=False).has_corrupt
    (tmp_path / "bad.json").write_text(json.dumps([{"prompt": "x"}]))
    with pytest.raises(DataFormatError, match="item 0 needs non-empty 'prompt' and 'target'"):
        read_items(tmp_path / "bad.json")
    with pytest.raises(EmptyDatasetError, match="no items left"):
        load_circuit_dataset(tmp_path / "d.json", model=tiny_gpt2, relation="other")


def test_pararel_and_known_sources(tiny_gpt2):
    ds = load_circuit_dataset("pararel", relation="P36", n=6, model=tiny_gpt2)
    assert len(ds) == 6 and ds.name == "pararel:P36" and ds.has_corrupt
    for it in ds.items:
        assert len(tiny_gpt2.encode(it.prompt)) == len(tiny_gpt2.encode(it.corrupt_prompt))
        assert it.relation == "P36" and it.target != it.corrupt_target
    kn = load_circuit_dataset("known", relation="P17", n=4, model=tiny_gpt2, corrupt=False)
    assert len(kn) == 4 and all(it.relation == "P17" and it.corrupt_prompt is None for it in kn.items)
    with pytest.raises(InvalidConfigError, match="needs --relation"):
        load_circuit_dataset("pararel", model=tiny_gpt2)


def _upstream_sites(model):
    """(hook name, upstream slice) of every upstream node output: the input, each layer's heads, each MLP."""
    g = EdgeGraph.from_model(model)
    out = [("blocks.0.hook_resid_pre", slice(0, 1))]
    for l in range(model.n_layers):
        out.append((f"blocks.{l}.attn.hook_result", slice(g.head_index(l, 0), g.head_index(l, 0) + model.n_heads)))
        out.append((f"blocks.{l}.hook_mlp_out", slice(g.mlp_index(l), g.mlp_index(l) + 1)))
    return out


def _reference_means(model, items, positional):
    """Each node's output averaged over the real positions of every item run alone (independent of the engine)."""
    sites = _upstream_sites(model)
    per_item = []
    with model.edge_hooks():
        for it in items:
            toks = make_items_task(model, [it]).clean
            _, cache = model.run_with_cache(toks, [n for n, _ in sites])
            acts = [cache[n][0].double() for n, _ in sites]  # [pos, d] or [pos, head, d]
            per_item.append(torch.cat([a[:, None] if a.ndim == 2 else a for a in acts], 1))  # [pos, n_up, d]
    if not positional:
        return torch.cat(per_item).mean(0)[:, None]  # [n_up, 1, d]
    width = max(x.shape[0] for x in per_item)
    tot = torch.zeros(width, *per_item[0].shape[1:], dtype=torch.float64)
    cnt = torch.zeros(width, dtype=torch.float64)
    for x in per_item:
        tot[: x.shape[0]] += x
        cnt[: x.shape[0]] += 1
    return (tot / cnt[:, None, None]).transpose(0, 1)  # [n_up, pos, d]


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_llama"])
def test_every_ablation_is_exact_on_a_dataset(request, name):
    """Full circuit == the model on every item; empty circuit == the model with every node output ablated."""
    model = request.getfixturevalue(name)
    items = list(ITEMS[:3])
    ds = CircuitDataset(tuple(items), "three")
    g = EdgeGraph.from_model(model)
    sites = _upstream_sites(model)
    masks = torch.stack([g.valid_mask(), torch.zeros_like(g.valid_mask())])
    for ablation in ("corrupt", "zero", "mean", "mean-positional"):
        d = ds if ablation == "corrupt" else ds.without_corrupt()
        tasks = d.tasks(model, batch_size=2)
        src = ready_source(model, g, tasks, ablation)
        logits = circuit_metrics(model, g, tasks, masks, src, return_logits=True)["logits"]
        rows = [lg[:, r] for lg, t in zip(logits, tasks) for r in range(t.n_items)]  # [2, pos, V] per item, in order
        if ablation.startswith("mean"):
            ref_mean = _reference_means(model, items, ablation == "mean-positional")
            torch.testing.assert_close(src.mean.double(), ref_mean, atol=1e-5, rtol=1e-5)
        for lg, it in zip(rows, items, strict=True):
            task = make_items_task(model, [it])
            n = task.clean.shape[1]
            torch.testing.assert_close(lg[0, :n], model.logits(task.clean)[0], atol=1e-5, rtol=1e-5)
            if ablation == "corrupt":
                ablated = model.logits(task.corrupt)
            else:
                hooks = []
                for hook, sl in sites:
                    if ablation == "zero":
                        val = 0.0
                    else:
                        m = src.mean[sl, :n]  # [k, pos|1, d]
                        val = m[0] if hook.endswith("mlp_out") or hook.endswith("resid_pre") else m.transpose(0, 1)
                    hooks.append((hook, H.set_to(val)))
                with model.edge_hooks():
                    ablated = model.logits(task.clean, hooks=hooks)
            torch.testing.assert_close(lg[1, :n], ablated[0], atol=1e-5, rtol=1e-5)
