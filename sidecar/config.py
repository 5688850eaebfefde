"""The sidecar's settings: read from ``SPARKGUARD_SIDECAR_*`` environment variables and flags.

Flags win over environment variables; every value is validated and an error names the setting
(both spellings) and the fix. :func:`load_config` is a purely computational function with no
side-effects other than reading the token file it is pointed at.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from sparkguard.sidecar import errors

ENV_PREFIX: Final = "SPARKGUARD_SIDECAR_"
STORAGE_OPTIONS_ENV: Final = "SPARKGUARD_STORAGE_OPTIONS"
DEFAULT_PORT: Final = 26754  # Hudi's timeline server port: the service this one stands in for

_T = TypeVar("_T")


class FlushMode(enum.StrEnum):
    """When a flush of pending markers starts."""

    #: Hudi's policy: every ``batch_interval_ms`` (acks cost ~interval/2 + one write).
    INTERVAL = "interval"
    #: A flush starts as soon as the previous one of the directory ends while requests wait, so
    #: an ack costs about one storage write and batches grow with the load by themselves.
    GROUP_COMMIT = "group-commit"
    #: The default: a directory's flush starts once ``batch_size`` names are queued, or once its
    #: oldest queued name has waited ``batch_interval_ms``, whichever comes first (Kafka's
    #: producer: ``batch.size`` / ``linger.ms``). Flushes follow the number of markers, not the
    #: duration of the write; the wait stays bounded.
    ADAPTIVE = "adaptive"


@dataclasses.dataclass(frozen=True)
class SidecarConfig:
    """Validated settings of one sidecar process. See docs/sidecar.md for each of them."""

    allowed_roots: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    auth_disabled: bool = False
    flush_mode: FlushMode = FlushMode.ADAPTIVE
    #: ``interval``: the tick; ``adaptive``: the longest the oldest queued name waits
    batch_interval_ms: int = 250
    #: ``adaptive``: a directory's flush starts as soon as this many names are queued
    batch_size: int = 24
    batch_threads: int = 20
    max_pending: int = 100_000
    max_body_bytes: int = 64 * 1024
    max_cached_dirs: int = 1_000
    max_connections: int = 1_024
    header_timeout_s: float = 15.0
    body_timeout_s: float = 15.0
    shutdown_timeout_s: float = 20.0
    storage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: drain and exit once a process matching this (``pgrep -f`` style) has come and gone
    exit_with_process: re.Pattern[str] | None = None
    #: ... or once none has appeared within this many seconds
    exit_with_process_wait_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.allowed_roots:
            raise errors.ConfigError(
                f"{_name('allowed_roots')} is empty: give the URL prefixes the sidecar may write "
                "markers under, e.g. s3://bucket/warehouse,/data/tables"
            )
        if self.token is None and not self.auth_disabled:
            raise errors.ConfigError(
                f"no bearer token configured: set {_name('token_file')} or {_name('token')}, "
                f"or {_name('auth_disabled')}=true to run without auth (local use only)"
            )


#: setting -> (environment variable, flag)
SETTINGS: Final[Mapping[str, tuple[str, str]]] = {
    "allowed_roots": (f"{ENV_PREFIX}ALLOWED_ROOTS", "--allowed-roots"),
    "host": (f"{ENV_PREFIX}HOST", "--host"),
    "port": (f"{ENV_PREFIX}PORT", "--port"),
    "token": (f"{ENV_PREFIX}TOKEN", "(env only)"),
    "token_file": (f"{ENV_PREFIX}TOKEN_FILE", "--token-file"),
    "auth_disabled": (f"{ENV_PREFIX}AUTH_DISABLED", "--auth-disabled"),
    "flush_mode": (f"{ENV_PREFIX}FLUSH_MODE", "--flush-mode"),
    "batch_interval_ms": (f"{ENV_PREFIX}BATCH_INTERVAL_MS", "--batch-interval-ms"),
    "batch_size": (f"{ENV_PREFIX}BATCH_SIZE", "--batch-size"),
    "batch_threads": (f"{ENV_PREFIX}BATCH_THREADS", "--batch-threads"),
    "max_pending": (f"{ENV_PREFIX}MAX_PENDING", "--max-pending"),
    "max_body_bytes": (f"{ENV_PREFIX}MAX_BODY_BYTES", "--max-body-bytes"),
    "max_cached_dirs": (f"{ENV_PREFIX}MAX_CACHED_DIRS", "--max-cached-dirs"),
    "max_connections": (f"{ENV_PREFIX}MAX_CONNECTIONS", "--max-connections"),
    "header_timeout_s": (f"{ENV_PREFIX}HEADER_TIMEOUT_S", "--header-timeout-s"),
    "body_timeout_s": (f"{ENV_PREFIX}BODY_TIMEOUT_S", "--body-timeout-s"),
    "shutdown_timeout_s": (f"{ENV_PREFIX}SHUTDOWN_TIMEOUT_S", "--shutdown-timeout-s"),
    "storage_options": (STORAGE_OPTIONS_ENV, "(env only)"),
    "exit_with_process": (f"{ENV_PREFIX}EXIT_WITH_PROCESS", "--exit-with-process"),
    "exit_with_process_wait_s": (
        f"{ENV_PREFIX}EXIT_WITH_PROCESS_WAIT_S",
        "--exit-with-process-wait-s",
    ),
}


#: setting -> what it means, for ``sparkguard sidecar --help`` (docs/sidecar.md has more)
MEANINGS: Final[Mapping[str, str]] = {
    "allowed_roots": "comma-separated URL prefixes (s3://bucket/warehouse,/data/tables); every "
    "marker directory must lie below one",
    "host": "listen address; 0.0.0.0 in a pod that executors reach",
    "port": "the port executors send markers to",
    "token": "the bearer token executors send",
    "token_file": "file holding the bearer token executors send (a mounted Secret); exclusive "
    "with SPARKGUARD_SIDECAR_TOKEN",
    "auth_disabled": "serve without bearer-token auth, for local use only",
    "flush_mode": "adaptive, interval or group-commit: when queued marker names are appended",
    "batch_interval_ms": "adaptive: the longest the oldest queued name waits; interval: the "
    "tick (1-60000)",
    "batch_size": "adaptive: a flush starts once this many names are queued (1-100000)",
    "batch_threads": "at most this many MARKERS<i> files, and concurrent flushes, per directory",
    "max_pending": "markers queued or being written before new ones are answered 503",
    "max_body_bytes": "request body limit in bytes",
    "max_cached_dirs": "idle directory states kept in memory",
    "max_connections": "open client connections; the one past it is answered 503 and closed "
    "(lowered at start to what the open-files limit holds)",
    "header_timeout_s": "seconds a connection has to send a complete request head (also "
    "closes idle kept-alive connections)",
    "body_timeout_s": "seconds a request body has to arrive once its head is read (else 408)",
    "shutdown_timeout_s": "graceful-stop budget in seconds (half of it for draining)",
    "storage_options": "JSON object of fsspec storage options",
    "exit_with_process": "a regular expression (as pgrep -f): once a process whose command "
    "line matches has come and gone, drain and exit 0 (a regular sidecar container)",
    "exit_with_process_wait_s": "with --exit-with-process: also stop if no matching process "
    "appeared within this many seconds of the start",
}


def default_of(setting: str) -> str:
    """The default of ``setting`` as a user writes it (``unset`` when it has none).

    A purely computational function with no side-effects.
    """
    field = {f.name: f for f in dataclasses.fields(SidecarConfig)}.get(setting)
    if field is not None and field.default is dataclasses.MISSING:
        return "none, required"
    if field is None or field.default is None:
        return "unset"  # the token file's only field is the token it holds
    value = field.default
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _name(setting: str) -> str:
    env, flag = SETTINGS[setting]
    return env if flag.startswith("(") else f"{env} / {flag}"


def _int_in(low: int, high: int) -> Callable[[str, str], int]:
    def parse(setting: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise errors.ConfigError(
                f"{_name(setting)}={raw!r} is not an integer; give a whole number in "
                f"[{low}, {high}]"
            ) from None
        if not low <= value <= high:
            raise errors.ConfigError(
                f"{_name(setting)}={value} is out of range; give a value in [{low}, {high}]"
            )
        return value

    return parse


def _positive_float(setting: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise errors.ConfigError(
            f"{_name(setting)}={raw!r} is not a positive number of seconds; give e.g. 20"
        )
    return value


def _bool(setting: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise errors.ConfigError(f"{_name(setting)}={raw!r} is not a boolean; use true or false")


def _flush_mode(setting: str, raw: str) -> FlushMode:
    try:
        return FlushMode(raw.strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in FlushMode)
        raise errors.ConfigError(
            f"{_name(setting)}={raw!r} is not a flush mode; use one of {choices}"
        ) from None


def normalise_root(root: str, *, setting: str = "allowed_roots") -> str:
    """A root URL prefix without trailing ``/``; local roots must be absolute."""
    value = root.strip()
    if value.startswith("file://"):
        value = value[len("file://") :]
    if "://" in value:
        scheme, rest = value.split("://", 1)
        if not scheme or not rest.strip("/"):
            raise errors.ConfigError(
                f"{_name(setting)} entry {root!r} has no bucket or path; give e.g. s3://bucket/dir"
            )
        value = f"{scheme.lower()}://{rest.rstrip('/')}"
    elif not value.startswith("/"):
        raise errors.ConfigError(
            f"{_name(setting)} entry {root!r} is neither a URL nor an absolute path; "
            "give e.g. /data/tables or s3://bucket/warehouse"
        )
    else:
        value = value.rstrip("/") or "/"
    if any(segment in (".", "..") for segment in value.split("://")[-1].split("/")):
        raise errors.ConfigError(f"{_name(setting)} entry {root!r} contains '.' or '..'")
    return value


def _roots(setting: str, raw: str) -> tuple[str, ...]:
    entries = [entry for entry in raw.split(",") if entry.strip()]
    return tuple(normalise_root(entry, setting=setting) for entry in entries)


def _host(setting: str, raw: str) -> str:
    value = raw.strip()
    if not value or any(c.isspace() for c in value):
        raise errors.ConfigError(f"{_name(setting)}={raw!r} is not a host; give e.g. 0.0.0.0")
    return value


def _storage_options(setting: str, raw: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise errors.ConfigError(f"{_name(setting)} is not valid JSON ({exc}); fix it") from None
    if not isinstance(value, dict):
        raise errors.ConfigError(
            f"{_name(setting)} must be a JSON object of fsspec storage options, "
            f'e.g. {{"client_kwargs": {{"endpoint_url": "http://minio:9000"}}}}'
        )
    return value


def _process_pattern(setting: str, raw: str) -> re.Pattern[str] | None:
    if not raw.strip():
        return None
    try:
        return re.compile(raw.strip())
    except re.error as exc:
        raise errors.ConfigError(
            f"{_name(setting)}={raw!r} is not a regular expression ({exc}); give e.g. "
            "org.apache.spark.deploy.SparkSubmit"
        ) from None


def _read_token_file(setting: str, raw: str) -> str:
    try:
        with open(raw.strip(), encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise errors.ConfigError(
            f"{_name(setting)}={raw!r} cannot be read ({exc.strerror}); mount the token secret "
            "there or fix the path"
        ) from None
    if not token:
        raise errors.ConfigError(f"{_name(setting)}={raw!r} is empty; write the token into it")
    return token


def _parse(setting: str, raw: str | None, parser: Callable[[str, str], _T], default: _T) -> _T:
    return default if raw is None else parser(setting, raw)


def load_config(
    env: Mapping[str, str], flags: Mapping[str, str | None] | None = None
) -> SidecarConfig:
    """Settings from ``env`` (``SPARKGUARD_SIDECAR_*``), overridden by non-``None`` ``flags``.

    ``flags`` maps setting names (see :data:`SETTINGS`) to the raw string a flag gave.
    Raises :class:`~sparkguard.sidecar.errors.ConfigError` naming the bad setting.
    """
    given = dict(flags or {})
    unknown = set(given) - set(SETTINGS)
    if unknown:
        raise errors.ConfigError(f"unknown sidecar settings {sorted(unknown)}")

    def raw(setting: str) -> str | None:
        flag_value = given.get(setting)
        if flag_value is not None:
            return flag_value
        return env.get(SETTINGS[setting][0])

    defaults = SidecarConfig(allowed_roots=("/",), auth_disabled=True)
    token = raw("token")
    token_file = raw("token_file")
    if token is not None and token_file is not None:
        raise errors.ConfigError(
            f"both {_name('token')} and {_name('token_file')} are set; keep only one"
        )
    if token is not None and not token.strip():
        raise errors.ConfigError(f"{_name('token')} is empty; give a token or unset it")
    resolved_token = (
        _read_token_file("token_file", token_file)
        if token_file is not None
        else (token.strip() if token is not None else None)
    )
    return SidecarConfig(
        allowed_roots=_parse("allowed_roots", raw("allowed_roots"), _roots, ()),
        host=_parse("host", raw("host"), _host, defaults.host),
        port=_parse("port", raw("port"), _int_in(0, 65535), defaults.port),
        token=resolved_token,
        auth_disabled=_parse("auth_disabled", raw("auth_disabled"), _bool, False),
        flush_mode=_parse("flush_mode", raw("flush_mode"), _flush_mode, defaults.flush_mode),
        batch_interval_ms=_parse(
            "batch_interval_ms",
            raw("batch_interval_ms"),
            _int_in(1, 60_000),
            defaults.batch_interval_ms,
        ),
        batch_size=_parse(
            "batch_size", raw("batch_size"), _int_in(1, 100_000), defaults.batch_size
        ),
        batch_threads=_parse(
            "batch_threads", raw("batch_threads"), _int_in(1, 1_000), defaults.batch_threads
        ),
        max_pending=_parse("max_pending", raw("max_pending"), _int_in(1, 10_000_000), 100_000),
        max_body_bytes=_parse(
            "max_body_bytes", raw("max_body_bytes"), _int_in(1_024, 16 * 1024 * 1024), 64 * 1024
        ),
        max_cached_dirs=_parse(
            "max_cached_dirs", raw("max_cached_dirs"), _int_in(1, 1_000_000), 1_000
        ),
        max_connections=_parse(
            "max_connections", raw("max_connections"), _int_in(1, 1_000_000), 1_024
        ),
        header_timeout_s=_parse("header_timeout_s", raw("header_timeout_s"), _positive_float, 15.0),
        body_timeout_s=_parse("body_timeout_s", raw("body_timeout_s"), _positive_float, 15.0),
        shutdown_timeout_s=_parse(
            "shutdown_timeout_s", raw("shutdown_timeout_s"), _positive_float, 20.0
        ),
        storage_options=_parse("storage_options", raw("storage_options"), _storage_options, {}),
        exit_with_process=_parse(
            "exit_with_process", raw("exit_with_process"), _process_pattern, None
        ),
        exit_with_process_wait_s=_parse(
            "exit_with_process_wait_s",
            raw("exit_with_process_wait_s"),
            _positive_float,
            defaults.exit_with_process_wait_s,
        ),
    )


def config_from_environ(flags: Mapping[str, str | None] | None = None) -> SidecarConfig:
    """:func:`load_config` over the process environment."""
    return load_config(os.environ, flags)
