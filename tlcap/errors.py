"""Errors tlcap raises on purpose: each says what was wrong and what to do."""

from __future__ import annotations


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
