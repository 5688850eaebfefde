"""The operator's settings, read once from ``SPARKGUARD_*`` environment variables.

:func:`load_config` collects every problem at once, each naming its variable and the fix, so a
misconfigured Deployment fails its first start with one readable message.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from sparkguard import __version__
from sparkguard.operator import durations, errors, podsecurity

T = TypeVar("T")

ENV_PREFIX: Final = "SPARKGUARD_"
DEFAULT_IMAGE: Final = f"ghcr.io/sparkguard/sparkguard:{__version__}"
_QUANTITY: Final = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_K8S_NAME: Final = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class WebhookMode(enum.StrEnum):
    """Who serves and registers the mutating admission webhook."""

    #: kopf serves it and creates/patches the MutatingWebhookConfiguration itself.
    MANAGED = "managed"
    #: kopf serves it with a mounted cert/key; the Helm chart owns the webhook configuration.
    EXTERNAL = "external"
    #: no webhook (apps must be mutated some other way; recovery still works).
    DISABLED = "disabled"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """Everything the operator needs to know that is not on a SparkApplication."""

    #: namespaces to watch; empty means cluster-wide
    namespaces: tuple[str, ...] = ()
    webhook_mode: WebhookMode = WebhookMode.EXTERNAL
    webhook_addr: str = "0.0.0.0"  # noqa: S104 - a pod must listen on its pod IP
    webhook_port: int = 9443
    #: hostname the apiserver uses to reach the webhook (managed mode); default: the address
    webhook_host: str | None = None
    webhook_cert_file: str | None = None
    webhook_key_file: str | None = None
    #: CA bundle for the webhook configuration (managed mode); default: the cert itself
    webhook_ca_file: str | None = None
    #: name of the MutatingWebhookConfiguration kopf manages (managed mode)
    webhook_config_name: str = "sparkguard.io"
    #: ``Ignore`` lets SparkApplications through unmutated while the operator is down
    webhook_ignore_failures: bool = False
    #: the image with the ``sparkguard`` command (sidecar, bundle, rollback)
    image: str = DEFAULT_IMAGE
    image_pull_policy: str | None = None
    sidecar_port: int = 7070
    sidecar_batch_interval_ms: int = 250
    sidecar_batch_threads: int = 20
    sidecar_cpu_request: str = "100m"
    sidecar_memory_request: str = "128Mi"
    sidecar_cpu_limit: str | None = None
    sidecar_memory_limit: str | None = "256Mi"
    #: URL prefixes the sidecar may write markers under (narrow them to your buckets)
    sidecar_allowed_roots: tuple[str, ...] = (
        "s3://",
        "s3a://",
        "gs://",
        "abfs://",
        "abfss://",
        "hdfs://",
        "file:///",
    )
    #: file name of the marker sidecar's bearer token in its mounted directory (the token is
    #: each app's own, from a pod annotation: see mutation.MARKER_TOKEN_ANNOTATION)
    sidecar_token_key: str = "token"  # noqa: S105 - a key's name
    #: the only names ``sparkguard.io/storage-secret`` may give, as the chart's RBAC grants
    #: ``secrets get`` by name (``rbac.storageSecretNames``); empty: any name
    storage_secret_names: tuple[str, ...] = ()
    #: the securityContext of every container sparkguard injects (initContainers and the marker
    #: sidecar): Pod Security "restricted" by default; see podsecurity.py
    injected_security_context: Mapping[str, Any] = dataclasses.field(
        default_factory=podsecurity.restricted
    )
    #: resources of the library and rollback initContainers (measured: docs/operator.md,
    #: "Hardened namespaces")
    init_cpu_request: str | None = "100m"
    init_memory_request: str | None = "128Mi"
    init_cpu_limit: str | None = None
    init_memory_limit: str | None = "512Mi"
    #: marker sidecar as a native sidecar (initContainer, restartPolicy Always): True, False,
    #: or None = when the API server is Kubernetes >= 1.29 and the installed SparkApplication
    #: CRD keeps a container's restartPolicy (read every few minutes, see sidecarmode.py)
    sidecar_native: bool | None = None
    #: default journal location; an app's journal is ``<journal_root>/<namespace>``
    journal_root: str | None = None
    #: the JVM layer for apps without a ``sparkguard.io/jvm-layer`` annotation (a cluster-wide
    #: switch for rolling it out; an app's annotation always wins)
    jvm_layer_default: bool = True
    metrics_addr: str = "0.0.0.0"  # noqa: S104 - scraped from other pods
    #: 0 disables the Prometheus endpoint
    metrics_port: int = 9090
    #: 0 disables kopf's liveness endpoint
    liveness_port: int = 8080
    #: rollbacks at once across all apps, each in its own thread; see docs/operator.md
    max_concurrent_rollbacks: int = 16
    #: wait before retrying a rollback or API call that failed for a passing reason
    error_backoff_seconds: float = 30.0
    #: longest single sleep while waiting for a backoff to expire
    max_sleep_seconds: float = 600.0
    #: how often the CRD of a SparkApplication kind not served yet is looked for (crdwatch.py)
    crd_check_seconds: float = 10.0
    #: only the holder of a coordination.k8s.io Lease recovers apps (every replica admits)
    leader_election: bool = False
    lease_name: str = "sparkguard-operator"
    #: namespace of the Lease (the chart's release namespace); required with leader election
    lease_namespace: str | None = None
    #: a Lease not renewed for this long is taken over by another replica
    lease_duration_seconds: float = 15.0
    #: this process's name in Leases and claims (a random suffix is added); default: hostname
    pod_name: str | None = None
    #: a rollback claim not renewed for this long is taken over (its holder renews it at 1/3)
    claim_ttl_seconds: float = 30.0
    #: how long a resubmitted app may stay FAILED (or its rerun unsubmitted in PENDING_RERUN)
    #: before the resubmission is patched again
    resubmit_timeout_seconds: float = 60.0
    #: longest time a deleted opted-in app is held for its rollback (then a Warning, and the
    #: finalizer goes anyway); see "Deleted apps" in docs/operator.md
    delete_rollback_timeout_seconds: float = 120.0

    @property
    def clusterwide(self) -> bool:
        """Whether the operator watches every namespace."""
        return not self.namespaces


def _text(value: str) -> str:
    return value.strip()


def _optional(value: str) -> str | None:
    return value.strip() or None


def _port(allow_zero: bool) -> Callable[[str], int]:
    def parse(value: str) -> int:
        port = int(value)
        low = 0 if allow_zero else 1
        if not low <= port <= 65535:
            raise ValueError(f"must be a port number {low}..65535")
        return port

    return parse


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        number = int(value)
        if not low <= number <= high:
            raise ValueError(f"must be an integer {low}..{high}")
        return number

    return parse


def _quantity(value: str) -> str | None:
    value = value.strip()
    if not value:
        return None
    if not _QUANTITY.match(value):
        raise ValueError("must be a Kubernetes quantity such as '100m', '0.5', '256Mi' or '1Gi'")
    return value


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("must be 'true' or 'false'")


def _failure_policy(value: str) -> bool:
    if value.strip() == "Ignore":
        return True
    if value.strip() == "Fail":
        return False
    raise ValueError("must be 'Fail' (deny while the operator is down) or 'Ignore'")


def _auto_bool(value: str) -> bool | None:
    if value.strip().lower() == "auto":
        return None
    try:
        return _bool(value)
    except ValueError:
        raise ValueError("must be 'auto', 'true' or 'false'") from None


def _namespaces(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    for name in names:
        if not _DNS_LABEL.match(name):
            raise ValueError(f"{name!r} is not a namespace name; give a comma-separated list")
    return names


def _roots(value: str) -> tuple[str, ...]:
    roots = tuple(r.strip() for r in value.split(",") if r.strip())
    if not roots:
        raise ValueError("must list URL prefixes, e.g. 's3://warehouse/,s3://staging/'")
    return roots


def _k8s_names(value: str) -> tuple[str, ...]:
    return tuple(_k8s_name(n) for n in value.split(",") if n.strip())


def _k8s_name(value: str) -> str:
    value = value.strip()
    if not _K8S_NAME.match(value):
        raise ValueError("must be a Kubernetes object name (lower-case letters, digits, '-', '.')")
    return value


def _pull_policy(value: str) -> str | None:
    value = value.strip()
    if value and value not in ("Always", "IfNotPresent", "Never"):
        raise ValueError("must be 'Always', 'IfNotPresent' or 'Never'")
    return value or None


def _seconds(value: str) -> float:
    seconds = durations.parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


#: bounds of SPARKGUARD_DELETE_ROLLBACK_TIMEOUT: a deletion is never held for longer than this
_LONGEST_DELETE_HOLD: Final = 3600.0


def _delete_timeout(value: str) -> float:
    try:
        seconds = durations.parse_duration(value)
    except ValueError:
        seconds = -1.0
    if not 1 <= seconds <= _LONGEST_DELETE_HOLD:
        raise ValueError(
            "must be a duration from 1s to 1h, e.g. '120' (seconds) or '2m': how long a deleted "
            "app may wait for its rollback"
        )
    return seconds


def _journal_root(value: str) -> str | None:
    value = value.strip().rstrip("/")
    if value and "://" not in value and not value.startswith("/"):
        raise ValueError(
            "must be a URL such as 's3://bucket/sparkguard/journal' or an absolute path"
        )
    return value or None


def _webhook_mode(value: str) -> WebhookMode:
    try:
        return WebhookMode(value.strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in WebhookMode)
        raise ValueError(f"must be one of: {allowed}") from None


#: field -> (variable suffix, parser); variables not set keep the dataclass default
_FIELDS: Final[dict[str, tuple[str, Callable[[str], object]]]] = {
    "namespaces": ("NAMESPACES", _namespaces),
    "webhook_mode": ("WEBHOOK_MODE", _webhook_mode),
    "webhook_addr": ("WEBHOOK_ADDR", _text),
    "webhook_port": ("WEBHOOK_PORT", _port(allow_zero=False)),
    "webhook_host": ("WEBHOOK_HOST", _optional),
    "webhook_cert_file": ("WEBHOOK_CERT_FILE", _optional),
    "webhook_key_file": ("WEBHOOK_KEY_FILE", _optional),
    "webhook_ca_file": ("WEBHOOK_CA_FILE", _optional),
    "webhook_config_name": ("WEBHOOK_CONFIG_NAME", _k8s_name),
    "webhook_ignore_failures": ("WEBHOOK_FAILURE_POLICY", _failure_policy),
    "image": ("IMAGE", _text),
    "image_pull_policy": ("IMAGE_PULL_POLICY", _pull_policy),
    "sidecar_port": ("SIDECAR_PORT", _port(allow_zero=False)),
    "sidecar_batch_interval_ms": ("SIDECAR_BATCH_INTERVAL_MS", _bounded_int(1, 60_000)),
    "sidecar_batch_threads": ("SIDECAR_BATCH_THREADS", _bounded_int(1, 256)),
    "sidecar_cpu_request": ("SIDECAR_CPU_REQUEST", _quantity),
    "sidecar_memory_request": ("SIDECAR_MEMORY_REQUEST", _quantity),
    "sidecar_cpu_limit": ("SIDECAR_CPU_LIMIT", _quantity),
    "sidecar_memory_limit": ("SIDECAR_MEMORY_LIMIT", _quantity),
    "sidecar_allowed_roots": ("SIDECAR_ALLOWED_ROOTS", _roots),
    "sidecar_token_key": ("SIDECAR_TOKEN_KEY", _text),
    "storage_secret_names": ("STORAGE_SECRET_NAMES", _k8s_names),
    "sidecar_native": ("SIDECAR_NATIVE", _auto_bool),
    "injected_security_context": ("INJECTED_SECURITY_CONTEXT", podsecurity.parse),
    "init_cpu_request": ("INIT_CPU_REQUEST", _quantity),
    "init_memory_request": ("INIT_MEMORY_REQUEST", _quantity),
    "init_cpu_limit": ("INIT_CPU_LIMIT", _quantity),
    "init_memory_limit": ("INIT_MEMORY_LIMIT", _quantity),
    "journal_root": ("JOURNAL_ROOT", _journal_root),
    "jvm_layer_default": ("JVM_LAYER", _bool),
    "metrics_addr": ("METRICS_ADDR", _text),
    "metrics_port": ("METRICS_PORT", _port(allow_zero=True)),
    "liveness_port": ("LIVENESS_PORT", _port(allow_zero=True)),
    "max_concurrent_rollbacks": ("MAX_CONCURRENT_ROLLBACKS", _bounded_int(1, 256)),
    "error_backoff_seconds": ("ERROR_BACKOFF", _seconds),
    "max_sleep_seconds": ("MAX_SLEEP", _seconds),
    "crd_check_seconds": ("CRD_CHECK_INTERVAL", _seconds),
    "leader_election": ("LEADER_ELECTION", _bool),
    "lease_name": ("LEASE_NAME", _k8s_name),
    "lease_namespace": ("LEASE_NAMESPACE", _optional),
    "lease_duration_seconds": ("LEASE_DURATION", _seconds),
    "pod_name": ("POD_NAME", _optional),
    "claim_ttl_seconds": ("CLAIM_TTL", _seconds),
    "resubmit_timeout_seconds": ("RESUBMIT_TIMEOUT", _seconds),
    "delete_rollback_timeout_seconds": ("DELETE_ROLLBACK_TIMEOUT", _delete_timeout),
}


def variable_of(field: str) -> str:
    """The environment variable that sets ``field`` of :class:`OperatorConfig`."""
    return ENV_PREFIX + _FIELDS[field][0]


def load_config(environ: Mapping[str, str]) -> OperatorConfig:
    """Build the config from ``SPARKGUARD_*`` variables in ``environ``.

    A purely computational function with no side-effects (pass ``os.environ``). Raises
    :class:`errors.ConfigError` naming every bad variable and what to set it to.
    """
    values: dict[str, object] = {}
    problems: list[str] = []
    for field, (suffix, parse) in _FIELDS.items():
        name = ENV_PREFIX + suffix
        raw = environ.get(name)
        if raw is None:
            continue
        try:
            values[field] = parse(raw)
        except ValueError as exc:
            problems.append(f"{name}={raw!r} {exc}")
    if problems:
        raise errors.ConfigError("invalid operator settings: " + "; ".join(problems))
    config = OperatorConfig(**values)  # type: ignore[arg-type]
    check_config(config)
    return config


def check_config(config: OperatorConfig) -> None:
    """Raise :class:`errors.ConfigError` when settings contradict each other.

    A purely computational function with no side-effects.
    """
    problems: list[str] = []
    if config.webhook_mode is WebhookMode.EXTERNAL and not (
        config.webhook_cert_file and config.webhook_key_file
    ):
        problems.append(
            f"{variable_of('webhook_mode')}=external needs {variable_of('webhook_cert_file')} and "
            f"{variable_of('webhook_key_file')} (the mounted TLS Secret); set them, or use "
            "managed mode to let the operator generate a certificate"
        )
    if bool(config.webhook_cert_file) != bool(config.webhook_key_file):
        problems.append(
            f"set both {variable_of('webhook_cert_file')} and {variable_of('webhook_key_file')}, "
            "or neither"
        )
    if not config.image:
        problems.append(f"{variable_of('image')} must name the sparkguard image")
    if config.leader_election and not config.lease_namespace:
        problems.append(
            f"{variable_of('leader_election')}=true needs {variable_of('lease_namespace')} (the "
            "namespace of the Lease, usually the operator's own); set it, or turn leader "
            "election off for a single replica"
        )
    if problems:
        raise errors.ConfigError("invalid operator settings: " + "; ".join(problems))
