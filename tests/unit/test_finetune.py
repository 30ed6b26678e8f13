"""Masked fine-tuning's Adam on the trained neurons' slices equals the full masked step (CNL enhance)."""

from __future__ import annotations

import pytest
import torch

from tlcap.metrics.sets import NeuronSet

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_located_steps_on_slices_equal_the_full_masked_adam_step(name, monkeypatch):
    """``"located"`` mode runs Adam on the trained neurons' slices only (``_Slice``): every weight after two epochs
    equals the full masked step's (Adam over whole matrices, gradients masked), bit for bit; the frozen neurons keep
    their values and the trained ones moved."""
    from tlcap.data.tasks import load_task
    from tlcap.intervene import finetune as F
    from tlcap.models import make_gpt2, make_llama

    m = make_gpt2("tiny", seed=0) if name == "gpt2" else make_llama(seed=0)
    train = load_task("emotion", split="train", n=3)
    ns = NeuronSet(((0, 1), (0, 7), (1, 2)), shape=(m.n_layers, m.d_mlp))
    params = {ws.param for ws, _ in F.neuron_params(m, ns)}
    got = {}
    for share in (0.5, -1.0):  # -1: never slice (the full masked step)
        monkeypatch.setattr(F, "SLICE_SHARE", share)
        edit = F.masked_finetune(m, train, ns, epochs=2, lr=1e-2, progress=False)
        got[share] = {id(p): p.detach().clone() for p in params}
        edit.undo()
    before = {id(p): p.detach().clone() for p in params}
    for p in params:
        assert torch.equal(got[0.5][id(p)], got[-1.0][id(p)])
    moved = [ws for ws, _ in F.neuron_params(m, ns) if not torch.equal(got[0.5][id(ws.param)], before[id(ws.param)])]
    assert len(moved) == len(params)  # every trained matrix moved
    out = m.mlp_out_weight(1)
    changed = (got[0.5][id(out.param)] != before[id(out.param)]).movedim(out.neuron_dim, 0).flatten(1).any(1)
    assert changed.nonzero()[:, 0].tolist() == [2]  # only neuron (1, 2) of layer 1's down projection


def _reference_master_adam(m, train, ns, mode, lr, epochs=1, seed=0):
    """Slow reference of mixed-precision Adam: float32 master copies of the trained parameters, torch's Adam on
    them with the masked gradients of the half-precision forward/backward, the model's weights the masters
    rounded after every step. Returns the masters."""
    import random

    from tlcap.data.tasks import encode_sample
    from tlcap.intervene import finetune as F

    params, masks, _ = F.trained_params(F.neuron_params(m, ns, mode))
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adam(masters, lr=lr, foreach=False)
    enc = [encode_sample(m, s, 16) for s in train]
    rng = random.Random(seed)
    for p in params:
        p.requires_grad_(True)
    for _ in range(epochs):
        order = list(range(len(enc)))
        rng.shuffle(order)
        for k in order:
            p_ids, t_ids = enc[k]
            logits = m.logits(torch.tensor([p_ids + t_ids[:-1]]))[0, len(p_ids) - 1:].float()
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor(t_ids))
            for p in params:
                p.grad = None
            loss.backward()
            for p, w in zip(params, masters):
                w.grad = p.grad.float() * masks[id(p)]
            opt.step()
            with torch.no_grad():
                for p, w in zip(params, masters):
                    p.copy_(w)
    for p in params:
        p.requires_grad_(False)
        p.grad = None
    return params, masters


def _ulp(x):
    """bfloat16 ulp of float32 values (7 explicit mantissa bits)."""
    return 2.0 ** (torch.floor(torch.log2(x.float().abs().clamp_min(2.0**-14))) - 7)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_compensated_half_precision_follows_float32_master_adam(name):
    """In bfloat16, ``precision="compensated"`` (the default there) tracks mixed-precision Adam with float32
    master weights (a slow reference written here): after 12 ``"located"`` steps at lr 1e-4 every weight is
    within one bfloat16 ulp of the rounded master (a weight at a rounding boundary), frozen neurons keep their
    values and no parameter keeps a gradient; Adam in bfloat16 itself (``precision="param"``) ends 9–30 ulps
    away. (``"except"`` trains every other neuron: there the trajectories' 1-ulp differences feed back
    through the gradients, so its step is tested on fixed gradients below and bit for bit in float32.)"""
    from tlcap.data.tasks import load_task
    from tlcap.intervene import finetune as F
    from tlcap.models import make_gpt2, make_llama

    def fresh():
        if name == "gpt2":
            return make_gpt2("tiny", seed=0, dtype=torch.bfloat16)
        return make_llama(seed=0, dtype=torch.bfloat16)

    train = load_task("emotion", split="train", n=6)
    m = fresh()
    ns = NeuronSet(((0, 1), (0, 7), (1, 2)), shape=(m.n_layers, m.d_mlp))
    _, masters = _reference_master_adam(m, train, ns, "located", lr=1e-4, epochs=2)
    ref = [w.detach().clone() for w in masters]
    worst = {}
    for precision in ("auto", "param"):
        m = fresh()
        params, mask, _ = F.trained_params(F.neuron_params(m, ns, "located"))
        before = [p.detach().clone() for p in params]
        edit = F.masked_finetune(m, train, ns, epochs=2, lr=1e-4, precision=precision, progress=False)
        assert edit.meta["precision"] == ("compensated" if precision == "auto" else "param")
        worst[precision] = max(float(((p.detach().float() - w.to(torch.bfloat16).float()).abs() / _ulp(w)).max())
                               for p, w in zip(params, ref))
        for p, b in zip(params, before):
            assert p.grad is None and not p.requires_grad
            frozen = ~mask[id(p)].expand_as(p)
            assert torch.equal(p.detach()[frozen], b[frozen])
        edit.undo()
    assert worst["auto"] <= 1.0 < 8.0 < worst["param"], worst


def test_compensated_step_tracks_float32_adam_where_bfloat16_adam_loses_steps():
    """One bfloat16 parameter, 200 Adam steps of gradients with a steady sign (lr 1e-5, so each step is at most 1e-5,
    below half an ulp of weights above ~0.003): ``weight + residual`` stays within the compensated bound
    (every step loses at most half an ulp of a residual, itself at most half an ulp of the weight: 2^-16 |w|
    per step) of torch's Adam on a float32 copy fed the same gradients, and the weight is that master rounded
    for nearly all entries; torch's Adam on the bfloat16 parameter itself ends far outside the bound."""
    from tlcap.intervene import finetune as F

    gen = torch.Generator().manual_seed(0)
    w0 = (torch.randn(64, 32, generator=gen) * 0.05).to(torch.bfloat16)
    grads = [(0.5 + torch.randn(64, 32, generator=gen)).to(torch.bfloat16) for _ in range(200)]
    lr = 1e-5
    comp = torch.nn.Parameter(w0.clone(), requires_grad=False)
    st = F._CompensatedAdam(comp, 1, torch.ones(1, 32, dtype=torch.bool), lr)
    assert st.idx is None  # every neuron trained: the whole parameter, masked
    master = torch.nn.Parameter(w0.float())
    opt32 = torch.optim.Adam([master], lr=lr, foreach=False)
    plain = torch.nn.Parameter(w0.clone())
    opt16 = torch.optim.Adam([plain], lr=lr, foreach=False)
    for g in grads:
        st.step(g)
        master.grad, plain.grad = g.float(), g.clone()
        opt32.step()
        opt16.step()
    bound = 200 * 2.0**-16 * w0.float().abs().clamp_min(2.0**-10)
    err = (comp.detach().float() + st.residual.float() - master.detach()).abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    assert float((comp.detach() == master.detach().to(torch.bfloat16)).float().mean()) > 0.99
    err16 = (plain.detach().float() - master.detach()).abs()
    assert float((err16 > bound).float().mean()) > 0.5
    assert float((master.detach() - w0.float()).abs().mean()) > 5e-4  # the steps add up to ~9e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("sliced", [False, True])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_the_compensated_step_equals_its_reference_bit_for_bit(dtype, sliced, mask_dtype):
    """The compensated step, rewritten to make no pass over the entries a copy (the masked gradient written in
    float32 at once, the weight rounded straight into the parameter, the residual from it), gives the old step's
    (``benchmarks/bench_compensated_adam.py``'s reference)
    weights, residuals and moments bit for bit over 20 steps: whole parameters with a mask (``"except"`` mode) and
    slices (``"located"``), in bfloat16, float16 and float32, with zero, signed-zero, tiny and large gradients."""
    from benchmarks.bench_compensated_adam import reference_step
    from tlcap.intervene import finetune as F

    gen = torch.Generator().manual_seed(1)
    w0 = (torch.randn(48, 40, generator=gen) * 0.05).to(dtype)
    mask = torch.zeros(1, 40, dtype=mask_dtype)
    mask[0, [1, 5, 6] if sliced else list(range(3, 40))] = 1
    new_p, ref_p = (torch.nn.Parameter(w0.clone(), requires_grad=False) for _ in range(2))
    new, ref = F._CompensatedAdam(new_p, 1, mask, 1e-3), F._CompensatedAdam(ref_p, 1, mask, 1e-3)
    assert (new.idx is not None) == sliced and (new.mask is None) == sliced
    for k in range(20):
        g = (torch.randn(48, 40, generator=gen) * 10.0 ** (k % 5 - 3)).to(dtype)
        g[0, :7] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0, 0.0]).to(dtype)
        new.step(g)
        reference_step(ref, g.clone())
    for a, b in ((new_p, ref_p), (new.residual, ref.residual), (new.exp_avg, ref.exp_avg),
                 (new.exp_avg_sq, ref.exp_avg_sq)):
        assert a.dtype == b.dtype and torch.equal(a.detach(), b.detach())
    assert not torch.equal(new_p.detach(), w0)  # the steps moved the trained entries


@pytest.mark.parametrize("mode", ["located", "except"])
def test_compensated_equals_torch_adam_in_float32(mode):
    """On a float32 model the compensated step (float32 moments, residual 0, each parameter stepping in the
    backward pass) gives torch's Adam bit for bit, sliced (``"located"``) and masked whole (``"except"``)."""
    from tlcap.data.tasks import load_task
    from tlcap.intervene import finetune as F
    from tlcap.models import make_llama

    m = make_llama(seed=0)
    train = load_task("emotion", split="train", n=3)
    ns = NeuronSet(((0, 1), (0, 7), (1, 2)), shape=(m.n_layers, m.d_mlp))
    params = F.trained_params(F.neuron_params(m, ns, mode))[0]
    got = {}
    for precision in ("param", "compensated"):
        edit = F.masked_finetune(m, train, ns, mode=mode, epochs=2, lr=1e-2, precision=precision, progress=False)
        assert edit.meta["precision"] == precision
        got[precision] = [p.detach().clone() for p in params]
        assert all(p.grad is None for p in params)
        edit.undo()
    for a, b in zip(got["param"], got["compensated"]):
        assert torch.equal(a, b)


def test_progress_bars_name_the_experiments_mode_and_random_draw(capsys):
    """A random set is fine-tuned in the low-level ``"located"`` mode on random neurons; its progress bar must say
    which random set it is, not ``located`` (the enhance experiment showed 'finetune located' for every draw)."""
    from tlcap.data.tasks import load_task
    from tlcap.experiments.cnl.enhance import tuned
    from tlcap.models import make_llama

    m = make_llama(seed=0)
    train = load_task("emotion", split="train", n=2)
    ns = NeuronSet(((0, 1), (1, 2)), shape=(m.n_layers, m.d_mlp))
    bars = {}
    for mode, draw in (("located", 0), ("random", 2), ("wo_located", 0)):
        with tuned(m, train, ns, mode, epochs=1, progress=True, draw=draw):
            pass
        bars[mode] = capsys.readouterr().err
    assert "finetune located epoch 1" in bars["located"]
    assert "finetune random set 2 epoch 1" in bars["random"] and "finetune located" not in bars["random"]
    assert "finetune wo_located epoch 1" in bars["wo_located"]


def test_host_snapshots_restore_a_parameter_exactly():
    """``WeightEdit(host=True)`` (what fine-tuning uses: on an accelerator the snapshots go to host memory) keeps a
    separate copy and restores it exactly; on the CPU, the host, it is an ordinary clone. (The accelerator copy is
    ``to("cpu", copy=True)`` and the undo's ``copy_`` across devices; the ``cuda``-marked fine-tuning test runs it.)"""
    from tlcap.intervene.weights import WeightEdit

    p = torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)
    before = p.detach().clone()
    edit = WeightEdit(host=True)
    edit.touch(p).mul_(2.0)
    saved = edit._saved[id(p)][1]
    assert saved.device.type == "cpu" and saved.data_ptr() != p.data.data_ptr()
    edit.undo()
    assert torch.equal(p.detach(), before)


@pytest.mark.cuda
def test_cuda_bf16_fine_tuning_steps_compensated_with_host_snapshots():
    """On a GPU in bfloat16: the compensated step, every snapshot in host memory, the weights restored exactly,
    and the same weights as the CPU run (one bfloat16 ulp at most: the devices' float32 sums differ)."""
    from tlcap.data.tasks import load_task
    from tlcap.intervene import finetune as F
    from tlcap.models import make_llama

    train = load_task("emotion", split="train", n=4)
    got = {}
    for dev in ("cpu", "cuda"):
        # vocab 50257: the vendored GPT-2 BPE serves where the SmolLM2 tokenizer is absent (a GPU machine)
        m = make_llama(seed=0, dtype=torch.bfloat16, device=dev, vocab=50257)
        ns = NeuronSet(((0, 1), (1, 2)), shape=(m.n_layers, m.d_mlp))
        params = F.trained_params(F.neuron_params(m, ns))[0]
        before = [p.detach().clone() for p in params]
        edit = F.masked_finetune(m, train, ns, epochs=2, lr=1e-4, progress=False)
        assert edit.meta["precision"] == "compensated"
        assert all(saved.device.type == "cpu" for _, saved in edit._saved.values())
        got[dev] = [p.detach().float().cpu() for p in params]
        edit.undo()
        assert all(torch.equal(p.detach(), b) for p, b in zip(params, before))
    for a, b in zip(got["cpu"], got["cuda"]):
        assert bool(((a - b).abs() <= _ulp(a)).all())
