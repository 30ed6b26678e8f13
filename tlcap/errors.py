"""Errors tlcap raises on purpose: each says what was wrong and what to do.

Every error a user can cause (a bad option, a malformed file, an output folder in the way) is a
:class:`TlcapError` subclass; the CLI prints it as one line (``error: <message>``) and exits 2.
Each class also subclasses the builtin a caller would have caught before (``ValueError``,
``FileNotFoundError``, ...), so ``except ValueError`` keeps working.

Message convention: one line, *what was wrong* then *what to do*, naming the option as it is
spelled on the command line where there is one::

    steps (--steps) must be >= 1, got 0
    unknown site 'mlp_postt' (--site); choose one of: mlp_post, mlp_pre, ...
    runs/paris already holds a finished run (summary.json); pass --overwrite or choose another --out

=============================  =================  ==========================================
class                          also a             raised for
=============================  =================  ==========================================
``InvalidConfigError``         ``ValueError``     an option / config value out of range or of the wrong kind
``UnknownNameError``           ``ValueError``     an unknown site, rule, method, kind, task, result type
``DataFormatError``            ``ValueError``     a malformed data row or file (missing column, bad label)
``OutputPathError``            ``ValueError``     ``--out`` that cannot be a folder (a file, not writable)
``OutputExistsError``          ``FileExistsError`` ``--out`` holding a finished run, without ``--overwrite``
``CheckpointError``            ``ValueError``     a damaged checkpoint, or one made by another run
``CheckpointMismatchError``    ``ValueError``     (a ``CheckpointError``) checkpoint of other samples/settings
``ResultIntegrityError``       ``ValueError``     a saved result whose checksum does not match, truncated or corrupt
``ResultTypeError``            ``TypeError``      a saved result of another type than the one asked for
``UnknownModelError``          ``ValueError``     a model name that cannot be resolved
``HubUnavailableError``        ``RuntimeError``   a hub model requested without network
``TargetTokenizationError``    ``ValueError``     a target that tokenizes unexpectedly
``PromptTooLongError``         ``ValueError``     a prompt longer than the context window
``EmptyDatasetError``          ``ValueError``     a dataset (or filtered subset) with no samples
``MissingFileError``           ``FileNotFoundError`` a data or result file that is not there
``ShapeMismatchError``         ``ValueError``     two inputs that must align and do not
``SubjectNotFoundError``       ``ValueError``     a subject that does not occur in its prompt
``DatasetUnavailableError``    ``FileNotFoundError`` more data than bundled, no full copy reachable
``StatisticsError``            ``ValueError``     values a statistic cannot be computed from (NaN, bad shape or level)
``TooFewSamplesError``         ``ValueError``     (a ``StatisticsError``) fewer samples or random draws than needed
``EmptyNeuronSetError``        ``ValueError``     an intervention asked on an empty neuron set
``OverlappingShardsError``     ``ValueError``     partial results to merge that share samples
``UnknownNodeError``           ``KeyError``       a graph node or parameter group the model does not have
``UnsupportedModelError``      ``NotImplementedError`` an architecture a method has no mapping for
``StorageError``               ``OSError``        a file that cannot be written: disk full, ``ulimit -f``, read-only
``ResultFormatError``          ``ValueError``     (a ``ResultIntegrityError``) a result or checkpoint of another format version
=============================  =================  ==========================================

Warnings tlcap issues on purpose (input it corrected, and says so) are :class:`TlcapWarning`
subclasses: ``PromptBoundaryWarning`` (a prompt's trailing whitespace removed before a target
that starts with a space), ``EmptyNeuronSetWarning`` (an empty located set: no intervention run).
"""

from __future__ import annotations

from collections.abc import Iterable


class TlcapError(Exception):
    """Base class of every error tlcap raises on purpose."""


class UnknownModelError(TlcapError, ValueError):
    """A model name that is neither registered, a local directory, nor loadable from the hub."""


class HubUnavailableError(TlcapError, RuntimeError):
    """A hub model was requested but the Hugging Face hub cannot be reached."""


class TargetTokenizationError(TlcapError, ValueError):
    """A target string that tokenizes differently from what the caller expects."""


class PromptTooLongError(TlcapError, ValueError):
    """A prompt longer than the model's context window."""


class EmptyDatasetError(TlcapError, ValueError):
    """A dataset (or a filtered subset of it) with no samples."""


class MissingFileError(TlcapError, FileNotFoundError):
    """A data or result file that is not where it was said to be."""


class ShapeMismatchError(TlcapError, ValueError):
    """Two inputs that must align (e.g. clean and corrupted prompts) do not."""


class SubjectNotFoundError(TargetTokenizationError):
    """A subject string that does not occur in its prompt (or covers no token of it)."""


class DatasetUnavailableError(MissingFileError):
    """More data than the bundled copy holds was asked for, and no full copy is local or downloadable."""


class InvalidConfigError(TlcapError, ValueError):
    """An option or config value out of range or of the wrong kind (see :mod:`tlcap.config`)."""


class UnknownNameError(InvalidConfigError):
    """A name that is not one of the known ones: site, rule, method, kind, task, result type.

    Build it with :meth:`of` so every such message reads the same.
    """

    @classmethod
    def of(cls, what: str, name: object, known: Iterable[object], option: str | None = None) -> UnknownNameError:
        """``unknown site 'x' (--site); choose one of: a, b, c``.

        Args:
            what: What the name names (``"site"``, ``"rule"``...).
            name: The name given.
            known: The names that exist.
            option: The CLI spelling of the option, when there is one.

        Returns:
            The error (not raised), its message listing every name in ``known``.
        """
        opt = f" ({option})" if option else ""
        return cls(f"unknown {what} {name!r}{opt}; choose one of: {', '.join(str(k) for k in known)}")


class DataFormatError(TlcapError, ValueError):
    """A malformed data row or file (missing column, missing label, wrong JSON shape)."""


class OutputPathError(TlcapError, ValueError):
    """An output path that cannot be used as an output folder (a file, or not writable)."""


class OutputExistsError(TlcapError, FileExistsError):
    """An output folder that already holds a finished run, and ``--overwrite`` was not given."""


class CheckpointError(TlcapError, ValueError):
    """A checkpoint that is damaged or does not belong to the resuming run."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint that was made with other samples or settings than the resuming run."""


class ResultIntegrityError(TlcapError, ValueError):
    """A saved result whose files are truncated, corrupt, or do not match their checksum."""


class ResultFormatError(ResultIntegrityError):
    """A saved result, checkpoint or stage record in a format version this tlcap cannot read."""


class StorageError(TlcapError, OSError):
    """A file that cannot be written: the disk is full, a file-size limit, a read-only place, no permission."""


class ResultTypeError(TlcapError, TypeError):
    """A saved result of another type than the one asked for."""


class StatisticsError(TlcapError, ValueError):
    """Values a statistic cannot be computed from (NaN, wrong shape, a level outside (0, 1), ...)."""


class TooFewSamplesError(StatisticsError):
    """Fewer samples or random draws than a statistic needs (an empty sample, < 20 null draws, ...)."""


class UnknownNodeError(UnknownNameError, KeyError):
    """A graph node or parameter group name that the model does not have (also a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnsupportedModelError(TlcapError, NotImplementedError):
    """A model architecture that a method has no mapping for (yet)."""


class EmptyNeuronSetError(TlcapError, ValueError):
    """An intervention (erase, enhance) asked on an empty neuron set: it could only report "no change"."""


class OverlappingShardsError(TlcapError, ValueError):
    """Partial results to merge that share samples (the same shard twice, overlapping shard layouts)."""


class TlcapWarning(UserWarning):
    """Base class of the warnings tlcap issues when it corrects an input (and records that it did)."""


class PromptBoundaryWarning(TlcapWarning):
    """A prompt's trailing whitespace was removed because the target starts with a space."""


class EmptyNeuronSetWarning(TlcapWarning):
    """A located neuron set is empty, so the interventions on it were not run (their effects are ``None``)."""


class StageError(TlcapError, ValueError):
    """A stage graph that cannot run (unknown dependency, cycle) or a stage that returned no results."""


class SubjectWarning(TlcapWarning):
    """A subject that occurs more than once in its prompt, or starts it (attention sink)."""


class CNLWarning(TlcapWarning):
    """A CNL result that holds but needs a caveat (e.g. a σ whose located set is empty)."""


class DataWarning(TlcapWarning):
    """A data problem tlcap worked around: skipped rows, fewer samples than requested."""


class StaticExportWarning(TlcapWarning):
    """A figure was written as HTML only (no working static exporter)."""


class MechanismAssertionError(AssertionError):
    """A mechanistic claim that the model does not bear out (:mod:`tlcap.testing`; the message gives the numbers).

    An ``AssertionError``, not a :class:`TlcapError`: pytest reports it as a failed test, not a misuse."""


__all__ = [
    "MechanismAssertionError",
    "StaticExportWarning",
    "DataWarning",
    "CNLWarning",
    "SubjectWarning",
    "StageError",
    "TlcapError", "UnknownModelError", "HubUnavailableError", "TargetTokenizationError", "PromptTooLongError",
    "EmptyDatasetError", "MissingFileError", "ShapeMismatchError", "SubjectNotFoundError", "DatasetUnavailableError",
    "InvalidConfigError", "UnknownNameError",
    "DataFormatError", "OutputPathError", "OutputExistsError", "CheckpointError", "CheckpointMismatchError",
    "ResultIntegrityError", "ResultFormatError", "StorageError", "ResultTypeError", "StatisticsError", "TooFewSamplesError",
    "EmptyNeuronSetError", "OverlappingShardsError", "UnknownNodeError", "UnsupportedModelError",
    "TlcapWarning", "PromptBoundaryWarning", "EmptyNeuronSetWarning",
]
