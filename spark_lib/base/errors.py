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


class VersionConflictError(SparkguardError):
    """A conditional rewrite lost: the file is gone, or is not the version the writer last saw
    (another writer replaced or deleted it). Nothing was written."""


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


#: The local causes a message can name precisely: errno -> (what, fix).
_LOCAL_CAUSES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the filesystem holding {where} is full ({cause})", "free space and {retry}"),
    errno.EDQUOT: (
        "the filesystem holding {where} is full for this user ({cause})",
        "raise the quota or free space, then {retry}",
    ),
    errno.EROFS: (
        "{where} is on a read-only filesystem ({cause})",
        "remount it read-write or use a writable location, then {retry}",
    ),
    errno.EIO: ("I/O error on {where} ({cause})", "check the disk or mount, then {retry}"),
    errno.ENOTDIR: (
        "{where} is not a directory: a file stands where a table or journal directory should be",
        "move that file away, then {retry}",
    ),
    errno.ENOENT: ("{where} does not exist ({cause})", "check the location, then {retry}"),
}


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
    remote = "://" in where
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        what, fix = (
            ("access to {where} was denied ({cause})", "check the credentials and the bucket's "
             "policy, then {retry}")
            if remote
            else ("permission denied on {where} ({cause})", "{retry} as a user who may write there")
        )  # fmt: skip
    elif exc.errno in _LOCAL_CAUSES:
        what, fix = _LOCAL_CAUSES[exc.errno]
    else:
        check = "the location, the network and the credentials" if remote else "the location"
        what, fix = "storage error on {where} ({cause})", f"check {check}, then {{retry}}"
    return f"{what}; {fix}".format(where=where, cause=cause, retry=retry)
