"""Device and precision: ``device=``/``dtype=`` through ``load_model``, the CLI options, bf16 IG.

bf16 vs float32 (same random weights, cast): bf16 keeps 8 significant bits (unit roundoff
2^-8 ≈ 0.39 %). Measured on these tiny models (2 seeds × 2 prompts, 20 midpoint steps) the
largest |score_bf16 − score_fp32| is 0.5–1.5 % of the largest |score_fp32| and the located sets
(score > 0.2·max) have IoU ≥ 0.8; the bound asserted is 8 units of roundoff (3.1 %) and IoU ≥ 0.7.
The completeness error of bf16 runs is large on these near-uniform random models (p ≈ 2e-5,
so p_full − p_baseline sits at bf16's resolution of the logits); it is reported, not asserted.
"""

from __future__ import annotations

import pytest
import torch

from tests.cli_helpers import assert_cli_error
from tlcap.attribution import integrated_gradients
from tlcap.errors import InvalidConfigError, TlcapError
from tlcap.models import load_model, make_llama
from tlcap.runtime.device import resolve_device, resolve_dtype

BF16_ROUNDOFF = 2.0**-8


def _compare(m32, mbf, prompt: str, target: str) -> tuple[float, float]:
    a = integrated_gradients(m32, prompt, target, steps=20)
    b = integrated_gradients(mbf, prompt, target, steps=20)
    assert a.scores.dtype == b.scores.dtype == torch.float32
    rel = float((a.scores - b.scores).abs().max() / a.scores.abs().max())
    iou = float(a.select(threshold=0.2).iou(b.select(threshold=0.2)))
    print(f"{m32.name}: max relative score error {rel:.4f}, IoU {iou:.3f}, completeness error fp32 "
          f"{a.completeness_rel_error:.2e} bf16 {b.completeness_rel_error:.2e}")
    return rel, iou


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_bf16_ig_agrees_with_float32(arch):
    if arch == "gpt2":
        m32, mbf = load_model("gpt2-tiny", device="cpu"), load_model("gpt2-tiny", device="cpu", dtype="bfloat16")
    else:
        m32, mbf = make_llama(seed=0, device="cpu"), make_llama(seed=0, device="cpu", dtype=torch.bfloat16)
    assert next(mbf.backend.parameters()).dtype == torch.bfloat16
    assert next(m32.backend.parameters()).dtype == torch.float32
    rel, iou = _compare(m32, mbf, "The capital of France is", " Paris")
    assert 0 < rel <= 8 * BF16_ROUNDOFF  # > 0: the bf16 model really ran in bf16
    assert iou >= 0.7


def test_float16_and_aliases_resolve():
    assert resolve_dtype(None) is torch.float32
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("float16") is torch.float16
    assert resolve_dtype(torch.bfloat16) is torch.bfloat16
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert next(load_model("gpt2-tiny", device="cpu", dtype="float16").backend.parameters()).dtype == torch.float16


@pytest.mark.parametrize("kwargs, needle", [
    (dict(dtype="int8"), "unknown dtype 'int8' (--dtype)"),
    (dict(dtype=torch.float64), "unknown dtype 'float64' (--dtype)"),
    (dict(device="gpu"), "'gpu' is not a torch device"),
    (dict(device="cuda:99"), "'cuda:99'"),
])
def test_invalid_dtype_or_device_is_a_tlcap_error(kwargs, needle):
    with pytest.raises(InvalidConfigError) as e:
        load_model("gpt2-tiny", **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("option, value, message", [
    ("--dtype", "int8", "unknown dtype 'int8' (--dtype); choose one of: float32, bfloat16, float16"),
    ("--device", "gpu", "device (--device) 'gpu' is not a torch device; use auto, cpu, cuda or cuda:N"),
])
@pytest.mark.parametrize("command", [
    ["kn", "--prompt", "The capital of France is", "--target", " Paris"],
    ["trace", "--prompt", "The capital of France is", "--subject", "France", "--target", " Paris"],
    ["cnl", "fidelity", "--n", "1"],
    ["cnl", "reliability", "--n", "1"],
    ["cnl", "decouple", "--n", "1"],
])
def test_cli_invalid_dtype_or_device_is_one_line(tmp_path, command, option, value, message):
    out = tmp_path / "o"
    assert_cli_error([*command, "--model", "gpt2-tiny", "--out", str(out), option, value], message, out=out)


def test_tlcap_error_base():
    assert issubclass(InvalidConfigError, TlcapError)


def test_shape_model_has_the_real_widths():
    m = load_model("smollm2-135m-shape", device="cpu", dtype="bfloat16", n_layers=1)
    assert (m.d_model, m.d_mlp, m.n_heads, m.n_kv_heads, m.d_head) == (576, 1536, 9, 3, 64)
    assert next(m.backend.parameters()).dtype == torch.bfloat16
    logits = m.last_logits(torch.tensor([[1, 2, 3]]))
    assert logits.shape[-1] == m.d_vocab and torch.isfinite(logits.float()).all()


@pytest.mark.cuda
def test_cuda_bf16_ig_agrees_with_float32():
    m32 = load_model("gpt2-tiny", device="cuda")
    mbf = load_model("gpt2-tiny", device="cuda", dtype="bfloat16")
    assert mbf.device.type == "cuda"
    rel, iou = _compare(m32, mbf, "The capital of France is", " Paris")
    assert 0 < rel <= 8 * BF16_ROUNDOFF and iou >= 0.7
