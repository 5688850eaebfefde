"""The exception hierarchy of the library: one base, one class per kind of failure.

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations


class SparkguardError(Exception):
    """Base of every error raised by sparkguard's library."""


class ConfigError(SparkguardError, ValueError):
    """A configuration key, option or argument has a value sparkguard cannot use."""


class InvalidPathError(SparkguardError, ValueError):
    """A path or name is unsafe or malformed (``..``, empty segments, NUL bytes, ...)."""


class UnsupportedStoreError(SparkguardError):
    """The storage cannot give the guarantee asked for (e.g. no conditional create)."""


class AlreadyExistsError(SparkguardError, FileExistsError):
    """A put-if-absent lost: the target already exists. Nothing was written."""


class CorruptFileError(SparkguardError):
    """A sparkguard file on storage cannot be parsed. It is never silently skipped."""


class UnsupportedVersionError(CorruptFileError):
    """A sparkguard file carries a format version this library does not know."""


class InstantDecidedError(SparkguardError):
    """An instant's fate was already decided (committed or rolled back) by someone else."""

    def __init__(self, message: str, *, instant: str, outcome: str) -> None:
        super().__init__(message)
        self.instant = instant
        self.outcome = outcome


class OwnerConflictError(SparkguardError):
    """An undecided instant of another owner stands in the way (same job id, same table)."""


class MarkerError(SparkguardError):
    """A marker could not be created or read."""


class MarkerServiceUnavailableError(MarkerError):
    """The marker sidecar did not answer before the deadline; the task must fail."""
