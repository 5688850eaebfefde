"""The ``sparkguard.io/`` annotations: the opt-in options a user sets, and the progress we record.

Options (set by users)::

    sparkguard.io/enabled         "true" | "false"
    sparkguard.io/job-id          the job id (default: derived from namespace and name)
    sparkguard.io/max-retries     0..20 resubmissions (default 3)
    sparkguard.io/backoff         first wait before a resubmission (default 30s), doubling
    sparkguard.io/backoff-max     cap of that wait (default 10m)
    sparkguard.io/marker-type     "sidecar" (default) | "direct" ("timeline-server" accepted)
    sparkguard.io/storage-secret  Secret in the app's namespace with storage credentials
    sparkguard.io/journal         the job journal's URL (default: <journal root>/<namespace>)
    sparkguard.io/jvm-layer       "true" (default) | "false": Spark's own writes through
                                  sparkguard's commit protocol (the jar and its conf injected)

Opting in: the label ``sparkguard.io/enabled: "true"`` (it reaches the runs of a
ScheduledSparkApplication, which copies labels but not annotations), or the annotation of the
same name.

Identity (written by admission once, at CREATE): ``sparkguard.io/owner`` =
``k8s:<namespace>/<name>/<random id>``, the owner recorded in every instant the app writes.

Progress (written by the operator, never by users): ``attempt``, ``phase``, ``handled-failure``,
``next-retry-at``, ``last-rollback``, ``message``; and the protection signal ``protection``
(``unprotected``) with ``protection-reason``, when a driver pod ran without sparkguard's
containers.

Values are strict: ASCII, no surrounding spaces, one canonical form (``3``, not ``+3``,
`` 3 `` or ``03``); a message echoes at most the first 64 characters of a bad value.
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
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.storage import timeline

PREFIX: Final = "sparkguard.io/"

ENABLED: Final = PREFIX + "enabled"
JOB_ID: Final = PREFIX + "job-id"
MAX_RETRIES: Final = PREFIX + "max-retries"
BACKOFF: Final = PREFIX + "backoff"
BACKOFF_MAX: Final = PREFIX + "backoff-max"
MARKER_TYPE: Final = PREFIX + "marker-type"
STORAGE_SECRET: Final = PREFIX + "storage-secret"
JOURNAL: Final = PREFIX + "journal"
JVM_LAYER: Final = PREFIX + "jvm-layer"
OPTION_KEYS: Final = frozenset(
    {
        ENABLED,
        JOB_ID,
        MAX_RETRIES,
        BACKOFF,
        BACKOFF_MAX,
        MARKER_TYPE,
        STORAGE_SECRET,
        JOURNAL,
        JVM_LAYER,
    }
)

ATTEMPT: Final = PREFIX + "attempt"
PHASE: Final = PREFIX + "phase"
HANDLED_FAILURE: Final = PREFIX + "handled-failure"
NEXT_RETRY_AT: Final = PREFIX + "next-retry-at"
LAST_ROLLBACK: Final = PREFIX + "last-rollback"
MESSAGE: Final = PREFIX + "message"
#: on an Apache app the operator recreated to resubmit it: the uid of the app it replaced
#: (whose resubmission record names it; see :mod:`resubmit`)
RESUBMITTED_FROM: Final = PREFIX + "resubmitted-from"
PROGRESS_KEYS: Final = frozenset(
    {ATTEMPT, PHASE, HANDLED_FAILURE, NEXT_RETRY_AT, LAST_ROLLBACK, MESSAGE, RESUBMITTED_FROM}
)

#: written by the operator when a driver pod of the app runs without sparkguard's containers
#: (spark-operator's pod webhook off or failing open): ``unprotected``; removed once a later
#: driver pod has them (see :mod:`protection`)
PROTECTION: Final = PREFIX + "protection"
#: why: the pod, what it lacks, the likely cause and the fix
PROTECTION_REASON: Final = PREFIX + "protection-reason"
SIGNAL_KEYS: Final = frozenset({PROTECTION, PROTECTION_REASON})

#: written by admission at CREATE, immutable afterwards; see :func:`storage_owner`
OWNER_ANNOTATION: Final = PREFIX + "owner"
IDENTITY_KEYS: Final = frozenset({OWNER_ANNOTATION})
#: the opt-in label (and annotation) key
ENABLED_LABEL: Final = ENABLED
OWNER_SCHEME: Final = "k8s:"
#: label admission sets on opted-in apps: a hash of the job id (a label value holds at most 63
#: characters, a job id 100), so the apps using one job id are one label-selected list
JOB_ID_LABEL: Final = PREFIX + "job-id-hash"

DEFAULT_MAX_RETRIES: Final = 3
MAX_MAX_RETRIES: Final = 20
DEFAULT_BACKOFF: Final = 30.0
DEFAULT_BACKOFF_MAX: Final = 600.0
LONGEST_BACKOFF: Final = 24 * 3600.0

_JOB_ID_MAX: Final = 100
_INVALID_JOB_CHARS: Final = re.compile(r"[^a-z0-9.-]+")
#: dot-separated DNS labels: no '..', '.-' or '-.' (one spelling per id); length checked apart
_JOB_ID: Final = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
_SECRET_NAME: Final = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_MAX_RETRIES: Final = re.compile(r"0|[1-9][0-9]?")
_DURATION: Final = re.compile(r"0|[1-9][0-9]*|((0|[1-9][0-9]*)[hms])+")
#: longest part of a bad value echoed in a message
ECHO_LIMIT: Final = 64


class MarkerType(enum.StrEnum):
    """How executors record markers (see docs/sidecar.md)."""

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
    #: Spark's own writes go through sparkguard's commit protocol (``sparkguard.io/jvm-layer``)
    jvm_layer: bool = True


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


def labels_of(app: Mapping[str, Any]) -> Mapping[str, str]:
    """The labels of ``app`` (empty when it has none).

    A purely computational function with no side-effects.
    """
    meta = app.get("metadata") or {}
    found = meta.get("labels") or {}
    return found if isinstance(found, Mapping) else {}


def shown(raw: str) -> str:
    """``raw`` quoted for a message, cut to :data:`ECHO_LIMIT` characters (length said).

    A purely computational function with no side-effects.
    """
    if len(raw) <= ECHO_LIMIT:
        return repr(raw)
    return f"{raw[:ECHO_LIMIT]!r}... ({len(raw)} characters)"


def opted_in(app: Mapping[str, Any]) -> bool:
    """Whether ``app`` asks for sparkguard: the label or the annotation ``sparkguard.io/enabled``
    is present and not ``"false"`` (a bad value counts as opted in, so it is reported).

    A purely computational function with no side-effects.
    """
    return any(
        value is not None and value != "false"
        for value in (labels_of(app).get(ENABLED_LABEL), of(app).get(ENABLED))
    )


def storage_owner(metadata: Mapping[str, Any] | None) -> str | None:
    """The owner this app's writes record in storage: its ``sparkguard.io/owner`` annotation.

    A purely computational function with no side-effects. ``None`` when the app has none (an
    app admitted before owners existed, or while the webhook was down): its instants then have
    the default owner ``job:<jobId>``.
    """
    annotations = (metadata or {}).get("annotations") or {}
    value = annotations.get(OWNER_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) and value else None


def new_owner(*, namespace: str, name: str, unique: str) -> str:
    """The owner admission gives an app at CREATE: ``k8s:<namespace>/<name>/<unique>``.

    A purely computational function with no side-effects. ``unique`` is a fresh random id per
    created object (its uid is not assigned yet during mutating admission), so an app deleted
    and recreated under the same name is another owner.
    """
    return f"{OWNER_SCHEME}{namespace}/{name}/{unique}"


def validate_job_id(raw: str) -> str:
    """``raw`` if it is a job id in its one canonical form, else raise ``ValueError``.

    A purely computational function with no side-effects. 1-100 ASCII characters, dot-separated
    parts of ``a-z 0-9 -`` that start and end with a letter or digit (so no ``..``).
    """
    if len(raw) > _JOB_ID_MAX or not raw.isascii() or not _JOB_ID.fullmatch(raw):
        raise ValueError(
            f"is {shown(raw)}; write 1-{_JOB_ID_MAX} lower-case letters, digits and '-', in parts "
            "separated by single dots, each starting and ending with a letter or digit "
            "(e.g. 'nightly-sales.2026')"
        )
    return timeline.validate_job_id(raw, what="the job id")


def job_id_label(job_id: str) -> str:
    """The value of :data:`JOB_ID_LABEL` for ``job_id``: 40 hex digits of its SHA-256.

    A purely computational function with no side-effects.
    """
    return hashlib.sha256(job_id.encode()).hexdigest()[:40]


def derive_job_id(*, namespace: str, name: str) -> str:
    """The default job id of the app ``namespace/name``: ``<namespace>.<name>``.

    A purely computational function with no side-effects. Deterministic, so every attempt of
    the app writes the same file names. A namespace never contains ``.``, so two apps never
    share an id. Lower-cased, characters outside ``[a-z0-9.-]`` become ``-``; an id longer
    than 100 characters is cut; any id changed this way ends with a hash of the full name.
    """
    full = f"{namespace}.{name}"
    cleaned = _INVALID_JOB_CHARS.sub("-", full.lower()).strip(".-")
    if cleaned == full and len(cleaned) <= _JOB_ID_MAX and _JOB_ID.fullmatch(cleaned):
        return validate_job_id(cleaned)
    # Lossy: a hash of the original keeps two different apps from sharing an id.
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[.-]*\.[.-]*", ".", cleaned)  # no '..', '.-', '-.'
    cleaned = cleaned[: _JOB_ID_MAX - len(digest) - 1].rstrip(".-")
    cleaned = f"{cleaned}-{digest}" if cleaned else digest
    return validate_job_id(cleaned)


def parse(app: Mapping[str, Any], *, config: config_.OperatorConfig) -> Parsed:
    """Read the options of ``app`` from its annotations, with defaults from ``config``.

    A purely computational function with no side-effects. An app is opted in when the label or
    the annotation ``sparkguard.io/enabled`` is present and not ``"false"`` (see
    :func:`opted_in`); every problem names the label or annotation and how to fix it.
    """
    if not opted_in(app):
        return Parsed(enabled=False)
    values = of(app)
    problems: list[Problem] = []
    label, annotation = labels_of(app).get(ENABLED_LABEL), values.get(ENABLED)
    for field, raw in ((f"metadata.labels[{ENABLED_LABEL}]", label), (ENABLED, annotation)):
        if raw is not None and raw not in ("true", "false"):
            problems.append(Problem(field, f'is {shown(raw)}; write "true" or "false"'))
    if label is not None and annotation is not None and label != annotation:
        problems.append(
            Problem(
                ENABLED,
                f"the label says {shown(label)} and the annotation {shown(annotation)}; "
                "keep only the label",
            )
        )

    known_keys = OPTION_KEYS | PROGRESS_KEYS | IDENTITY_KEYS | SIGNAL_KEYS
    for key in sorted(values):
        if key.startswith(PREFIX) and key not in known_keys:
            known = ", ".join(sorted(k.removeprefix(PREFIX) for k in OPTION_KEYS))
            problems.append(
                Problem(
                    key, f"is not a sparkguard annotation; known options under {PREFIX}: {known}"
                )
            )
    for key in sorted(OPTION_KEYS - {ENABLED}):
        raw = values.get(key)
        if raw is not None and (raw != raw.strip() or not raw):
            problems.append(Problem(key, f"is {shown(raw)}; write it without surrounding spaces"))
    values = {k: v for k, v in values.items() if not (k in OPTION_KEYS and v != v.strip())}

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
    storage_secret = _parse_secret(
        values.get(STORAGE_SECRET), allowed=config.storage_secret_names, problems=problems
    )
    journal = _parse_journal(
        values.get(JOURNAL), namespace=meta.get("namespace"), config=config, problems=problems
    )
    jvm_layer = _parse_switch(
        values.get(JVM_LAYER), key=JVM_LAYER, problems=problems, default=config.jvm_layer_default
    )

    if (
        problems
        or job_id is None
        or max_retries is None
        or backoff is None
        or backoff_max is None
        or marker_type is None
        or journal is None
        or jvm_layer is None
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
            jvm_layer=jvm_layer,
        ),
    )


def _parse_job_id(
    raw: str | None, *, meta: Mapping[str, Any], problems: list[Problem]
) -> str | None:
    if raw is not None:
        try:
            return validate_job_id(raw)
        except (ValueError, lib_errors.ConfigError) as exc:
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
    # fullmatch on ASCII digits: int() would take ' 3 ', '+3', '03' and '٣'
    value = int(raw) if raw.isascii() and _MAX_RETRIES.fullmatch(raw) else -1
    if not 0 <= value <= MAX_MAX_RETRIES:
        problems.append(
            Problem(
                MAX_RETRIES,
                f"is {shown(raw)}; write a whole number 0..{MAX_MAX_RETRIES} "
                "(digits only, no sign or leading zero)",
            )
        )
        return None
    return value


def _parse_backoff(
    raw: str | None, *, key: str, default: float, problems: list[Problem]
) -> float | None:
    if raw is None:
        return default
    if not raw.isascii() or not _DURATION.fullmatch(raw):
        problems.append(
            Problem(
                key,
                f"is {shown(raw)}; write whole seconds ('45') or units h/m/s ('30s', '2m', "
                "'1h30m'), ASCII digits without spaces or signs",
            )
        )
        return None
    try:
        value = durations.parse_duration(raw)
    except ValueError as exc:
        problems.append(Problem(key, str(exc)))
        return None
    if value > LONGEST_BACKOFF:
        problems.append(Problem(key, f"is {shown(raw)}; write at most 24h"))
        return None
    return value


#: "sidecar" is how users write it everywhere; "timeline-server" (its former name) is accepted
_MARKER_SPELLINGS: Final[Mapping[str, MarkerType]] = {
    "sidecar": MarkerType.TIMELINE_SERVER,
    "timeline-server": MarkerType.TIMELINE_SERVER,
    "direct": MarkerType.DIRECT,
}


def _parse_marker_type(raw: str | None, *, problems: list[Problem]) -> MarkerType | None:
    if raw is None:
        return MarkerType.TIMELINE_SERVER
    found = _MARKER_SPELLINGS.get(raw)
    if found is None:
        problems.append(
            Problem(
                MARKER_TYPE,
                f'is {shown(raw)}; write "sidecar" (markers batched by the driver\'s marker '
                'sidecar, the default) or "direct" (written to storage by each task)',
            )
        )
    return found


def _parse_switch(
    raw: str | None, *, key: str, problems: list[Problem], default: bool = True
) -> bool | None:
    if raw is None:
        return default
    if raw not in ("true", "false"):
        problems.append(Problem(key, f'is {shown(raw)}; write "true" or "false" (lower case)'))
        return None
    return raw == "true"


def _parse_secret(
    raw: str | None, *, allowed: tuple[str, ...], problems: list[Problem]
) -> str | None:
    if raw is None:
        return None
    if not raw.isascii() or not _SECRET_NAME.fullmatch(raw):
        problems.append(
            Problem(STORAGE_SECRET, f"is {shown(raw)}; name a Secret in the app's namespace")
        )
        return None
    if allowed and raw not in allowed:
        # the operator could not read it for a rollback: refused now, not at the first failure
        problems.append(
            Problem(
                STORAGE_SECRET,
                f"is {shown(raw)}, but the operator may read only the Secrets named "
                f"{', '.join(allowed)} (the chart's rbac.storageSecretNames): give your "
                "Secret one of these names, or add its name there",
            )
        )
        return None
    return raw


def _parse_journal(
    raw: str | None,
    *,
    namespace: object,
    config: config_.OperatorConfig,
    problems: list[Problem],
) -> str | None:
    if raw is not None:
        value = raw.rstrip("/")
        if (
            not value
            or ("://" not in value and not value.startswith("/"))
            or any(c.isspace() or not c.isprintable() for c in value)
        ):
            problems.append(
                Problem(
                    JOURNAL,
                    f"is {shown(raw)}; write a URL such as 's3://bucket/sparkguard/journal'",
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
