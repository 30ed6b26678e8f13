"""The built-in CNL tasks: prompt templates, row parsing, and the loaders of their files.

Every loader reads its rows defensively: a row it cannot turn into a correct sample is skipped
and recorded as a :class:`~tlcap.data.sample.RowIssue` (file and line), never scored with a wrong
answer (an Emotion line without ``;label`` used to be scored with the whole tweet as the answer).
:func:`tlcap.data.tasks.load_task` warns with the count, or refuses with ``strict=True``. A file
that lacks a whole column (no row could be read) is a :class:`~tlcap.errors.DataFormatError`.

Templates and splits are documented in :mod:`tlcap.data.tasks`.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tlcap.data.files import find_file, need_file, read_text, text_stream
from tlcap.data.sample import RowIssues, Sample
from tlcap.errors import DataFormatError, DatasetUnavailableError, UnknownNameError

IMDB_MAX_WORDS = 120
EMOTION_LABELS = ("sadness", "joy", "love", "anger", "fear", "surprise")
IMDB_LABELS = ("negative", "positive")
EMOTION_TEMPLATE = (
    "Classify the emotion of the text as sadness, joy, love, anger, fear or surprise.\nText: {text}\nEmotion:"
)
IMDB_TEMPLATE = "Classify the sentiment of the movie review as positive or negative.\nReview: {review}\nSentiment:"


# --------------------------------------------------------------------------- helpers
def hf_rows(name: str, *args: Any, split: str) -> Any:
    """Rows of a Hugging Face dataset (``datasets`` needed, online)."""
    try:
        import datasets  # noqa: PLC0415 - optional dependency, only for data_dir="hf:"
    except ImportError as exc:  # pragma: no cover - optional path
        raise DatasetUnavailableError(
            "loading by HF name needs `pip install datasets`; or pass --data-dir with local files"
        ) from exc
    try:
        return datasets.load_dataset(name, *args, split=split)
    except Exception as exc:  # noqa: BLE001 - offline or unknown split
        raise DatasetUnavailableError(f"could not load {name!r} split {split!r} from the HF hub ({exc}); omit --data-dir "
                         "(bundled data) or pass a folder with local files") from exc


def check_split(split: str, allowed: Sequence[str], name: str) -> None:
    if split not in allowed:
        raise UnknownNameError(f"{name} has splits {', '.join(allowed)}; got {split!r}")


def jsonl_records(path: Path, issues: RowIssues) -> list[tuple[int, dict]]:
    """``(line, record)`` of a JSON Lines file; unparsable or non-object lines are recorded as bad rows."""
    file = need_file(path)
    out = []
    for k, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            issues.bad(file, k, f"not valid JSON ({exc.msg})")
            continue
        if not isinstance(rec, dict):
            issues.bad(file, k, "not a JSON object")
            continue
        out.append((k, rec))
    return out


def _missing(rec: dict, keys: Sequence[str], types: Sequence[type] | None = None) -> str | None:
    """Reason a record lacks one of ``keys`` (absent, null, empty text, wrong type), else None."""
    for j, k in enumerate(keys):
        v = rec.get(k)
        if v is None:
            return f"no {k!r} field"
        want = types[j] if types else str
        if want is str and (not isinstance(v, str) or not v.strip()):
            return f"empty or non-text {k!r} field"
        if want is list and not isinstance(v, list):
            return f"{k!r} is not a list"
        if want is float and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
            return f"{k!r} is not a number"
    return None


def fmt_number(x: float | str) -> str:
    v = float(str(x).replace(",", ""))
    return str(int(v)) if v == int(v) else f"{v:g}"


# --------------------------------------------------------------------------- GSM8K
_CALC = re.compile(r"<<[^>]*>>")
_NUMBER = re.compile(r"^-?\d[\d,]*(\.\d+)?$")


def gsm8k_sample(question: str, solution: str, uid: str = "") -> Sample:
    """GSM8K record → sample (calculator annotations removed, ``#### N`` → ``The answer is N.``).

    Args:
        question: The problem.
        solution: The worked solution ending in ``#### N``.
        uid: Sample id.

    Returns:
        The :class:`Sample` (``gold`` is the final number without commas).
    """
    body, _, final = solution.rpartition("####")
    final = final.strip().replace(",", "")
    text = _CALC.sub("", body).strip()
    answer = f" {text}\nThe answer is {final}."
    return Sample(f"Question: {question.strip()}\nAnswer:", answer, final, uid)


def load_gsm8k(d: Path | None, split: str) -> list[Sample]:
    """GSM8K samples of ``split`` (malformed rows skipped and recorded).

    Args:
        d: Data folder holding ``gsm8k/``; None: the Hugging Face hub.
        split: ``"train"`` or ``"test"``.

    Returns:
        A :class:`TaskSamples` list.
    """
    check_split(split, ("train", "test"), "gsm8k")
    issues = RowIssues()
    if d is None:
        records = list(enumerate(hf_rows("openai/gsm8k", "main", split=split), start=1))
        file: str | Path = "hf:openai/gsm8k"
    else:
        path = d / "gsm8k" / f"{split}.jsonl"
        file = need_file(path)
        records = jsonl_records(path, issues)
    out = []
    for i, (line, r) in enumerate(records):
        why = _missing(r, ("question", "answer"))
        if why is None and not _NUMBER.match(str(r["answer"]).rpartition("####")[2].strip() or "x"):
            why = "the answer has no '#### <number>' final line"
        if why is not None:
            issues.bad(file, line, why)
            continue
        out.append(gsm8k_sample(r["question"], r["answer"], f"gsm8k-{split}-{i}"))
    return issues.samples(out)


# --------------------------------------------------------------------------- SVAMP
def svamp_sample(body: str, question: str, equation: str, answer: float, uid: str = "") -> Sample:
    """SVAMP record → sample (answer ``" <equation> = N. The answer is N."``).

    Args:
        body: The problem's body.
        question: The question.
        equation: The equation (``.0`` on whole numbers dropped).
        answer: The numeric answer.
        uid: Sample id.

    Returns:
        The :class:`Sample` (``gold`` is the formatted answer).
    """
    eq = re.sub(r"(\d+)\.0\b", r"\1", equation.strip())
    eq = re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", eq))
    n = fmt_number(answer)
    return Sample(f"Question: {body.strip()} {question.strip()}\nAnswer:", f" {eq} = {n}. The answer is {n}.", n, uid)


def load_svamp(d: Path | None, split: str) -> list[Sample]:
    """SVAMP samples of ``split`` (every 5th problem is test; malformed rows skipped and recorded).

    Args:
        d: Data folder holding ``svamp/SVAMP.json``; None: the Hugging Face hub.
        split: ``"train"`` or ``"test"``.

    Returns:
        A :class:`TaskSamples` list.
    """
    check_split(split, ("train", "test"), "svamp")
    issues = RowIssues()
    if d is None:
        rows = list(hf_rows("ChilleD/SVAMP", split="train")) + list(hf_rows("ChilleD/SVAMP", split="test"))
        file: str | Path = "hf:ChilleD/SVAMP"
    else:
        path = d / "svamp" / "SVAMP.json"
        file = need_file(path)
        try:
            rows = json.loads(read_text(path))
        except ValueError as exc:
            raise DataFormatError(f"{file} is not valid JSON ({exc}); restore the file or omit --data-dir") from None
        if not isinstance(rows, list):
            raise DataFormatError(f"{file} must hold a JSON list of problems; restore the file or omit --data-dir")
    out = []
    for i, r in enumerate(rows):
        if (i % 5 == 0) != (split == "test"):
            continue
        why = "not a JSON object" if not isinstance(r, dict) else _missing(
            r, ("Body", "Question", "Equation", "Answer"), (str, str, str, float))
        if why is None:
            try:
                fmt_number(r["Answer"])
            except ValueError:
                why = f"'Answer' {r['Answer']!r} is not a number"
        if why is not None:
            issues.bad(file, i + 1, f"record {i}: {why}")
            continue
        out.append(svamp_sample(r["Body"], r["Question"], r["Equation"], r["Answer"], str(r.get("ID", i))))
    return issues.samples(out)


# --------------------------------------------------------------------------- MBPP
def mbpp_sample(text: str, code: str, tests: Sequence[str], uid: str = "") -> Sample:
    """MBPP record → sample (docstring prompt with the first test; the reference code as answer and gold).

    Args:
        text: The task description.
        code: The reference solution.
        tests: The task's asserts (only the first goes in the prompt).
        uid: Sample id.

    Returns:
        The :class:`Sample`.
    """
    first = tests[0] if tests else ""
    prompt = f'"""{text.strip()}\n{first.strip()}\n"""\n'
    ref = code.replace("\r\n", "\n").replace("\r", "\n").rstrip() + "\n"
    return Sample(prompt, ref, ref, uid)


def load_mbpp(d: Path | None, split: str) -> list[Sample]:
    """MBPP samples of ``split`` (test: task ids 11-510; malformed rows skipped and recorded).

    Args:
        d: Data folder holding ``mbpp/mbpp.jsonl``; None: the Hugging Face hub.
        split: ``"train"`` or ``"test"``.

    Returns:
        A :class:`TaskSamples` list, sorted by task id.
    """
    check_split(split, ("train", "test"), "mbpp")
    issues = RowIssues()
    if d is None:
        hf = [r for s in ("train", "test", "validation", "prompt") for r in hf_rows("google-research-datasets/mbpp", split=s)]
        records = list(enumerate(hf, start=1))
        file: str | Path = "hf:google-research-datasets/mbpp"
    else:
        path = d / "mbpp" / "mbpp.jsonl"
        file = need_file(path)
        records = jsonl_records(path, issues)
    good = []
    for line, r in records:
        why = _missing(r, ("text", "code", "test_list"), (str, str, list))
        try:
            tid = int(r.get("task_id"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            why = why or f"'task_id' {r.get('task_id')!r} is not an integer"
        if why is not None:
            issues.bad(file, line, why)
            continue
        good.append((tid, r))
    good.sort(key=lambda x: x[0])
    keep = [r for tid, r in good if (11 <= tid <= 510) == (split == "test")]
    return issues.samples(mbpp_sample(r["text"], r["code"], r["test_list"], f"mbpp-{r['task_id']}") for r in keep)


# --------------------------------------------------------------------------- Emotion
def emotion_sample(text: str, label: str, uid: str = "") -> Sample:
    """Emotion tweet → sample (``EMOTION_TEMPLATE``; answer and gold are ``" " + label``).

    Args:
        text: The tweet.
        label: The emotion label.
        uid: Sample id.

    Returns:
        The :class:`Sample`.
    """
    return Sample(EMOTION_TEMPLATE.format(text=text.strip()), " " + label, " " + label, uid)


def _emotion_row(raw: str, issues: RowIssues, file: str | Path, line: int) -> tuple[str, str] | None:
    if ";" not in raw:
        issues.bad(file, line, "no ';label' at the end of the line")
        return None
    text, _, label = raw.rpartition(";")
    label = label.strip()
    if not text.strip() or not label:
        issues.bad(file, line, "empty text" if not text.strip() else "empty label after ';'")
        return None
    if label not in EMOTION_LABELS:
        issues.unknown_label(file, line, label, EMOTION_LABELS)
        return None
    return text, label


def load_emotion(d: Path | None, split: str) -> list[Sample]:
    """Emotion samples of ``split`` (full files, else the bundled subset; bad rows skipped and recorded).

    Args:
        d: Data folder holding ``emotion/``; None: the Hugging Face hub.
        split: ``"train"``, ``"val"`` or ``"test"``.

    Returns:
        A :class:`TaskSamples` list (a plain list from the hub).
    """
    check_split(split, ("train", "val", "test"), "emotion")
    issues = RowIssues()
    if d is None:
        ds = hf_rows("dair-ai/emotion", split={"val": "validation"}.get(split, split))
        return [emotion_sample(r["text"], EMOTION_LABELS[int(r["label"])], f"emotion-{split}-{i}") for i, r in enumerate(ds)]
    full, subset = d / "emotion" / f"{split}.txt", d / "emotion" / f"{split}_subset.jsonl"
    lines: list[tuple[int, int, str]] = []  # (line index in the original file, line reported, raw text)
    if find_file(full) is None and find_file(subset) is not None:  # bundled: original line numbers kept
        file = need_file(subset)
        for k, rec in jsonl_records(subset, issues):
            if not isinstance(rec.get("raw"), str) or not isinstance(rec.get("line"), int):
                issues.bad(file, k, "a subset record needs 'line' (int) and 'raw' (text)")
                continue
            lines.append((rec["line"], k, rec["raw"]))
    else:
        file = need_file(full)
        lines = [(i, i + 1, raw) for i, raw in enumerate(read_text(full).splitlines())]
    out = []
    for i, line, raw in lines:
        if not raw.strip() or i == 0 and raw.startswith("text;"):
            continue
        row = _emotion_row(raw, issues, file, line)
        if row is not None:
            out.append(emotion_sample(row[0], row[1], f"emotion-{split}-{i}"))
    return issues.samples(out)


# --------------------------------------------------------------------------- IMDB
def imdb_sample(review: str, label: str, uid: str = "", max_words: int = IMDB_MAX_WORDS) -> Sample:
    """IMDB review → sample (``<br />`` removed, cut to ``max_words`` words; answer and gold are ``" " + label``).

    Args:
        review: The review text.
        label: ``"positive"`` or ``"negative"``.
        uid: Sample id.
        max_words: Words kept (``" ..."`` marks a cut).

    Returns:
        The :class:`Sample`.
    """
    text = re.sub(r"<br\s*/?>", " ", review)
    words = text.split()
    text = " ".join(words[:max_words]) + (" ..." if len(words) > max_words else "")
    return Sample(IMDB_TEMPLATE.format(review=text), " " + label, " " + label, uid)


def _imdb_csv(path: Path, issues: RowIssues) -> list[tuple[int, int, dict]]:
    """``(row index, CSV line, record)``; a file without the two columns is refused."""
    file = need_file(path)
    reader = csv.DictReader(text_stream(path))
    cols = reader.fieldnames or []
    lost = [c for c in ("review", "sentiment") if c not in cols]
    if lost:
        raise DataFormatError(f"{file} has no {' or '.join(map(repr, lost))} column (columns: {', '.join(cols) or 'none'}); "
                              "the IMDB file needs 'review' and 'sentiment' columns")
    out = []
    try:
        for i, r in enumerate(reader):
            out.append((i, reader.line_num, r))
    except csv.Error as exc:
        raise DataFormatError(f"{file}:{reader.line_num}: unreadable CSV ({exc}); fix the file or omit --data-dir") from None
    return out


def load_imdb(d: Path | None, split: str) -> list[Sample]:
    """IMDB samples of ``split`` (every 5th review is test; bad rows and labels skipped and recorded).

    Args:
        d: Data folder holding ``imdb/``; None: the Hugging Face hub.
        split: ``"train"`` or ``"test"``.

    Returns:
        A :class:`TaskSamples` list (a plain list from the hub).
    """
    check_split(split, ("train", "test"), "imdb")
    issues = RowIssues()
    if d is None:
        ds = hf_rows("stanfordnlp/imdb", split=split)
        return [imdb_sample(r["text"], IMDB_LABELS[int(r["label"])], f"imdb-{split}-{i}") for i, r in enumerate(ds)]
    full, subset = d / "imdb" / "imdb_reviews_2500.csv", d / "imdb" / "reviews_subset.jsonl"
    if find_file(full) is None and find_file(subset) is not None:  # bundled: original row numbers kept
        file = need_file(subset)
        rows = []
        for k, rec in jsonl_records(subset, issues):
            if not isinstance(rec.get("row"), int):
                issues.bad(file, k, "a subset record needs 'row' (int)")
                continue
            rows.append((rec["row"], k, rec))
    else:
        file = need_file(full)
        rows = _imdb_csv(full, issues)
    out = []
    for i, line, r in rows:
        if (i % 5 == 0) != (split == "test"):
            continue
        why = _missing(r, ("review", "sentiment"))
        if why is not None:
            issues.bad(file, line, why)
            continue
        label = r["sentiment"].strip()
        if label not in IMDB_LABELS:
            issues.unknown_label(file, line, label, IMDB_LABELS)
            continue
        out.append(imdb_sample(r["review"], label, f"imdb-{i}"))
    return issues.samples(out)


__all__ = [
    "EMOTION_LABELS", "IMDB_LABELS", "IMDB_MAX_WORDS", "EMOTION_TEMPLATE", "IMDB_TEMPLATE", "gsm8k_sample", "svamp_sample",
    "mbpp_sample", "emotion_sample", "imdb_sample", "load_gsm8k", "load_svamp", "load_mbpp", "load_emotion", "load_imdb",
]
