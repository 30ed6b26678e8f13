"""The subject of a fact in its prompt: checks before any model load, and the occurrence used.

Causal tracing noises the subject's tokens and ROME edits at the subject's last token, so both
need one well-defined occurrence of the subject. :func:`check_subject` checks the strings (run it
before loading a model); :func:`find_subject` finds the token span through the adapter
(:meth:`tlcap.models.Model.subject_span`) and warns with a :class:`SubjectWarning` when the
subject occurs more than once and no occurrence was chosen.

Example:
    >>> check_subject("Paris is in France; France is big", "France")   # 2 occurrences
    2
    >>> span = find_subject(model, "Paris is in France; France is big", "France", occurrence=1)
"""

from __future__ import annotations

import warnings

from tlcap.config import check_int, check_str
from tlcap.errors import InvalidConfigError, SubjectNotFoundError, SubjectWarning
from tlcap.models.adapter import Model
from tlcap.models.tokens import SubjectSpan


def count_occurrences(prompt: str, subject: str, start: int = 0) -> int:
    """How many times ``subject`` starts in ``prompt[start:]`` (overlapping ones included).

    Counted the way :meth:`tlcap.models.Model.subject_span` numbers occurrences.

    Args:
        prompt: The prompt.
        subject: The subject (empty: 0).
        start: Character index where counting begins.

    Returns:
        The number of occurrences.
    """
    n, i = 0, prompt.find(subject, start) if subject else -1
    while i >= 0:
        n += 1
        i = prompt.find(subject, i + 1)
    return n


def check_subject(prompt: str, subject: str, occurrence: int | None = None, start: int = 0) -> int:
    """Check a prompt and its subject as strings (no model needed); returns the occurrence count.

    Args:
        prompt: The prompt.
        subject: The subject exactly as written in the prompt.
        occurrence: The occurrence to use, 0-based (negative counts from the last); ``None`` =
            the first, with a warning later when there are several.
        start: Character index where the search begins (e.g. after a prefix).

    Returns:
        How many times the subject occurs in ``prompt[start:]``.

    Raises:
        InvalidConfigError: an empty prompt or subject, or an occurrence the prompt does not have.
        SubjectNotFoundError: the subject does not occur in the prompt.
    """
    check_str("prompt", prompt)
    check_str("subject", subject)
    n = count_occurrences(prompt, subject, start)
    if n == 0:
        raise SubjectNotFoundError(
            f"subject {subject!r} does not occur in the prompt {prompt!r}; pass the subject exactly as it is "
            "written in the prompt (case and spacing included)"
        )
    if occurrence is not None:
        check_int("occurrence", occurrence)
        if not -n <= occurrence < n:
            raise InvalidConfigError(
                f"occurrence (--occurrence) must be in {-n}..{n - 1}: subject {subject!r} occurs "
                f"{n} time{'s' if n != 1 else ''} in the prompt, got {occurrence}"
            )
    return n


TRACE_SINK = "noising it also corrupts what every later token attends to"
ROME_SINK = "a one-token subject's key and value are the attention sink's"


def sink_message(prompt: str, subject: str, why: str = TRACE_SINK) -> str:
    """The warning for a subject that starts the prompt (no BOS before it); ``why`` says what it breaks.

    Args:
        prompt: The prompt.
        subject: The subject.
        why: What the sink breaks (default: the causal trace's corruption).

    Returns:
        The warning text.
    """
    return (
        f"subject {subject!r} starts the prompt {prompt!r}: its first token is at position 0, the model's attention "
        f"sink, so {why}; pass bos=True (--bos) to prepend the BOS token"
    )


def ambiguity_message(prompt: str, subject: str, n: int) -> str:
    """The warning for a subject occurring ``n > 1`` times with no occurrence chosen.

    Args:
        prompt: The prompt.
        subject: The subject.
        n: Its number of occurrences.

    Returns:
        The warning text.
    """
    return (
        f"subject {subject!r} occurs {n} times in the prompt {prompt!r}; using the first (occurrence 0); "
        "pass occurrence= (--occurrence) to choose another"
    )


def find_subject(
    model: Model,
    prompt: str,
    subject: str,
    occurrence: int | None = None,
    start: int = 0,
    prepend_bos: bool | None = None,
    warn: bool = True,
) -> SubjectSpan:
    """Token span of the chosen occurrence of ``subject`` in ``prompt`` (positions of ``model.encode``).

    Args:
        model: The model (its tokenizer's offsets place the subject).
        prompt: The prompt.
        subject: The subject exactly as written in the prompt.
        occurrence: Which occurrence (0-based among those at or after ``start``; negative from
            the last); ``None`` = the first, warning with a :class:`SubjectWarning` when the
            subject occurs more than once.
        start: Character index where the search begins (skip a prepended prefix).
        prepend_bos: As in :meth:`tlcap.models.Model.encode` (a BOS shifts the span by one).
        warn: Warn when the subject is ambiguous and ``occurrence`` is ``None``.

    Returns:
        A :class:`tlcap.models.tokens.SubjectSpan` (``range``, ``n_occurrences``, ...).

    Raises:
        SubjectNotFoundError: the subject is not in the prompt or covers no token.
        InvalidConfigError: an occurrence the prompt does not have.
    """
    check_subject(prompt, subject, occurrence, start)
    span = model.subject_span(prompt, subject, occurrence=0 if occurrence is None else occurrence, start=start,
                              prepend_bos=prepend_bos)
    if warn and occurrence is None and span.n_occurrences > 1:
        warnings.warn(ambiguity_message(prompt, subject, span.n_occurrences), SubjectWarning, stacklevel=3)
    return span


__all__ = [
    "ROME_SINK", "TRACE_SINK", "SubjectNotFoundError", "SubjectWarning", "ambiguity_message", "check_subject",
    "count_occurrences", "find_subject", "sink_message",
]
