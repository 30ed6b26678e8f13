"""``bench_gpu.py --quick``'s machinery (sections by name, budgets, the cuda-test list) and the README GPU table."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from benchmarks import gpu_quick as Q
from benchmarks import gpu_table as T


class FakeReport:
    """``bench_gpu.Report``'s section contract, in memory."""

    def __init__(self) -> None:
        self.payload: dict = {}

    def section(self, key, fn):
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - as bench_gpu.Report records it
            res = {"error": f"{type(exc).__name__}: {exc}"}
        self.payload["/".join(key)] = res
        return res


def test_sections_are_called_by_name_with_what_their_signature_asks():
    def bench_kn_facts_batched(model, n, steps, batch, cap, peak, rule="midpoint"):
        return {"args": (model, n, steps, batch, cap, peak, rule)}

    def trace_facts_batched(model, n, extra):
        return {}

    mod = ModuleType("bench_gpu_fake")
    mod.bench_kn_facts_batched = bench_kn_facts_batched
    mod.trace_facts_batched = trace_facts_batched
    found = Q.batched_sections(mod)
    assert sorted(found) == ["kn_facts_batched", "trace_facts_batched"]
    values = {"model": "M", "n": 2, "steps": 20, "batch": 8, "cap": 12.0, "peak": 800.0, "device": "cuda"}
    assert Q.call_section(found["kn_facts_batched"], values) == {"args": ("M", 2, 20, 8, 12.0, 800.0, "midpoint")}
    with pytest.raises(TypeError, match="trace_facts_batched needs 'extra'"):
        Q.call_section(found["trace_facts_batched"], values)


def test_budget_skips_what_does_not_fit_and_stops_what_runs_over():
    rep = FakeReport()
    q = Q.Budget(rep, max_wall=2.0)
    assert q.run(("a",), lambda: {"x": 1}, budget=1.0) == {"x": 1}

    def forever() -> dict:
        while True:
            time.sleep(0.01)

    t0 = time.perf_counter()
    res = q.run(("slow",), forever, budget=0.5, need=0.1)
    assert res["error"] == "SectionTimeout: stopped at its budget of 0.5 s" and time.perf_counter() - t0 < 1.5
    res = q.run(("late",), lambda: {"x": 2}, budget=30.0, need=10.0)
    assert res["skipped"].startswith("out of time:") and "needs 10" in res["skipped"]


def test_cuda_test_files_are_the_ones_with_cuda_marks():
    files = Q.cuda_test_files()
    assert {"tests/unit/test_packed_rows.py", "tests/unit/test_placement.py", "tests/unit/test_device_dtype.py"} <= set(files)
    root = Path(Q.__file__).resolve().parent.parent
    assert all("@pytest.mark.cuda" in (root / f).read_text() for f in files)
    assert "tests/unit/test_gpu_quick.py" not in files  # names the mark in a string, marks no test


QUICK = {
    "quick": True, "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-27",
    "env": {"torch": "2.11.0", "transformer_lens": "4.3.0"},
    "matmul": {"n": 8192, "tflops": 800.0}, "settings": {"trace_samples": 10, "cnl_batch": 8},
    "cuda_tests": {"counts": {"passed": 6}, "summary": "6 passed in 40.1s"},
    "smollm2_shape": {"bfloat16": {"model": {"load_seconds": 1.0},
                                   "kn_exact_ig": {"samples_per_s": 2.0, "seconds_per_sample": 0.5,
                                                   "fraction_of_matmul_peak": 0.0005, "peak_gib": 1.06},
                                   "cnl_exact_ig": {"error": "OutOfMemoryError: CUDA out of memory\nmore"}}},
    "llama7b_shape": {"bfloat16": {"cnl_exact_ig_batched": {"samples_per_s": 1.95, "seconds_per_sample": 0.513,
                                                            "fraction_of_matmul_peak": 0.32, "peak_gib": 74.7,
                                                            "sample_batch": 8},
                                   "causal_trace": {"skipped": "out of time: 10 s left"}}},
}


def test_gpu_table_rows_and_block(tmp_path):
    md = T.markdown(QUICK, "gpu_quick.json")
    assert md.startswith("Measured on **NVIDIA H100 80GB HBM3** (2026-11-27, torch 2.11.0, transformer-lens 4.3.0; "
                         "`python benchmarks/bench_gpu.py --quick`, JSON: `gpu_quick.json`); measured bf16 matmul peak 800")
    assert "| KN exact IG, 20 steps, one fact | SmolLM2-135M shape | bfloat16 | 2 | 0.5 | 0.05 % | 1.1 |  |" in md
    assert "| CNL exact IG, one GSM8K sample at a time | SmolLM2-135M shape | bfloat16 | not measured: OutOfMemoryError: " \
           "CUDA out of memory |  |  |  |  |" in md
    assert "| CNL exact IG, 8 GSM8K samples batched | Llama-2-7B shape | bfloat16 | 1.95 | 0.513 | 32.0 % | 74.7 | 8 |" in md
    # a section that did not run is named with the run's settings (it records none of its own)
    assert "| causal trace, 10 noise samples, one prompt | Llama-2-7B shape | bfloat16 | not measured: out of time: " \
           "10 s left |" in md
    assert "not measured: out of time: 10 s left" in md and md.endswith("`cuda`-marked tests there: 6 passed in 40.1s.")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{T.START}\nold table\n{T.END}\noutro\n")
    (tmp_path / "q.json").write_text(json.dumps(QUICK))
    T.main([str(tmp_path / "q.json"), "--write", str(readme)])
    text = readme.read_text()
    assert text.startswith(f"intro\n{T.START}\nMeasured on") and text.endswith(f"{T.END}\noutro\n") and "old table" not in text
    with pytest.raises(ValueError, match="no <!-- gpu-table:start -->"):
        T.replace_block("no markers", "x")


def test_run_timed_leaves_out_the_plateau_probes_of_its_timed_calls():
    """A probe that falls into a timed call is reported (``probe_seconds``) and not counted per sample."""
    import torch

    from benchmarks import bench_gpu as B
    from tlcap.runtime import plateau as P

    P.clear_plateaus()

    def with_probe() -> None:  # a call whose batch_rows="auto" probe takes 0.2 s of its time
        time.sleep(0.2)
        P._CACHE[("fake",)] = P.Plateau(rows=64, rates=((8, 1.0), (64, 2.0)), cap=64, limited=False, seconds=0.2)

    try:
        res = B.run_timed([lambda: None, with_probe, lambda: time.sleep(0.05)], torch.device("cpu"), cap=10.0)
    finally:
        P.clear_plateaus()
    assert res["n"] == 2 and res["probe_seconds"] == pytest.approx(0.2)
    assert res["seconds"] == pytest.approx(res["seconds_with_probes"] - 0.2)
    assert 0.04 < res["seconds"] < 0.2  # the 0.05 s call and the probe call's own work, not the probe
    assert res["samples_per_s"] == pytest.approx(2 / res["seconds"])


@pytest.mark.heavy
def test_gpu_goals_tiny_runs_the_chosen_sections(tmp_path):
    """``gpu_goals.py --tiny --only ...``: the chosen sections, auto at the fixed run's completeness."""
    from benchmarks import gpu_goals as G

    out = tmp_path / "goals.json"
    G.main(["--device", "cpu", "--tiny", "--out", str(out), "--only", "cnl_fixed_b8,cnl_auto_b8", "--cap", "2"])
    got = json.loads(out.read_text())["llama7b_shape"]
    assert set(got) == {"model", "cnl_fixed_b8", "cnl_auto_b8"}
    fixed, auto = got["cnl_fixed_b8"], got["cnl_auto_b8"]
    assert "error" not in fixed and "error" not in auto
    err = fixed["completeness_rel_error"]  # auto runs at it, clamped to [1e-4, 0.5] (float32 here: ~3e-5)
    assert auto["tol"] == pytest.approx(min(max(err, 1e-4), 0.5)) and auto["steps"] == "auto"
    assert fixed["evaluations_per_sample"] == 504.0  # 21 rows (20 nodes + baseline) x 3 layers x 8 answer tokens


@pytest.mark.heavy
def test_gpu_goals_tiny_times_the_weight_edit_rows(tmp_path):
    """``gpu_goals.py --tiny --only table2_rows,rome_rows,finetune_slices``: Table 2 and a ROME sweep one edit at a
    time and as rows, "located" fine-tuning on slices and in full, with the same results (the GPU run reports the
    speedups)."""
    from benchmarks import gpu_goals as G

    out = tmp_path / "goals.json"
    G.main(["--device", "cpu", "--tiny", "--out", str(out), "--only", "table2_rows,rome_rows,finetune_slices",
            "--cap", "2"])
    got = json.loads(out.read_text())["llama7b_shape"]
    assert set(got) == {"model", "table2_rows", "rome_rows", "finetune_slices"}
    ft = got["finetune_slices"]
    assert ft["same_weights"] and (ft["samples"], ft["neurons"]) == (8, 1)  # 0.15 % of a tiny model's 384 neurons
    t2, rome = got["table2_rows"], got["rome_rows"]
    assert (t2["facts"], t2["edits"], rome["layers"], rome["steps"]) == (2, 2 * 2 * 2 * 2, 3, 5)
    # bfloat16, as on the GPU: the weight edit rounds W + ΔW to bf16 (eps 7.8e-3), the rows add the exact write
    assert t2["same_rel_gen_loc"] and t2["max_rel_diff_p_ppl"] < 2e-2 and rome["same_metrics"]
    assert rome["max_rel_diff_new_prob"] < 2e-2 and len(t2["seconds"]["rows"]) == len(rome["seconds"]["alone"]) == 1


def test_memory_8b_peak_of_records_an_escaped_oom_and_raises_other_errors():
    """``memory_8b.peak_of``: an out-of-memory error the method did not absorb is the finding (status "oom", not
    fitting the card); any other error is a bug and propagates; a call that runs fits (no peak on a CPU)."""
    from benchmarks import memory_8b as M8

    cpu = torch.device("cpu")

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    got = M8.peak_of(oom, cpu)
    assert (got["status"], got["fits_80gb_card"]) == ("oom", False) and got["error"].startswith("CUDA out of memory")
    ran = M8.peak_of(lambda: None, cpu)
    assert (ran["status"], ran["fits_80gb_card"], ran["peak_gib"]) == ("ran", True, None) and "error" not in ran
    with pytest.raises(ValueError, match="a bug"):
        M8.peak_of(lambda: (_ for _ in ()).throw(ValueError("a bug")), cpu)
    with M8.card_of(cpu) as cap:  # a CPU: nothing capped
        assert cap is None


@pytest.mark.heavy
def test_gpu_goals_tiny_runs_every_registered_method_on_the_8b_sections(tmp_path):
    """``gpu_goals.py --tiny --only llama3_8b_shape``: every method of the registry, the batched paths and the edits
    run (the 7B model is not loaded)."""
    import tlcap
    from benchmarks import gpu_goals as G

    out = tmp_path / "goals.json"
    G.main(["--device", "cpu", "--tiny", "--out", str(out), "--only", "llama3_8b_shape", "--cap", "2"])
    doc = json.loads(out.read_text())
    assert "llama7b_shape" not in doc
    got = doc["llama3_8b_shape"]
    names = [m.name for m in tlcap.methods()]
    paths = ["kn_facts_b8", "amig_facts_b3", "trace_facts_b4", "cnl_score_b8", "rome_edit"]
    assert set(got) == {"card_gib", "model", *names, *paths, "enhance_memory"}
    assert got["card_gib"] is None and got["model"]["n_layers"] == 3
    for k in (*names, *paths):
        assert got[k]["status"] == "ran" and got[k]["fits_80gb_card"] is True, (k, got[k])
    assert "error" not in got["enhance_memory"] and got["enhance_memory"]["steps"] == 2
