"""The driver and executor pods each operator has made from a SparkApplication, as the API server
receives them: for checks of what those pods carry (Pod Security admission of the containers
sparkguard injects, tests/operator/test_pod_security.py). Models of upstream; pods only, no
scheduling and no status (the stand-ins run them).

**Kubeflow's spark-operator** (``sparkoperator.k8s.io/v1beta2``; ``kubeflow-model.md`` §5).
spark-submit makes the driver pod, and the driver its executor pods, with Spark's container
only (:func:`spark_pod`); spark-operator's pod webhook then mutates each (WH
``internal/webhook/sparkpod_defaulter.go`` @v2.5.2, ``mutateSparkPod``). Modelled are the options
that shape containers, volumes and security, in upstream's order: ``addEnvVars``,
``addEnvFrom``, ``addVolumes`` (a volume of ``spec.volumes`` only when the Spark container
mounts it), ``addInitContainers``, ``addSidecarContainers`` (each appended unless one of the same
name and image is there), ``addContainerSecurityContext`` (replaces the Spark container's),
``addPodSecurityContext`` (replaces the pod's), ``addShareProcessNamespace`` (only when true).
The Spark container is the one named ``spark-kubernetes-driver`` / ``spark-kubernetes-executor``
/ ``executor``, else the first (``findContainer``).

**The Apache Spark Kubernetes Operator** (``spark.apache.org/v1``; ``apache-model.md``). Spark
builds each pod from the pod template of ``spec.driverSpec`` / ``spec.executorSpec``
(``podTemplateSpec``), its own container merged into the template container that
``spark.kubernetes.<role>.podTemplateContainerName`` names, else the first
(``KubernetesUtils.selectSparkContainer``; :func:`apache_template_pod`); for the driver pod the
operator then sets ``allowPrivilegeEscalation: false`` on every container that leaves it unset
(``SparkAppResourceSpecFactory.buildResourceSpec`` → ``SecurityContextDecorator``, v1.0.0).

Not modelled: what Spark adds that no Pod Security level looks at (env, ports, resources, the
driver's conf ConfigMap), and the webhook's other options (affinity, tolerations, GPU, …).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

#: Spark's names of its container (``Constants.DEFAULT_{DRIVER,EXECUTOR}_CONTAINER_NAME``)
SPARK_CONTAINERS: Final = {
    "driver": "spark-kubernetes-driver",
    "executor": "spark-kubernetes-executor",
}
#: what ``findContainer`` (WH) takes for the Spark container, by role
_WEBHOOK_SPARK_CONTAINERS: Final = {
    "driver": ("spark-kubernetes-driver",),
    "executor": ("spark-kubernetes-executor", "executor"),
}
#: Spark's scratch space (``LocalDirsFeatureStep``: an emptyDir per local dir)
LOCAL_DIR_VOLUME: Final = "spark-local-dir-1"


def spark_pod(role: str, *, name: str, namespace: str, image: str) -> dict[str, Any]:
    """A pod as Spark makes it (spark-submit the driver's, the driver its executors'), before
    any webhook: Spark's container, its local-dir emptyDir, ``restartPolicy: Never``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"spark-role": role}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": SPARK_CONTAINERS[role],
                    "image": image,
                    "volumeMounts": [{"name": LOCAL_DIR_VOLUME, "mountPath": "/var/data/spark"}],
                }
            ],
            "volumes": [{"name": LOCAL_DIR_VOLUME, "emptyDir": {}}],
        },
    }


def kubeflow_pod(app: Mapping[str, Any], role: str, *, name: str) -> dict[str, Any]:
    """The ``role`` pod (driver or executor) of a Kubeflow app after spark-operator's pod
    webhook (WH ``mutateSparkPod``, the options named in this module's docstring)."""
    spec = app["spec"]
    part: Mapping[str, Any] = spec.get(role) or {}
    image = str(part.get("image") or spec.get("image") or "spark")
    pod = spark_pod(role, name=name, namespace=app["metadata"]["namespace"], image=image)
    pod_spec = pod["spec"]
    containers: list[dict[str, Any]] = pod_spec["containers"]
    spark = _webhook_spark_container(containers, role)
    # addEnvVars, addEnvFrom
    spark.setdefault("env", []).extend(copy.deepcopy(part.get("env") or []))
    spark.setdefault("envFrom", []).extend(copy.deepcopy(part.get("envFrom") or []))
    # addVolumes: only volumes the Spark container mounts (not spark-local-dir-*), once each
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    added: set[str] = set()
    for mount in part.get("volumeMounts") or []:
        if mount["name"].startswith("spark-local-dir-") or mount["name"] not in volumes:
            continue
        if mount["name"] not in added:
            pod_spec["volumes"].append(copy.deepcopy(volumes[mount["name"]]))
            added.add(mount["name"])
        spark["volumeMounts"].append(copy.deepcopy(mount))
    # addInitContainers, addSidecarContainers: unless one of the same name and image is there
    for key, source in (("initContainers", "initContainers"), ("containers", "sidecars")):
        present = pod_spec.setdefault(key, [])
        for container in part.get(source) or []:
            if not any(
                (c["name"], c.get("image")) == (container["name"], container.get("image"))
                for c in present
            ):
                present.append(copy.deepcopy(container))
    # addContainerSecurityContext, addPodSecurityContext: replace, when the app sets one
    if part.get("securityContext") is not None:
        spark["securityContext"] = copy.deepcopy(part["securityContext"])
    if part.get("podSecurityContext") is not None:
        pod_spec["securityContext"] = copy.deepcopy(part["podSecurityContext"])
    # addShareProcessNamespace: only when true
    if part.get("shareProcessNamespace") is True:
        pod_spec["shareProcessNamespace"] = True
    return pod


def _webhook_spark_container(containers: list[dict[str, Any]], role: str) -> dict[str, Any]:
    for container in containers:
        if container.get("name") in _WEBHOOK_SPARK_CONTAINERS[role]:
            return container
    return containers[0]


def apache_template_pod(
    template: Mapping[str, Any], *, role: str, conf: Mapping[str, Any]
) -> tuple[dict[str, Any], int]:
    """The pod spec Spark builds from a pod template's spec for ``role``, and the index of its
    Spark container: the template container ``spark.kubernetes.<role>.podTemplateContainerName``
    names, else the first (a template without containers gets one), with Spark's name and the
    image of ``spark.kubernetes.container.image`` where the template sets none."""
    pod_spec = copy.deepcopy(dict(template))
    containers = list(pod_spec.get("containers") or [])
    named = conf.get(f"spark.kubernetes.{role}.podTemplateContainerName")
    index = next((i for i, c in enumerate(containers) if named and c.get("name") == named), 0)
    if not containers:
        containers = [{}]
    spark = dict(containers[index])
    spark.setdefault("name", SPARK_CONTAINERS[role])
    spark.setdefault("image", conf.get("spark.kubernetes.container.image", "apache/spark"))
    containers[index] = spark
    pod_spec["containers"] = containers
    return pod_spec, index


def apache_pod(app: Mapping[str, Any], role: str, *, name: str) -> dict[str, Any]:
    """The ``role`` pod of an Apache operator app: Spark's pod from the template
    (:func:`apache_template_pod`, with Spark's local-dir emptyDir), for the driver decorated
    by the operator (``SecurityContextDecorator``)."""
    spec = app["spec"]
    template = ((spec.get(f"{role}Spec") or {}).get("podTemplateSpec") or {}).get("spec") or {}
    pod_spec, index = apache_template_pod(template, role=role, conf=spec.get("sparkConf") or {})
    pod = spark_pod(role, name=name, namespace=app["metadata"]["namespace"], image="spark")
    spark = pod_spec["containers"][index]
    spark.setdefault("volumeMounts", []).extend(pod["spec"]["containers"][0]["volumeMounts"])
    pod_spec.setdefault("volumes", []).extend(pod["spec"]["volumes"])
    pod_spec.setdefault("restartPolicy", "Never")
    if role == "driver":
        for container in [*(pod_spec.get("initContainers") or []), *pod_spec["containers"]]:
            context = container.setdefault("securityContext", {})
            context.setdefault("allowPrivilegeEscalation", False)
    pod["spec"] = pod_spec
    return pod
