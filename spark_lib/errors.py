"""The exception hierarchy of the library: one base, one class per kind of failure.

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

import errno


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


def describe_storage_error(exc: OSError, *, retry: str) -> str:
    """One sentence for an :class:`OSError` of the storage: what failed, where, the cause in
    the system's words and the fix, ending with ``retry`` (e.g. ``"run the rollback again"``).

    Only a store reached over the network (a URL with ``://``) is told to check credentials;
    a full or read-only local disk is told what it is. A purely computational function with
    no side-effects.
    """
    where = str(exc.filename) if exc.filename else "the storage location"
    # OSError(errno, strerror[, filename]) or, from s3fs, PermissionError("Access Denied")
    message = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else None
    cause = exc.strerror or message or type(exc).__name__
    code = exc.errno
    if code == errno.ENOSPC:
        return f"the filesystem holding {where} is full ({cause}); free space and {retry}"
    if code == errno.EDQUOT:
        return (
            f"the filesystem holding {where} is full for this user ({cause}); raise the quota "
            f"or free space, then {retry}"
        )
    if code == errno.EROFS:
        return (
            f"{where} is on a read-only filesystem ({cause}); remount it read-write or use a "
            f"writable location, then {retry}"
        )
    if code == errno.EIO:
        return f"I/O error on {where} ({cause}); check the disk or mount, then {retry}"
    if code == errno.ENOTDIR or isinstance(exc, NotADirectoryError):
        return (
            f"{where} is not a directory: a file stands where a table or journal directory "
            f"should be; move that file away, then {retry}"
        )
    remote = "://" in where
    if isinstance(exc, PermissionError) or code in (errno.EACCES, errno.EPERM):
        if remote:
            return (
                f"access to {where} was denied ({cause}); check the credentials and the "
                f"bucket's policy, then {retry}"
            )
        return (
            f"permission denied on {where} ({cause}); {retry} as a user who may write there"
        )
    if isinstance(exc, FileNotFoundError):
        return f"{where} does not exist ({cause}); check the location, then {retry}"
    check = "the location, the network and the credentials" if remote else "the location"
    return f"storage error on {where} ({cause}); check {check}, then {retry}"
