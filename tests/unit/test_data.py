"""The data bundled with tlcap: integrity, counts, where the loaders look, downloads."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest

from tlcap.data import download, load_known_facts, load_pararel, load_task, load_wikitext
from tlcap.data.files import bundled_dir, bundled_manifest, data_home, read_text
from tlcap.data.pararel import list_relations
from tlcap.errors import DatasetUnavailableError, MissingFileError

REPO = Path(__file__).resolve().parents[2]
BUNDLED = bundled_dir()


def _recorded_sha256(provenance: Path) -> dict[str, str]:
    """``file name -> sha256`` from the tables of a PROVENANCE.md (the values recorded at retrieval)."""
    out = {}
    for line in provenance.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"[0-9a-f]{64}", cells[-1]):
            out[cells[0]] = cells[-1]
    return out


# ------------------------------------------------------------------ integrity and licences
def test_bundled_files_are_the_recorded_originals():
    """Whole files decompress to the exact bytes whose sha256 PROVENANCE.md recorded at retrieval;
    subsets match the manifest, and their manifest's source checksums match PROVENANCE.md."""
    datasets = bundled_manifest()["datasets"]
    assert set(datasets) == {"pararel", "gsm8k", "svamp", "mbpp", "rome", "wikitext2", "emotion", "imdb"}
    n_files = 0
    for name, info in datasets.items():
        recorded = _recorded_sha256(BUNDLED / name / "PROVENANCE.md")
        for rel, meta in info["files"].items():
            data = gzip.decompress((BUNDLED / rel).read_bytes())
            assert hashlib.sha256(data).hexdigest() == meta["sha256"] and len(data) == meta["bytes"], rel
            if not info["subset"]:
                assert recorded[rel.split("/", 1)[1].removesuffix(".gz")] == meta["sha256"], rel
            n_files += 1
        for rel, sha in info.get("source_sha256", {}).items():
            assert recorded[rel.split("/", 1)[1]] == sha, rel
    assert n_files == 62 + 2 + 1 + 1 + 1 + 1 + 2 + 1
    on_disk = {p.relative_to(BUNDLED).as_posix() for p in BUNDLED.rglob("*.gz")}
    assert on_disk == {rel for info in datasets.values() for rel in info["files"]}


def test_every_bundled_folder_has_provenance_and_licence_and_is_package_data():
    for name in bundled_manifest()["datasets"]:
        assert (BUNDLED / name / "PROVENANCE.md").is_file()
        assert (BUNDLED / name / "LICENSE").is_file() or (BUNDLED / name / "NOTICE.md").is_file(), name
    section = (REPO / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1]
    patterns = json.loads(re.search(r"^tlcap\s*=\s*(\[.*?\])", section, re.M).group(1))
    pkg = REPO / "tlcap"
    for p in BUNDLED.rglob("*"):
        if p.is_file():
            rel = p.relative_to(pkg).as_posix()
            assert any(fnmatch.fnmatch(rel, pat.replace("**/", "")) or fnmatch.fnmatch(rel, pat) for pat in patterns), rel


# ------------------------------------------------------------------ what the loaders read by default
def test_bundled_counts_and_subsets():
    assert len(load_task("gsm8k", split="train")) == 7473 and len(load_task("gsm8k", split="test")) == 1319
    assert len(load_task("svamp", split="train")) == 800 and len(load_task("svamp", split="test")) == 200
    assert len(load_task("mbpp", split="train")) == 474 and len(load_task("mbpp", split="test")) == 500
    assert len(list_relations()) == 31
    assert len(load_known_facts()) == 1209 and load_known_facts(n=1)[0]["subject"] == "Vinson Massif"
    assert load_wikitext(n_texts=1)[0].startswith("Robert Boulter is an English film , television and theatre actor")
    splits = bundled_manifest()["datasets"]
    for name in ("emotion", "imdb"):
        for split in ("train", "test"):
            samples = load_task(name, split=split)
            want = splits[name]["splits"][split]
            assert len(samples) == want["n"] == {"train": 600, "test": 300}[split]
            assert len({s.uid for s in samples}) == len(samples)
            labels = {}
            for s in samples:
                labels[s.gold.strip()] = labels.get(s.gold.strip(), 0) + 1
            assert labels == want["labels"]
    # the original row is kept: IMDB's split rule (row % 5 == 0 → test) still holds for the subset
    assert all(int(s.uid.split("-")[1]) % 5 == 0 for s in load_task("imdb", split="test"))
    assert all(int(s.uid.split("-")[1]) % 5 != 0 for s in load_task("imdb", split="train"))


def _write_emotion(root: Path, n: int) -> list[str]:
    labels = ["joy", "sadness", "anger"]
    lines = ["text;label_name"] + [f"i feel thing number {i};{labels[i % 3]}" for i in range(n)]
    (root / "emotion").mkdir(parents=True)
    (root / "emotion" / "train.txt").write_text("\n".join(lines) + "\n")
    return lines


def test_explicit_folder_then_env_then_bundled(tmp_path, monkeypatch):
    local = tmp_path / "local"
    _write_emotion(local, 5)
    gz = local / "gsm8k"
    gz.mkdir()
    (gz / "test.jsonl.gz").write_bytes(gzip.compress(b'{"question": "1+1?", "answer": "2\\n#### 2"}\n'))
    # explicit data_dir: its files, plain or gzipped
    assert sorted(s.uid for s in load_task("emotion", local, "train")) == sorted(f"emotion-train-{i}" for i in range(1, 6))
    assert load_task("gsm8k", local, "test")[0].gold == "2"
    with pytest.raises(MissingFileError):
        load_task("svamp", local, "test")  # an explicit folder is never silently replaced
    with pytest.raises(MissingFileError):
        load_task("emotion", tmp_path / "nowhere", "train")
    # $TLCAP_DATA: used for the datasets it holds, the bundled copy for the others
    monkeypatch.setenv("TLCAP_DATA", str(local))
    assert len(load_task("emotion", split="train")) == 5
    assert len(load_task("svamp", split="test")) == 200
    (local / "rome").mkdir()
    (local / "rome" / "known_1000.json").write_text(json.dumps([{"subject": "A", "prompt": "A is in"}]))
    assert load_known_facts() == [{"subject": "A", "prompt": "A is in"}]
    assert len(load_known_facts(BUNDLED / "rome" / "known_1000.json.gz")) == 1209  # explicit beats the env
    assert load_wikitext(n_texts=1)[0].startswith("Robert Boulter")  # local holds no wikitext2/
    monkeypatch.setenv("TLCAP_DATA", str(tmp_path / "empty"))
    assert len(load_task("emotion", split="train")) == 600


def test_emotion_test_split_missing_locally_is_an_error(tmp_path, monkeypatch):
    _write_emotion(tmp_path, 3)
    monkeypatch.setenv("TLCAP_DATA", str(tmp_path))
    with pytest.raises(MissingFileError, match="test.txt"):
        load_task("emotion", split="test")


def test_more_than_the_bundled_subset_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("TLCAP_CACHE", str(tmp_path))
    assert data_home() == tmp_path / "data"
    assert len(load_task("emotion", split="train", n=600)) == 600  # the whole subset: no download needed
    with pytest.raises(DatasetUnavailableError) as err:
        load_task("emotion", split="train", n=5000)
    msg = str(err.value)
    assert "600 'train' samples" in msg and "5000" in msg and "TLCAP_DATA" in msg and "offline" in msg
    with pytest.raises(DatasetUnavailableError, match="leaves out the 'val' split"):
        load_task("emotion", split="val", n=10)
    with pytest.raises(DatasetUnavailableError, match="300 'test' samples; you asked for 301"):
        load_task("imdb", split="test", n=301)
    assert not (tmp_path / "data").exists()


@pytest.fixture
def online(tmp_path, monkeypatch):
    """Downloads allowed (from file:// URLs only), data home in tmp_path/cache/data."""
    monkeypatch.setenv("TLCAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TLCAP_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "cache" / "data"


def _serve_emotion(tmp_path, monkeypatch, n: int, sha: str | None = None) -> tuple[list[str], bytes]:
    server = tmp_path / "server"
    lines = _write_emotion(server, n)
    data = (server / "emotion" / "train.txt").read_bytes()
    spec = download.RemoteFile((server / "emotion" / "train.txt").as_uri(), "emotion/train.txt",
                               sha or hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(download.REMOTE, "emotion", (spec,))
    return lines, data


def test_fetch_downloads_and_serves_requests_beyond_the_subset(tmp_path, monkeypatch, online):
    lines, data = _serve_emotion(tmp_path, monkeypatch, 700)
    got = load_task("emotion", split="train", n=650, seed=0)  # more than the 600 bundled: downloads
    assert (online / "emotion" / "train.txt").read_bytes() == data
    assert len(got) == 650 and got == load_task("emotion", online, "train", n=650, seed=0)
    assert {s.prompt.split("Text: ")[1].split("\n")[0] for s in got} <= {l.split(";")[0] for l in lines[1:]}

    def no_network(url, timeout):  # noqa: ARG001
        raise AssertionError("downloaded again")

    monkeypatch.setattr(download, "_download", no_network)
    assert download.fetch("emotion") == online  # present with the right checksum: nothing downloaded
    (online / "emotion" / "train.txt").write_text("edited\n")
    with pytest.raises(DatasetUnavailableError, match="not the expected file"):
        download.fetch("emotion")
    assert (online / "emotion" / "train.txt").read_text() == "edited\n"  # never overwritten without force


def test_fetch_rejects_a_checksum_mismatch(tmp_path, monkeypatch, online):
    _serve_emotion(tmp_path, monkeypatch, 3, sha="0" * 64)
    with pytest.raises(DatasetUnavailableError, match="expected 0000"):
        download.fetch("emotion")
    assert not (online / "emotion" / "train.txt").exists()
    with pytest.raises(DatasetUnavailableError, match="the bundled emotion subset has 600 'train' samples"):
        load_task("emotion", split="train", n=601)


def test_fetch_has_pinned_sources_only_for_the_subsets():
    assert set(download.REMOTE) == {"emotion", "imdb"}
    for name, files in download.REMOTE.items():
        recorded = _recorded_sha256(BUNDLED / name / "PROVENANCE.md")
        for f in files:
            assert f.url.startswith("https://raw.githubusercontent.com/") and re.search(r"/[0-9a-f]{40}/", f.url)
            assert f.sha256 in recorded.values()


def test_known_facts_reexport_and_pararel_default():
    from tlcap.locate.causal_trace import load_known_facts as old

    assert old is load_known_facts
    with pytest.raises(MissingFileError):
        load_pararel(Path("no") / "such" / "folder", ["P36"], n_facts=1, single_token=False)


def test_read_text_reads_gzip_transparently(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"x\r\ny\n"))
    assert read_text(tmp_path / "a.txt").splitlines() == ["x", "y"]
    with pytest.raises(MissingFileError):
        read_text(tmp_path / "b.txt")
