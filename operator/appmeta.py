"""The ``sparkguard.io/`` annotations: the opt-in options a user sets, and the progress we record.

Options (set by users)::

    sparkguard.io/enabled         "true" | "false"
    sparkguard.io/job-id          the job id (default: derived from namespace and name)
    sparkguard.io/max-retries     0..20 resubmissions (default 3)
    sparkguard.io/backoff         first wait before a resubmission (default 30s), doubling
    sparkguard.io/backoff-max     cap of that wait (default 10m)
    sparkguard.io/marker-type     "timeline-server" (default) | "direct"
    sparkguard.io/storage-secret  Secret in the app's namespace with storage credentials
    sparkguard.io/journal         the job journal's URL (default: <journal root>/<namespace>)

Progress (written by the operator, never by users): ``attempt``, ``phase``, ``handled-failure``,
``next-retry-at``, ``last-rollback``, ``message``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.operator import config as config_
from sparkguard.operator import durations
from sparkguard.spark_lib import errors as lib_errors
from sparkguard.spark_lib import timeline

PREFIX: Final = "sparkguard.io/"

ENABLED: Final = PREFIX + "enabled"
JOB_ID: Final = PREFIX + "job-id"
MAX_RETRIES: Final = PREFIX + "max-retries"
BACKOFF: Final = PREFIX + "backoff"
BACKOFF_MAX: Final = PREFIX + "backoff-max"
MARKER_TYPE: Final = PREFIX + "marker-type"
STORAGE_SECRET: Final = PREFIX + "storage-secret"
JOURNAL: Final = PREFIX + "journal"
OPTION_KEYS: Final = frozenset(
    {ENABLED, JOB_ID, MAX_RETRIES, BACKOFF, BACKOFF_MAX, MARKER_TYPE, STORAGE_SECRET, JOURNAL}
)

ATTEMPT: Final = PREFIX + "attempt"
PHASE: Final = PREFIX + "phase"
HANDLED_FAILURE: Final = PREFIX + "handled-failure"
NEXT_RETRY_AT: Final = PREFIX + "next-retry-at"
LAST_ROLLBACK: Final = PREFIX + "last-rollback"
MESSAGE: Final = PREFIX + "message"
PROGRESS_KEYS: Final = frozenset(
    {ATTEMPT, PHASE, HANDLED_FAILURE, NEXT_RETRY_AT, LAST_ROLLBACK, MESSAGE}
)

DEFAULT_MAX_RETRIES: Final = 3
MAX_MAX_RETRIES: Final = 20
DEFAULT_BACKOFF: Final = 30.0
DEFAULT_BACKOFF_MAX: Final = 600.0
LONGEST_BACKOFF: Final = 24 * 3600.0

_JOB_ID_MAX: Final = 100
_INVALID_JOB_CHARS: Final = re.compile(r"[^a-z0-9.-]+")
_SECRET_NAME: Final = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


class MarkerType(enum.StrEnum):
    """How executors record markers (see DESIGN.md, "Marker sidecar")."""

    TIMELINE_SERVER = "timeline-server"
    DIRECT = "direct"

    @property
    def conf_value(self) -> str:
        """The value of ``spark.sparkguard.markers.type`` for this marker type."""
        return "TIMELINE_SERVER_BASED" if self is MarkerType.TIMELINE_SERVER else "DIRECT"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a SparkApplication: the annotation or field, and the fix."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """The effective sparkguard options of one SparkApplication (annotations + defaults)."""

    job_id: str
    max_retries: int
    backoff: float
    backoff_max: float
    marker_type: MarkerType
    storage_secret: str | None
    journal: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parsed:
    """What the annotations of an app say: opted in or not, its options, or its problems."""

    enabled: bool
    options: Options | None = None
    problems: tuple[Problem, ...] = ()


def of(app: Mapping[str, Any]) -> Mapping[str, str]:
    """The annotations of ``app`` (empty when it has none).

    A purely computational function with no side-effects.
    """
    meta = app.get("metadata") or {}
    found = meta.get("annotations") or {}
    return found if isinstance(found, Mapping) else {}


def derive_job_id(*, namespace: str, name: str) -> str:
    """The default job id of the app ``namespace/name``: ``<namespace>.<name>``.

    A purely computational function with no side-effects. Deterministic, so every attempt of
    the app writes the same file names. A namespace never contains ``.``, so two apps never
    share an id. Lower-cased, characters outside ``[a-z0-9.-]`` become ``-``; an id longer
    than 100 characters is cut; any id changed this way ends with a hash of the full name.
    """
    full = f"{namespace}.{name}"
    cleaned = _INVALID_JOB_CHARS.sub("-", full.lower()).strip(".-")
    if cleaned == full and len(cleaned) <= _JOB_ID_MAX:
        return timeline.validate_job_id(cleaned)
    # Lossy: a hash of the original keeps two different apps from sharing an id.
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    cleaned = cleaned[: _JOB_ID_MAX - len(digest) - 1].rstrip(".-")
    cleaned = f"{cleaned}-{digest}" if cleaned else digest
    return timeline.validate_job_id(cleaned)


def parse(app: Mapping[str, Any], *, config: config_.OperatorConfig) -> Parsed:
    """Read the options of ``app`` from its annotations, with defaults from ``config``.

    A purely computational function with no side-effects. An app is opted in when
    ``sparkguard.io/enabled`` is present and not ``"false"``; every problem names the
    annotation and how to fix it.
    """
    values = of(app)
    raw_enabled = values.get(ENABLED)
    if raw_enabled is None or raw_enabled.strip().lower() == "false":
        return Parsed(enabled=False)
    problems: list[Problem] = []
    if raw_enabled.strip().lower() != "true":
        problems.append(Problem(ENABLED, f'is {raw_enabled!r}; write "true" or "false"'))

    for key in sorted(values):
        if key.startswith(PREFIX) and key not in OPTION_KEYS and key not in PROGRESS_KEYS:
            known = ", ".join(sorted(k.removeprefix(PREFIX) for k in OPTION_KEYS))
            problems.append(
                Problem(
                    key, f"is not a sparkguard annotation; known options under {PREFIX}: {known}"
                )
            )

    meta = app.get("metadata") or {}
    job_id = _parse_job_id(values.get(JOB_ID), meta=meta, problems=problems)
    max_retries = _parse_max_retries(values.get(MAX_RETRIES), problems=problems)
    backoff = _parse_backoff(
        values.get(BACKOFF), key=BACKOFF, default=DEFAULT_BACKOFF, problems=problems
    )
    backoff_max = _parse_backoff(
        values.get(BACKOFF_MAX), key=BACKOFF_MAX, default=DEFAULT_BACKOFF_MAX, problems=problems
    )
    if backoff is not None and backoff_max is not None and backoff_max < backoff:
        problems.append(
            Problem(
                BACKOFF_MAX,
                f"is {durations.format_duration(backoff_max)}, shorter than "
                f"{BACKOFF}={durations.format_duration(backoff)}; make it at least as long",
            )
        )
    marker_type = _parse_marker_type(values.get(MARKER_TYPE), problems=problems)
    storage_secret = _parse_secret(values.get(STORAGE_SECRET), problems=problems)
    journal = _parse_journal(
        values.get(JOURNAL), namespace=meta.get("namespace"), config=config, problems=problems
    )

    if (
        problems
        or job_id is None
        or max_retries is None
        or backoff is None
        or backoff_max is None
        or marker_type is None
        or journal is None
    ):
        return Parsed(enabled=True, problems=tuple(problems))
    return Parsed(
        enabled=True,
        options=Options(
            job_id=job_id,
            max_retries=max_retries,
            backoff=backoff,
            backoff_max=backoff_max,
            marker_type=marker_type,
            storage_secret=storage_secret,
            journal=journal,
        ),
    )


def _parse_job_id(
    raw: str | None, *, meta: Mapping[str, Any], problems: list[Problem]
) -> str | None:
    if raw is not None:
        try:
            return timeline.validate_job_id(raw.strip(), what="the job id")
        except lib_errors.ConfigError as exc:
            problems.append(Problem(JOB_ID, str(exc)))
            return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name:
        problems.append(
            Problem(
                JOB_ID,
                "is needed when the app has no fixed metadata.name (generateName) or namespace: "
                "set it to a stable id such as 'nightly-sales'",
            )
        )
        return None
    return derive_job_id(namespace=str(namespace), name=str(name))


def _parse_max_retries(raw: str | None, *, problems: list[Problem]) -> int | None:
    if raw is None:
        return DEFAULT_MAX_RETRIES
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_MAX_RETRIES:
        problems.append(
            Problem(MAX_RETRIES, f"is {raw!r}; write a whole number 0..{MAX_MAX_RETRIES}")
        )
        return None
    return value


def _parse_backoff(
    raw: str | None, *, key: str, default: float, problems: list[Problem]
) -> float | None:
    if raw is None:
        return default
    try:
        value = durations.parse_duration(raw)
    except ValueError as exc:
        problems.append(Problem(key, str(exc)))
        return None
    if value > LONGEST_BACKOFF:
        problems.append(Problem(key, f"is {raw!r}; write at most 24h"))
        return None
    return value


def _parse_marker_type(raw: str | None, *, problems: list[Problem]) -> MarkerType | None:
    if raw is None:
        return MarkerType.TIMELINE_SERVER
    try:
        return MarkerType(raw.strip().lower())
    except ValueError:
        allowed = " or ".join(f'"{m.value}"' for m in MarkerType)
        problems.append(Problem(MARKER_TYPE, f"is {raw!r}; write {allowed}"))
        return None


def _parse_secret(raw: str | None, *, problems: list[Problem]) -> str | None:
    if raw is None:
        return None
    if not _SECRET_NAME.match(raw.strip()):
        problems.append(
            Problem(STORAGE_SECRET, f"is {raw!r}; name a Secret in the app's namespace")
        )
        return None
    return raw.strip()


def _parse_journal(
    raw: str | None,
    *,
    namespace: object,
    config: config_.OperatorConfig,
    problems: list[Problem],
) -> str | None:
    if raw is not None:
        value = raw.strip().rstrip("/")
        if not value or ("://" not in value and not value.startswith("/")):
            problems.append(
                Problem(
                    JOURNAL, f"is {raw!r}; write a URL such as 's3://bucket/sparkguard/journal'"
                )
            )
            return None
        return value
    if not config.journal_root:
        problems.append(
            Problem(
                JOURNAL,
                "is not set and the operator has no default: set this annotation to a URL "
                "such as 's3://bucket/sparkguard/journal', or set "
                f"{config_.variable_of('journal_root')}",
            )
        )
        return None
    if not namespace:
        problems.append(Problem(JOURNAL, "cannot default without metadata.namespace; set it"))
        return None
    return f"{config.journal_root}/{namespace}"
