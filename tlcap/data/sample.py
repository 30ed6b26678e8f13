"""Task samples and what loading them found: :class:`Sample`, :class:`Task`, row issues, data reports.

A task loader turns the rows of a data file into :class:`Sample` values. A row it cannot read (an
Emotion line without ``;label``, a JSON record without its ``question``, a CSV row with an empty
column) or whose label is not one of the task's labels is *skipped and counted*, never turned into
a wrong sample: the loader returns a :class:`TaskSamples` list carrying one :class:`RowIssue` per
skipped row (file and line), and :func:`tlcap.data.tasks.load_task` warns with the count (or refuses
with ``strict=True``). The :class:`DataReport` of a load (requested vs used sizes, skipped rows by
kind) travels with the samples into every CNL result.

Example:
    >>> from tlcap.data.tasks import load_task
    >>> samples = load_task("emotion", split="train", n=50)
    >>> samples.report.used, samples.report.bad_rows, samples.report.summary()
    (50, 0, {'task': 'emotion', 'split': 'train', 'requested': 50, 'available': 600, 'used': 50,
             'skipped_bad_rows': 0, 'skipped_unknown_labels': 0, 'first_issues': []})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tlcap.errors import DataWarning

Kind = Literal["number", "choice", "code"]
IssueKind = Literal["bad_row", "unknown_label"]
MAX_ISSUES_KEPT = 20


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
            ``data_dir`` holds one folder per dataset, files plain or gzipped. A loader may return
            a :class:`TaskSamples` whose ``issues`` list the rows it skipped.
        kind: ``"number"`` (exact match of the final number after greedy decoding),
            ``"choice"`` (label chosen by likelihood among ``choices``) or ``"code"``
            (reference-solution token accuracy; model code is never executed).
        choices: Answer strings of a choice task, e.g. ``(" positive", " negative")``.
        hf_name: The Hugging Face ``datasets`` name read with ``data_dir="hf:"``.
        template: The prompt template, for documentation and summaries.
        max_new_tokens: Generation budget for ``number`` tasks.
        description: One line for listings.
    """

    name: str
    loader: Loader
    kind: Kind = "choice"
    choices: tuple[str, ...] = ()
    hf_name: str = ""
    template: str = ""
    max_new_tokens: int = 64
    description: str = ""


@dataclass(frozen=True)
class RowIssue:
    """A data row a loader skipped.

    Attributes:
        file: The file it is in.
        line: 1-based line (JSON Lines, text), record number (JSON list) or CSV line.
        kind: ``"bad_row"`` (malformed: missing field, no label, unparsable) or
            ``"unknown_label"`` (a label the task does not have).
        reason: What is wrong, e.g. ``"no ';label' at the end of the line"``.
    """

    file: str
    line: int
    kind: IssueKind
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


class RowIssues:
    """Collects the rows a loader skips (used by the built-in loaders)."""

    def __init__(self) -> None:
        self.issues: list[RowIssue] = []

    def bad(self, file: str | Path, line: int, reason: str) -> None:
        """Record a malformed row.

        Args:
            file: The file read.
            line: The row's line (or record) number.
            reason: What is wrong with the row.
        """
        self.issues.append(RowIssue(str(file), int(line), "bad_row", reason))

    def unknown_label(self, file: str | Path, line: int, label: str, known: Iterable[str]) -> None:
        """Record a row whose label is not one of ``known``.

        Args:
            file: The file read.
            line: The row's line (or record) number.
            label: The label found.
            known: The valid labels (listed in the message).
        """
        self.issues.append(RowIssue(str(file), int(line), "unknown_label",
                                    f"unknown label {label!r} (known: {', '.join(known)})"))

    def samples(self, samples: Iterable[Sample]) -> TaskSamples:
        """The loader's return value: ``samples`` carrying the recorded issues.

        Args:
            samples: The rows that were kept.

        Returns:
            A :class:`TaskSamples` whose ``issues`` are the recorded ones.
        """
        return TaskSamples(samples, issues=tuple(self.issues))


@dataclass(frozen=True)
class DataReport:
    """What loading a task's split gave: sizes and skipped rows.

    Attributes:
        task: Task name.
        split: Split name.
        requested: Samples asked for (``None`` = all).
        available: Usable samples in the source (after skipping bad rows).
        used: Samples returned.
        bad_rows: Malformed rows skipped.
        unknown_labels: Rows skipped because their label is not one of the task's.
        issues: The first skipped rows (at most 20), for messages.
    """

    task: str = ""
    split: str = ""
    requested: int | None = None
    available: int = 0
    used: int = 0
    bad_rows: int = 0
    unknown_labels: int = 0
    issues: tuple[RowIssue, ...] = ()

    @property
    def skipped_rows(self) -> int:
        return self.bad_rows + self.unknown_labels

    def summary(self) -> dict[str, Any]:
        """JSON-ready counts (the ``data`` entry of CNL summaries).

        Returns:
            A dict of task, split, requested / available / used counts, skipped rows and the first five issues.
        """
        return {
            "task": self.task, "split": self.split, "requested": self.requested, "available": self.available,
            "used": self.used, "skipped_bad_rows": self.bad_rows, "skipped_unknown_labels": self.unknown_labels,
            "first_issues": [str(i) for i in self.issues[:5]],
        }

    @classmethod
    def of(cls, samples: Sequence[Sample], task: str = "", split: str = "") -> DataReport:
        """The report of ``samples``: its own when loaded by ``load_task``, else just its size.

        Args:
            samples: A task's samples.
            task: Task name for a report built here.
            split: Split name for a report built here.

        Returns:
            ``samples.report`` when it is a :class:`DataReport`, else a report with ``available == used == len(samples)``.
        """
        rep = getattr(samples, "report", None)
        if isinstance(rep, DataReport):
            return rep
        return cls(task=task, split=split, requested=None, available=len(samples), used=len(samples))


class TaskSamples(list):
    """A list of :class:`Sample` that also carries the loader's :class:`RowIssue` list and the
    :class:`DataReport` of the load (``load_task`` fills it in). Slices are plain lists."""

    def __init__(self, samples: Iterable[Sample] = (), *, issues: Sequence[RowIssue] = (),
                 report: DataReport | None = None) -> None:
        super().__init__(samples)
        self.issues: tuple[RowIssue, ...] = tuple(issues)
        self.report: DataReport = report if report is not None else DataReport(available=len(self), used=len(self))


def summarize_issues(issues: Sequence[RowIssue], limit: int = 3) -> str:
    """``"12 malformed rows, 1 unknown label (first: f:3: no ';label' ...; f:9: ...)"``.

    Args:
        issues: The skipped rows.
        limit: How many issues to quote.

    Returns:
        The one-line summary.
    """
    bad = sum(i.kind == "bad_row" for i in issues)
    unk = len(issues) - bad
    parts = []
    if bad:
        parts.append(f"{bad} malformed row{'s' if bad != 1 else ''}")
    if unk:
        parts.append(f"{unk} row{'s' if unk != 1 else ''} with an unknown label")
    first = "; ".join(str(i) for i in issues[:limit])
    return f"{' and '.join(parts)} (first: {first}{'; ...' if len(issues) > limit else ''})"


__all__ = [
    "Sample", "Task", "Kind", "Loader", "RowIssue", "RowIssues", "DataReport", "TaskSamples", "DataWarning",
    "summarize_issues", "MAX_ISSUES_KEPT",
]
