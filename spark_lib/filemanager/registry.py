"""Choosing a backend: a URL's fsspec protocol, or the configured kind, picks the file manager.

:func:`resolve` turns a URL (and fsspec storage options) into a file manager and a path;
:data:`DEFAULT_KINDS` maps each protocol to its backend. Storage options a filesystem does not
take are refused here, since fsspec filesystems swallow unknown keyword arguments.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Final

import fsspec
from fsspec.spec import AbstractFileSystem

from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.filemanager.base import AtomicStream, CreateMode, FileManager, Kind
from sparkguard.spark_lib.filemanager.direct_put import DirectPutFileManager
from sparkguard.spark_lib.filemanager.memory import MemoryFileManager
from sparkguard.spark_lib.filemanager.rename import RenameFileManager

#: fsspec protocols and the backend that serves them by default.
DEFAULT_KINDS: Final[Mapping[str, Kind]] = {
    "file": Kind.RENAME,
    "local": Kind.RENAME,
    "hdfs": Kind.RENAME,
    "viewfs": Kind.RENAME,
    "arrow_hdfs": Kind.RENAME,
    "s3": Kind.DIRECT_PUT,
    "s3a": Kind.DIRECT_PUT,
    "gs": Kind.DIRECT_PUT,
    "gcs": Kind.DIRECT_PUT,
    "abfs": Kind.DIRECT_PUT,
    "az": Kind.DIRECT_PUT,
    "memory": Kind.MEMORY,
}

_BACKENDS: Final[Mapping[Kind, type[FileManager]]] = {
    Kind.RENAME: RenameFileManager,
    Kind.DIRECT_PUT: DirectPutFileManager,
    Kind.MEMORY: MemoryFileManager,
}


def protocol_of(url: str) -> str:
    """The fsspec protocol of ``url`` (``file`` for plain paths)."""
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


#: ``scheme:`` at the start of a location: with no ``//`` after it, a URL typed wrong
_SCHEME: Final = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?!//)")


def check_location(url: str, *, what: str) -> str:
    """``url`` (stripped) if it is a location another process can open, else raise
    :class:`~sparkguard.spark_lib.base.errors.ConfigError` naming ``what`` (the flag) and the fix.

    A purely computational function with no side-effects, shared by every command that takes a
    journal or a table (rollback, inspect, compact, spark-conf, demo), so all of them accept the
    same locations: a local path, or a URL of a protocol in :data:`DEFAULT_KINDS` other than
    ``memory://`` (which lives inside one process: no other process sees it).
    """
    value = url.strip()
    if not value:
        raise errors.ConfigError(f"{what} must not be empty; give a storage URL")
    malformed = _SCHEME.match(value)
    if malformed and "://" not in value and len(malformed.group("scheme")) > 1:  # not C:\
        scheme = malformed.group("scheme").lower()
        rest = value[malformed.end() :].lstrip("/")
        raise errors.ConfigError(
            f"{what} {url!r} is not a URL sparkguard can open (no '//' after '{scheme}:'); "
            f"write {scheme}://{rest}"
        )
    protocol = protocol_of(value)
    if protocol not in DEFAULT_KINDS:
        known = ", ".join(f"{p}://" for p in sorted(DEFAULT_KINDS) if p not in ("file", "memory"))
        raise errors.ConfigError(
            f"{what} {url!r}: sparkguard cannot open {protocol}:// locations; give a local path "
            f"or a URL starting with one of {known}"
        )
    if protocol == "memory":
        raise errors.ConfigError(
            f"{what} {url!r}: memory:// lives inside one process, so no other process (a "
            "Spark job, a rollback, this command) sees it; give a local path or an object "
            "store URL"
        )
    return value


def parse_kind(
    value: str | Kind | None, *, key: str = "spark.sparkguard.fileManager"
) -> Kind | None:
    """Parse a configured backend name; ``None``/empty means "by protocol"."""
    if value is None or value == "":
        return None
    try:
        return Kind(value)
    except ValueError:
        choices = ", ".join(k.value for k in Kind)
        raise errors.ConfigError(
            f"{key}={value!r} is not a file manager; use one of {choices}"
        ) from None


#: the create mode of a process that is given none (the CLI, the marker sidecar, the operator's
#: rollback initContainer): ``check-then-put`` lets them work on a store that ignores
#: ``If-None-Match``, as ``spark.sparkguard.createMode`` lets the writer
CREATE_MODE_ENV: Final = "SPARKGUARD_CREATE_MODE"


def parse_create_mode(
    value: str | CreateMode | None, *, key: str = "spark.sparkguard.createMode"
) -> CreateMode:
    """Parse the configured create-if-absent mode (default: conditional)."""
    if value is None or value == "":
        return CreateMode.CONDITIONAL
    try:
        return CreateMode(value)
    except ValueError:
        choices = ", ".join(m.value for m in CreateMode)
        raise errors.ConfigError(
            f"{key}={value!r} is not a create mode; use one of {choices}"
        ) from None


#: protocols served by s3fs (botocore underneath)
S3_PROTOCOLS: Final = frozenset({"s3", "s3a"})

#: botocore's retry policy for every S3 client of sparkguard, unless the storage options give
#: one (``config_kwargs={"retries": ...}``): botocore's "standard" mode retries throttling
#: (503 SlowDown, 429), transient 5xx (500, 502, 503, 504) and connection errors (resets,
#: timeouts) with exponential backoff and full jitter, capped at 20 s a wait, here up to 10
#: attempts a request (about a minute in the worst case); a retried write that had landed is
#: recognised by the file manager (direct_put: ``_holds``). s3fs adds its own bounded loop
#: (5 attempts) around that for connection errors and SlowDown.
S3_RETRIES: Final = {"mode": "standard", "total_max_attempts": 10}


def with_retry_policy(config_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """botocore ``Config`` arguments with :data:`S3_RETRIES` unless they name a policy."""
    result = dict(config_kwargs or {})
    result.setdefault("retries", dict(S3_RETRIES))
    return result


#: storage options under which s3fs does not make its client from the process's shared session
#: (:func:`shared_s3_session`): a session of the caller's own, or an event loop of its own
_OWN_SESSION_OPTIONS: Final = frozenset({"session", "asynchronous", "loop"})

_S3_SESSIONS: dict[tuple[int, tuple[tuple[str, str], ...], str], Any] = {}
_S3_SESSIONS_LOCK = threading.Lock()


def shared_s3_session(session_kwargs: Mapping[str, Any]) -> Any:
    """The aiobotocore session every S3 filesystem of this process makes its client from, as
    boto3's default session serves every ``boto3.client()`` of a process.

    A session costs most of a new client's CPU: it loads and parses botocore's endpoint
    rules and S3's service model (about 2 MB of JSON) and registers its handlers, once per
    session. One filesystem per :func:`resolve` used to mean one session each: about 0.25 s
    of CPU per call (measured against the tests' S3 server; 0.07 s with this shared session).
    Each filesystem still has its own client and connection pool.

    Kept per process (a forked child makes its own, as fsspec does with its event loop), per
    ``AWS_*`` environment (a session caches the credentials it resolved, and reads its
    configuration from there) and per ``session_kwargs`` (s3fs's own session arguments, such
    as ``profile``)."""
    import aiobotocore.session

    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    key = (os.getpid(), environment, repr(sorted(session_kwargs.items())))
    with _S3_SESSIONS_LOCK:
        session = _S3_SESSIONS.get(key)
        if session is None:
            if any(pid != key[0] for pid, _, _ in _S3_SESSIONS):
                _S3_SESSIONS.clear()  # a parent's sessions, copied by a fork
            session = _S3_SESSIONS[key] = aiobotocore.session.AioSession(**session_kwargs)
        return session


def resolve(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    kind: str | Kind | None = None,
    create_mode: str | CreateMode | None = None,
    options_source: str = "storage options",
) -> tuple[FileManager, str]:
    """Return the file manager for ``url`` and the path inside its filesystem.

    ``storage_options`` the filesystem does not take are refused (:func:`check_storage_options`),
    naming ``options_source`` (the setting they came from), unless another store takes them:
    those are left out of this filesystem's (:func:`own_storage_options`).

    The backend comes from ``kind`` when given, else from the protocol (:data:`DEFAULT_KINDS`).
    Filesystem instances are never shared through fsspec's instance cache (they may hold event
    loops and connections that must not cross forks), and object-store listings are not cached,
    so every ``list``/``exists`` sees the store as it is now. An S3 filesystem makes its client
    from the process's shared botocore session (:func:`shared_s3_session`).
    """
    if not isinstance(url, str) or not url.strip():
        raise errors.InvalidPathError(f"storage URL must be a non-empty string, got {url!r}")
    protocol = protocol_of(url)
    chosen = parse_kind(kind)
    if chosen is None:
        if protocol not in DEFAULT_KINDS:
            known = ", ".join(sorted(DEFAULT_KINDS))
            raise errors.UnsupportedStoreError(
                f"no atomic file manager is known for protocol {protocol!r} in {url!r}; "
                f"use one of {known}, or set spark.sparkguard.fileManager to rename or direct-put"
            )
        chosen = DEFAULT_KINDS[protocol]
    try:
        fs_class = fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        raise errors.UnsupportedStoreError(
            f"cannot open storage {url!r}: {exc}. Install the fsspec backend for {protocol!r}"
        ) from exc
    given = storage_options or {}
    check_storage_options(fs_class, protocol, given, source=options_source)
    if create_mode is None and os.environ.get(CREATE_MODE_ENV):
        create_mode = parse_create_mode(os.environ[CREATE_MODE_ENV], key=CREATE_MODE_ENV)
    options: dict[str, Any] = {"skip_instance_cache": True}
    if chosen is Kind.DIRECT_PUT:
        options["use_listings_cache"] = False
    options.update(own_storage_options(fs_class, given))
    if protocol in S3_PROTOCOLS:
        options["config_kwargs"] = with_retry_policy(options.get("config_kwargs"))
    fs = fs_class(**options)
    if protocol in S3_PROTOCOLS and not _OWN_SESSION_OPTIONS & set(options):
        # Set on the instance, not passed as an option: the options are what the filesystem
        # pickles, and a session does not travel to another process.
        fs.session = shared_s3_session(getattr(fs, "kwargs", None) or {})
    path = paths.validate_base(fs._strip_protocol(url), what="storage URL")
    if protocol in ("file", "local"):
        path = os.path.abspath(path)
    backend = _BACKENDS[chosen]
    manager: FileManager
    if backend is DirectPutFileManager:
        manager = DirectPutFileManager(
            fs, protocol=protocol, create_mode=parse_create_mode(create_mode)
        )
    else:
        manager = backend(fs, protocol=protocol)
    return manager, path


#: What every fsspec filesystem takes besides its own parameters (``AbstractFileSystem``
#: hands them to its listings cache and its instance cache).
_COMMON_OPTIONS: Final = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"}
)


def storage_option_names(fs_class: type[AbstractFileSystem]) -> frozenset[str] | None:
    """The keyword options ``fs_class`` takes: its constructor's named parameters and those of
    the constructors its ``**kwargs`` reach, plus :data:`_COMMON_OPTIONS`. ``None`` when a
    constructor cannot be inspected (then nothing is checked)."""
    names = set(_COMMON_OPTIONS)
    for klass in fs_class.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            break
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return None
        names.update(
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        )
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return frozenset(names)


def own_storage_options(
    fs_class: type[AbstractFileSystem], options: Mapping[str, Any]
) -> dict[str, Any]:
    """``options`` without those ``fs_class`` does not take: one setting serves a job whose
    tables are on several stores (HDFS's ``host`` must not reach an S3 client, which fails on
    it, nor S3's keys an HDFS one). All of them when ``fs_class`` cannot be inspected."""
    known = storage_option_names(fs_class)
    if known is None:
        return dict(options)
    return {key: value for key, value in options.items() if key in known}


@functools.cache
def _every_store_option() -> frozenset[str]:
    """The options of every filesystem sparkguard opens whose fsspec backend is installed."""
    names: set[str] = set()
    for protocol in DEFAULT_KINDS:
        try:
            fs_class = fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError):
            continue
        names |= storage_option_names(fs_class) or set()
    return frozenset(names)


def check_storage_options(
    fs_class: type[AbstractFileSystem],
    protocol: str,
    options: Mapping[str, Any],
    *,
    source: str = "storage options",
) -> None:
    """Refuse an option no filesystem sparkguard opens takes: fsspec filesystems swallow
    unknown keyword arguments, so a misspelt ``endpoint_url`` would be silently ignored.
    An option of another store (S3 credentials while the journal is on local disk and the
    tables on S3: one setting serves both) is left to the locations it is for. Raises
    :class:`~sparkguard.spark_lib.base.errors.ConfigError` naming the key and what ``fs_class``
    takes."""
    known = storage_option_names(fs_class)
    if known is None:
        return
    unknown = sorted(str(key) for key in options if key not in known)
    unknown = [key for key in unknown if key not in _every_store_option()]
    if unknown:
        own = sorted(known - _COMMON_OPTIONS) or ["none of its own"]
        many = len(unknown) > 1
        raise errors.ConfigError(
            f"{source}: key{'s' if many else ''} {', '.join(map(repr, unknown))} "
            f"{'are' if many else 'is'} not an option of {protocol}:// storage "
            f"({fs_class.__name__} takes {', '.join(own)}) nor of any other storage sparkguard "
            f"opens; remove {'them' if many else 'it'} from {source} or fix the spelling"
        )


@contextlib.contextmanager
def atomic_writer(
    url: str, *, overwrite: bool = False, storage_options: Mapping[str, Any] | None = None
) -> Iterator[AtomicStream]:
    """Convenience: ``with atomic_writer(url) as f: f.write(...)`` for a single file."""
    manager, path = resolve(url, storage_options=storage_options)
    with manager.create_atomic(path, overwrite=overwrite) as stream:
        yield stream
