"""Admission: what sparkguard adds to an opted-in SparkApplication, as a JSON merge patch.

The additions (see docs/operator.md)::

    spec.sparkConf        spark.sparkguard.{jobId,attempt,markers.type,markers.endpoint,
                          markers.tokenFile,journal}
    spec.driver.sidecars  the marker sidecar (timeline-server markers only), ending with the
                          driver: spec.driver.shareProcessNamespace true
    spec.driver.initContainers              the marker sidecar as a native sidecar
                          (restartPolicy Always, Kubernetes >= 1.29) instead, when asked
    spec.{driver,executor}.initContainers   the library, copied into a shared emptyDir
    spec.driver.initContainers              a rollback of what an earlier attempt left
    metadata.annotations  sparkguard.io/owner at CREATE (see :func:`review`), job-id
    metadata.labels       sparkguard.io/job-id-hash (to find the apps that use a job id)
    spec.volumes, volumeMounts, PYTHONPATH  the library (and the sidecar token) in every pod
    spec.{driver,executor}.annotations      sparkguard.io/marker-token: the app's own marker
                          token (random, written at CREATE by :func:`review`), which a
                          downward API volume turns into the token file of the sidecar and
                          the executors: no Secret to create per namespace
    spec.sparkConf        the JVM layer (unless ``sparkguard.io/jvm-layer: "false"``): what
                          :func:`sparkguard.spark_lib.spark.sparkconf.build_spark_conf`
                          returns, e.g. spark.sql.sources.commitProtocolClass, and the bundle's jar
                          (``local://``) appended to spark.jars (and to spec.deps.jars when set)
    every injected container  a securityContext that meets Pod Security "restricted" (less what
                          the pod's own securityContext sets, see podsecurity.py), /tmp on
                          the library volume (subPath .tmp), PYTHONDONTWRITEBYTECODE and
                          TMPDIR; the initContainers' resources (:func:`harden`)

That is a Kubeflow app (``sparkoperator.k8s.io/v1beta2``). An Apache Spark operator app
(``spark.apache.org/v1``) gets the same metadata and sparkConf (the JVM layer's jar appended to
``spec.jars`` when sparkConf has no spark.jars, as that operator would have set it), but its
containers and volumes go into its pod templates::

    spec.driverSpec.podTemplateSpec.spec    volumes; initContainers: the library, the
                          rollback, the marker sidecar (always native); the Spark container's
                          volumeMounts and PYTHONPATH
    spec.executorSpec.podTemplateSpec.spec  volumes; the library initContainer; the Spark
                          container's volumeMounts and PYTHONPATH

Nothing is added to ``containers[]`` beyond the Spark container of a template that has none
(:func:`spark_container`).

Everything here is pure: plain dicts in, plain dicts out. Mutating an already-mutated app
changes nothing; fields the user set are kept; a user value that contradicts sparkguard's
(another job id, a different image under our container's name) is a :class:`Problem`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from sparkguard.operator import appmeta, errors, finalizers, podsecurity
from sparkguard.operator import config as config_
from sparkguard.spark_lib.base import errors as lib_errors
from sparkguard.spark_lib.spark import firstwrite, sparkconf, sparkversions

GROUP: Final = "sparkoperator.k8s.io"
VERSION: Final = "v1beta2"
PLURAL: Final = "sparkapplications"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AppKind:
    """One of the two SparkApplication kinds sparkguard admits: where its API lives.

    Everything else (options, validation, conf, the JVM layer, the owner, the finalizer) is
    shared; only where the containers, volumes and mounts go differs (:func:`mutate`).
    """

    name: str
    group: str
    version: str
    plural: str = PLURAL
    #: whether the operator watches this kind's apps and so can take the
    #: ``sparkguard.io/rollback`` finalizer off a deleted one; admission adds it only then (a
    #: finalizer nobody removes would hold every deletion, the operator's TTL's included)
    finalized: bool = True

    @property
    def api_version(self) -> str:
        """``group/version`` as in an object's ``apiVersion``."""
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        """The name of the CustomResourceDefinition."""
        return f"{self.plural}.{self.group}"


#: Kubeflow's spark-operator (``sparkoperator.k8s.io/v1beta2``)
KUBEFLOW: Final = AppKind(name="kubeflow", group=GROUP, version=VERSION)
#: the Apache Spark Kubernetes Operator (``spark.apache.org/v1``; v1alpha1/v1beta1 reach the
#: webhook converted to v1 under ``matchPolicy: Equivalent``)
APACHE: Final = AppKind(name="apache", group="spark.apache.org", version="v1")
KINDS: Final = (KUBEFLOW, APACHE)


def kind_of(app: Mapping[str, Any]) -> AppKind:
    """The kind of ``app`` by the group of its ``apiVersion`` (Kubeflow's when it has none).

    A purely computational function with no side-effects.
    """
    group = str(app.get("apiVersion") or "").partition("/")[0]
    return APACHE if group == APACHE.group else KUBEFLOW


CONF_JOB_ID: Final = "spark.sparkguard.jobId"
CONF_ATTEMPT: Final = "spark.sparkguard.attempt"
CONF_MARKERS_TYPE: Final = "spark.sparkguard.markers.type"
CONF_MARKERS_ENDPOINT: Final = "spark.sparkguard.markers.endpoint"
CONF_MARKERS_TOKEN_FILE: Final = "spark.sparkguard.markers.tokenFile"  # noqa: S105 - a key
CONF_JOURNAL: Final = "spark.sparkguard.journal"
CONF_OWNER: Final = "spark.sparkguard.owner"
#: the library's own keys (shared by the Python writer and the JVM layer)
CONF_PREFIX: Final = "spark.sparkguard."
#: substituted by the library with ``spark.driver.host`` at runtime: Spark's driver service is
#: headless, so executors reach the driver pod (and its sidecar) on any port
DRIVER_HOST_PLACEHOLDER: Final = "{driverHost}"

SIDECAR_NAME: Final = "sparkguard-markers"
LIB_INIT_NAME: Final = "sparkguard-lib"
ROLLBACK_INIT_NAME: Final = "sparkguard-rollback"
LIB_VOLUME: Final = "sparkguard-lib"
TOKEN_VOLUME: Final = "sparkguard-token"  # noqa: S105 - a volume's name
LIB_DIR: Final = sparkconf.POD_LIB_DIR
TOKEN_DIR: Final = "/var/run/sparkguard/token"  # noqa: S105 - a mount path
#: the pod annotation holding an app's marker token (driver and executor pods), projected into
#: :data:`TOKEN_DIR` by a downward API volume; see docs/decisions.md
MARKER_TOKEN_ANNOTATION: Final = "sparkguard.io/marker-token"  # noqa: S105 - a key
#: the JVM layer's jar in the library volume, as Spark finds it in every pod (driver and
#: executors mount the volume); ``sparkguard spark-conf --for-pod`` prints the same location
JAR_URI: Final = sparkconf.POD_JAR_URI
#: the writable temp directory of every injected container (their root filesystem is read-only):
#: a subPath of the library volume, because spark-operator's pod webhook adds a volume to the
#: pod only when the Spark container mounts it; a dot name, which Python never imports from
#: the library's directory on PYTHONPATH
TMP_DIR: Final = "/tmp"  # noqa: S108 - the pod's own emptyDir, not a shared /tmp
TMP_SUBPATH: Final = ".tmp"
TMP_MOUNT: Final[Mapping[str, str]] = {
    "name": LIB_VOLUME,
    "mountPath": TMP_DIR,
    "subPath": TMP_SUBPATH,
}
#: the environment of every injected container: no bytecode next to the image's read-only
#: files, temp files in :data:`TMP_DIR` (HOME is never needed)
INJECTED_ENV: Final[tuple[Mapping[str, str], ...]] = (
    {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    {"name": "TMPDIR", "value": TMP_DIR},
)
#: what a regular (non-native) marker sidecar watches for in the shared process namespace: the
#: driver JVM's main class, present from spark-submit's script to the JVM's end
DRIVER_PROCESS_PATTERN: Final = "org.apache.spark.deploy.SparkSubmit"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Review:
    """The admission verdict on one request: allowed or not, and the merge patch to apply."""

    allowed: bool
    patch: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    problems: tuple[appmeta.Problem, ...] = ()
    #: the effective job id of an opted-in app that was allowed (for the duplicate check)
    job_id: str | None = None

    @property
    def message(self) -> str:
        """All problems in one line, each naming its annotation or field."""
        return "sparkguard: " + "; ".join(str(p) for p in self.problems) if self.problems else ""


def token_file(config: config_.OperatorConfig) -> str:
    """Where the marker sidecar's token is mounted in every pod."""
    return f"{TOKEN_DIR}/{config.sidecar_token_key}"


def marker_endpoint(config: config_.OperatorConfig) -> str:
    """The marker sidecar's URL as executors see it, before the library substitutes the host."""
    return f"http://{DRIVER_HOST_PLACEHOLDER}:{config.sidecar_port}"


def build_sidecar(
    options: appmeta.Options,
    *,
    config: config_.OperatorConfig,
    native: bool = False,
    pod_security: Mapping[str, Any] | None = None,
    data_mounts: Sequence[Any] = (),
) -> dict[str, Any]:
    """The marker sidecar container for the driver pod.

    A purely computational function with no side-effects. ``pod_security``: the driver pod's
    own securityContext (see :func:`harden`). ``data_mounts``: the driver container's own
    volume mounts (see :func:`add_data_mounts`). ``native``: as a Kubernetes native
    sidecar (an initContainer with ``restartPolicy: Always``, Kubernetes >= 1.29), which the
    kubelet stops once the driver container has ended, so the pod reaches Succeeded/Failed.
    It has no startupProbe: the driver starts as soon as the sidecar's process has, and the
    sidecar serves long before the driver's first marker (the JVM's start and Spark's set-up
    come first); a marker sent earlier meets a refused connection, which every marker client
    retries within its deadline, as with the regular sidecar, which never held the driver
    back (docs/decisions.md, "The native sidecar has no startup probe"). Otherwise, a regular
    container, it drains and exits once the driver's JVM is gone (``--exit-with-process``,
    which needs ``spec.driver.shareProcessNamespace``), so the pod still ends.
    """
    port = config.sidecar_port
    container: dict[str, Any] = {
        "name": SIDECAR_NAME,
        "image": config.image,
        "command": [
            "sparkguard",
            "sidecar",
            "--host",
            "0.0.0.0",  # noqa: S104 - executors connect from other pods
            "--port",
            str(port),
            "--batch-interval-ms",
            str(config.sidecar_batch_interval_ms),
            "--batch-threads",
            str(config.sidecar_batch_threads),
            "--token-file",
            token_file(config),
            "--allowed-roots",
            ",".join(config.sidecar_allowed_roots),
        ],
        "ports": [{"name": "markers", "containerPort": port, "protocol": "TCP"}],
        "resources": _resources(
            cpu_request=config.sidecar_cpu_request,
            memory_request=config.sidecar_memory_request,
            cpu_limit=config.sidecar_cpu_limit,
            memory_limit=config.sidecar_memory_limit,
        ),
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": port}, "periodSeconds": 2},
        "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}],
    }
    if not native:
        container["command"] += ["--exit-with-process", DRIVER_PROCESS_PATTERN]
    if native:
        container["restartPolicy"] = "Always"
    _add_storage_env(container, options)
    _add_pull_policy(container, config)
    harden(container, config=config, pod_security=pod_security)
    add_data_mounts(container, data_mounts)
    return container


def build_lib_init(
    *, config: config_.OperatorConfig, pod_security: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The initContainer that copies the library into the shared volume (driver and executors).

    A purely computational function with no side-effects. ``pod_security``: the pod's own
    securityContext (see :func:`harden`).
    """
    container: dict[str, Any] = {
        "name": LIB_INIT_NAME,
        "image": config.image,
        "command": ["sparkguard", "bundle", "--dest", LIB_DIR],
        "volumeMounts": [{"name": LIB_VOLUME, "mountPath": LIB_DIR}],
    }
    _add_init_resources(container, config)
    _add_pull_policy(container, config)
    harden(container, config=config, pod_security=pod_security)
    return container


def build_rollback_init(
    options: appmeta.Options,
    *,
    config: config_.OperatorConfig,
    owner: str | None = None,
    pod_security: Mapping[str, Any] | None = None,
    data_mounts: Sequence[Any] = (),
) -> dict[str, Any]:
    """The driver's initContainer that rolls back whatever an earlier attempt left uncommitted.

    A purely computational function with no side-effects. With ``owner`` (the app's
    ``sparkguard.io/owner``) only instants of that owner are rolled back. ``pod_security``:
    the driver pod's own securityContext (see :func:`harden`). ``data_mounts``: the driver
    container's own volume mounts (see :func:`add_data_mounts`).
    """
    container: dict[str, Any] = {
        "name": ROLLBACK_INIT_NAME,
        "image": config.image,
        "command": [
            "sparkguard",
            "rollback",
            "--job-id",
            options.job_id,
            "--journal",
            options.journal,
            # a first run finds no journal yet: nothing to roll back, not an error
            "--allow-missing-journal",
            *(["--owner", owner] if owner else []),
        ],
    }
    _add_init_resources(container, config)
    _add_storage_env(container, options)
    _add_pull_policy(container, config)
    harden(container, config=config, pod_security=pod_security)
    add_data_mounts(container, data_mounts)
    return container


def add_data_mounts(container: dict[str, Any], data_mounts: Sequence[Any]) -> None:
    """Give ``container`` the driver container's own volume mounts ``data_mounts``, less
    sparkguard's volumes and any path the container mounts already.

    A purely computational function with no side-effects beyond ``container``. In a pod each
    container sees only the volumes mounted into it: a table or a journal on a volume of the
    app (a PersistentVolumeClaim, an NFS share) is where the driver mounts it, and the rollback
    initContainer and the marker sidecar must find it at the same path; without it the rollback
    finds no journal and rolls nothing back.
    """
    mounts = _list_at(container, "volumeMounts")
    taken = {m.get("mountPath") for m in mounts if isinstance(m, Mapping)}
    for mount in data_mounts:
        if (
            isinstance(mount, Mapping)
            and mount.get("name") not in (LIB_VOLUME, TOKEN_VOLUME)
            and isinstance(mount.get("mountPath"), str)
            and mount["mountPath"] not in taken
        ):
            mounts.append(copy.deepcopy(dict(mount)))
            taken.add(mount["mountPath"])


def harden(
    container: dict[str, Any],
    *,
    config: config_.OperatorConfig,
    pod_security: Mapping[str, Any] | None = None,
) -> None:
    """Make an injected ``container`` run under Pod Security "restricted" with a read-only root.

    A purely computational function with no side-effects beyond ``container``. It gets the
    configured securityContext less what the pod's own securityContext ``pod_security`` (the
    app's) decides (:func:`podsecurity.for_pod`), the temp directory :data:`TMP_MOUNT` and
    :data:`INJECTED_ENV`. No fixed user: the image runs as any non-root UID in group 0.
    """
    context = podsecurity.for_pod(config.injected_security_context, pod_security)
    if context:
        container["securityContext"] = context
    _list_at(container, "env").extend(dict(e) for e in INJECTED_ENV)
    _list_at(container, "volumeMounts").append(dict(TMP_MOUNT))


def _resources(
    *,
    cpu_request: str | None,
    memory_request: str | None,
    cpu_limit: str | None,
    memory_limit: str | None,
) -> dict[str, dict[str, str]]:
    """A container's ``resources`` with the quantities that are set."""
    requests = {"cpu": cpu_request, "memory": memory_request}
    limits = {"cpu": cpu_limit, "memory": memory_limit}
    resources = {
        "requests": {k: v for k, v in requests.items() if v},
        "limits": {k: v for k, v in limits.items() if v},
    }
    return {k: v for k, v in resources.items() if v}


def _add_init_resources(container: dict[str, Any], config: config_.OperatorConfig) -> None:
    resources = _resources(
        cpu_request=config.init_cpu_request,
        memory_request=config.init_memory_request,
        cpu_limit=config.init_cpu_limit,
        memory_limit=config.init_memory_limit,
    )
    if resources:
        container["resources"] = resources


def _add_storage_env(container: dict[str, Any], options: appmeta.Options) -> None:
    if options.storage_secret:
        container["envFrom"] = [{"secretRef": {"name": options.storage_secret}}]


def _add_pull_policy(container: dict[str, Any], config: config_.OperatorConfig) -> None:
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy


def build_conf(
    options: appmeta.Options, *, config: config_.OperatorConfig, owner: str | None = None
) -> dict[str, str]:
    """The ``spark.sparkguard.*`` entries sparkguard puts in ``spec.sparkConf`` (attempt 0).

    A purely computational function with no side-effects.
    """
    conf = {
        CONF_JOB_ID: options.job_id,
        CONF_ATTEMPT: "0",
        CONF_MARKERS_TYPE: options.marker_type.conf_value,
        CONF_JOURNAL: options.journal,
    }
    if owner:
        conf[CONF_OWNER] = owner
    if options.marker_type is appmeta.MarkerType.TIMELINE_SERVER:
        conf[CONF_MARKERS_ENDPOINT] = marker_endpoint(config)
        conf[CONF_MARKERS_TOKEN_FILE] = token_file(config)
    return conf


#: how :func:`sparkconf.build_spark_conf` errors name its parameters: by what sets each here
_JVM_CONF_NAMES: Final[Mapping[str, str]] = {
    **sparkconf.PARAMETER_NAMES,
    "job_id": appmeta.JOB_ID,
    "owner": appmeta.OWNER_ANNOTATION,
    "markers": appmeta.MARKER_TYPE,
    "endpoint": f"the marker sidecar's endpoint ({config_.variable_of('sidecar_port')})",
    "token_file": f"the marker token's file ({config_.variable_of('sidecar_token_key')})",
    "journal": appmeta.JOURNAL,
    "jar": "the JVM layer's jar",
}


#: where each kind of app names its Spark version (the field, and its path under ``spec``)
SPARK_VERSION_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    KUBEFLOW.name: ("sparkVersion",),
    APACHE.name: ("runtimeVersions", "sparkVersion"),
}


def spark_version_of(spec: Mapping[str, Any], *, kind: AppKind) -> tuple[str, str | None]:
    """The field that names the Spark version of an app of ``kind`` (``spec.sparkVersion`` for
    Kubeflow, ``spec.runtimeVersions.sparkVersion`` for Apache) and its value in ``spec``
    (None when unset).

    A purely computational function with no side-effects.
    """
    path = SPARK_VERSION_FIELDS[kind.name]
    value: Any = spec
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return "spec." + ".".join(path), None if value is None else str(value)


def build_jvm_conf(
    options: appmeta.Options,
    *,
    config: config_.OperatorConfig,
    owner: str | None = None,
    spark_version: tuple[str, str | None] | None = None,
) -> dict[str, str]:
    """The Spark conf of the JVM layer for this app: :func:`sparkconf.build_spark_conf` with
    the settings :func:`build_conf` gives the Python writer, and the bundle's jar
    (:data:`JAR_URI`), for the app's Spark (``spark_version``: the field that names it and its
    value, see :func:`spark_version_of`; unset: the conf for the newest lines).

    A purely computational function with no side-effects. Whatever ``build_spark_conf``
    returns is injected (its ``spark.jars`` merged, see :func:`mutate`), so a key added there
    reaches every opted-in app. Raises :class:`errors.InvalidApplicationError` naming the
    annotation when ``build_spark_conf`` refuses a value, and the version field when the
    app's Spark is not supported.
    """
    timeline_server = options.marker_type is appmeta.MarkerType.TIMELINE_SERVER
    markers = sparkconf.MarkerMode.SIDECAR if timeline_server else sparkconf.MarkerMode.DIRECT
    field, version = spark_version if spark_version is not None else ("", None)
    try:
        return sparkconf.build_spark_conf(
            options.job_id,
            owner=owner,
            markers=markers,
            endpoint=marker_endpoint(config) if timeline_server else None,
            token_file=token_file(config) if timeline_server else None,
            journal=options.journal,
            jar=JAR_URI,
            spark_version=version,
            names={**_JVM_CONF_NAMES, "spark_version": field},
        )
    except sparkversions.UnsupportedSparkError:
        supported = ", ".join(sparkversions.SUPPORTED_LINES)
        raise errors.InvalidApplicationError(
            [
                appmeta.Problem(
                    field,
                    f"is {appmeta.shown(str(version))}, a Spark sparkguard's JVM layer does not "
                    f"support (supported: Spark {supported}): run the app on a supported Spark, "
                    f'or set {appmeta.JVM_LAYER}: "false"',
                )
            ]
        ) from None
    except lib_errors.ConfigError as exc:
        raise errors.InvalidApplicationError(
            [appmeta.Problem(appmeta.JVM_LAYER, f"cannot be enabled: {exc}")]
        ) from None


#: conf keys that follow annotations: a different user value is a conflict, not a preference
_STRICT_CONF: Final = {
    CONF_JOB_ID: appmeta.JOB_ID,
    CONF_MARKERS_TYPE: appmeta.MARKER_TYPE,
    CONF_JOURNAL: appmeta.JOURNAL,
}


def mutate(
    app: Mapping[str, Any],
    *,
    config: config_.OperatorConfig,
    native_sidecar: bool = False,
    marker_token: str | None = None,
) -> dict[str, Any]:
    """A copy of ``app`` with everything sparkguard needs added (or an unchanged copy).

    A purely computational function with no side-effects. Apps that did not opt in come back
    unchanged. Raises :class:`errors.InvalidApplicationError` listing every bad annotation or
    conflicting field. ``mutate(mutate(app)) == mutate(app)``. The owner comes from the
    ``sparkguard.io/owner`` annotation (written by :func:`review` at CREATE): it is set in
    ``spark.sparkguard.owner`` and the rollback initContainer's ``--owner``, overwriting any
    other value there. ``native_sidecar`` puts a new marker sidecar among the driver's
    initContainers (a sidecar of ours already in either list stays where it is).
    ``marker_token``: the app's marker token when its driver pod has none yet (kept otherwise),
    copied to its executor pods (:func:`_share_marker_token`).
    """
    result = copy.deepcopy(dict(app))
    parsed = appmeta.parse(result, config=config)
    if not parsed.enabled:
        return result
    if parsed.options is None:
        raise errors.InvalidApplicationError(parsed.problems)
    options = parsed.options
    problems: list[appmeta.Problem] = []

    meta = _dict_at(result, "metadata")
    meta_annotations = _dict_at(meta, "annotations")
    meta_annotations.setdefault(appmeta.JOB_ID, options.job_id)
    # ours alone, always rewritten: admission finds the other holders of a job id by it
    _dict_at(meta, "labels")[appmeta.JOB_ID_LABEL] = appmeta.job_id_label(options.job_id)
    owner = appmeta.storage_owner(meta)

    spec = _dict_at(result, "spec")
    conf = _dict_at(spec, "sparkConf")
    _ensure_conf(conf, build_conf(options, config=config, owner=owner), problems)
    if owner:
        conf[CONF_OWNER] = owner  # ours alone: a copied manifest's stale owner is replaced
    kind = kind_of(result)
    _apply_jvm_layer(spec, options, kind=kind, config=config, owner=owner, problems=problems)

    timeline_server = options.marker_type is appmeta.MarkerType.TIMELINE_SERVER
    volumes = [{"name": LIB_VOLUME, "emptyDir": {}}]
    if timeline_server:
        _share_marker_token(spec, kind=kind, fresh=marker_token)
        volumes.append(build_token_volume(config))
    mounts = [{"name": LIB_VOLUME, "mountPath": LIB_DIR, "readOnly": True}]
    if timeline_server:
        mounts.append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})

    placement = _place_apache if kind is APACHE else _place_kubeflow
    placement(
        spec,
        options,
        config=config,
        owner=owner,
        volumes=volumes,
        mounts=mounts,
        native_sidecar=native_sidecar,
        problems=problems,
    )

    if problems:
        raise errors.InvalidApplicationError(problems)
    return result


def build_token_volume(config: config_.OperatorConfig) -> dict[str, Any]:
    """The volume that makes a pod's :data:`MARKER_TOKEN_ANNOTATION` its marker token file.

    A purely computational function with no side-effects. A downward API volume needs nothing
    else to exist, so it never holds a pod in ContainerCreating (a Secret volume waits for its
    Secret); without the annotation the file is empty and the sidecar says so at its start.
    """
    field = f"metadata.annotations['{MARKER_TOKEN_ANNOTATION}']"
    return {
        "name": TOKEN_VOLUME,
        "downwardAPI": {
            "items": [{"path": config.sidecar_token_key, "fieldRef": {"fieldPath": field}}]
        },
    }


def pod_annotations(spec: dict[str, Any], role: str, *, kind: AppKind) -> dict[str, Any]:
    """Where the annotations of an app's ``role`` pods live in its spec (created if missing):
    ``spec.<role>.annotations`` (Kubeflow) or the pod template's metadata (Apache)."""
    if kind is APACHE:
        template = _dict_at(_dict_at(spec, f"{role}Spec"), "podTemplateSpec")
        return _dict_at(_dict_at(template, "metadata"), "annotations")
    return _dict_at(_dict_at(spec, role), "annotations")


def marker_token_of(app: Mapping[str, Any]) -> str | None:
    """The marker token an app's driver pods get, or ``None``.

    A purely computational function with no side-effects.
    """
    spec = copy.deepcopy(dict(app.get("spec") or {}))
    token = pod_annotations(spec, "driver", kind=kind_of(app)).get(MARKER_TOKEN_ANNOTATION)
    return str(token) if token else None


def _has_token_volume(app: Mapping[str, Any]) -> bool:
    """Whether ``app`` already mounts a marker token volume (of either kind)."""
    spec = copy.deepcopy(dict(app.get("spec") or {}))
    if kind_of(app) is APACHE:
        pod = _dict_at(_dict_at(_dict_at(spec, "driverSpec"), "podTemplateSpec"), "spec")
        volumes = pod.get("volumes")
    else:
        volumes = spec.get("volumes")
    return any(isinstance(v, Mapping) and v.get("name") == TOKEN_VOLUME for v in volumes or ())


def _share_marker_token(spec: dict[str, Any], *, kind: AppKind, fresh: str | None) -> None:
    """The driver pod's marker token (``fresh`` when it has none) on the executor pods too:
    ours alone, always rewritten, so every pod of the app holds the same token."""
    token = marker_token_of({"apiVersion": kind.api_version, "spec": spec}) or fresh
    if token:  # else nothing to share (an app mutated outside admission): no empty maps
        pod_annotations(spec, "driver", kind=kind).setdefault(MARKER_TOKEN_ANNOTATION, token)
        pod_annotations(spec, "executor", kind=kind)[MARKER_TOKEN_ANNOTATION] = token


def _place_kubeflow(
    spec: dict[str, Any],
    options: appmeta.Options,
    *,
    config: config_.OperatorConfig,
    owner: str | None,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    native_sidecar: bool,
    problems: list[appmeta.Problem],
) -> None:
    """Kubeflow's places: ``spec.volumes``, ``spec.{driver,executor}`` (initContainers,
    volumeMounts, env: spark-operator's pod webhook copies them onto the pods), the marker
    sidecar in ``spec.driver.sidecars`` or (native) ``spec.driver.initContainers``."""
    timeline_server = options.marker_type is appmeta.MarkerType.TIMELINE_SERVER
    for volume in volumes:
        _ensure_named(
            spec, "volumes", volume, field="spec.volumes", compare=_same_volume, problems=problems
        )
    for role in ("driver", "executor"):
        pod = _dict_at(spec, role)
        _ensure_named(
            pod,
            "initContainers",
            build_lib_init(config=config, pod_security=kubeflow_pod_security(pod)),
            field=f"spec.{role}.initContainers",
            compare=_same_image,
            problems=problems,
            fill_in=True,
        )
        for mount in mounts:
            _ensure_mount(pod, mount, field=f"spec.{role}.volumeMounts", problems=problems)
        _ensure_pythonpath(pod, field=f"spec.{role}", problems=problems)

    driver = _dict_at(spec, "driver")
    pod_security = kubeflow_pod_security(driver)
    data_mounts = list(driver.get("volumeMounts") or [])
    _ensure_named(
        driver,
        "initContainers",
        build_rollback_init(
            options, config=config, owner=owner, pod_security=pod_security, data_mounts=data_mounts
        ),
        field="spec.driver.initContainers",
        compare=_same_image,
        problems=problems,
        ours=("command",),  # its arguments follow the annotations and the owner
        fill_in=True,
    )
    if timeline_server:
        in_list = _sidecar_list(driver, native=native_sidecar)
        sidecar = build_sidecar(
            options,
            config=config,
            native=in_list == "initContainers",
            pod_security=pod_security,
            data_mounts=data_mounts,
        )
        _ensure_named(
            driver,
            in_list,
            sidecar,
            field=f"spec.driver.{in_list}",
            compare=_same_image,
            problems=problems,
            fill_in=True,
        )
        if in_list == "sidecars":  # a regular sidecar sees the driver end only so
            _ensure_shared_processes(driver, problems)


def kubeflow_pod_security(role_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The securityContext of a Kubeflow app's driver or executor pod, from ``spec.driver`` or
    ``spec.executor``: ``podSecurityContext`` (spark-operator's pod webhook puts it on the pod,
    ``addPodSecurityContext``), else the one of its pod ``template`` (spark-submit's pod
    template file), else ``None``.

    A purely computational function with no side-effects.
    """
    context = role_spec.get("podSecurityContext")
    if isinstance(context, Mapping):
        return context
    template = role_spec.get("template")
    pod = template.get("spec") if isinstance(template, Mapping) else None
    context = pod.get("securityContext") if isinstance(pod, Mapping) else None
    return context if isinstance(context, Mapping) else None


#: Spark's names of its own container when a pod template has none (Spark's
#: ``Constants.DEFAULT_DRIVER_CONTAINER_NAME`` / ``DEFAULT_EXECUTOR_CONTAINER_NAME``)
SPARK_CONTAINER_NAMES: Final[Mapping[str, str]] = {
    "driver": "spark-kubernetes-driver",
    "executor": "spark-kubernetes-executor",
}
#: the Spark conf that names the template's Spark container, per role
TEMPLATE_CONTAINER_CONF: Final[Mapping[str, str]] = {
    role: f"spark.kubernetes.{role}.podTemplateContainerName" for role in ("driver", "executor")
}


def spark_container(
    pod: dict[str, Any], role: str, conf: Mapping[str, Any]
) -> tuple[dict[str, Any], int]:
    """The container of a pod template that Spark makes its own, and its index.

    A purely computational function with no side-effects beyond ``pod``. Spark's rule
    (``KubernetesUtils.selectSparkContainer``): the one container named by
    ``spark.kubernetes.<role>.podTemplateContainerName``, else the first. A template without
    containers gets one that carries only sparkguard's mounts and env, named as Spark names its
    own (or as that conf says): Spark takes it as its container and fills in the rest (image,
    command, resources); it is never a second container.
    """
    containers = _list_at(pod, "containers")
    wanted = conf.get(TEMPLATE_CONTAINER_CONF[role])
    named = [i for i, c in enumerate(containers) if isinstance(c, dict) and c.get("name") == wanted]
    if wanted and len(named) == 1:
        return containers[named[0]], named[0]
    if containers and isinstance(containers[0], dict):
        return containers[0], 0
    if not containers:
        containers.append({"name": str(wanted or SPARK_CONTAINER_NAMES[role])})
        return containers[0], 0
    raise AssertionError("unreachable: a schema-valid template holds objects")  # pragma: no cover


def apache_restart_config(options: appmeta.Options) -> dict[str, Any]:
    """The ``applicationTolerations.restartConfig`` an Apache app gets when it has none.

    A purely computational function with no side-effects. The Apache operator restarts a
    failed attempt itself (a new driver pod, whose rollback initContainer cleans the dead
    attempt first): ``OnFailure``, ``max-retries`` restarts, and a **fixed** wait of
    ``backoff`` between them (the operator has no exponential backoff: ``backoff-max`` does not
    apply). ``maxRestartOnFailure`` and ``restartCounterResetMillis`` stay unset, so the budget
    is exactly ``max-retries`` restarts.
    """
    return {
        "restartPolicy": "OnFailure",
        "maxRestartAttempts": options.max_retries,
        "restartBackoffMillis": round(options.backoff * 1000),
    }


def _place_apache(
    spec: dict[str, Any],
    options: appmeta.Options,
    *,
    config: config_.OperatorConfig,
    owner: str | None,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    native_sidecar: bool,  # always native here: the CRD keeps restartPolicy
    problems: list[appmeta.Problem],
) -> None:
    """The Apache operator's places: ``spec.{driverSpec,executorSpec}.podTemplateSpec.spec``,
    which become Spark's pod template files (volumes, initContainers, the Spark container's
    mounts and PYTHONPATH); the marker sidecar is always native (an initContainer with
    ``restartPolicy: Always``): nothing is ever added to ``containers[]`` (Spark takes the
    first template container as its own, and every other one counts as a main container)."""
    conf = _dict_at(spec, "sparkConf")
    tolerations = _dict_at(spec, "applicationTolerations")
    if not tolerations.get("restartConfig"):
        tolerations["restartConfig"] = apache_restart_config(options)
    for role in ("driver", "executor"):
        prefix = f"spec.{role}Spec.podTemplateSpec.spec"
        pod = _dict_at(_dict_at(_dict_at(spec, f"{role}Spec"), "podTemplateSpec"), "spec")
        for volume in volumes:
            _ensure_named(
                pod,
                "volumes",
                volume,
                field=f"{prefix}.volumes",
                compare=_same_volume,
                problems=problems,
            )
        security = pod.get("securityContext")
        pod_security = security if isinstance(security, Mapping) else None
        _ensure_named(
            pod,
            "initContainers",
            build_lib_init(config=config, pod_security=pod_security),
            field=f"{prefix}.initContainers",
            compare=_same_image,
            problems=problems,
            fill_in=True,
        )
        container, index = spark_container(pod, role, conf)
        where = f"{prefix}.containers[{index}]"
        for mount in mounts:
            _ensure_mount(container, mount, field=f"{where}.volumeMounts", problems=problems)
        _ensure_pythonpath(container, field=where, problems=problems)
        if role == "driver":
            data_mounts = list(container.get("volumeMounts") or [])
            _ensure_named(
                pod,
                "initContainers",
                build_rollback_init(
                    options,
                    config=config,
                    owner=owner,
                    pod_security=pod_security,
                    data_mounts=data_mounts,
                ),
                field=f"{prefix}.initContainers",
                compare=_same_image,
                problems=problems,
                ours=("command",),
                fill_in=True,
            )
            if options.marker_type is appmeta.MarkerType.TIMELINE_SERVER:
                _ensure_named(
                    pod,
                    "initContainers",
                    build_sidecar(
                        options,
                        config=config,
                        native=True,
                        pod_security=pod_security,
                        data_mounts=data_mounts,
                    ),
                    field=f"{prefix}.initContainers",
                    compare=_same_image,
                    problems=problems,
                    ours=("restartPolicy",),  # among initContainers only native can work
                    fill_in=True,
                )


def build_patch(
    app: Mapping[str, Any], *, config: config_.OperatorConfig, native_sidecar: bool = False
) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``app`` into ``mutate(app)``.

    A purely computational function with no side-effects. Empty when there is nothing to add,
    in particular for an already-mutated app. Lists appear whole, as merge patches require.
    """
    return merge_diff(app, mutate(app, config=config, native_sidecar=native_sidecar))


def review(
    app: Mapping[str, Any],
    *,
    old: Mapping[str, Any] | None,
    config: config_.OperatorConfig,
    owner_id: str,
    native_sidecar: bool = False,
    keep_owner: bool = False,
    marker_token: str | None = None,
) -> Review:
    """Decide an admission request for ``app`` (``old`` is the stored object on UPDATE).

    A purely computational function with no side-effects. Bad annotations are denied, except
    on an UPDATE that leaves sparkguard's annotations as they were: an app stored while the
    webhook was down must stay editable (the operator marks it Invalid instead).

    The owner: at CREATE an opted-in app gets ``sparkguard.io/owner`` =
    ``k8s:<namespace>/<name>/<owner_id>`` (``owner_id`` fresh and random per request; a value
    the manifest brought along, e.g. copied from another app, is replaced, with a warning). On
    UPDATE it is immutable: dropped (a ``kubectl replace`` from the original manifest) it is
    restored; changed or added it is denied.

    The finalizer ``sparkguard.io/rollback`` is added to an opted-in app at CREATE, and at an
    UPDATE of an app that did not have it (:func:`finalizers.admission_adds`): never twice,
    never to an app being deleted, never again after it was removed; and only to the kinds
    whose deleted apps the operator handles (:attr:`AppKind.finalized`).

    ``keep_owner``: a CREATE that keeps the owner it carries, for the recreation of an Apache
    app the operator resubmits (:mod:`admission` checks its resubmission record first).

    ``marker_token``: a fresh random token (one per request), which an app that has none gets
    as its marker token; on UPDATE the stored app's token is kept (restored when the change
    dropped it), so running pods and new ones agree.
    """
    prepared = copy.deepcopy(dict(app))
    notes: list[appmeta.Problem] = []
    if appmeta.opted_in(prepared):
        meta = _dict_at(prepared, "metadata")
        annotations = _dict_at(meta, "annotations")
        now = appmeta.storage_owner(meta)
        if old is None and keep_owner and now is not None:
            pass  # a resubmission's recreation (its record vouches for the owner it carries)
        elif old is None:
            fresh = appmeta.new_owner(
                namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or meta.get("generateName") or ""),
                unique=owner_id,
            )
            annotations[appmeta.OWNER_ANNOTATION] = fresh
            if now is not None:
                notes.append(
                    appmeta.Problem(
                        appmeta.OWNER_ANNOTATION,
                        f"was {appmeta.shown(now)}; sparkguard writes it at creation, so this "
                        "new app got its own owner",
                    )
                )
        else:
            before = appmeta.storage_owner(old.get("metadata") or {})
            if now is None and before is not None:
                annotations[appmeta.OWNER_ANNOTATION] = before  # restored: it never changes
            elif now != before:
                was = appmeta.shown(before) if before else "not set"
                return Review(
                    allowed=False,
                    problems=(
                        appmeta.Problem(
                            appmeta.OWNER_ANNOTATION,
                            f"is {appmeta.shown(str(now))} but was {was}; sparkguard writes it "
                            "once, at creation: remove it from your change",
                        ),
                    ),
                )
    kept = marker_token_of(old) if old is not None else None
    if old is not None and not kept and _has_token_volume(old):
        # admitted by a sparkguard that mounted a Secret: a token now would change the spec
        # (spark-operator reruns an app whose spec changes) for nothing
        marker_token = None
    try:
        mutated = mutate(
            prepared,
            config=config,
            native_sidecar=native_sidecar,
            marker_token=kept or marker_token,
        )
    except errors.InvalidApplicationError as exc:
        if old is not None and _options_of(old) == _options_of(app):
            return Review(allowed=True, problems=exc.problems)
        return Review(allowed=False, problems=exc.problems)
    job_id = None
    if appmeta.opted_in(mutated):
        job_id = appmeta.of(mutated).get(appmeta.JOB_ID)
        if kind_of(mutated).finalized and finalizers.admission_adds(mutated, old=old):
            # The deleted app is rolled back first (see finalizers); deduplicated, others kept.
            meta = _dict_at(mutated, "metadata")
            meta["finalizers"] = finalizers.with_finalizer(finalizers.finalizers_of(mutated))
    return Review(
        allowed=True, patch=merge_diff(app, mutated), problems=tuple(notes), job_id=job_id
    )


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns ``old`` into ``new`` (``None`` removes a key).

    A purely computational function with no side-effects.
    """
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_diff(before, value)
            if nested:
                patch[key] = nested
        elif key not in old or before != value:
            patch[key] = copy.deepcopy(value)
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def apply_merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` with the JSON merge patch ``patch`` applied (a copy).

    A purely computational function with no side-effects.
    """
    result = copy.deepcopy(dict(target))
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            current = result.get(key)
            result[key] = apply_merge_patch(current if isinstance(current, Mapping) else {}, value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _options_of(app: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in appmeta.of(app).items() if k in appmeta.OPTION_KEYS}


def _ensure_conf(
    conf: dict[str, Any], ours: Mapping[str, str], problems: list[appmeta.Problem]
) -> None:
    for key, value in ours.items():
        current = conf.get(key)
        if current is None:
            conf[key] = value
        elif key in _STRICT_CONF and current != value:
            problems.append(
                appmeta.Problem(
                    f"spec.sparkConf[{key}]",
                    f"is {current!r} but {_STRICT_CONF[key]} makes it {value!r}; remove the "
                    "sparkConf entry or change the annotation",
                )
            )
        elif key == CONF_ATTEMPT and not (isinstance(current, str) and current.isdigit()):
            problems.append(
                appmeta.Problem(
                    f"spec.sparkConf[{key}]",
                    f"is {current!r}; remove it (sparkguard counts attempts from 0)",
                )
            )


def _apply_jvm_layer(
    spec: dict[str, Any],
    options: appmeta.Options,
    *,
    kind: AppKind,
    config: config_.OperatorConfig,
    owner: str | None,
    problems: list[appmeta.Problem],
) -> None:
    """The JVM layer in ``spec.sparkConf``: added, or (opted out) taken out again."""
    conf = _dict_at(spec, "sparkConf")
    try:
        jvm_conf = build_jvm_conf(
            options, config=config, owner=owner, spark_version=spark_version_of(spec, kind=kind)
        )
    except errors.InvalidApplicationError as exc:
        if options.jvm_layer:
            problems.extend(exc.problems)
        return
    if options.jvm_layer:
        _ensure_jvm_layer(spec, conf, jvm_conf, problems, kind=kind)
        problems.extend(first_write_problems(conf, options))
    else:
        _remove_jvm_layer(spec, conf, jvm_conf, kind=kind)


def first_write_problems(
    conf: Mapping[str, Any], options: appmeta.Options
) -> list[appmeta.Problem]:
    """What the JVM layer would refuse at the app's first write, with its own messages
    (:mod:`sparkguard.spark_lib.spark.firstwrite`: one rules file for both), so the app is
    refused at admission instead of failing every attempt. The app's tables are taken to be
    on its journal's store (the only store admission knows).

    A purely computational function with no side-effects.
    """
    scheme = urlsplit(options.journal).scheme or "file"
    strings = {str(k): str(v) for k, v in conf.items()}
    return [
        appmeta.Problem(f"spec.sparkConf[{refusal.key}]", refusal.message)
        for refusal in firstwrite.refusals(
            strings, store=options.journal, where=f"a table on {scheme}:// (as the journal)"
        )
    ]


def _ensure_jvm_layer(
    spec: dict[str, Any],
    conf: dict[str, Any],
    jvm_conf: Mapping[str, str],
    problems: list[appmeta.Problem],
    *,
    kind: AppKind,
) -> None:
    """Add the JVM layer's conf: our jar appended to the user's jars, our extension classes
    where the user chose none (another choice is a conflict), ``spark.sparkguard.*`` as
    :func:`_ensure_conf` left them (user values of endpoint/token file kept)."""
    for key, value in jvm_conf.items():
        current = conf.get(key)
        if key == sparkconf.JARS_KEY:
            if current is None and kind is APACHE:
                # the Apache operator sets spark.jars to spec.jars only if sparkConf has none
                # (SparkAppSubmissionWorker.buildDriverConf): keep the app's jar in it
                current = _apache_primary_jars(spec)
            conf[key] = sparkconf.append_jar(None if current is None else str(current), value)
            # spark-operator passes spec.deps.jars as spark-submit's --jars, which replaces a
            # spark.jars given with --conf: with deps.jars set, ours must be in there too
            deps = spec.get("deps")
            jars = deps.get("jars") if isinstance(deps, dict) else None
            if isinstance(jars, list) and jars and value not in jars:
                jars.append(value)
        elif current is None:
            conf[key] = value
        elif key.startswith(CONF_PREFIX):
            continue  # shared with the Python writer: build_conf's rules apply
        elif current != value:
            problems.append(
                appmeta.Problem(
                    f"spec.sparkConf[{key}]",
                    f"is {appmeta.shown(str(current))} but sparkguard's JVM layer sets it to "
                    f"{value!r} (exactly-once writes without code change); remove the entry, or "
                    f'set {appmeta.JVM_LAYER}: "false" to keep yours (then Spark\'s own writes '
                    "are not protected, only the sparkguard writer's)",
                )
            )


def _apache_primary_jars(spec: Mapping[str, Any]) -> str | None:
    jars = spec.get("jars")
    return jars if isinstance(jars, str) and jars.strip() else None


def _remove_jvm_layer(
    spec: dict[str, Any], conf: dict[str, Any], jvm_conf: Mapping[str, str], *, kind: AppKind
) -> None:
    """Take out what :func:`_ensure_jvm_layer` added (an app that opted out after it was
    admitted): entries with exactly our values; user values stay."""
    for key, value in jvm_conf.items():
        current = conf.get(key)
        if key == sparkconf.JARS_KEY:
            if isinstance(current, str):
                entries = [e for e in current.split(",") if e.strip()]
                kept = [e for e in entries if e.strip() != value]
                if len(kept) != len(entries):
                    primary = _apache_primary_jars(spec) if kind is APACHE else None
                    if kept and ",".join(kept) != primary:
                        conf[key] = ",".join(kept)
                    else:
                        del conf[key]
            deps = spec.get("deps")
            jars = deps.get("jars") if isinstance(deps, dict) else None
            if isinstance(jars, list) and value in jars:
                jars.remove(value)
        elif not key.startswith(CONF_PREFIX) and current == value:
            del conf[key]


def _sidecar_list(driver: Mapping[str, Any], *, native: bool) -> str:
    """Where the marker sidecar goes: where it already is, else as ``native`` says."""
    for key in ("sidecars", "initContainers"):
        if any(
            isinstance(c, Mapping) and c.get("name") == SIDECAR_NAME for c in driver.get(key) or ()
        ):
            return key
    return "initContainers" if native else "sidecars"


def _ensure_shared_processes(driver: dict[str, Any], problems: list[appmeta.Problem]) -> None:
    if driver.setdefault("shareProcessNamespace", True) is not True:
        problems.append(
            appmeta.Problem(
                "spec.driver.shareProcessNamespace",
                f"is {driver['shareProcessNamespace']!r}; the marker sidecar, a regular container "
                "on this cluster, must see the driver's process to end with it: remove the field",
            )
        )


def _dict_at(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def _list_at(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key)
    if not isinstance(value, list):
        value = []
        parent[key] = value
    return value


def _same_image(existing: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    if existing.get("image") != ours["image"]:
        return (
            f"has image {existing.get('image')!r}, not sparkguard's {ours['image']!r}; "
            "rename your container or remove it"
        )
    return None


def _same_volume(existing: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    if existing.get("name") == TOKEN_VOLUME and "secret" in existing:
        return None  # an app admitted before the per-app token, still on its Secret: kept
    source_keys = {k for k in existing if k != "name"}
    ours_keys = {k for k in ours if k != "name"}
    if source_keys != ours_keys:
        return "is a different kind of volume than sparkguard's; rename your volume"
    return None


def _ensure_named(
    parent: dict[str, Any],
    key: str,
    item: dict[str, Any],
    *,
    field: str,
    compare: Any,
    problems: list[appmeta.Problem],
    ours: tuple[str, ...] = (),
    fill_in: bool = False,
) -> None:
    items = _list_at(parent, key)
    for existing in items:
        if isinstance(existing, dict) and existing.get("name") == item["name"]:
            complaint = compare(existing, item)
            if complaint:
                problems.append(appmeta.Problem(f"{field}[{item['name']}]", complaint))
                return
            # a matching user entry is respected as it is, except for the fields only we set
            for name in ours:
                existing[name] = copy.deepcopy(item[name])
            if ours:
                existing.pop("args", None)
            if fill_in:
                _fill_in(existing, item)
            return
    items.append(item)


def _fill_in(existing: dict[str, Any], ours: Mapping[str, Any]) -> None:
    """Give an existing entry of one of our containers what it lacks of ``ours`` (an app
    admitted by an older sparkguard, or written by hand): securityContext fields, resources,
    env entries by name, volume mounts by path. A value already there is never changed."""
    context = ours.get("securityContext")
    if context:
        current = existing.get("securityContext")
        if not isinstance(current, dict):
            current = existing["securityContext"] = {}
        for name, value in context.items():
            current.setdefault(name, copy.deepcopy(value))
    if "resources" in ours and not existing.get("resources"):
        existing["resources"] = copy.deepcopy(ours["resources"])
    for key, identity in (("env", "name"), ("volumeMounts", "mountPath")):
        if key not in ours:
            continue
        entries = _list_at(existing, key)
        present = {e.get(identity) for e in entries if isinstance(e, Mapping)}
        entries.extend(copy.deepcopy(e) for e in ours[key] if e[identity] not in present)


def _ensure_mount(
    pod: dict[str, Any],
    mount: dict[str, Any],
    *,
    field: str,
    problems: list[appmeta.Problem],
) -> None:
    mounts = _list_at(pod, "volumeMounts")
    for existing in mounts:
        if not isinstance(existing, Mapping):
            continue
        same_name = existing.get("name") == mount["name"]
        same_path = existing.get("mountPath") == mount["mountPath"]
        if same_name and same_path:
            return
        if same_name or same_path:
            problems.append(
                appmeta.Problem(
                    f"{field}[{existing.get('name')}]",
                    f"mounts {existing.get('name')!r} at {existing.get('mountPath')!r}; sparkguard "
                    f"needs {mount['name']!r} at {mount['mountPath']!r}: remove your mount",
                )
            )
            return
    mounts.append(mount)


def _ensure_pythonpath(pod: dict[str, Any], *, field: str, problems: list[appmeta.Problem]) -> None:
    """Append the library to PYTHONPATH, keeping whatever the user put there first."""
    env_vars = pod.get("envVars")
    if isinstance(env_vars, dict) and "PYTHONPATH" in env_vars:
        env_vars["PYTHONPATH"] = _append_path(str(env_vars["PYTHONPATH"]))
        return
    env = _list_at(pod, "env")
    for entry in env:
        if isinstance(entry, dict) and entry.get("name") == "PYTHONPATH":
            if "valueFrom" in entry:
                problems.append(
                    appmeta.Problem(
                        f"{field}.env[PYTHONPATH]",
                        "comes from valueFrom; write it as a value so sparkguard can append "
                        f"{LIB_DIR}",
                    )
                )
                return
            entry["value"] = _append_path(str(entry.get("value") or ""))
            return
    env.append({"name": "PYTHONPATH", "value": LIB_DIR})


def _append_path(value: str) -> str:
    parts = [p for p in value.split(":") if p]
    if LIB_DIR in parts:
        return value
    return ":".join([*parts, LIB_DIR])


@dataclasses.dataclass(frozen=True, kw_only=True)
class RollbackTarget:
    """What the operator's rollback of one app rolls back: its job, journal and storage owner."""

    job_id: str
    journal: str
    owner: str | None


def rollback_target(app: Mapping[str, Any], *, journal: str | None = None) -> RollbackTarget:
    """The job, journal and owner the operator rolls back for ``app`` (what its rollback
    initContainer is given, see :func:`build_rollback_init`), for a rollback run by hand
    (``sparkguard rollback --app``).

    A purely computational function with no side-effects. The options come from
    :func:`appmeta.parse`, as the operator reads them; the default journal
    (``<journal root>/<namespace>``) needs the operator's journal root, which is not on the
    app: it is taken from the ``spark.sparkguard.journal`` admission wrote into
    ``spec.sparkConf``. ``journal`` overrides the journal. Raises
    :class:`errors.InvalidApplicationError` naming what is missing.
    """
    meta = app.get("metadata") or {}
    if not appmeta.opted_in(app):
        raise errors.InvalidApplicationError(
            [appmeta.Problem(appmeta.ENABLED, "is not set: sparkguard never guarded this app")]
        )
    spec = app.get("spec")
    conf = spec.get("sparkConf") if isinstance(spec, Mapping) else None
    injected = str(conf.get(CONF_JOURNAL) or "") if isinstance(conf, Mapping) else ""
    suffix = f"/{meta.get('namespace')}"
    root = injected.removesuffix(suffix) if injected.endswith(suffix) else None
    if journal is None and root is None and appmeta.JOURNAL not in appmeta.of(app):
        raise errors.InvalidApplicationError(
            [
                appmeta.Problem(
                    f"spec.sparkConf[{CONF_JOURNAL}]",
                    f"is {'not set' if not injected else appmeta.shown(injected)} and the app "
                    f"has no {appmeta.JOURNAL}: sparkguard's admission never prepared it; give "
                    "--journal <the operator's journal root>/<namespace>",
                )
            ]
        )
    parsed = appmeta.parse(app, config=config_.OperatorConfig(journal_root=journal or root))
    if parsed.options is None:
        raise errors.InvalidApplicationError(parsed.problems)
    return RollbackTarget(
        job_id=parsed.options.job_id,
        journal=journal or parsed.options.journal,
        owner=appmeta.storage_owner(meta),
    )
