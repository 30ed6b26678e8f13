"""Models dispatched over devices by accelerate (some layers offloaded to disk) give the plain model's results.

On a CPU the offloaded layer's weights live in files (``meta`` in the module, put in by accelerate
around each forward), which is the hard case for hooks, packed rows, gradients and weight edits;
GPUs split by ``n_devices`` take the same code paths (the ``cuda``-marked test at the end splits a
model between a GPU and the CPU, so activations, caches and edits really cross devices).
"""

from __future__ import annotations

import pytest
import torch

from tests.cli_helpers import assert_cli_error
from tlcap.attribution import integrated_gradients
from tlcap.attribution.dataset import score_dataset
from tlcap.data.tasks import Sample
from tlcap.errors import InvalidConfigError, UnsupportedModelError
from tlcap.intervene.finetune import masked_finetune
from tlcap.intervene.rome import RomeConfig, rome_edit
from tlcap.intervene.weights import erase_neurons
from tlcap.locate.causal_trace import causal_trace
from tlcap.locate.circuits.eap import edge_attribution
from tlcap.metrics.sets import NeuronSet
from tlcap.models import load_model, make_llama
from tlcap.models.placement import Placement, is_offloaded
from tlcap.runtime.batching import device_shares
from tlcap.runtime.run_control import RunControl

PROMPT, SUBJECT, TARGET = "The Eiffel Tower is located in the city of", "The Eiffel Tower", " Paris"
MAP = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
       "model.layers.2": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
ROME = RomeConfig(steps=3, cov_tokens=256, cov_seq_len=64, clamp_norm_factor=1e3, weight_decay=0.0, prefixes=("",))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    plain = make_llama(seed=0, n_layers=3)
    split = make_llama(seed=0, n_layers=3, placement=Placement(MAP, offload_folder=str(tmp_path_factory.mktemp("off"))))
    return plain, split


def test_layer_is_offloaded_and_the_model_knows_where_layers_run(pair):
    plain, split = pair
    down = split.hf_model.model.layers[1].mlp.down_proj
    assert down.weight.device.type == "meta" and is_offloaded(down)  # really only in accelerate's files
    assert split.mlp_out_weight(1).offloaded and not split.mlp_out_weight(0).offloaded
    assert split.device == torch.device("cpu") and split.layer_devices == [torch.device("cpu")] * 3
    assert device_shares(split) == {torch.device("cpu"): 1.0}
    assert torch.equal(split.mlp_down_matrix(1), plain.mlp_down_matrix(1))  # the handle holds the real values
    assert split.mlp_out_weight(1).param is split.mlp_out_weight(1).param  # one handle: edits snapshot once
    t = plain.to_tokens(PROMPT)
    assert torch.equal(split.logits(t), plain.logits(t))


def test_ig_and_cnl_scoring_equal_the_plain_model(pair):
    plain, split = pair
    a = integrated_gradients(plain, PROMPT, TARGET, steps=4)
    b = integrated_gradients(split, PROMPT, TARGET, steps=4)
    torch.testing.assert_close(b.scores, a.scores, rtol=1e-5, atol=1e-9)
    assert a.scores.abs().max() > 0
    samples = [Sample("Item 1 is", " very red", uid="1"), Sample("The sky on a clear day is", " blue", uid="2")]
    for batch in (1, 2):  # one sample at a time, and both samples' rows packed in shared batches
        da = score_dataset(plain, samples, max_answer_tokens=2, steps=3, sample_batch=batch, run=RunControl(progress=False))
        db = score_dataset(split, samples, max_answer_tokens=2, steps=3, sample_batch=batch, run=RunControl(progress=False))
        torch.testing.assert_close(db.scores, da.scores, rtol=1e-5, atol=1e-9)


def test_trace_and_eap_equal_the_plain_model(pair):
    plain, split = pair
    ta = causal_trace(plain, PROMPT, SUBJECT, TARGET, samples=2, warn=False)
    tb = causal_trace(split, PROMPT, SUBJECT, TARGET, samples=2, warn=False)
    torch.testing.assert_close(tb.scores, ta.scores, rtol=1e-5, atol=1e-7)
    corrupt = "The Colosseum is located in the city of"
    for steps in (1, 3):
        ea = edge_attribution(plain, PROMPT, TARGET, corrupt, steps=steps)
        eb = edge_attribution(split, PROMPT, TARGET, corrupt, steps=steps)
        torch.testing.assert_close(eb.scores, ea.scores, rtol=1e-5, atol=1e-7)


def test_weight_edits_on_an_offloaded_layer_apply_and_undo(pair):
    plain, split = pair
    t = plain.to_tokens(PROMPT)
    before = plain.logits(t)
    with erase_neurons(plain, [(1, 3), (1, 7), (0, 2)]), erase_neurons(split, [(1, 3), (1, 7), (0, 2)]):
        erased = plain.logits(t)
        assert not torch.equal(erased, before)
        assert torch.equal(split.logits(t), erased)
    assert torch.equal(split.logits(t), before)
    with rome_edit(plain, PROMPT, SUBJECT, " Rome", 1, config=ROME) as ra, \
            rome_edit(split, PROMPT, SUBJECT, " Rome", 1, config=ROME) as rb:
        torch.testing.assert_close(rb.delta, ra.delta, rtol=1e-5, atol=1e-6)
        edited = plain.logits(t)
        assert (edited - before).abs().max() > 1e-3
        torch.testing.assert_close(split.logits(t), edited, rtol=1e-5, atol=1e-6)
    assert torch.equal(split.logits(t), before) and torch.equal(plain.logits(t), before)


def test_fine_tuning_refuses_offloaded_layers(pair):
    _, split = pair
    ns = NeuronSet(((1, 0),), (split.n_layers, split.d_mlp))
    with pytest.raises(UnsupportedModelError, match="layer 1's MLP weights .* offloaded"):
        masked_finetune(split, [Sample("Item 1 is", " red", uid="1")], ns, mode="located")


def test_load_model_dispatches_a_registered_model(tmp_path):
    plain = load_model("qwen2-tiny")
    split = load_model("qwen2-tiny", device_map={**MAP, "model.layers.1": "cpu", "model.layers.0": "disk"},
                       offload_folder=str(tmp_path))
    assert is_offloaded(split.hf_model.model.layers[0].mlp.down_proj)
    a = integrated_gradients(plain, PROMPT, TARGET, steps=3)
    b = integrated_gradients(split, PROMPT, TARGET, steps=3)
    torch.testing.assert_close(b.scores, a.scores, rtol=1e-5, atol=1e-9)


def test_placement_errors(tmp_path):
    with pytest.raises(InvalidConfigError, match="offload_folder needs a device_map"):
        load_model("qwen2-tiny", offload_folder=str(tmp_path))
    with pytest.raises(InvalidConfigError, match="'disk' entries needs offload_folder"):
        load_model("qwen2-tiny", device_map=MAP)
    with pytest.raises(InvalidConfigError, match="n_devices"):
        load_model("qwen2-tiny", n_devices=0)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidConfigError, match="CUDA device"):
            load_model("qwen2-tiny", device="cpu", n_devices=2)
        out = tmp_path / "o"
        assert_cli_error(["kn", "--model", "qwen2-tiny", "--prompt", "The capital of France is", "--target", " Paris",
                          "--device", "cuda*2", "--out", str(out)], "CUDA is not available", out=out, exact=False)
    out = tmp_path / "o2"
    assert_cli_error(["kn", "--model", "qwen2-tiny", "--prompt", "The capital of France is", "--target", " Paris",
                      "--device", "cuda*x", "--out", str(out)],
                     "device (--device) 'cuda*x': write cuda*N with N >= 1 GPUs, e.g. cuda*4", out=out)


@pytest.mark.cuda
def test_split_between_a_gpu_and_the_cpu_equals_one_gpu():
    """Layers on cuda:0 and on the CPU (executed there): activations, hooks, caches and weight edits cross devices."""
    dev_map = {"model.embed_tokens": torch.device("cuda:0"), "model.rotary_emb": torch.device("cuda:0"),
               "model.layers.0": torch.device("cuda:0"), "model.layers.1": torch.device("cpu"),
               "model.layers.2": torch.device("cuda:0"), "model.norm": torch.device("cuda:0"),
               "lm_head": torch.device("cuda:0")}
    # GPT-2's vocabulary: the vendored tokenizer then serves where SmolLM2's is not cached (an offline GPU machine)
    one = make_llama(seed=0, n_layers=3, device="cuda", vocab=50257)
    split = make_llama(seed=0, n_layers=3, placement=Placement(dev_map, main_device="cpu"), vocab=50257)
    assert split.layer_devices == [torch.device("cuda:0"), torch.device("cpu"), torch.device("cuda:0")]
    a = integrated_gradients(one, PROMPT, TARGET, steps=4)
    b = integrated_gradients(split, PROMPT, TARGET, steps=4)
    torch.testing.assert_close(b.scores, a.scores, rtol=1e-4, atol=1e-7)
    samples = [Sample("Item 1 is", " very red", uid="1"), Sample("The sky on a clear day is", " blue", uid="2")]
    da = score_dataset(one, samples, max_answer_tokens=2, steps=3, sample_batch=2, run=RunControl(progress=False))
    db = score_dataset(split, samples, max_answer_tokens=2, steps=3, sample_batch=2, run=RunControl(progress=False))
    torch.testing.assert_close(db.scores, da.scores, rtol=1e-4, atol=1e-7)
    ta = causal_trace(one, PROMPT, SUBJECT, TARGET, samples=2, warn=False)
    tb = causal_trace(split, PROMPT, SUBJECT, TARGET, samples=2, warn=False)
    torch.testing.assert_close(tb.scores, ta.scores, rtol=1e-4, atol=1e-6)
    t = one.to_tokens(PROMPT)
    with erase_neurons(one, [(1, 3)]), erase_neurons(split, [(1, 3)]):
        torch.testing.assert_close(split.logits(t).cpu(), one.logits(t).cpu(), rtol=1e-4, atol=1e-5)
