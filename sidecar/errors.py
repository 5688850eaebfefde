"""The exception hierarchy of the sidecar: one base, one class per kind of failure.

Errors raised while serving a request carry the HTTP status they become; every message says
what was wrong and what to do about it.
"""

from __future__ import annotations


class SidecarError(Exception):
    """Base of every error raised by the marker sidecar."""

    #: The HTTP status a request failing with this error is answered with.
    status: int = 500


class ConfigError(SidecarError, ValueError):
    """A setting (environment variable or flag) has a value the sidecar cannot use."""


class BadRequestError(SidecarError):
    """A request parameter is missing, unsafe or malformed (400)."""

    status = 400


class UnauthorizedError(SidecarError):
    """The request has no bearer token, or the wrong one (401)."""

    status = 401


class ForbiddenDirError(SidecarError):
    """The marker directory lies outside every allowed root (403)."""

    status = 403


class RequestTimeoutError(SidecarError):
    """The client did not send its request body within the body timeout (408)."""

    status = 408


class InstantDecidedError(SidecarError):
    """The marker's instant is already committed or rolled back: no new markers for it (409).

    A task asking for one belongs to a finished write (a zombie); refusing the marker makes it
    fail before it writes its data file, which no rollback pass would then find.
    """

    status = 409

    def __init__(self, message: str, *, instant: str) -> None:
        super().__init__(message)
        self.instant = instant


class UnavailableError(SidecarError):
    """The sidecar cannot take the request now; the client should retry later (503)."""

    status = 503

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFullError(UnavailableError):
    """Too many markers are waiting to be written; memory stays bounded by refusing more."""


class ShuttingDownError(UnavailableError):
    """The sidecar is stopping; pending markers it could not write are refused, not dropped."""


class StorageError(UnavailableError):
    """Writing or reading marker files on storage failed; nothing was acknowledged."""


class CorruptMarkerDirError(SidecarError):
    """A marker directory holds files the sidecar cannot parse; it refuses to append to it."""

    status = 500
