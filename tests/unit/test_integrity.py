"""Issue 28: integrity of everything read back — checksums over JSON and tensors, format versions, file modes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save as save_bytes

from tlcap.atomic import json_digest, write_bytes_atomic, write_text_atomic
from tlcap.attribution.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
from tlcap.errors import CheckpointError, ResultFormatError, ResultIntegrityError
from tlcap.experiments.cnl_eval.common import ItemCheckpoint
from tlcap.metrics import NeuronSet
from tlcap.reproduce.stage_store import read_record, save_stage
from tlcap.results import load_result

REDO = "re-run the command that wrote it (or restore the folder from a copy)"


@pytest.fixture()
def saved(tmp_path):
    ns = NeuronSet.from_list([(0, 1), (1, 5)], (2, 8))
    return ns, ns.save(tmp_path / "r")


def _edit(path, fn, keep_checksum=False):
    meta = json.loads((path / "result.json").read_text())
    fn(meta)
    if keep_checksum:  # an edit that also rewrites the checksum (a tool that knows the format)
        meta.pop("json_sha256", None)
        meta["json_sha256"] = json_digest(meta)
    (path / "result.json").write_text(json.dumps(meta))


def test_a_removed_field_is_a_clear_integrity_error_not_a_type_error(saved):
    ns, path = saved
    field = next(iter(json.loads((path / "result.json").read_text())["fields"]))
    _edit(path, lambda m: m["fields"].pop(field))
    with pytest.raises(ResultIntegrityError) as exc:
        load_result(path)
    assert str(exc.value) == (f"{path / 'result.json'} does not match its own sha256 (json_sha256: edited or damaged); "
                              f"{REDO}")
    _edit(path, lambda m: None, keep_checksum=True)
    with pytest.raises(ResultIntegrityError, match=rf"lacks the field {field} of NeuronSet \(edited or damaged\?\)"):
        load_result(path)


def test_a_changed_value_is_caught_by_the_json_checksum(saved):
    ns, path = saved
    _edit(path, lambda m: m["fields"].update(shape=[2, 9]))
    with pytest.raises(ResultIntegrityError, match="does not match its own sha256"):
        load_result(path)


def test_format_versions_newer_refused_older_migrated(saved):
    ns, path = saved
    _edit(path, lambda m: m.update(format=99), keep_checksum=True)
    with pytest.raises(ResultFormatError, match=r"is in result format 99 \(written by tlcap .*\); this tlcap .* reads "
                                                r"formats 1 to 3: load it with that tlcap or a newer one"):
        load_result(path)
    _edit(path, lambda m: (m.update(format=2), m.pop("json_sha256")))  # what format 2 wrote: no JSON checksum
    assert load_result(path) == ns


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_files_follow_the_umask_like_any_new_file(tmp_path, umask):
    old = os.umask(umask)
    try:
        NeuronSet.from_list([(0, 1)], (2, 8)).save(tmp_path / "r")
        save_checkpoint(tmp_path / "ck", {"sums": torch.arange(4)}, {"n": 1})
        write_text_atomic(tmp_path / "summary.json", "{}")
        plain = tmp_path / "plain"
        plain.write_text("")  # what open() gives under this umask
    finally:
        os.umask(old)
    want = plain.stat().st_mode & 0o777
    assert want == 0o666 & ~umask
    for f in (tmp_path / "r" / "result.json", tmp_path / "ck" / CHECKPOINT_FILE, tmp_path / "summary.json"):
        assert f.stat().st_mode & 0o777 == want, f


def test_a_result_with_tensors_is_group_readable(tmp_path, tiny_gpt2):
    from tlcap.attribution import integrated_gradients

    old = os.umask(0o022)
    try:
        attr = integrated_gradients(tiny_gpt2, "The capital of France is", " Paris", steps=1, progress=False)
        attr.save(tmp_path / "a")
    finally:
        os.umask(old)
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "a").iterdir()} == {
        "result.json": 0o644, "tensors.safetensors": 0o644}


def test_checkpoints_are_checksummed_and_versioned(tmp_path):
    ck = tmp_path / "ck"
    sums = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    f = save_checkpoint(ck, {"sums": sums}, {"n_seen": 3})
    tensors, state = load_checkpoint(ck)
    assert torch.equal(tensors["sums"], sums) and state == {"n_seen": 3}
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x01  # one counter changed, the file the same size and still a valid safetensors file
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"is damaged \(its content does not match the sha256 recorded in it\); "
                                              r"rerun with --no-resume"):
        load_checkpoint(ck)
    f.write_bytes(save_bytes({"sums": sums}, metadata={"tlcap_checkpoint": "7", "state": "{}"}))
    with pytest.raises(CheckpointError, match=r"is of format 7, made by a newer tlcap \(this one reads formats 2 to 3\)"):
        load_checkpoint(ck)
    f.write_bytes(save_bytes({"sums": sums}, metadata={"tlcap_checkpoint": "2", "state": '{"n_seen": 3}'}))
    assert load_checkpoint(ck)[1] == {"n_seen": 3}  # format 2 (no checksum) still resumes


def test_item_checkpoints_are_checksummed(tmp_path):
    ck = ItemCheckpoint(tmp_path, "fp1", every=1)
    ck.add({"x": 1})
    ck.add({"x": 2})
    assert ItemCheckpoint(tmp_path, "fp1").items == [{"x": 1}, {"x": 2}]
    data = json.loads((tmp_path / "items.json").read_text())
    data["items"].append({"x": 2})  # an item counted twice by hand
    (tmp_path / "items.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="its content does not match the sha256 recorded in it"):
        ItemCheckpoint(tmp_path, "fp1")
    (tmp_path / "items.json").write_text(json.dumps({**data, "version": 9}))
    with pytest.raises(CheckpointError, match="is of format 9, made by a newer tlcap"):
        ItemCheckpoint(tmp_path, "fp1")


def test_stage_records_are_checksummed_and_versioned(tmp_path):
    assert save_stage(tmp_path, "s-0", {"set": NeuronSet.from_list([(0, 1)], (2, 8))}, {"name": "s", "seconds": 1.0})
    folder = tmp_path / "s-0"
    assert read_record(folder)["results"] == ["set"]
    rec = json.loads((folder / "stage.json").read_text())
    (folder / "stage.json").write_text(json.dumps({**rec, "results": []}))
    with pytest.raises(CheckpointError, match=f"does not match its own sha256 .*; delete {folder} to recompute"):
        read_record(folder)
    rec = {**rec, "format": 5}
    rec.pop("json_sha256")
    (folder / "stage.json").write_text(json.dumps({**rec, "json_sha256": json_digest(rec)}))
    with pytest.raises(CheckpointError, match="is of stage format 5, written by a newer tlcap"):
        read_record(folder)


def test_atomic_writes_leave_no_temporary_file_and_clean_those_of_dead_processes(tmp_path):
    dead = tmp_path / ".f.json.tmp-999999999-abc"  # a process that was killed while writing f.json
    dead.write_text("half")
    write_bytes_atomic(tmp_path / "f.json", b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
