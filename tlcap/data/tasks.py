"""Capability datasets for CNL: GSM8K, SVAMP (math), MBPP (code), Emotion, IMDB (sentiment).

Every task turns a raw record into a :class:`Sample`: a ``prompt`` x and an ``answer`` string y
used for teacher forcing (CNL eq. 7), plus what accuracy needs (the gold number, the label, or
the reference code). Data come from an explicit ``data_dir``, ``$TLCAP_DATA``, the copy bundled
with tlcap (whole files, except a seeded subset of Emotion and IMDB), the full files downloaded
when a request exceeds that subset, or Hugging Face ``datasets`` (``data_dir="hf:"``); see
:mod:`tlcap.data.files` and ``docs/data.md``.

Prompt templates (documented choices; change them with :func:`register_task`):

============ ======================================================= ==============================
task         prompt                                                  answer y (teacher forcing)
============ ======================================================= ==============================
gsm8k        ``Question: {question}\\nAnswer:``                       `` {solution}`` (calculator
                                                                     ``<<…>>`` removed, ``#### N``
                                                                     → ``The answer is N.``)
svamp        ``Question: {Body} {Question}\\nAnswer:``                `` {Equation} = N. The answer
                                                                     is N.``
mbpp         a docstring: ``{text}`` and the first test assert, then   the reference code (LF)
             a newline
emotion      ``Classify the emotion of the text as sadness, joy,     `` {label}``
             love, anger, fear or surprise.\\nText: {text}\\nEmotion:``
imdb         ``Classify the sentiment of the movie review as          `` {positive|negative}``
             positive or negative.\\nReview: {review}\\nSentiment:``
============ ======================================================= ==============================

IMDB reviews lose their ``<br />`` tags and are cut to the first ``IMDB_MAX_WORDS`` words
(long prompts cost memory in batched attribution; the label is usually clear early).

Splits: GSM8K and Emotion have their own files (Emotion: train/val/test). The single-file sets
are split deterministically: MBPP follows the upstream convention (test = task ids 11–510,
train = the rest), SVAMP and IMDB put every 5th record (index % 5 == 0) in ``test`` and the
others in ``train``. ``n`` samples are drawn by a seeded shuffle, so the same
``(split, n, seed)`` always gives the same samples from the same source. The bundled Emotion and
IMDB subsets keep each record's index in the original file (same ``uid``, same IMDB split), but a
seed draws from the subset, so it picks other samples than from the full files.

Example:
    >>> samples = load_task("emotion", split="train", n=100)        # the bundled subset
    >>> samples = load_task("emotion", "path/to/data", "train", n=5000)  # full files: data/emotion/
    >>> samples[0].prompt, samples[0].answer
    >>> register_task("mytask", loader=my_loader, kind="choice", choices=(" yes", " no"))
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tlcap.data.download import fetch
from tlcap.data.files import (
    bundled_dir,
    bundled_info,
    data_home,
    find_file,
    is_hf,
    local_root,
    read_jsonl,
    read_text,
    text_stream,
)
from tlcap.errors import DatasetUnavailableError, EmptyDatasetError, MissingFileError, TlcapError

Kind = Literal["number", "choice", "code"]
Split = str

IMDB_MAX_WORDS = 120
EMOTION_LABELS = ("sadness", "joy", "love", "anger", "fear", "surprise")


@dataclass(frozen=True)
class Sample:
    """One task example.

    Attributes:
        prompt: The input x.
        answer: The answer string y scored by teacher forcing (starts with a space or follows
            the prompt's trailing newline).
        gold: What accuracy compares with: the final number (math), the label (choice tasks,
            equal to ``answer``), or the reference code (code).
        uid: A stable identifier (dataset id or line number) used for checkpoint fingerprints.
    """

    prompt: str
    answer: str
    gold: str = ""
    uid: str = ""
    meta: dict = field(default_factory=dict, compare=False)


Loader = Callable[[Path | None, str], list[Sample]]


@dataclass(frozen=True)
class Task:
    """A registered dataset: how to load it and how to score accuracy on it.

    Attributes:
        name: Registry name.
        loader: ``loader(data_dir, split) -> list[Sample]`` (``data_dir`` None = HF datasets);
            ``data_dir`` holds one folder per dataset, files plain or gzipped.
        kind: ``"number"`` (exact match of the final number after greedy decoding),
            ``"choice"`` (label chosen by likelihood among ``choices``) or ``"code"``
            (reference-solution token accuracy; model code is never executed).
        choices: Answer strings of a choice task, e.g. ``(" positive", " negative")``.
        hf_name: The Hugging Face ``datasets`` name read with ``data_dir="hf:"``.
        template: The prompt template, for documentation and summaries.
        max_new_tokens: Generation budget for ``number`` tasks.
    """

    name: str
    loader: Loader
    kind: Kind = "choice"
    choices: tuple[str, ...] = ()
    hf_name: str = ""
    template: str = ""
    max_new_tokens: int = 64
    description: str = ""


TASKS: dict[str, Task] = {}


def register_task(
    name: str,
    loader: Loader,
    kind: Kind = "choice",
    choices: Sequence[str] = (),
    hf_name: str = "",
    template: str = "",
    max_new_tokens: int = 64,
    description: str = "",
    overwrite: bool = False,
) -> Task:
    """Register a dataset under ``name`` so that the CLI and experiments can use it.

    Example:
        >>> def load_yesno(data_dir, split):
        ...     rows = json.loads((Path(data_dir) / "yesno" / f"{split}.json").read_text())
        ...     return [Sample(f"Q: {r['q']}\\nA:", " " + r["a"], " " + r["a"], str(i)) for i, r in enumerate(rows)]
        >>> register_task("yesno", load_yesno, kind="choice", choices=(" yes", " no"))
    """
    if name in TASKS and not overwrite:
        raise TlcapError(f"task {name!r} is already registered; pass overwrite=True to replace it")
    if kind not in ("number", "choice", "code"):
        raise TlcapError(f"unknown task kind {kind!r}; use 'number', 'choice' or 'code'")
    if kind == "choice" and not choices:
        raise TlcapError(f"choice task {name!r} needs its answer strings in choices=")
    task = Task(name, loader, kind, tuple(choices), hf_name, template, max_new_tokens, description)
    TASKS[name] = task
    return task


def get_task(name: str) -> Task:
    """The registered task called ``name``."""
    if name not in TASKS:
        raise TlcapError(f"unknown dataset {name!r}; known: {', '.join(sorted(TASKS))} (or register_task(...))")
    return TASKS[name]


def load_task(name: str, data_dir: str | Path | None = None, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Sample]:
    """Load ``n`` samples of a task's split (seeded shuffle; all if ``n`` is None).

    Args:
        name: A registered task (``gsm8k``, ``svamp``, ``mbpp``, ``emotion``, ``imdb``, ...).
        data_dir: Folder holding the dataset folders (``data_dir/emotion/train.txt``, ...). None:
            ``$TLCAP_DATA`` if it holds ``name/``, else the copy bundled with tlcap; a request the
            bundled Emotion / IMDB subset cannot serve (more than its 600 train / 300 test
            samples, or Emotion's ``val``) reads the full files from
            :func:`~tlcap.data.files.data_home`, downloading them when online. ``"hf:"``: the
            Hugging Face hub via ``datasets`` (online).
        split: ``"train"`` or ``"test"`` (Emotion also ``"val"``).
        n: Number of samples (None = all of the source; for a bundled subset, the whole subset).
        seed: Shuffle seed.

    Raises:
        DatasetUnavailableError: more samples than the bundled subset holds, offline, and no
            full copy in ``$TLCAP_DATA`` or the data home.

    Example:
        >>> load_task("emotion", split="test", n=100, seed=1)
    """
    task = get_task(name)
    if n is not None and n < 1:
        raise EmptyDatasetError(f"n must be >= 1, got {n}")
    samples = _source_samples(task, data_dir, split, n)
    if not samples:
        raise EmptyDatasetError(f"{name} split {split!r} has no samples")
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    return [samples[i] for i in order[:n]]


def _source_samples(task: Task, data_dir: str | Path | None, split: str, n: int | None) -> list[Sample]:
    """Every sample of ``split`` from the first source that can serve ``n`` (see :func:`load_task`)."""
    if is_hf(data_dir):
        return task.loader(None, split)
    root = local_root(data_dir, task.name)
    if root is not None:
        return task.loader(root, split)
    info = bundled_info(task.name)
    if info is None:  # a registered task with no local files: its loader's own default
        return task.loader(None, split)
    try:
        samples = task.loader(bundled_dir(), split)
    except MissingFileError:  # a split the bundled subset leaves out (Emotion "val")
        samples = []
    if not info["subset"] or (samples and (n is None or n <= len(samples))):
        return samples
    try:
        root = fetch(task.name)
    except DatasetUnavailableError as exc:
        has = f"has {len(samples)} {split!r} samples" if samples else f"leaves out the {split!r} split"
        raise DatasetUnavailableError(
            f"the bundled {task.name} subset {has}; you asked for {n if n is not None else 'all'}: set TLCAP_DATA "
            f"(or --data-dir) to a folder holding {task.name}/ with the full files, or run online once "
            f"(tlcap.data.fetch({task.name!r}) downloads them to {data_home()}). [{exc}]"
        ) from None
    return task.loader(root, split)


def encode_sample(model: Any, sample: Sample, max_answer_tokens: int | None = None) -> tuple[list[int], list[int]]:
    """Token ids ``(prompt, answer)`` of a sample, the answer cut to ``max_answer_tokens``.

    The answer is tokenized in context (``prompt + answer``) so that what is scored is what the
    model would read; if the joint tokenization does not start with the prompt's tokens, the
    answer is tokenized on its own.
    """
    p_ids = model.encode(sample.prompt)
    joint = model.encode(sample.prompt + sample.answer, prepend_bos=model.prepend_bos)
    if joint[: len(p_ids)] == p_ids and len(joint) > len(p_ids):
        t_ids = joint[len(p_ids):]
    else:
        t_ids = model.encode(sample.answer, prepend_bos=False, check_length=False)
    if max_answer_tokens is not None:
        t_ids = t_ids[:max_answer_tokens]
    return p_ids, t_ids


# --------------------------------------------------------------------------- helpers
def _hf(name: str, *args: Any, split: str) -> Any:
    try:
        import datasets  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - optional path
        raise TlcapError("loading by HF name needs `pip install datasets`; or pass --data-dir with local files") from exc
    try:
        return datasets.load_dataset(name, *args, split=split)
    except Exception as exc:  # noqa: BLE001 - offline or unknown split
        raise TlcapError(f"could not load {name!r} split {split!r} from the HF hub ({exc}); omit --data-dir "
                         "(bundled data) or pass a folder with local files") from exc


def _check_split(split: str, allowed: Sequence[str], name: str) -> None:
    if split not in allowed:
        raise TlcapError(f"{name} has splits {', '.join(allowed)}; got {split!r}")


def _fmt_number(x: float | str) -> str:
    v = float(str(x).replace(",", ""))
    return str(int(v)) if v == int(v) else f"{v:g}"


_CALC = re.compile(r"<<[^>]*>>")


def gsm8k_sample(question: str, solution: str, uid: str = "") -> Sample:
    """GSM8K record → sample (calculator annotations removed, ``#### N`` → ``The answer is N.``)."""
    body, _, final = solution.rpartition("####")
    final = final.strip().replace(",", "")
    text = _CALC.sub("", body).strip()
    answer = f" {text}\nThe answer is {final}."
    return Sample(f"Question: {question.strip()}\nAnswer:", answer, final, uid)


def _load_gsm8k(d: Path | None, split: str) -> list[Sample]:
    _check_split(split, ("train", "test"), "gsm8k")
    if d is None:
        rows = _hf("openai/gsm8k", "main", split=split)
    else:
        rows = read_jsonl(d / "gsm8k" / f"{split}.jsonl")
    return [gsm8k_sample(r["question"], r["answer"], f"gsm8k-{split}-{i}") for i, r in enumerate(rows)]


def svamp_sample(body: str, question: str, equation: str, answer: float, uid: str = "") -> Sample:
    eq = re.sub(r"(\d+)\.0\b", r"\1", equation.strip())
    eq = re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", eq))
    n = _fmt_number(answer)
    return Sample(f"Question: {body.strip()} {question.strip()}\nAnswer:", f" {eq} = {n}. The answer is {n}.", n, uid)


def _load_svamp(d: Path | None, split: str) -> list[Sample]:
    _check_split(split, ("train", "test"), "svamp")
    if d is None:
        rows = list(_hf("ChilleD/SVAMP", split="train")) + list(_hf("ChilleD/SVAMP", split="test"))
    else:
        rows = json.loads(read_text(d / "svamp" / "SVAMP.json"))
    keep = [(i, r) for i, r in enumerate(rows) if (i % 5 == 0) == (split == "test")]
    return [svamp_sample(r["Body"], r["Question"], r["Equation"], r["Answer"], str(r.get("ID", i))) for i, r in keep]


def mbpp_sample(text: str, code: str, tests: Sequence[str], uid: str = "") -> Sample:
    first = tests[0] if tests else ""
    prompt = f'"""{text.strip()}\n{first.strip()}\n"""\n'
    ref = code.replace("\r\n", "\n").replace("\r", "\n").rstrip() + "\n"
    return Sample(prompt, ref, ref, uid)


def _load_mbpp(d: Path | None, split: str) -> list[Sample]:
    _check_split(split, ("train", "test"), "mbpp")
    if d is None:
        rows = [r for s in ("train", "test", "validation", "prompt") for r in _hf("google-research-datasets/mbpp", split=s)]
    else:
        rows = read_jsonl(d / "mbpp" / "mbpp.jsonl")
    rows = sorted(rows, key=lambda r: int(r["task_id"]))
    keep = [r for r in rows if (11 <= int(r["task_id"]) <= 510) == (split == "test")]
    return [mbpp_sample(r["text"], r["code"], r["test_list"], f"mbpp-{r['task_id']}") for r in keep]


EMOTION_TEMPLATE = (
    "Classify the emotion of the text as sadness, joy, love, anger, fear or surprise.\nText: {text}\nEmotion:"
)


def emotion_sample(text: str, label: str, uid: str = "") -> Sample:
    return Sample(EMOTION_TEMPLATE.format(text=text.strip()), " " + label, " " + label, uid)


def _load_emotion(d: Path | None, split: str) -> list[Sample]:
    _check_split(split, ("train", "val", "test"), "emotion")
    if d is None:
        ds = _hf("dair-ai/emotion", split={"val": "validation"}.get(split, split))
        return [emotion_sample(r["text"], EMOTION_LABELS[int(r["label"])], f"emotion-{split}-{i}") for i, r in enumerate(ds)]
    full, subset = d / "emotion" / f"{split}.txt", d / "emotion" / f"{split}_subset.jsonl"
    if find_file(full) is None and find_file(subset) is not None:  # bundled: original line numbers kept
        lines = [(int(r["line"]), r["raw"]) for r in read_jsonl(subset)]
    else:
        lines = list(enumerate(read_text(full).splitlines()))
    out = []
    for i, line in lines:
        if not line.strip() or i == 0 and line.startswith("text;"):
            continue
        text, _, label = line.rpartition(";")
        out.append(emotion_sample(text, label.strip(), f"emotion-{split}-{i}"))
    return out


IMDB_TEMPLATE = "Classify the sentiment of the movie review as positive or negative.\nReview: {review}\nSentiment:"


def imdb_sample(review: str, label: str, uid: str = "", max_words: int = IMDB_MAX_WORDS) -> Sample:
    text = re.sub(r"<br\s*/?>", " ", review)
    words = text.split()
    text = " ".join(words[:max_words]) + (" ..." if len(words) > max_words else "")
    return Sample(IMDB_TEMPLATE.format(review=text), " " + label, " " + label, uid)


def _load_imdb(d: Path | None, split: str) -> list[Sample]:
    _check_split(split, ("train", "test"), "imdb")
    if d is None:
        ds = _hf("stanfordnlp/imdb", split=split)
        return [imdb_sample(r["text"], ("negative", "positive")[int(r["label"])], f"imdb-{split}-{i}") for i, r in enumerate(ds)]
    full, subset = d / "imdb" / "imdb_reviews_2500.csv", d / "imdb" / "reviews_subset.jsonl"
    if find_file(full) is None and find_file(subset) is not None:  # bundled: original row numbers kept
        rows = [(int(r["row"]), r) for r in read_jsonl(subset)]
    else:
        rows = list(enumerate(csv.DictReader(text_stream(full))))
    keep = [(i, r) for i, r in rows if (i % 5 == 0) == (split == "test")]
    return [imdb_sample(r["review"], r["sentiment"].strip(), f"imdb-{i}") for i, r in keep]


register_task("gsm8k", _load_gsm8k, kind="number", hf_name="openai/gsm8k", template="Question: {question}\\nAnswer:",
              max_new_tokens=96, description="grade-school math; exact match of the final number")
register_task("svamp", _load_svamp, kind="number", hf_name="ChilleD/SVAMP", template="Question: {Body} {Question}\\nAnswer:",
              max_new_tokens=32, description="one-step math word problems; exact match of the final number")
register_task("mbpp", _load_mbpp, kind="code", hf_name="google-research-datasets/mbpp",
              template='"""{text}\\n{test_list[0]}\\n"""\\n', description="Python problems; reference-solution token accuracy")
register_task("emotion", _load_emotion, kind="choice", choices=tuple(" " + l for l in EMOTION_LABELS), hf_name="dair-ai/emotion",
              template=EMOTION_TEMPLATE, description="6-way emotion of a tweet; label by likelihood")
register_task("imdb", _load_imdb, kind="choice", choices=(" positive", " negative"), hf_name="stanfordnlp/imdb",
              template=IMDB_TEMPLATE, description="binary movie-review sentiment; label by likelihood")

__all__ = [
    "Sample", "Task", "TASKS", "encode_sample", "register_task", "get_task", "load_task", "EMOTION_LABELS", "IMDB_MAX_WORDS",
    "gsm8k_sample", "svamp_sample", "mbpp_sample", "emotion_sample", "imdb_sample",
]
