"""CNL's bad inputs (issue 15), each with its exact behaviour: malformed data rows skipped with a
count and a warning naming file and line (refused with --strict), requested vs used sizes, merges
of overlapping shards refused, empty neuron sets named, out-of-range options refused before any
model load, checkpoints written as one unit and a damaged one named with the way out."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.data.sample import DataWarning, Sample
from tlcap.data.tasks import load_task
from tlcap.errors import CheckpointError, DataFormatError, EmptyNeuronSetError, OverlappingShardsError
from tlcap.metrics.sets import NeuronSet
from tlcap.runtime.run_control import RunControl

KW = dict(max_answer_tokens=1, steps=2, method="grad_x_act")
EMOTION_LINES = [
    "text;label_name",
    "i feel so happy today;joy",
    "a tweet without any label at all",
    "i feel wonderful;happiness",
    "i am scared of the dark;fear",
    "nothing after the separator;",
    "i miss you so much;sadness",
]


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.heavy]  # seconds per module: after the fast gate


@pytest.fixture()
def emo_dir(tmp_path):
    d = tmp_path / "data"
    (d / "emotion").mkdir(parents=True)
    for split in ("train", "test"):
        (d / "emotion" / f"{split}.txt").write_text("\n".join(EMOTION_LINES) + "\n")
    return d


def _samples(k: int) -> list[Sample]:
    return [Sample(f"Item {i} is", f" very red {i}", uid=str(i)) for i in range(k)]


# --------------------------------------------------------------------------- malformed rows
def test_malformed_emotion_rows_are_skipped_counted_and_named(emo_dir):
    f = emo_dir / "emotion" / "train.txt"
    with pytest.warns(DataWarning) as rec:
        s = load_task("emotion", emo_dir, "train")
    assert [str(w.message) for w in rec] == [
        f"emotion 'train': skipped 2 malformed rows and 1 row with an unknown label (first: {f}:3: no ';label' at the "
        f"end of the line; {f}:4: unknown label 'happiness' (known: sadness, joy, love, anger, fear, surprise); "
        f"{f}:6: empty label after ';'); pass --strict (strict=True) to refuse such files"
    ]
    assert sorted(x.uid for x in s) == ["emotion-train-1", "emotion-train-4", "emotion-train-6"]
    assert {x.answer for x in s} == {" joy", " fear", " sadness"}  # never the whole tweet as the answer
    r = s.report
    assert (r.requested, r.available, r.used, r.bad_rows, r.unknown_labels) == (None, 3, 3, 2, 1)
    with pytest.raises(DataFormatError) as exc:
        load_task("emotion", emo_dir, "train", strict=True)
    assert str(exc.value) == (f"{f}:3: no ';label' at the end of the line; emotion 'train' has 2 malformed rows and 1 "
                              "row with an unknown label in all (--strict refuses them; fix the file, or drop --strict to "
                              "skip them with a warning)")


def test_missing_columns_and_fields(tmp_path):
    d = tmp_path / "data"
    (d / "imdb").mkdir(parents=True)
    csv = d / "imdb" / "imdb_reviews_2500.csv"
    csv.write_text("review,stars\ngreat film,5\n")
    with pytest.raises(DataFormatError) as exc:
        load_task("imdb", d, "test")
    assert str(exc.value) == (f"{csv} has no 'sentiment' column (columns: review, stars); the IMDB file needs 'review' "
                              "and 'sentiment' columns")
    csv.write_text('review,sentiment\n"good, really",positive\n"",negative\nbad film,neutral\n'
                   + "".join(f"film {i},negative\n" for i in range(3, 11)))
    with pytest.warns(DataWarning, match=f"skipped 1 malformed row and 1 row with an unknown label .first: {csv}:3: empty "
                                         f"or non-text 'review' field; {csv}:4: unknown label 'neutral'"):
        s = load_task("imdb", d, "train")
    assert s.report.bad_rows == 1 and s.report.unknown_labels == 1 and len(s) == 6
    (d / "gsm8k").mkdir()
    js = d / "gsm8k" / "train.jsonl"
    js.write_text('{"question": "1+1?", "answer": "2 #### 2"}\n{"question": "x"\n{"question": "2+2?"}\n'
                  '{"question": "3+3?", "answer": "six"}\n')
    with pytest.warns(DataWarning, match=f"skipped 3 malformed rows .first: {js}:2: not valid JSON"):
        s = load_task("gsm8k", d, "train")
    assert [x.gold for x in s] == ["2"] and s.report.bad_rows == 3


def test_cli_reports_skipped_rows_and_refuses_them_with_strict(emo_dir, tmp_path):
    out = tmp_path / "loc"
    args = ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--data-dir", str(emo_dir), "--n", "50",
            "--method", "grad_x_act", "--max-answer-tokens", "1", "--convergence-points", "1", "--out", str(out)]
    f = emo_dir / "emotion" / "train.txt"
    assert_cli_error([*args, "--strict"], f"{f}:3: no ';label' at the end of the line", out=out, exact=False)
    run = run_cli(args)
    assert run.code == 0, run.stderr
    warns = [line for line in run.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warns) == 2 and f"{f}:3" in warns[0]
    assert warns[1] == "warning: emotion 'train': asked for 50 samples, the source has 3; using 3"
    assert "data: 3 of 50 requested samples used; skipped 2 malformed rows, 1 unknown labels, 0 too long, " \
           "0 empty answer" in run.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["data"]["requested"] == 50 and s["data"]["used"] == 3 and s["n_samples"] == 3
    assert s["skipped"] == {"too_long": 0, "empty_answer": 0, "bad_rows": 2, "unknown_labels": 1}


def test_requested_vs_used_sizes_are_recorded(emo_dir):
    with pytest.warns(DataWarning, match="emotion 'test': asked for 50 samples, the source has 3; using 3"):
        s = load_task("emotion", emo_dir, "test", n=50)
    assert (s.report.requested, s.report.used, s.report.available) == (50, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # the bundled files are clean, and hold 20
        assert load_task("emotion", split="test", n=20).report.summary()["requested"] == 20


def test_too_long_samples_are_counted_by_kind(tiny_gpt2):
    from tlcap.attribution.dataset import score_dataset
    from tlcap.data.tasks import register_task
    from tlcap.metrics.accuracy import task_accuracy

    long = Sample("word " * 200 + "is", " yes", " yes", "long")
    ok = [Sample(f"Item {i} is", " yes", " yes", str(i)) for i in range(2)]
    res = score_dataset(tiny_gpt2, [*ok, long, Sample("Item x is", "", "", "empty")], **KW)
    assert res.n_samples == 2 and res.skipped == {"too_long": 1, "empty_answer": 1} and res.n_skipped == 2
    register_task("toy_long", lambda d, split: [*ok, long], kind="choice", choices=(" yes", " no"), overwrite=True)
    acc = task_accuracy(tiny_gpt2, "toy_long", [*ok, long])
    assert acc.n == 2 and acc.n_skipped == 1 and acc.summary()["n_skipped"] == 1


# --------------------------------------------------------------------------- merges
def test_merging_a_shard_twice_or_overlapping_shards_is_refused(tiny_gpt2, tmp_path):
    from tlcap.attribution.dataset import merge_scores, score_dataset

    S = _samples(5)
    p0, p1 = (score_dataset(tiny_gpt2, S, **KW, run=RunControl(shard=(i, 2))) for i in range(2))
    assert merge_scores([p0, p1]).n_samples == 5
    with pytest.raises(OverlappingShardsError) as exc:
        merge_scores([p0, p1, p0], names=["s0", "s1", "s0 again"])
    assert str(exc.value) == ("s0 and s0 again share 3 samples (the same part given twice?); merging them would count those "
                              "samples twice: give each shard of one run once")
    q0 = score_dataset(tiny_gpt2, S, **KW, run=RunControl(shard=(0, 3)))  # positions 0, 3 — shard 0/2 holds 0, 2, 4
    with pytest.raises(OverlappingShardsError, match="part 0 and part 1 share 1 sample; merging"):
        merge_scores([p0, q0])


def test_cli_merge_refuses_the_same_part_twice(tmp_path):
    base = ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--n", "8", "--method", "grad_x_act",
            "--max-answer-tokens", "1", "--convergence-points", "1"]
    for i in range(2):
        run = run_cli([*base, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")])
        assert run.code == 0, run.stderr
    s0, out = tmp_path / "s0", tmp_path / "merged"
    assert_cli_error(["cnl", "merge", "--parts", str(s0), "--parts", str(s0), "--out", str(out)],
                     f"{s0} (chunk A0) and {s0} (chunk A0) share 2 samples (the same part given twice?); merging them "
                     "would count those samples twice: give each shard of one run once", out=out)
    run = run_cli(["cnl", "merge", "--parts", str(s0), "--out", str(out)])
    assert run.code == 0 and "warning: merged 1 of 2 shards: the result covers part of the data" in run.stderr
    run = run_cli(["cnl", "merge", "--parts", str(s0), "--parts", str(tmp_path / "s1"), "--out", str(out), "--overwrite"])
    assert run.code == 0, run.stderr
    assert json.loads((out / "summary.json").read_text())["n_samples"] == 8


# --------------------------------------------------------------------------- empty sets
def test_empty_neuron_sets_are_named_not_reported_as_no_change(tiny_gpt2, tmp_path):
    from tlcap.experiments.cnl import enhance_effect, erase_effect

    empty = NeuronSet((), (tiny_gpt2.n_layers, tiny_gpt2.d_mlp))
    with pytest.raises(EmptyNeuronSetError) as exc:
        erase_effect(tiny_gpt2, "emotion", load_task("emotion", split="test", n=2), empty, source="emotion")
    assert str(exc.value) == ("the neuron set of emotion is empty (0 neurons): erasing it changes nothing; locate with a "
                              "lower --sigma or on more samples")
    with pytest.raises(EmptyNeuronSetError, match="is empty .0 neurons.: there is nothing to fine-tune"):
        enhance_effect(tiny_gpt2, "emotion", _samples(2), _samples(2), empty)
    summ = tmp_path / "loc" / "summary.json"
    summ.parent.mkdir()
    summ.write_text(json.dumps({"task": "emotion", "sigma": 12.0, "neurons": []}))
    msg = (f"the neuron set in {summ} is empty (0 neurons located at σ=12.0): erasing or fine-tuning it changes nothing; "
           "locate with a lower --sigma or on more samples")
    for cmd in ("erase", "enhance"):
        out = tmp_path / cmd
        assert_cli_error(["cnl", cmd, "--model", "gpt2-tiny", "--dataset", "emotion", "--neurons", str(summ.parent),
                          "--out", str(out)], msg, out=out)


# --------------------------------------------------------------------------- out-of-range options
LOC = ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion"]


@pytest.mark.parametrize("args, message", [
    ([*LOC, "--sigma", "0"], "sigma (--sigma) must be > 0, got 0"),
    ([*LOC, "--sigma", "-1"], "sigma (--sigma) must be > 0, got -1"),
    ([*LOC, "--spread", "mad"], "unknown spread 'mad' (--spread); choose one of: std, var"),
    ([*LOC, "--n", "1"], "n (--n) must be >= 2, got 1"),
    ([*LOC, "--steps", "0"], "steps (--steps) must be >= 1, got 0"),
    ([*LOC, "--method", "sig"], "unknown method 'sig' (--method); choose one of: ig, joint, grad_x_act"),
    ([*LOC, "--max-answer-tokens", "0"], "max_answer_tokens (--max-answer-tokens) must be >= 1, got 0"),
    ([*LOC, "--checkpoint-every", "0"], "checkpoint_every (--checkpoint-every) must be >= 1, got 0"),
    ([*LOC, "--convergence-points", "0"], "convergence_points (--convergence-points) must be >= 1, got 0"),
    ([*LOC, "--shard", "2/2"], "shard (--shard) 2/2 is invalid: need 0 <= i < n"),
    ([*LOC, "--shard", "x"], "--shard must look like i/n (e.g. 0/4), got 'x'"),
    ([*LOC, "--layers", "0-x"], "--layers takes layers and ranges such as 0-5,8, got '0-x'"),
    ([*LOC, "--layers", "-1"], "layers[0] (--layers) must be >= 0, got -1"),
    (["cnl", "merge", "--parts", "p", "--sigma", "0"], "sigma (--sigma) must be > 0, got 0"),
    (["cnl", "erase", "--dataset", "emotion", "--neurons", "x", "--sigma", "3,abc"],
     "--sigma takes comma-separated numbers (e.g. 3,6,12), got '3,abc'"),
    (["cnl", "erase", "--dataset", "emotion", "--neurons", "x", "--sigma", "3,0"], "sigma[1] (--sigma) must be > 0, got 0"),
    (["cnl", "erase", "--dataset", "emotion", "--neurons", "x", "--sigma", "3,3"], "sigma (--sigma) repeats 3.0; give each once"),
    (
        ["cnl", "erase", "--dataset", "emotion", "--neurons", "x", "--n-random", "-1"],
        "n_random (--n-random) must be >= 0, got -1",
    ),
    (["cnl", "erase", "--dataset", "emotion", "--neurons", "x", "--n", "0"], "n (--n) must be >= 1, got 0"),
    (["cnl", "enhance", "--dataset", "emotion", "--neurons", "x", "--lr", "0"], "lr (--lr) must be > 0, got 0"),
    (["cnl", "enhance", "--dataset", "emotion", "--neurons", "x", "--epochs", "0"], "epochs (--epochs) must be >= 1, got 0"),
    (["cnl", "enhance", "--dataset", "emotion", "--neurons", "x", "--epochs", "2", "--eval-epochs", "1,5"],
     "eval_epochs[1] (--eval-epochs) must be between 1 and 2, got 5"),
    (["cnl", "enhance", "--dataset", "emotion", "--neurons", "x", "--modes", "located,except"],
     "unknown mode 'except' (--modes); choose one of: located, random, wo_located, except_frozen"),
    (["cnl", "enhance", "--dataset", "emotion", "--neurons", "x", "--n-train", "0"], "n_train (--n-train) must be >= 1, got 0"),
    (["cnl", "cross", "--neurons", "emotion=x", "--train-on", "both"],
     "unknown train_on 'both' (--train-on); choose one of: source, target"),
    (["cnl", "cross", "--neurons", "emotionx"], "--neurons takes NAME=path/to/summary.json, got 'emotionx'"),
])
def test_out_of_range_options_fail_before_any_work(tmp_path, args, message):
    out = tmp_path / "run"
    assert_cli_error([*args, "--out", str(out)], message, out=out)


def test_missing_neurons_file_and_unknown_dataset(tmp_path):
    out = tmp_path / "run"
    assert_cli_error(["cnl", "locate", "--dataset", "nope", "--out", str(out)], "unknown dataset 'nope'; known: ", out=out,
                     exact=False)
    assert_cli_error(["cnl", "erase", "--dataset", "emotion", "--neurons", str(tmp_path / "nope"), "--out", str(out)],
                     f"--neurons {tmp_path / 'nope'}: {tmp_path / 'nope'} not found; pass the --out folder (or summary.json) "
                     "of `tlcap cnl locate`", out=out)


# --------------------------------------------------------------------------- checkpoints
def test_interrupted_checkpoint_writes_never_double_count(tiny_gpt2, tmp_path, monkeypatch):
    from tlcap import atomic
    from tlcap.attribution.dataset import score_dataset

    S = _samples(4)
    full = score_dataset(tiny_gpt2, S, **KW)
    real = os.replace
    for fail_at in (1, 2, 3):
        ck = tmp_path / f"ck{fail_at}"
        calls = {"n": 0}

        def flaky(src, dst, fail_at=fail_at, calls=calls):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise KeyboardInterrupt  # interrupted while the checkpoint is being put in place
            return real(src, dst)

        monkeypatch.setattr(atomic.os, "replace", flaky)
        with pytest.raises(KeyboardInterrupt):
            score_dataset(tiny_gpt2, S, **KW, run=RunControl(checkpoint_dir=ck, checkpoint_every=1))
        monkeypatch.setattr(atomic.os, "replace", real)
        assert [p.name for p in ck.iterdir()] == (["checkpoint.safetensors"] if fail_at > 1 else [])
        again = score_dataset(tiny_gpt2, S, **KW, run=RunControl(checkpoint_dir=ck, checkpoint_every=1))
        assert torch.equal(again.sums, full.sums) and again.n_samples == 4 and again.n_seen == 4


def test_damaged_checkpoint_names_the_file_and_the_way_out(tiny_gpt2, tmp_path):
    from tlcap.attribution.dataset import score_dataset

    S = _samples(3)
    ck = tmp_path / "ck"
    score_dataset(tiny_gpt2, S, **KW, run=RunControl(checkpoint_dir=ck))
    f = ck / "checkpoint.safetensors"
    f.write_bytes(f.read_bytes()[:40])  # truncated
    with pytest.raises(CheckpointError) as exc:
        score_dataset(tiny_gpt2, S, **KW, run=RunControl(checkpoint_dir=ck))
    msg = str(exc.value)
    assert msg.startswith(f"the checkpoint {f} is damaged (") and msg.endswith(
        "); rerun with --no-resume (resume=False) to start this part over, or delete the file")
    assert score_dataset(tiny_gpt2, S, **KW,
                         run=RunControl(checkpoint_dir=ck, resume=False)).n_samples == 3  # and it is rewritten
    assert score_dataset(tiny_gpt2, S, **KW, run=RunControl(checkpoint_dir=ck)).n_samples == 3
    legacy = tmp_path / "old"
    legacy.mkdir()
    (legacy / "state.json").write_text("{}")
    with pytest.raises(CheckpointError, match="state.json is a checkpoint of an older tlcap"):
        score_dataset(tiny_gpt2, S, **KW, run=RunControl(checkpoint_dir=legacy))


def test_cli_damaged_checkpoint_is_one_line_and_no_resume_recovers(tmp_path):
    out = tmp_path / "loc"
    args = ["cnl", "locate", "--model", "gpt2-tiny", "--dataset", "emotion", "--n", "4", "--method", "grad_x_act",
            "--max-answer-tokens", "1", "--convergence-points", "1", "--out", str(out)]
    bad = tmp_path / ".loc.checkpoints" / "A0" / "checkpoint.safetensors"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a safetensors file")
    assert_cli_error(args, f"the checkpoint {bad} is damaged", out=out, exact=False)
    run = run_cli([*args, "--no-resume"])
    assert run.code == 0, run.stderr
    assert json.loads((out / "summary.json").read_text())["n_samples"] == 4
