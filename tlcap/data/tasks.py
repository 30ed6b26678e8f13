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

Malformed rows (an Emotion line without ``;label``, a record without its question, a label the
task does not have) are skipped, counted in ``samples.report`` and warned about with their file
and line (:mod:`tlcap.data.task_formats`); ``strict=True`` (CLI ``--strict``) refuses them.

Example:
    >>> samples = load_task("emotion", split="train", n=100)        # the bundled subset
    >>> samples[0].prompt, samples[0].answer
    ('Classify the emotion of the text as sadness, joy, love, anger, fear or surprise.\\nText: ...\\nEmotion:', ' joy')
    >>> from tlcap.data.files import bundled_dir
    >>> samples = load_task("emotion", bundled_dir(), "train", n=50)  # a data folder holding emotion/
    >>> len(samples), samples.report.available
    (50, 600)

With the full files (:func:`tlcap.data.download.fetch_emotion`, or your own ``data/emotion/``),
``load_task("emotion", "data", "train", n=5000)`` draws from all 16,000 training tweets. A task
of your own is one :func:`register_task` call (example there).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tlcap.data.download import fetch
from tlcap.data.files import bundled_dir, bundled_info, data_home, is_hf, local_root
from tlcap.data.sample import (
    MAX_ISSUES_KEPT,
    DataReport,
    DataWarning,
    Kind,
    Loader,
    RowIssue,
    Sample,
    Task,
    TaskSamples,
    summarize_issues,
)
from tlcap.data.task_formats import (
    EMOTION_LABELS,
    EMOTION_TEMPLATE,
    IMDB_LABELS,
    IMDB_MAX_WORDS,
    IMDB_TEMPLATE,
    emotion_sample,
    gsm8k_sample,
    imdb_sample,
    load_emotion,
    load_gsm8k,
    load_imdb,
    load_mbpp,
    load_svamp,
    mbpp_sample,
    svamp_sample,
)
from tlcap.errors import (
    DataFormatError,
    DatasetUnavailableError,
    EmptyDatasetError,
    InvalidConfigError,
    MissingFileError,
    PromptTooLongError,
    UnknownNameError,
)

Split = str

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

    Args:
        name: Registry name.
        loader: ``loader(data_dir, split) -> list[Sample]``; it may return a
            :class:`~tlcap.data.sample.TaskSamples` listing the rows it skipped
            (:class:`~tlcap.data.sample.RowIssues` helps), which ``load_task`` then reports.
        kind: ``"number"``, ``"choice"`` or ``"code"`` (how accuracy is measured).
        choices: The answer strings of a choice task.
        hf_name: Hugging Face dataset name (documentation).
        template: Prompt template (documentation).
        max_new_tokens: Generation budget of a number task.
        description: One line for listings.
        overwrite: Replace a task of the same name.

    Returns:
        The registered :class:`Task`.

    Example:
        >>> import json, tempfile
        >>> root = Path(tempfile.mkdtemp()); (root / "yesno").mkdir()
        >>> rows = [{"q": "Is the sky blue?", "a": "yes"}, {"q": "Is ice hot?", "a": "no"}]
        >>> _ = (root / "yesno" / "test.json").write_text(json.dumps(rows))
        >>> def load_yesno(data_dir, split):
        ...     rows = json.loads((Path(data_dir) / "yesno" / f"{split}.json").read_text())
        ...     return [Sample(f"Q: {r['q']}\\nA:", " " + r["a"], " " + r["a"], str(i)) for i, r in enumerate(rows)]
        >>> task = register_task("yesno", load_yesno, kind="choice", choices=(" yes", " no"), overwrite=True)
        >>> task.name, task.kind, task.choices
        ('yesno', 'choice', (' yes', ' no'))
        >>> [s.prompt for s in load_task("yesno", root, "test")]
        ['Q: Is the sky blue?\\nA:', 'Q: Is ice hot?\\nA:']
    """
    if name in TASKS and not overwrite:
        raise InvalidConfigError(f"task {name!r} is already registered; pass overwrite=True to replace it")
    if kind not in ("number", "choice", "code"):
        raise UnknownNameError(f"unknown task kind {kind!r}; use 'number', 'choice' or 'code'")
    if kind == "choice" and not choices:
        raise InvalidConfigError(f"choice task {name!r} needs its answer strings in choices=")
    task = Task(name, loader, kind, tuple(choices), hf_name, template, max_new_tokens, description)
    TASKS[name] = task
    return task


def get_task(name: str) -> Task:
    """The registered task called ``name``.

    Args:
        name: A key of ``TASKS`` (built in, or added with ``register_task``).

    Returns:
        The :class:`Task`.

    Raises:
        UnknownNameError: no task of that name (the message lists the known ones).
    """
    if name not in TASKS:
        raise UnknownNameError(f"unknown dataset {name!r}; known: {', '.join(sorted(TASKS))} (or register_task(...))")
    return TASKS[name]


def load_task(
    name: str,
    data_dir: str | Path | None = None,
    split: Split = "train",
    n: int | None = None,
    seed: int = 0,
    *,
    strict: bool = False,
) -> TaskSamples:
    """Load ``n`` samples of a task's split (seeded shuffle; all if ``n`` is None).

    Rows the loader cannot read correctly (malformed, or with a label the task does not have)
    are skipped and counted, with a :class:`~tlcap.data.sample.DataWarning` naming the file and
    the first lines; ``strict=True`` refuses them instead. Fewer samples than ``n`` in the source
    also warn. Both are recorded in the returned list's ``.report``
    (:class:`~tlcap.data.sample.DataReport`), which CNL results carry.

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
        strict: Refuse a file with malformed rows or unknown labels instead of skipping them.

    Returns:
        A :class:`~tlcap.data.sample.TaskSamples` (a list of samples with ``.report``).

    Raises:
        DataFormatError: with ``strict``, the first skipped row (file and line); or a file
            missing a whole column.
        DatasetUnavailableError: more samples than the bundled subset holds, offline, and no
            full copy in ``$TLCAP_DATA`` or the data home.

    Example:
        >>> load_task("emotion", split="test", n=100, seed=1).report.used
        100
    """
    task = get_task(name)
    if n is not None and (isinstance(n, bool) or n < 1):
        raise EmptyDatasetError(f"n must be >= 1, got {n}")
    samples = _source_samples(task, data_dir, split, n)
    issues: tuple[RowIssue, ...] = tuple(getattr(samples, "issues", ()))
    if issues and strict:
        raise DataFormatError(
            f"{issues[0]}; {name} {split!r} has {summarize_issues(issues, limit=0).split(' (')[0]} in all "
            "(--strict refuses them; fix the file, or drop --strict to skip them with a warning)"
        )
    if issues and not samples:  # every row unreadable: the file's shape is wrong, --strict would not help
        raise DataFormatError(
            f"{name} {split!r}: no row could be read ({summarize_issues(issues)}); fix the file or omit --data-dir to "
            "use the data bundled with tlcap"
        )
    if issues:
        warnings.warn(DataWarning(f"{name} {split!r}: skipped {summarize_issues(issues)}; "
                                  "pass --strict (strict=True) to refuse such files"), stacklevel=2)
    if not samples:
        raise EmptyDatasetError(f"{name} split {split!r} has no samples")
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    chosen = [samples[i] for i in order[:n]]
    if n is not None and len(chosen) < n:
        warnings.warn(DataWarning(f"{name} {split!r}: asked for {n} samples, the source has {len(samples)}; "
                                  f"using {len(samples)}"), stacklevel=2)
    bad = sum(i.kind == "bad_row" for i in issues)
    report = DataReport(task=name, split=split, requested=n, available=len(samples), used=len(chosen), bad_rows=bad,
                        unknown_labels=len(issues) - bad, issues=issues[:MAX_ISSUES_KEPT])
    return TaskSamples(chosen, issues=issues[:MAX_ISSUES_KEPT], report=report)


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
    answer is tokenized on its own. Only the part that is used must fit the context window.

    Args:
        model: The model (its ``encode``, ``prepend_bos`` and ``n_ctx``).
        sample: The sample.
        max_answer_tokens: Keep at most this many answer tokens (None: all).

    Returns:
        The prompt's token ids and the answer's token ids.

    Raises:
        PromptTooLongError: the prompt plus the used answer tokens do not fit the context.
    """
    p_ids = model.encode(sample.prompt)
    joint = model.encode(sample.prompt + sample.answer, prepend_bos=model.prepend_bos, check_length=False)
    if joint[: len(p_ids)] == p_ids and len(joint) > len(p_ids):
        t_ids = joint[len(p_ids):]
    else:
        t_ids = model.encode(sample.answer, prepend_bos=False, check_length=False)
    if max_answer_tokens is not None:
        t_ids = t_ids[:max_answer_tokens]
    if len(p_ids) + max(len(t_ids) - 1, 0) > model.n_ctx:
        raise PromptTooLongError(f"prompt + answer is {len(p_ids) + len(t_ids) - 1} tokens; {model.name} has a context "
                                 f"of {model.n_ctx}")
    return p_ids, t_ids


register_task("gsm8k", load_gsm8k, kind="number", hf_name="openai/gsm8k", template="Question: {question}\\nAnswer:",
              max_new_tokens=96, description="grade-school math; exact match of the final number")
register_task("svamp", load_svamp, kind="number", hf_name="ChilleD/SVAMP", template="Question: {Body} {Question}\\nAnswer:",
              max_new_tokens=32, description="one-step math word problems; exact match of the final number")
register_task("mbpp", load_mbpp, kind="code", hf_name="google-research-datasets/mbpp",
              template='"""{text}\\n{test_list[0]}\\n"""\\n', description="Python problems; reference-solution token accuracy")
register_task("emotion", load_emotion, kind="choice", choices=tuple(" " + l for l in EMOTION_LABELS), hf_name="dair-ai/emotion",
              template=EMOTION_TEMPLATE, description="6-way emotion of a tweet; label by likelihood")
register_task("imdb", load_imdb, kind="choice", choices=(" positive", " negative"), hf_name="stanfordnlp/imdb",
              template=IMDB_TEMPLATE, description="binary movie-review sentiment; label by likelihood")

__all__ = [
    "Sample", "Task", "TASKS", "TaskSamples", "DataReport", "DataWarning", "RowIssue", "encode_sample", "register_task",
    "get_task", "load_task", "EMOTION_LABELS", "IMDB_LABELS", "IMDB_MAX_WORDS", "gsm8k_sample", "svamp_sample",
    "mbpp_sample", "emotion_sample", "imdb_sample",
]
