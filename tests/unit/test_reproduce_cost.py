"""The GPU cost model of ``reproduce``: per-pass + per-FLOP arithmetic, calibration files, the shape-only replay plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tlcap.reproduce.run as run_module
from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.errors import InvalidConfigError, MissingFileError
from tlcap.models import load_model
from tlcap.reproduce.cost import (
    UNITS,
    Calibration,
    ModelShape,
    Workload,
    batched_passes,
    dominant,
    forward,
    held_bytes,
    ig_rows,
    ig_rows_batched,
    load_calibration,
    memory_rows,
    plateau_probe_seconds,
    predict,
    read_calibrations,
    save_calibrations,
    train,
)
from tlcap.reproduce.probe import calibrate, split_pass_flop
from tlcap.reproduce.run import build_stages, plan_lines, predictions
from tlcap.reproduce.scales import ScaleConfig
from tlcap.reproduce.stages import Runner

SHAPE = ModelShape.from_config(32, 4096, 11008, 32000, n_heads=32)


def test_split_pass_flop_solves_the_two_timings():
    # 1 pass, 100 FLOPs, 1.1 s and 1 pass, 1000 FLOPs, 2.0 s: 0.9 s for 900 FLOPs -> 1 ms per FLOP, 1.0 s per pass
    c, s = split_pass_flop((1, 100, 1.1), (1, 1000, 2.0))
    assert (c, s) == pytest.approx((1.0, 0.001))
    # two passes each (fine-tuning on two samples): 2c + 10s = 3, 2c + 30s = 5 -> s = 0.1, c = 1
    assert split_pass_flop((2, 10, 3.0), (2, 30, 5.0)) == pytest.approx((1.0, 0.1))
    # the larger run was not slower (noise): all per pass, the mean
    assert split_pass_flop((1, 100, 2.0), (1, 1000, 1.8)) == pytest.approx((1.9, 0.0))
    # a negative intercept: all per FLOP, from the larger run
    assert split_pass_flop((1, 100, 0.05), (1, 1000, 1.0)) == pytest.approx((0.0, 0.001))


def test_predict_adds_passes_and_flops_per_unit():
    cal = Calibration({"ig_row": 1e-12, "fwd_token": 2e-12}, base_bytes=1000, memory_scale=0.5,
                      seconds_per_pass={"ig_row": 0.25})
    w = Workload({"ig_row": 4e12, "fwd_token": 1e12}, {}, 600, {"ig_row": 10, "fwd_token": 3})
    p = predict(w, cal)
    assert p.by_unit == pytest.approx({"ig_row": 4.0 + 10 * 0.25, "fwd_token": 2.0})  # no per-pass cost measured for fwd
    assert p.seconds == pytest.approx(8.5) and p.peak_bytes == 1000 + 300
    with pytest.raises(InvalidConfigError, match="train_token"):
        predict(Workload({"train_token": 1.0}), cal)


def test_workload_helpers_count_passes_and_add():
    w = ig_rows(SHAPE, 210, ctx=16, evals=3) + forward(SHAPE, 64, 32, 64, calls=2) + train(SHAPE, 100, 0, 50, 100, steps=4)
    assert dict(w.passes) == {"ig_row": 3, "fwd_token": 2, "train_token": 4}
    assert w.flops["ig_row"] == 210 * SHAPE.ig_row_flops() and w.units["fwd_token"] == 64
    assert dict(w.scaled(2).passes) == {"ig_row": 6, "fwd_token": 4, "train_token": 8}
    with pytest.raises(InvalidConfigError, match="unknown cost units"):
        Workload(passes={"ig_rows": 1})


def test_fine_tuning_memory_takes_its_own_ratio_and_the_parameter_dtype():
    # two float32 Adam moments per trained parameter and its gradient (float32) or rounding residual (bfloat16, the
    # compensated step: 2 bytes), the snapshot in host memory, plus the longest sequence's activations in float32 units
    acts = 4 * 100 * SHAPE.n_layers * (12 * SHAPE.d_model + 4 * SHAPE.d_mlp)
    assert SHAPE.train_bytes(10**9, 100, 2) == 10 * 10**9 + acts
    assert SHAPE.train_bytes(10**9, 100) == 12 * 10**9 + acts  # float32 parameters
    w = train(SHAPE, 100, 10**9, 50, 100, steps=4, param_bytes=2) + ig_rows(SHAPE, 64)
    assert w.train_bytes == 10 * 10**9 + acts and w.extra_bytes == 0 and w.row_bytes == {"ig_row": SHAPE.ig_row_bytes()}
    cal = Calibration(dict.fromkeys(UNITS, 1e-12), base_bytes=1000, memory_scale=0.5)
    assert predict(w, cal).peak_bytes == 1000 + w.train_bytes  # not measured: the model's bytes as they are
    cal2 = Calibration.from_dict({**cal.to_dict(), "train_memory_scale": 0.25})
    assert cal2.train_memory_scale == 0.25 and cal2.to_dict()["train_memory_scale"] == 0.25
    assert predict(w, cal2).peak_bytes == 1000 + max(-(-w.train_bytes // 4), 32 * SHAPE.ig_row_bytes())
    assert predict(ig_rows(SHAPE, 64), cal2).peak_bytes == 1000 + 32 * SHAPE.ig_row_bytes()


def test_dominant_stages():
    secs = {"a": 50.0, "b": 30.0, "c": 15.0, "d": 5.0, "e": 0.0}
    assert dominant(secs) == [("a", 0.5), ("b", 0.3)]  # 80 % of 100 s
    assert [n for n, _ in dominant(secs, 0.9)] == ["a", "b", "c"]
    assert dominant({}) == [] and dominant({"x": 0.0}) == []


def _cal(shape: dict, dtype: str, device: str = "cuda (H100)", spf: float = 1e-12) -> Calibration:
    return Calibration(dict.fromkeys(UNITS, spf), 10**9, 0.5, {}, device, None, 12.0, {"ig_row": 0.1}, "m", shape, dtype,
                       {"date": "2026-11-27"})


@pytest.mark.heavy
@pytest.mark.parametrize("dims", [(4, 256, 1024, 4), (6, 128, 512, 2)])
def test_an_ig_row_costs_the_flops_it_runs(dims, monkeypatch):
    """``ModelShape.ig_row_flops`` against the matrix products KN IG runs (torch's FlopCounterMode, the fused
    read-out's in-place ``addmm_`` counted too): 4 more steps add 4 rows per layer, each a forward from its layer
    up and the activations' gradient, 2 forward passes' worth (the count had been 3: 1.5x too many)."""
    import tlcap.runtime.batching as batching
    from benchmarks.bench_gpu import count_flops
    from tlcap.attribution import integrated_gradients_facts
    from tlcap.attribution.config import IGConfig
    from tlcap.models import make_llama

    # no throughput probe on a CPU (gpu_goals' CPU smoke run, earlier in the same process, adds "cpu" to this)
    monkeypatch.setattr(batching, "PROBE_DEVICE_TYPES", tuple(t for t in batching.PROBE_DEVICE_TYPES if t != "cpu"))
    L, d, mlp, kv = dims
    m = make_llama(seed=0, n_layers=L, d_model=d, n_heads=4, n_kv_heads=kv, d_mlp=mlp)
    facts = [("The capital of France is", " Paris")]
    flops = {S: count_flops(lambda S=S: integrated_gradients_facts(m, facts, config=IGConfig(steps=S))) for S in (2, 6)}
    per_row = (flops[6] - flops[2]) / (4 * L)
    assert per_row == pytest.approx(ModelShape.of(m).ig_row_flops(), rel=0.02)


def test_a_probe_saved_with_the_older_ig_count_predicts_the_same_seconds(tmp_path):
    """A calibration file written before the IG count was 2 (no ``ig_row_passes``): its IG FLOPs and seconds per FLOP
    are rescaled on load, so an IG workload takes the seconds it took, at a floor 2/3 of the old one."""
    f3 = SHAPE.ig_row_flops() * 3 / 2  # the older count
    old = {"seconds_per_flop": {"ig_row": 2e-15}, "seconds_per_pass": {"ig_row": 0.1}, "base_bytes": 0,
           "memory_scale": 1.0, "device": "cuda (H100)", "meta": {"two_sizes": True}, "peak_flops": 1e15,
           "probe": {"ig_row": {"units": 100, "flops": 100 * f3, "seconds": 0.2, "passes": 1.0}}}
    cal = Calibration.from_dict(old)
    assert cal.probe["ig_row"]["flops"] == pytest.approx(100 * SHAPE.ig_row_flops())
    assert cal.seconds_per_flop["ig_row"] == pytest.approx(3e-15, rel=1e-9, abs=0)
    work = ig_rows(SHAPE, rows=1000)
    assert predict(work, cal).by_unit["ig_row"] == pytest.approx(1000 * f3 * 2e-15)  # one evaluation: no pass part
    assert predict(work, cal).floor_seconds == pytest.approx(1000 * SHAPE.ig_row_flops() / 1e15)
    assert Calibration.from_dict(cal.to_dict()) == cal  # saved now: read back as it is


def test_calibration_file_round_trip_and_choice(tmp_path):
    path = tmp_path / "cal.json"
    big, small = SHAPE.dims(), {"n_layers": 2, "d_model": 64, "d_mlp": 128, "d_vocab": 50257}
    save_calibrations(path, [_cal(big, "bfloat16"), _cal(small, "float32")])
    save_calibrations(path, [_cal(big, "bfloat16", spf=2e-12)])  # same shape, dtype and device: replaced
    d = json.loads(path.read_text())
    assert d["format"] == "tlcap-calibration/1" and len(d["calibrations"]) == 2
    got = load_calibration(path, SHAPE, "bfloat16")
    assert got == _cal(big, "bfloat16", spf=2e-12)
    # the same shape with another tokenizer's vocabulary (a shape model built on the GPU machine): still that probe
    other_vocab = ModelShape.from_config(32, 4096, 11008, 50257, n_heads=32)
    assert load_calibration(path, other_vocab, "bfloat16") == got
    with pytest.raises(InvalidConfigError, match="no probe"):
        load_calibration(path, ModelShape.from_config(31, 4096, 11008, 32000, n_heads=32), "bfloat16")
    have = r"\(it has: m float32 .*; m bfloat16 .* on cuda \(H100\)\)"
    with pytest.raises(InvalidConfigError, match=r"no probe of a model shaped .* in float32 " + have):
        load_calibration(path, SHAPE, "float32")
    with pytest.raises(MissingFileError, match="no such file"):
        read_calibrations(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(InvalidConfigError, match="not a tlcap calibration file"):
        read_calibrations(tmp_path / "bad.json")
    # a calibration cached by an earlier version (no per-pass part, no shape) still loads
    old = {"seconds_per_flop": {"ig_row": 1e-9}, "base_bytes": 5, "memory_scale": 1.0, "probe": {}, "device": "cpu"}
    assert Calibration.from_dict(old).seconds_per_pass == {} and Calibration.from_dict(old).shape == {}


def test_calibrate_two_sizes_splits_what_it_measured(tiny_llama):
    cal = calibrate(tiny_llama, two_sizes=True)
    assert cal.shape == ModelShape.of(tiny_llama).dims() and cal.dtype == "float32" and cal.model == tiny_llama.name
    for unit in ("ig_row", "fwd_token", "train_token"):
        a, b = cal.probe[f"{unit}@0"], cal.probe[unit]
        assert b["flops"] > a["flops"] and a["passes"] == b["passes"]
        c, s = split_pass_flop((a["passes"], a["flops"], a["seconds"]), (b["passes"], b["flops"], b["seconds"]))
        floor = 1.0 / cal.peak_flops  # the matrix-product peak the probe measured bounds s from below
        if s < floor:  # refitted through the larger run
            c, s = max(0.0, (b["seconds"] - b["flops"] * floor) / b["passes"]), floor
        assert cal.seconds_per_pass[unit] == pytest.approx(c, rel=1e-12, abs=1e-15)
        assert cal.seconds_per_flop[unit] == pytest.approx(s, rel=1e-12, abs=0)
    assert 1e9 < cal.peak_flops < 1e16
    assert "gen_token" not in cal.seconds_per_pass and cal.seconds_per_flop["gen_token"] > 0
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


def test_the_fine_tuning_probe_times_the_steps_without_the_set_up(tiny_llama, monkeypatch):
    """The probe's fine-tuning time is its second epoch: a run's set-up (undo snapshots, which go to host memory on
    a GPU, and the first step's state) is paid once per thousands of steps in a stage, not per step. A stand-in
    fine-tuning whose set-up takes 0.3 s and whose epochs take 0.02 s: the unit's seconds are the epoch's, the
    set-up is recorded beside them."""
    import time as _time

    from tlcap.reproduce import probe as P

    class _Edit:
        def undo(self):
            pass

    def fake(model, samples, neurons, *, mode, epochs, on_epoch, progress):
        _time.sleep(0.3)
        for e in range(1, epochs + 1):
            _time.sleep(0.02)
            on_epoch(e)
        return _Edit()

    monkeypatch.setattr(P, "masked_finetune", fake)
    cal = calibrate(tiny_llama)
    assert 0.02 <= cal.probe["train_token"]["seconds"] < 0.2
    assert cal.meta["train_setup_seconds"] >= 0.28
    assert cal.meta["trials"] == P.PROBE_TRIALS == 3
    assert all("spread" in run for run in cal.probe.values())
    assert cal.meta["timing_spread"] == max(run["spread"] for run in cal.probe.values())


def test_the_probe_keeps_the_fastest_of_its_trials_and_how_far_the_slowest_was():
    """A stall in one trial (0.3 s against 0.03 s) does not become the unit's time: the fastest trial is kept, and
    the slowest's excess (about 9x) is recorded, so the plan can say how repeatable its probe was. ``after`` turns a
    trial's wall time into the part that counts (the fine-tuning probe's second epoch)."""
    import time as _time

    from tlcap.reproduce import probe as P

    delays = iter([0.03, 0.3, 0.03, 0.04])  # warm-up, then three trials

    def op():
        _time.sleep(next(delays))

    best, spread = P._timed(op)
    assert 0.03 <= best < 0.1 and spread > 2.0
    halves = iter([0.05, 0.05, 0.05, 0.05])
    best, spread = P._timed(lambda: _time.sleep(next(halves)), trials=3, after=lambda t: t / 2)
    assert 0.025 <= best < 0.05 and spread < 1.0


def test_a_launch_bound_fit_is_floored_at_the_matmul_peak_and_refitted():
    """Two launch-bound probe sizes fit s/FLOP = 0 (7B on an H200: 16 and 128 tokens both 48 ms): the peak bounds it,
    and the per-pass part is refitted through the larger run, so that run is still predicted as measured."""
    probe = {"fwd_token@0": {"units": 16, "flops": 2.1e11, "seconds": 0.0483, "passes": 1.0},
             "fwd_token": {"units": 128, "flops": 1.7e12, "seconds": 0.0473, "passes": 1.0}}
    raw = split_pass_flop((1.0, 2.1e11, 0.0483), (1.0, 1.7e12, 0.0473))
    assert raw == (pytest.approx(0.0478), 0.0)  # what the committed H200 calibration holds
    cal = Calibration({"fwd_token": raw[1]}, probe=probe, seconds_per_pass={"fwd_token": raw[0]}, peak_flops=800e12)
    assert cal.seconds_per_flop["fwd_token"] == 1 / 800e12
    assert cal.seconds_per_pass["fwd_token"] == pytest.approx(0.0473 - 1.7e12 / 800e12)
    big = Workload({"fwd_token": 1.7e12}, {}, 0, {"fwd_token": 1.0})
    assert predict(big, cal).seconds == pytest.approx(0.0473)  # the larger run, as measured
    huge = Workload({"fwd_token": 1.7e15}, {}, 0, {"fwd_token": 1.0})
    assert predict(huge, cal).seconds > 2.0  # 1,000 × the FLOPs is no longer free
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal  # the floor is idempotent
    cpu = Calibration({"fwd_token": 1e-10}, peak_flops=1e11)
    assert cpu.seconds_per_flop == {"fwd_token": 1e-10}  # above the floor: unchanged


def test_batched_rows_take_passes_of_the_probe_size():
    """Rows batched across items (dataset / fact windows) take calls × ceil(rows per call / B) passes, B the rows of the
    probe's larger IG run; unbatched evaluations keep one pass each."""
    cal = Calibration({"ig_row": 1e-15}, probe={"ig_row": {"units": 2048, "flops": 1.0, "seconds": 1.0, "passes": 1.0}},
                      seconds_per_pass={"ig_row": 0.2})
    w = ig_rows_batched(SHAPE, 10 * 5000, 10)  # 10 calls of 5,000 rows: 3 passes each
    assert batched_passes(w, cal, "ig_row") == 30
    assert predict(w, cal).seconds == pytest.approx(30 * 0.2 + w.flops["ig_row"] * 1e-15)
    assert batched_passes(ig_rows_batched(SHAPE, 10 * 100, 10), cal, "ig_row") == 10  # a small call: one pass
    assert batched_passes(ig_rows(SHAPE, 1000, evals=7), cal, "ig_row") == 0
    assert batched_passes(w, Calibration({"ig_row": 1e-15}), "ig_row") == 10  # no probe size: one pass per call
    assert w.scaled(2).batched == {"ig_row": 20.0}
    with pytest.raises(InvalidConfigError, match="batched"):
        w + w


def test_a_pass_of_the_probe_rows_is_predicted_at_the_memory_the_probe_measured():
    """Working memory = the most rows one pass holds: an evaluation's or a batched call's rows (on an accelerator the
    plateau probe may run a whole call's rows once), at most what fits the card; a CPU probe: 128 modelled rows."""
    rb, measured = SHAPE.ig_row_bytes(), 6_000_000_000
    probe = {"ig_row": {"units": 2048, "flops": 1.0, "seconds": 1.0, "passes": 1.0}}
    gpu = Calibration({"ig_row": 1e-15}, base_bytes=10**9, memory_scale=measured / (2048 * rb), probe=probe,
                      meta={"two_sizes": True})
    assert memory_rows(gpu, rb) == float("inf")  # the card's memory not recorded: no cap
    assert predict(ig_rows_batched(SHAPE, 10 * 2048, 10), gpu).peak_bytes == pytest.approx(10**9 + measured, abs=2)
    assert predict(ig_rows_batched(SHAPE, 10 * 5000, 10), gpu).peak_bytes == pytest.approx(
        10**9 + measured * 5000 / 2048, abs=2)  # a call of 5,000 rows: the plateau probe may run them at once
    assert held_bytes(ig_rows_batched(SHAPE, 10 * 100, 10), gpu) == 100 * rb  # a small call holds its own rows
    assert held_bytes(ig_rows(SHAPE, 21 * 32 * 5, evals=5), gpu) == 21 * 32 * rb  # one evaluation's rows per pass
    seq = ig_rows(SHAPE, 672, ctx=40) + forward(SHAPE, 10, 5, 10)
    assert held_bytes(seq, gpu) == 672 * rb and seq.extra_bytes == SHAPE.sequence_bytes(40)
    # the card records its memory: at most the rows whose modelled bytes fit 0.8 of it above the loaded model
    card = Calibration.from_dict({**gpu.to_dict(), "meta": {"two_sizes": True, "device_bytes": 80 * 10**9}})
    fit = int(0.8 * (80e9 - 1e9)) // rb
    assert memory_rows(card, rb) == fit and 2048 < fit < 50_000
    assert held_bytes(ig_rows_batched(SHAPE, 50_000, 1), card) == fit * rb
    assert predict(ig_rows_batched(SHAPE, 50_000, 1), card).peak_bytes == pytest.approx(10**9 + measured * fit / 2048,
                                                                                         abs=2)
    cpu = Calibration({"ig_row": 1e-12}, memory_scale=2.0, probe=probe)  # one size: 128 modelled rows
    assert memory_rows(cpu, rb) == 128 and held_bytes(ig_rows_batched(SHAPE, 5000, 1), cpu) == 128 * rb
    assert predict(ig_rows(SHAPE, 64), cpu).peak_bytes == 2 * 64 * rb


def test_calibrate_refuses_a_shape_only_model():
    with pytest.raises(InvalidConfigError, match="meta device"):
        calibrate(load_model("qwen2-tiny", device="meta"))


SMOKE = ScaleConfig(cnl_datasets=("emotion",), cnl_eval_datasets=("emotion",), cnl_eval_facts=1, cnl_eval_pairs=2,
                    cnl_eval_known_top_k=None, ql_n_facts=2, ql_sig_facts=1)
ONLY = "cnl.locate.emotion,cnl.erase.emotion,cnl.fidelity,ql.localize.ig,ql.table2"


def test_replayed_plan_on_the_meta_device_equals_the_plan_of_the_real_model(tmp_path):
    """A probe saved elsewhere, replayed for a shape-only (meta) model: the same predictions as with the weights."""
    real = load_model("qwen2-tiny")
    cal = _cal(ModelShape.of(real).dims(), "float32")
    path = save_calibrations(tmp_path / "gpu.json", [cal])
    runner = Runner(build_stages(("cnl", "ql"), SMOKE), tmp_path / "c1", real)
    plan = runner.plan(ONLY.split(","))
    want = predictions(runner, plan, cal)
    meta = load_model("qwen2-tiny", device="meta")
    assert meta.device.type == "meta" and not any(p.device.type != "meta" for p in meta.backend.parameters())
    runner_m = Runner(build_stages(("cnl", "ql"), SMOKE), tmp_path / "c2", meta, plan_only=True)
    got = predictions(runner_m, runner_m.plan(ONLY.split(",")), load_calibration(path, ModelShape.of(meta), "float32"))
    assert set(got) == set(want) and all(want[n] is not None for n in want)
    for n in want:
        assert got[n].seconds == pytest.approx(want[n].seconds) and got[n].peak_bytes == want[n].peak_bytes, n


def test_cli_dry_run_replays_a_calibration_file(tmp_path):
    shape = ModelShape.of(load_model("qwen2-tiny", device="meta")).dims()
    path = save_calibrations(tmp_path / "gpu.json", [_cal(shape, "float32")])
    out = tmp_path / "plan"
    r = run_cli(["reproduce", "all", "--model", "qwen2-tiny", "--scale", "smoke", "--dry-run", "--calibration", str(path),
                 "--only", "cnl.locate.emotion,ql.localize.ig", "--out", str(out)])
    assert r.code == 0, r.stderr
    assert "loading qwen2-tiny (meta, float32)" in r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("calibration: cuda (H100) (m, float32, 2026-11-27") and str(path) in lines[0]
    assert "; each op timed once)" in lines[0]  # a probe saved before the trials says so
    stage_lines = {ln.split()[0]: ln for ln in lines if ln.startswith(("cnl.", "ql."))}
    assert set(stage_lines) == {"cnl.locate.emotion", "ql.facts", "ql.localize.ig"}
    assert any(ln.startswith("dominant") and "of the predicted time" in ln for ln in lines)
    assert not any("of which probes" in ln for ln in lines)  # a probe of one size per unit: no plateau probe priced
    assert not out.exists()  # a dry run writes nothing
    assert_cli_error(["reproduce", "all", "--model", "qwen2-tiny", "--dry-run", "--calibration", str(tmp_path / "no.json"),
                      "--out", str(out)], f"--calibration {tmp_path / 'no.json'}: no such file", out=out)
    assert_cli_error(["reproduce", "all", "--model", "qwen2-tiny", "--dry-run", "--dtype", "bfloat16", "--calibration",
                      str(path), "--out", str(out)], "no probe of a model shaped", out=out, exact=False)


def test_save_calibration_writes_the_probe(tmp_path, monkeypatch):
    fake = _cal(ModelShape.of(load_model("qwen2-tiny", device="meta")).dims(), "float32", device="cpu (1 threads)")
    monkeypatch.setattr(run_module, "calibrate", lambda model: fake)  # the probe itself is tested above
    path = tmp_path / "probe.json"
    r = run_cli(["reproduce", "ql", "--model", "qwen2-tiny", "--scale", "smoke", "--dry-run", "--device", "cpu",
                 "--only", "ql.localize.ig", "--save-calibration", str(path), "--out", str(tmp_path / "o")])
    assert r.code == 0, r.stderr
    assert read_calibrations(path) == [fake] and f"probe written to {path}" in r.stdout


def test_modelled_train_bytes_counts_the_trained_neurons_in_the_model_dtype(tiny_llama):
    from tlcap.metrics.sets import NeuronSet
    from tlcap.reproduce.probe import modelled_train_bytes

    m, shape = tiny_llama, ModelShape.of(tiny_llama)
    ns = NeuronSet(tuple((l, 0) for l in range(m.n_layers)), (m.n_layers, m.d_mlp))  # one neuron per layer kept out
    trainable = round(shape.n_mlp_params * (m.d_mlp - 1) / m.d_mlp)  # Llama MLPs: every neuron owns as many weights
    assert modelled_train_bytes(m, ns, 10) == (trainable, shape.train_bytes(trainable, 10, 4))
    assert modelled_train_bytes(m, ns, 10, "located")[0] == round(shape.n_mlp_params / m.d_mlp)


def test_replayed_h200_probe_predicts_the_peak_memory_that_run_measured(tmp_path):
    """The committed H200 probe (``gpu_goals3_h200.calibration_v3.json``), replayed for the meta 7B shape on the
    configuration of that run's ``reproduce_check``, predicts the two stages' measured peak memory within 5 %
    (``ql.localize.ig``: one call of 8,064 IG rows, the plateau probe's peak)."""
    import torch

    from tlcap.attribution.config import IGConfig

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    run = json.loads((results / "gpu_goals3_h200.json").read_text())["reproduce_check"]
    measured = {s["name"]: s["measured_bytes"] for s in run["stages"]}
    m = load_model("llama-7b-shape", device="meta", dtype=torch.bfloat16)
    cal = load_calibration(results / "gpu_goals3_h200.calibration_v3.json", ModelShape.of(m), "bfloat16")
    scale = ScaleConfig(name="smoke", cnl_datasets=("emotion",), cnl_eval_datasets=(), cnl_locate_n=8,
                        cnl_ig=IGConfig(steps=20), cnl_max_answer_tokens=1, cnl_groups=4, ql_relations=("P36",),
                        ql_n_facts=4, ql_max_queries=3, ql_known_top_k=None, ql_ig=IGConfig(steps=20), ql_sig_facts=1,
                        ql_amig_facts=1, n_boot=200)  # benchmarks/gpu_quick.py repro_check
    runner = Runner(build_stages(("cnl", "ql"), scale), tmp_path, m, plan_only=True)
    got = predictions(runner, runner.plan(["cnl.locate.emotion", "ql.localize.ig"]), cal)
    for name in ("cnl.locate.emotion", "ql.localize.ig"):
        assert got[name].peak_bytes == pytest.approx(measured[name], rel=0.05), name
    assert measured["ql.localize.ig"] > 3 * (measured["cnl.locate.emotion"] - cal.base_bytes)  # not a trivial match


def test_plateau_probe_seconds_follows_the_probe_rule_on_the_calibrated_times():
    """Hand-computed: a batch of ``b`` rows takes ``s/pass + b · s/row``; each measured size costs 3 batches."""
    shape = ModelShape.from_config(n_layers=2, d_model=8, d_mlp=32, d_vocab=50)
    f = shape.ig_row_flops()

    def gpu(per_row: float, per_pass: float) -> Calibration:
        return Calibration({"ig_row": per_row / f}, seconds_per_pass={"ig_row": per_pass}, meta={"two_sizes": True})

    # flat rate from the start: 8 rows, then two doublings (16, 32) without a 10 % gain, then stop
    assert plateau_probe_seconds(ig_rows(shape, rows=4096), gpu(1e-3, 0.0)) == pytest.approx(3 * 1e-3 * (8 + 16 + 32))
    # launch-bound to the cap: 8 … 256, then the cap 300 (still rising 10 % or more at every size)
    sizes = [8, 16, 32, 64, 128, 256, 300]
    assert plateau_probe_seconds(ig_rows(shape, rows=300), gpu(1e-6, 0.5)) == pytest.approx(
        sum(3 * (0.5 + 1e-6 * b) for b in sizes))
    # the 20 s budget: the first size already takes 30 s
    assert plateau_probe_seconds(ig_rows(shape, rows=300), gpu(1e-6, 10.0)) == pytest.approx(3 * (10.0 + 8e-6))
    # the cap is the rows one pass holds: an evaluation's (2 evaluations of 64 rows), not the stage's 128
    assert plateau_probe_seconds(ig_rows(shape, rows=128, evals=2), gpu(1e-6, 0.5)) == pytest.approx(
        sum(3 * (0.5 + 1e-6 * b) for b in (8, 16, 32, 64)))
    # a CPU probes nothing; predict adds the probe under its own key on an accelerator only
    cpu = Calibration({"ig_row": 1e-3 / f})
    assert plateau_probe_seconds(ig_rows(shape, rows=64), cpu) == 0.0
    assert "plateau_probe" not in predict(ig_rows(shape, rows=64), cpu).by_unit
    pred = predict(ig_rows(shape, rows=300), gpu(1e-6, 0.5))
    assert pred.by_unit["plateau_probe"] == pytest.approx(sum(3 * (0.5 + 1e-6 * b) for b in sizes))
    assert pred.seconds == pytest.approx(sum(pred.by_unit.values()))

    # a trace's forward rows: timed as fwd_token, capped at their own rows; a sum keeps the largest call's probe
    fwd = Calibration({"fwd_token": 1e-6 / 1e3, "ig_row": 1.0}, seconds_per_pass={"fwd_token": 0.5},
                      meta={"two_sizes": True})
    trace = Workload(probes={"trace": (300.0, 1e3)})
    assert plateau_probe_seconds(trace, fwd) == pytest.approx(sum(3 * (0.5 + 1e-6 * b) for b in sizes))
    both = Workload(probes={"trace": (20.0, 1e3)}) + trace + Workload(probes={"trace": (40.0, 1e3)})
    assert both.probes == {"trace": (300.0, 1e3)} and both.scaled(3).probes == both.probes
    assert plateau_probe_seconds(both, cpu) == 0.0
    with pytest.raises(InvalidConfigError, match="unknown probe kinds"):
        Workload(probes={"eap": (8.0, 1.0)})


def test_replayed_h200_probe_predicts_the_plateau_probes_that_run_measured():
    """The committed H200 calibration prices ``batch_rows="auto"``'s throughput probe within 20 % of the probes that
    same run timed (``gpu_goals3_h200.json`` ``plateaus``: the three that started fresh, 672 to 8,175 rows, 3.3–7.8 s;
    the fourth continued an earlier probe and is left out)."""
    import torch

    from tlcap.runtime.plateau import candidates

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    probes = json.loads((results / "gpu_goals3_h200.json").read_text())["plateaus"]["probes"]
    m = load_model("llama-7b-shape", device="meta", dtype=torch.bfloat16)
    shape = ModelShape.of(m)
    cal = load_calibration(results / "gpu_goals3_h200.calibration_v3.json", shape, "bfloat16")
    fresh = [p for p in probes if [b for b, _ in p["rates_rows_per_s"]] == candidates(p["cap"])[:len(p["rates_rows_per_s"])]]
    assert sorted(p["cap"] for p in fresh) == [672, 7821, 8175]
    for p in fresh:
        got = plateau_probe_seconds(ig_rows(shape, rows=p["cap"]), cal)
        assert got == pytest.approx(p["seconds"], rel=0.2), p["cap"]


def test_plan_shows_the_share_of_the_throughput_probes(tmp_path):
    """On an accelerator calibration the plan prints the probes' seconds under the total: the sum of the stages'."""
    from tlcap.reproduce.cost import fmt_seconds

    meta = load_model("qwen2-tiny", device="meta")
    cal = Calibration(dict.fromkeys(UNITS, 1e-12), seconds_per_pass={"ig_row": 0.1, "fwd_token": 0.05},
                      shape=ModelShape.of(meta).dims(), meta={"two_sizes": True})
    runner = Runner(build_stages(("cnl", "ql"), SMOKE), tmp_path, meta, plan_only=True)
    plan = runner.plan(ONLY.split(","))
    pred = predictions(runner, plan, cal)
    probes = sum(p.by_unit.get("plateau_probe", 0.0) for p in pred.values() if p is not None)
    # ql.localize.ig: one call of 36 rows, probed (8, 16, 32, 36); cnl.locate.emotion: 6 rows per evaluation,
    # at most START (8), which the runtime does not probe either
    assert probes == pred["ql.localize.ig"].by_unit["plateau_probe"] > 0
    assert "plateau_probe" not in pred["cnl.locate.emotion"].by_unit
    line = next(ln for ln in plan_lines(runner, plan, pred) if "of which probes" in ln)
    assert fmt_seconds(probes) in line


def test_plan_prints_the_flop_floor_of_every_stage_and_the_distance_from_it(tmp_path):
    """With a measured matmul peak a stage's floor is its FLOPs at that peak (no batching or launch saving beats
    it); the plan prints the floors' sum and each dominant stage's prediction over its own floor. Without a peak:
    no floor."""
    from tlcap.reproduce.cost import fmt_seconds

    meta = load_model("qwen2-tiny", device="meta")
    peak = 2e12
    kw = dict(seconds_per_pass={"ig_row": 0.1, "fwd_token": 0.05}, shape=ModelShape.of(meta).dims())
    cal = Calibration(dict.fromkeys(UNITS, 1e-12), peak_flops=peak, **kw)
    runner = Runner(build_stages(("cnl", "ql"), SMOKE), tmp_path, meta, plan_only=True)
    plan = runner.plan(ONLY.split(","))
    pred = predictions(runner, plan, cal)
    floors = {}
    for s in plan:
        if pred[s.name] is not None:
            flops = sum(s.workload(runner.context(s.name)).flops.values())
            assert pred[s.name].floor_seconds == pytest.approx(flops / peak)  # the stage's FLOPs at the peak
            assert pred[s.name].seconds >= pred[s.name].floor_seconds  # no prediction beats its floor
            floors[s.name] = flops / peak
    total = sum(p.seconds for p in pred.values() if p is not None)
    lines = plan_lines(runner, plan, pred)
    line = next(ln for ln in lines if "FLOP floor" in ln)
    assert fmt_seconds(sum(floors.values())) in line and f"{total / sum(floors.values()):.1f}x it" in line
    dom = next(ln for ln in lines if ln.startswith("dominant"))
    top = max(floors, key=lambda n: pred[n].seconds)
    assert f"{top} " in dom and f"({pred[top].seconds / floors[top]:.1f}x its floor)" in dom
    no_peak = predictions(runner, plan, Calibration(dict.fromkeys(UNITS, 1e-12), **kw))
    assert all(p is None or p.floor_seconds is None for p in no_peak.values())
    assert not any("FLOP floor" in ln or "its floor" in ln for ln in plan_lines(runner, plan, no_peak))


def test_a_number_tasks_generation_is_priced_batched_on_an_accelerator_and_per_token_on_a_cpu():
    """``task_accuracy`` generates GEN_ROWS samples per batch on an accelerator: their prompts are one padded pass
    and their tokens forward FLOPs in one pass per decoding step there (hand-computed), and ``gen_token`` FLOPs
    (one sample at a time, each prompt its own pass) on a CPU."""
    import math

    from tlcap.data.tasks import get_task, load_task
    from tlcap.metrics.accuracy import GEN_ROWS
    from tlcap.reproduce.cnl_stages import eval_work
    from tlcap.reproduce.cost import n_tokens

    meta = load_model("qwen2-tiny", device="meta")
    samples = load_task("gsm8k", split="test", n=40, seed=0)
    t = get_task("gsm8k")
    w = eval_work(meta, "gsm8k", samples, times=2)
    assert w.gen_steps == 2 * math.ceil(40 / GEN_ROWS) * t.max_new_tokens == 2 * 3 * 96
    shape = ModelShape.of(meta)
    lens = [n_tokens(meta, s.prompt) for s in samples]
    gen_flops = 2 * 40 * t.max_new_tokens * shape.fwd_token_flops(max(lens) + t.max_new_tokens / 2)
    assert w.flops["gen_token"] == pytest.approx(gen_flops)
    spf = {"fwd_token": 2e-15, "gen_token": 5e-12, "ig_row": 1e-15, "train_token": 1e-15, "set_token": 1e-15}
    gpu = Calibration(spf, seconds_per_pass={"fwd_token": 0.04}, meta={"two_sizes": True})
    cpu = Calibration(spf, seconds_per_pass={"fwd_token": 0.04})
    fwd_passes = w.passes["fwd_token"]  # one per sample and evaluation: the prompts' forward
    on_gpu, on_cpu = predict(w, gpu), predict(w, cpu)
    assert "gen_token" not in on_gpu.by_unit and on_cpu.by_unit["gen_token"] == pytest.approx(gen_flops * 5e-12)
    assert fwd_passes == 2 * 40 and w.accelerator_passes["fwd_token"] == 2 * (3 - 40)
    assert on_gpu.by_unit["fwd_token"] == pytest.approx((w.flops["fwd_token"] + gen_flops) * 2e-15
                                                        + (2 * 3 + 2 * 3 * 96) * 0.04)
    assert on_cpu.by_unit["fwd_token"] == pytest.approx(w.flops["fwd_token"] * 2e-15 + fwd_passes * 0.04)
    assert on_gpu.peak_bytes >= w.gen_bytes == shape.sequence_bytes(GEN_ROWS * (max(lens) + t.max_new_tokens))
    assert on_cpu.peak_bytes < w.gen_bytes or w.extra_bytes >= w.gen_bytes


def test_passes_an_accelerator_saves_are_taken_off_on_an_accelerator_calibration_only():
    """``Workload.accelerator_passes`` (e.g. Table 2's erasure rows) changes the passes on an accelerator
    calibration, not on a CPU one; it adds and scales with the workload."""
    from dataclasses import replace

    shape = ModelShape.of(load_model("qwen2-tiny", device="meta"))

    w = replace(forward(shape, 100.0, 4, 8, 10), accelerator_passes={"fwd_token": -4.0})
    assert (w + w).accelerator_passes == {"fwd_token": -8.0} and w.scaled(3).accelerator_passes == {"fwd_token": -12.0}
    spf = dict.fromkeys(UNITS, 1e-9)
    gpu = Calibration(spf, seconds_per_pass={"fwd_token": 0.5}, meta={"two_sizes": True})
    cpu = Calibration(spf, seconds_per_pass={"fwd_token": 0.5})
    fl = w.flops["fwd_token"] * 1e-9
    assert predict(w, gpu).by_unit["fwd_token"] == pytest.approx(fl + 6 * 0.5)
    assert predict(w, cpu).by_unit["fwd_token"] == pytest.approx(fl + 10 * 0.5)
