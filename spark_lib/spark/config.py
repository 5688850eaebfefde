"""Write settings: the ``spark.sparkguard.*`` SparkConf keys, overridden by write options.

The operator injects the SparkConf keys into every guarded application; a single write may
override them with ``df.write.option(...)``. :func:`parse_settings` is a purely computational
function with no side-effects: it takes plain mappings and returns a frozen
:class:`WriteSettings`, or raises :class:`~sparkguard.spark_lib.base.errors.ConfigError` naming the
key and the fix. :func:`marker_client_for` turns settings into the marker client executors use.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.storage import markers, timeline

logger = logging.getLogger(__name__)

CONF_PREFIX: Final = "spark.sparkguard."
DRIVER_HOST_KEY: Final = "spark.driver.host"
DRIVER_HOST_PLACEHOLDER: Final = "{driverHost}"

#: setting name -> (SparkConf key, write option name)
KEYS: Final[Mapping[str, tuple[str, str]]] = {
    "job_id": ("spark.sparkguard.jobId", "jobId"),
    "owner": ("spark.sparkguard.owner", "owner"),
    "attempt": ("spark.sparkguard.attempt", "attempt"),
    "marker_type": ("spark.sparkguard.markers.type", "markerType"),
    "marker_endpoint": ("spark.sparkguard.markers.endpoint", "markerEndpoint"),
    "token_file": ("spark.sparkguard.markers.tokenFile", "tokenFile"),
    "journal": ("spark.sparkguard.journal", "journal"),
    "file_manager": ("spark.sparkguard.fileManager", "fileManager"),
    "create_mode": ("spark.sparkguard.createMode", "createMode"),
    "storage_options": ("spark.sparkguard.storageOptions", "storageOptions"),
    "snapshot_every": ("spark.sparkguard.timeline.snapshotEvery", "snapshotEvery"),
    "archive_retention_days": (
        "spark.sparkguard.timeline.archiveRetentionDays",
        "archiveRetentionDays",
    ),
}


@dataclasses.dataclass(frozen=True)
class WriteSettings:
    """Everything a guarded write needs besides the data: who writes, where markers and the
    journal go, and how files are published. Picklable: it travels to executors."""

    job_id: str
    attempt: int = 0
    #: who starts this job's instants; ``None``: ``job:<jobId>`` (timeline.default_owner)
    owner: str | None = None
    marker_type: markers.MarkerType = markers.MarkerType.DIRECT
    marker_endpoint: str | None = None
    token_file: str | None = None
    journal: str | None = None
    file_manager: filemanager.Kind | None = None
    create_mode: filemanager.CreateMode = filemanager.CreateMode.CONDITIONAL
    storage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: the setting ``storage_options`` came from, named when one of them is refused
    storage_options_key: str = KEYS["storage_options"][0]
    #: compact the timeline after a commit once this many decided instants are uncovered
    #: (0: never automatically; docs/storage-contract.md, "Snapshots and the archive")
    snapshot_every: int = 10
    #: delete archive files of pruned snapshots older than this many days (None: keep them)
    archive_retention_days: float | None = None

    @property
    def instant_owner(self) -> str:
        """The owner recorded in this job's instants (``job:<jobId>`` when none is set)."""
        return self.owner or timeline.default_owner(self.job_id)

    def resolve(self, url: str) -> tuple[filemanager.FileManager, str]:
        """The file manager and path for ``url`` under these settings."""
        return filemanager.resolve(
            url,
            storage_options=self.storage_options,
            kind=self.file_manager,
            create_mode=self.create_mode,
            options_source=self.storage_options_key,
        )


def _lookup(
    name: str, conf: Mapping[str, str], options: Mapping[str, str]
) -> tuple[str | None, str]:
    """The value of setting ``name`` (option first, then conf) and the key it came from."""
    conf_key, option_key = KEYS[name]
    for key, value in options.items():
        if key.lower() == option_key.lower() and value is not None and str(value).strip():
            return str(value).strip(), f"write option {option_key!r}"
    conf_value = conf.get(conf_key)
    if conf_value is not None and str(conf_value).strip():
        return str(conf_value).strip(), conf_key
    return None, conf_key


def parse_non_negative_int(raw: str, *, error: str) -> int:
    """``raw`` as an integer >= 0, else :class:`ConfigError` with ``error`` (pure)."""
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise errors.ConfigError(error)
    return value


def parse_storage_options(raw: str, *, key: str) -> dict[str, Any]:
    """fsspec storage options from the JSON object in ``raw``; errors name ``key`` (pure)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise errors.ConfigError(
            f"{key} is not valid JSON ({exc}); give a JSON object such as "
            '{"client_kwargs": {"endpoint_url": "http://minio:9000"}}'
        ) from None
    if not isinstance(value, dict):
        raise errors.ConfigError(f"{key} must be a JSON object, got {raw!r}")
    return value


def parse_settings(
    *, conf: Mapping[str, str], options: Mapping[str, str] | None = None
) -> WriteSettings:
    """Parse ``spark.sparkguard.*`` keys of ``conf``, overridden by write ``options``.

    A purely computational function with no side-effects. ``{driverHost}`` in the marker
    endpoint is replaced by ``spark.driver.host`` from ``conf``.
    """
    options = options or {}
    job_id, where = _lookup("job_id", conf, options)
    if job_id is None:
        raise errors.ConfigError(
            "no job id: set spark.sparkguard.jobId (the operator injects it) or pass "
            ".option('jobId', '<job id>') to the write"
        )
    timeline.validate_job_id(job_id, what=f"{where}")

    owner, where = _lookup("owner", conf, options)
    if owner is not None:
        timeline.validate_owner(owner, what=where)

    raw_attempt, where = _lookup("attempt", conf, options)
    attempt = 0
    if raw_attempt is not None:
        attempt = parse_non_negative_int(
            raw_attempt,
            error=f"{where}={raw_attempt!r} is not an attempt number; use an integer >= 0",
        )

    raw_type, where = _lookup("marker_type", conf, options)
    marker_type = (
        markers.MarkerType.DIRECT
        if raw_type is None
        else markers.parse_marker_type(raw_type, key=where)
    )

    endpoint, endpoint_key = _lookup("marker_endpoint", conf, options)
    if endpoint is not None and DRIVER_HOST_PLACEHOLDER in endpoint:
        host = conf.get(DRIVER_HOST_KEY)
        if not host:
            raise errors.ConfigError(
                f"{endpoint_key}={endpoint!r} uses {DRIVER_HOST_PLACEHOLDER} but "
                f"{DRIVER_HOST_KEY} is not set; set it or give the sidecar's address literally"
            )
        endpoint = endpoint.replace(DRIVER_HOST_PLACEHOLDER, host)
    if marker_type is markers.MarkerType.TIMELINE_SERVER_BASED:
        if endpoint is None:
            raise errors.ConfigError(
                f"{KEYS['marker_type'][0]}=TIMELINE_SERVER_BASED needs the sidecar address: set "
                f"{endpoint_key} (e.g. http://{DRIVER_HOST_PLACEHOLDER}:8765) or use DIRECT"
            )
        if not endpoint.startswith(("http://", "https://")):
            raise errors.ConfigError(
                f"{endpoint_key}={endpoint!r} is not an http(s) URL; give e.g. "
                "http://localhost:8765"
            )

    token_file, _ = _lookup("token_file", conf, options)
    journal, _ = _lookup("journal", conf, options)

    raw_kind, where = _lookup("file_manager", conf, options)
    kind = filemanager.parse_kind(raw_kind, key=where)
    raw_mode, where = _lookup("create_mode", conf, options)
    create_mode = filemanager.parse_create_mode(raw_mode, key=where)

    raw_storage, storage_key = _lookup("storage_options", conf, options)
    storage = {} if raw_storage is None else parse_storage_options(raw_storage, key=storage_key)

    raw_every, where = _lookup("snapshot_every", conf, options)
    snapshot_every = 10
    if raw_every is not None:
        snapshot_every = parse_non_negative_int(
            raw_every,
            error=f"{where}={raw_every!r} is not valid; use an integer >= 0 (the number of "
            "decided instants that triggers a timeline snapshot; 0 turns automatic "
            "compaction off), e.g. 10",
        )
    raw_retention, where = _lookup("archive_retention_days", conf, options)
    retention = None if raw_retention is None else parse_retention_days(raw_retention, key=where)

    return WriteSettings(
        job_id=job_id,
        owner=owner,
        attempt=attempt,
        marker_type=marker_type,
        marker_endpoint=endpoint,
        token_file=token_file,
        journal=journal,
        file_manager=kind,
        create_mode=create_mode,
        storage_options=storage,
        storage_options_key=storage_key,
        snapshot_every=snapshot_every,
        archive_retention_days=retention,
    )


def parse_retention_days(raw: str, *, key: str) -> float:
    """``raw`` as a number of days >= 0 (fractions allowed), else ConfigError naming ``key``."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise errors.ConfigError(
            f"{key}={raw!r} is not valid; use a number of days >= 0 (archive files of "
            "pruned snapshots older than that are deleted), e.g. 30, or leave it unset to "
            "keep the archive"
        )
    return value


def conf_from_spark(spark: Any) -> dict[str, str]:
    """The ``spark.sparkguard.*`` keys and ``spark.driver.host`` of a live SparkSession.

    Reads the SparkContext's conf, then the session's runtime conf (which wins).
    """
    result: dict[str, str] = {}
    result.update(
        (key, value)
        for key, value in spark.sparkContext.getConf().getAll()
        if key.startswith(CONF_PREFIX) or key == DRIVER_HOST_KEY
    )
    for key in [k for name in KEYS for k in (KEYS[name][0],)] + [DRIVER_HOST_KEY]:
        value = spark.conf.get(key, None)
        if value is not None:
            result[key] = value
    return result


def marker_client_for(
    settings: WriteSettings, manager: filemanager.FileManager
) -> markers.MarkerClient:
    """The marker client ``settings`` ask for: direct files, or the driver's marker sidecar.

    The sidecar client is imported only when it is configured.
    """
    if settings.marker_type is markers.MarkerType.DIRECT:
        return markers.DirectMarkerClient(manager)
    from sparkguard.spark_lib.spark import marker_http  # type: ignore[attr-defined,unused-ignore]

    if settings.marker_endpoint is None:
        raise errors.ConfigError(
            "spark.sparkguard.markers.type=TIMELINE_SERVER_BASED needs "
            "spark.sparkguard.markers.endpoint; set it or use DIRECT markers"
        )
    client: markers.MarkerClient = marker_http.HttpMarkerClient(
        settings.marker_endpoint, token_file=settings.token_file
    )
    return client
