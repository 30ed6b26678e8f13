"""Build the data bundled with tlcap (``tlcap/data/bundled/``) from a folder with the source layout.

The source folder holds the original files, one folder per dataset (``pararel/graphs_json/PXX.jsonl``,
``gsm8k/train.jsonl``, ``emotion/train.txt``, ``imdb/imdb_reviews_2500.csv``, ...; see
``docs/data.md``). Every source file's sha256 is checked against the value recorded in the
bundle's ``PROVENANCE.md`` before anything is written.

- Whole files (ParaRel, GSM8K, SVAMP, MBPP, ROME known facts, WikiText-2) are gzipped byte for
  byte (``mtime=0``, level 9, so the output is reproducible): ``gunzip`` gives the original.
- Emotion and IMDB, whose licences are unclear, are bundled as a seeded, label-stratified subset
  (``SUBSETS``) written as JSON Lines that keep each record's index in the original file, so a
  bundled sample has the same ``uid`` (and the same IMDB train/test membership) as in the full file.

``MANIFEST.json`` records, for each dataset, whether it is a subset, the sample counts and the
sha256 of every bundled file's decompressed content. Run it from the repository root:

    python scripts/bundle_data.py --src PATH/TO/DATA [--out tlcap/data/bundled] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

WHOLE = {
    "pararel": ["pararel/graphs_json/*.jsonl", "pararel/trex_lms_vocab/*.jsonl"],
    "gsm8k": ["gsm8k/train.jsonl", "gsm8k/test.jsonl"],
    "svamp": ["svamp/SVAMP.json"],
    "mbpp": ["mbpp/mbpp.jsonl"],
    "rome": ["rome/known_1000.json"],
    "wikitext2": ["wikitext2/wiki.test.raw"],
}
# Samples per split of the two subsets (see docs/data.md for why these sizes).
SUBSETS = {"emotion": {"train": 600, "test": 300}, "imdb": {"train": 600, "test": 300}}
IMDB_FILE = "imdb/imdb_reviews_2500.csv"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recorded_sha256(provenance: Path) -> dict[str, str]:
    """``file name -> sha256`` from the table rows of a PROVENANCE.md (``| name | ... | <64 hex> |``)."""
    out = {}
    for line in provenance.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"[0-9a-f]{64}", cells[-1]):
            out[cells[0]] = cells[-1]
    return out


def read_checked(src: Path, rel: str, out: Path) -> bytes:
    """The source file's bytes, after checking them against the bundle's PROVENANCE.md."""
    data = (src / rel).read_bytes()
    dataset, name = rel.split("/", 1)
    want = recorded_sha256(out / dataset / "PROVENANCE.md").get(name)
    if want is None:
        raise SystemExit(f"{rel}: no sha256 recorded in {out / dataset / 'PROVENANCE.md'}")
    if sha256(data) != want:
        raise SystemExit(f"{rel}: sha256 {sha256(data)} differs from the recorded {want}")
    return data


def write_gz(path: Path, data: bytes) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return {"sha256": sha256(data), "bytes": len(data), "gz_bytes": path.stat().st_size}


def stratified(indices: list[int], labels: dict[int, str], k: int, rng: random.Random) -> list[int]:
    """``k`` of ``indices``, each label's share as in ``indices`` (largest remainder), sorted."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i in indices:
        groups[labels[i]].append(i)
    names = sorted(groups)
    exact = {g: k * len(groups[g]) / len(indices) for g in names}
    quota = {g: int(exact[g]) for g in names}
    for g in sorted(names, key=lambda g: (-(exact[g] - quota[g]), g))[: k - sum(quota.values())]:
        quota[g] += 1
    return sorted(i for g in names for i in rng.sample(groups[g], quota[g]))


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="Folder holding the original dataset folders.")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tlcap" / "data" / "bundled")
    ap.add_argument("--seed", type=int, default=0, help="Seed of the Emotion and IMDB subsets.")
    args = ap.parse_args()
    src, out = args.src, args.out
    manifest: dict = {"format": 1, "datasets": {}}

    for name, patterns in WHOLE.items():
        files = {}
        for pat in patterns:
            for p in sorted(src.glob(pat)):
                rel = p.relative_to(src).as_posix()
                files[rel + ".gz"] = write_gz(out / (rel + ".gz"), read_checked(src, rel, out))
        if not files:
            raise SystemExit(f"no {name} files under {src}")
        manifest["datasets"][name] = {"subset": False, "files": files}

    # Emotion: the line index in the original file (header = line 0) is kept: uid emotion-<split>-<line>.
    files, source, splits = {}, {}, {}
    for split, k in SUBSETS["emotion"].items():
        rel = f"emotion/{split}.txt"
        lines = read_checked(src, rel, out).decode("utf-8").splitlines()
        source[rel] = sha256((src / rel).read_bytes())
        idx = [i for i, l in enumerate(lines) if l.strip() and not (i == 0 and l.startswith("text;"))]
        labels = {i: lines[i].rpartition(";")[2].strip() for i in idx}
        keep = stratified(idx, labels, k, random.Random(args.seed))
        files[f"emotion/{split}_subset.jsonl.gz"] = write_gz(
            out / "emotion" / f"{split}_subset.jsonl.gz", jsonl([{"line": i, "raw": lines[i]} for i in keep]))
        splits[split] = {"n": len(keep), "of": len(idx), "labels": dict(sorted(Counter(labels[i] for i in keep).items()))}
    manifest["datasets"]["emotion"] = {"subset": True, "seed": args.seed, "splits": splits, "source_sha256": source,
                                       "files": files}

    # IMDB: the row index in the CSV is kept (uid imdb-<row>; test = row % 5 == 0, as for the full file).
    raw = read_checked(src, IMDB_FILE, out)
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8"), newline="")))
    labels = {i: r["sentiment"].strip() for i, r in enumerate(rows)}
    keep, splits = [], {}
    for split, k in SUBSETS["imdb"].items():
        pool = [i for i in range(len(rows)) if (i % 5 == 0) == (split == "test")]
        chosen = stratified(pool, labels, k, random.Random(args.seed))
        splits[split] = {"n": len(chosen), "of": len(pool), "labels": dict(sorted(Counter(labels[i] for i in chosen).items()))}
        keep += chosen
    recs = [{"row": i, "review": rows[i]["review"], "sentiment": rows[i]["sentiment"]} for i in sorted(keep)]
    manifest["datasets"]["imdb"] = {
        "subset": True, "seed": args.seed, "splits": splits, "source_sha256": {IMDB_FILE: sha256(raw)},
        "files": {"imdb/reviews_subset.jsonl.gz": write_gz(out / "imdb" / "reviews_subset.jsonl.gz", jsonl(recs))},
    }

    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for name, d in manifest["datasets"].items():
        gz = sum(f["gz_bytes"] for f in d["files"].values())
        subset = f"  subset {d['splits']}" if d["subset"] else ""
        print(f"{name:10s} {len(d['files']):3d} files {gz:>10,d} bytes gzipped{subset}")


if __name__ == "__main__":
    main()
