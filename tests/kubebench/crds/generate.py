"""Writes the bench's two SparkApplication CRDs: spark-operator 1.x and 2.x, both v1beta2.

    PYTHONSAFEPATH=1 .venv/bin/python tests/kubebench/crds/generate.py   # rewrites both files

Written field for field from upstream's generated CRDs (read through the code index; the
schemas below are ours, typed from those files, not copied):

- 1.x: ``kubeflow/spark-operator`` chart ``charts/spark-operator-chart/crds/
  sparkoperator.k8s.io_sparkapplications.yaml`` @3c96963d224c90cbc7c03e75612d66bbfe2cc2a5
  (the 1.x CRD the index holds; generated from ``pkg/apis/sparkoperator.k8s.io/v1beta2/
  types.go`` against a pre-1.28 Kubernetes API: no container ``restartPolicy``, no
  ``x-kubernetes-preserve-unknown-fields`` anywhere, so everything undeclared is pruned).
- 2.x: the same path @09f9894b6e8070e0ed0d122dc95f38fe17f26d19 (controller-gen v0.17.1, from
  ``api/v1beta2/sparkapplication_types.go``; the Kubernetes API of 1.32: containers have
  ``restartPolicy`` and ``resizePolicy``; ``driver.template``/``executor.template`` are the
  only preserve-unknown fields, from ``+kubebuilder:pruning:PreserveUnknownFields``).
  Its securityContext and podSecurityContext fields are typed from the v2.5.2 release's CRD
  (``../shared/upstream/kubeflow-spark-operator-v2.5.2.tar.gz``, same path; the core/v1 types
  of a 1.32+ API). The 1.x CRD's come from a Kubernetes API older than 1.19: **no
  seccompProfile** (and no appArmorProfile), so it prunes both.

The tests' check that the files match this script: tests/operator/test_crds.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

HERE: Final = Path(__file__).resolve().parent
OUT: Final = HERE / "sparkapplications"

SOURCES: Final = {
    "1.x": (
        "charts/spark-operator-chart/crds/sparkoperator.k8s.io_sparkapplications.yaml"
        " @3c96963d224c90cbc7c03e75612d66bbfe2cc2a5"
    ),
    "2.x": (
        "charts/spark-operator-chart/crds/sparkoperator.k8s.io_sparkapplications.yaml"
        " @09f9894b6e8070e0ed0d122dc95f38fe17f26d19 (controller-gen v0.17.1)"
    ),
}

LEFT_OUT: Final = """\
Left out (both versions), so an app using them loses them to pruning here, unlike upstream:
the inner schemas of spec.driver/executor affinity, tolerations, dnsConfig, hostAliases,
gpu, ports, lifecycle (pod level), the batchSchedulerOptions/monitoring/sparkUIOptions/
driverIngressOptions/dynamicAllocation objects, and every volume source except emptyDir,
downwardAPI, secret, configMap, hostPath and persistentVolumeClaim (each is declared `type: object`
without properties: its content is pruned). Descriptions are left out.
Relaxed on purpose: status.driverInfo is not required (upstream requires it; the Go
controller always writes it, the tests patch status without it).
"""

QUANTITY: Final[dict[str, Any]] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": (
        r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
        r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
    ),
    "x-kubernetes-int-or-string": True,
}
INT_OR_STRING: Final[dict[str, Any]] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-int-or-string": True,
}
STRING: Final = {"type": "string"}
BOOL: Final = {"type": "boolean"}
INT32: Final = {"type": "integer", "format": "int32"}
INT64: Final = {"type": "integer", "format": "int64"}
STRING_MAP: Final = {"type": "object", "additionalProperties": STRING}
#: declared, but its content is not modelled (pruned): see LEFT_OUT
OPAQUE: Final = {"type": "object"}


def obj(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    """An object schema with ``properties`` (sorted, as controller-gen writes them)."""
    schema: dict[str, Any] = {"type": "object", "properties": dict(sorted(properties.items()))}
    if required:
        schema["required"] = sorted(required)
    return schema


def array(items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **extra}


def strings() -> dict[str, Any]:
    return array(STRING)


def env_var(v2: bool) -> dict[str, Any]:
    key_ref = obj(("key",), key=STRING, name=STRING, optional=BOOL)
    return obj(
        ("name",),
        name=STRING,
        value=STRING,
        valueFrom=obj(
            configMapKeyRef=key_ref,
            fieldRef=obj(("fieldPath",), apiVersion=STRING, fieldPath=STRING),
            resourceFieldRef=obj(
                ("resource",), containerName=STRING, divisor=QUANTITY, resource=STRING
            ),
            secretKeyRef=key_ref,
        ),
    )


def env_from() -> dict[str, Any]:
    ref = obj(name=STRING, optional=BOOL)
    return obj(configMapRef=ref, prefix=STRING, secretRef=ref)


def volume_mount(v2: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "mountPath": STRING,
        "mountPropagation": STRING,
        "name": STRING,
        "readOnly": BOOL,
        "subPath": STRING,
        "subPathExpr": STRING,
    }
    if v2:
        fields["recursiveReadOnly"] = STRING
    return obj(("mountPath", "name"), **fields)


def handler(v2: bool, *, probe: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "exec": obj(command=strings()),
        "httpGet": obj(
            ("port",),
            host=STRING,
            httpHeaders=array(obj(("name", "value"), name=STRING, value=STRING)),
            path=STRING,
            port=INT_OR_STRING,
            scheme=STRING,
        ),
        "tcpSocket": obj(("port",), host=STRING, port=INT_OR_STRING),
    }
    if v2 and probe:
        fields["grpc"] = obj(("port",), port=INT32, service=STRING)
    if v2 and not probe:
        fields["sleep"] = obj(("seconds",), seconds=INT64)
    return fields


def probe(v2: bool) -> dict[str, Any]:
    fields = handler(v2, probe=True)
    fields.update(
        failureThreshold=INT32,
        initialDelaySeconds=INT32,
        periodSeconds=INT32,
        successThreshold=INT32,
        timeoutSeconds=INT32,
    )
    if v2:
        fields["terminationGracePeriodSeconds"] = INT64
    return obj(**fields)


def security_context(v2: bool, *, pod: bool) -> dict[str, Any]:
    """A core/v1 SecurityContext (a container's) or, with ``pod``, a PodSecurityContext, as
    the CRD of that version declares it. 1.x has no seccompProfile and no appArmorProfile
    (Pod Security "restricted" needs a seccompProfile: the 1.x CRD prunes it)."""
    windows: dict[str, Any] = {
        "gmsaCredentialSpec": STRING,
        "gmsaCredentialSpecName": STRING,
        "runAsUserName": STRING,
    }
    if v2:
        windows["hostProcess"] = BOOL
    fields: dict[str, Any] = {
        "runAsGroup": INT64,
        "runAsNonRoot": BOOL,
        "runAsUser": INT64,
        "seLinuxOptions": obj(level=STRING, role=STRING, type=STRING, user=STRING),
        "windowsOptions": obj(**windows),
    }
    if v2:
        profile = obj(("type",), localhostProfile=STRING, type=STRING)
        fields.update(appArmorProfile=profile, seccompProfile=profile)
    if pod:
        fields.update(
            fsGroup=INT64,
            supplementalGroups=array(INT64),
            sysctls=array(obj(("name", "value"), name=STRING, value=STRING)),
        )
        if v2:
            fields.update(
                fsGroupChangePolicy=STRING,
                seLinuxChangePolicy=STRING,
                supplementalGroupsPolicy=STRING,
            )
    else:
        fields.update(
            allowPrivilegeEscalation=BOOL,
            capabilities=obj(add=strings(), drop=strings()),
            privileged=BOOL,
            procMount=STRING,
            readOnlyRootFilesystem=BOOL,
        )
    return obj(**fields)


def container(v2: bool) -> dict[str, Any]:
    """A core/v1 Container as the CRD of that version declares it."""
    resources: dict[str, Any] = {
        "limits": {"type": "object", "additionalProperties": QUANTITY},
        "requests": {"type": "object", "additionalProperties": QUANTITY},
    }
    if v2:
        resources["claims"] = array(
            obj(("name",), name=STRING, request=STRING),
            **{"x-kubernetes-list-map-keys": ["name"], "x-kubernetes-list-type": "map"},
        )
    port_required = ("containerPort",) if v2 else ("containerPort", "protocol")
    fields: dict[str, Any] = {
        "args": strings(),
        "command": strings(),
        "env": array(env_var(v2)),
        "envFrom": array(env_from()),
        "image": STRING,
        "imagePullPolicy": STRING,
        "lifecycle": obj(
            postStart=obj(**handler(v2, probe=False)), preStop=obj(**handler(v2, probe=False))
        ),
        "livenessProbe": probe(v2),
        "name": STRING,
        "ports": array(
            obj(
                port_required,
                containerPort=INT32,
                hostIP=STRING,
                hostPort=INT32,
                name=STRING,
                protocol={"type": "string", "default": "TCP"} if v2 else STRING,
            ),
            **{
                "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                "x-kubernetes-list-type": "map",
            },
        ),
        "readinessProbe": probe(v2),
        "resources": obj(**resources),
        "securityContext": security_context(v2, pod=False),
        "startupProbe": probe(v2),
        "stdin": BOOL,
        "stdinOnce": BOOL,
        "terminationMessagePath": STRING,
        "terminationMessagePolicy": STRING,
        "tty": BOOL,
        "volumeDevices": array(obj(("devicePath", "name"), devicePath=STRING, name=STRING)),
        "volumeMounts": array(volume_mount(v2)),
        "workingDir": STRING,
    }
    if v2:
        # Kubernetes 1.28+ (SidecarContainers): the field a native sidecar needs.
        fields["restartPolicy"] = STRING
        fields["resizePolicy"] = array(
            obj(("resourceName", "restartPolicy"), resourceName=STRING, restartPolicy=STRING)
        )
    return obj(("name",), **fields)


def pod_spec(v2: bool, *, driver: bool) -> dict[str, Any]:
    """SparkPodSpec plus the DriverSpec/ExecutorSpec fields."""
    fields: dict[str, Any] = {
        "affinity": OPAQUE,
        "annotations": STRING_MAP,
        "configMaps": array(obj(("name", "path"), name=STRING, path=STRING)),
        "coreLimit": STRING,
        "coreRequest": STRING,
        "cores": {"type": "integer", "format": "int32", "minimum": 1},
        "dnsConfig": OPAQUE,
        "env": array(env_var(v2)),
        "envFrom": array(env_from()),
        "envSecretKeyRefs": {
            "type": "object",
            "additionalProperties": obj(("key", "name"), key=STRING, name=STRING),
        },
        "envVars": STRING_MAP,
        "gpu": OPAQUE,
        "hostAliases": array(OPAQUE),
        "hostNetwork": BOOL,
        "image": STRING,
        "initContainers": array(container(v2)),
        "javaOptions": STRING,
        "labels": STRING_MAP,
        "lifecycle": OPAQUE,
        "memory": STRING,
        "memoryOverhead": STRING,
        "nodeSelector": STRING_MAP,
        "podSecurityContext": security_context(v2, pod=True),
        "schedulerName": STRING,
        "secrets": array(
            obj(("name", "path", "secretType"), name=STRING, path=STRING, secretType=STRING)
        ),
        "securityContext": security_context(v2, pod=False),
        "serviceAccount": STRING,
        "shareProcessNamespace": BOOL,
        "sidecars": array(container(v2)),
        "terminationGracePeriodSeconds": INT64,
        "tolerations": array(OPAQUE),
        "volumeMounts": array(volume_mount(v2)),
    }
    if driver:
        fields.update(
            kubernetesMaster=STRING,
            podName={
                "type": "string",
                "pattern": r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
            },
            serviceAnnotations=STRING_MAP,
        )
    else:
        fields.update(
            deleteOnTermination=BOOL,
            instances={"type": "integer", "format": "int32", "minimum": 1},
        )
    if v2:
        fields.update(
            memoryLimit=STRING,
            priorityClassName=STRING,
            ports=array(OPAQUE),
            # +kubebuilder:validation:Schemaless + PreserveUnknownFields in the 2.x types
            template={"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        )
        if driver:
            fields["serviceLabels"] = STRING_MAP
    return obj(**fields)


def volume() -> dict[str, Any]:
    key_to_path = array(obj(("key", "path"), key=STRING, mode=INT32, path=STRING))
    return obj(
        ("name",),
        name=STRING,
        emptyDir=obj(medium=STRING, sizeLimit=QUANTITY),
        downwardAPI=obj(
            defaultMode=INT32,
            items=array(
                obj(
                    ("path",),
                    fieldRef=obj(("fieldPath",), apiVersion=STRING, fieldPath=STRING),
                    mode=INT32,
                    path=STRING,
                    resourceFieldRef=obj(
                        ("resource",), containerName=STRING, divisor=QUANTITY, resource=STRING
                    ),
                )
            ),
        ),
        secret=obj(defaultMode=INT32, items=key_to_path, optional=BOOL, secretName=STRING),
        configMap=obj(defaultMode=INT32, items=key_to_path, name=STRING, optional=BOOL),
        hostPath=obj(("path",), path=STRING, type=STRING),
        persistentVolumeClaim=obj(("claimName",), claimName=STRING, readOnly=BOOL),
    )


def spec(v2: bool) -> dict[str, Any]:
    deps = {
        "excludePackages": strings(),
        "files": strings(),
        "jars": strings(),
        "packages": strings(),
        "pyFiles": strings(),
        "repositories": strings(),
    }
    if v2:
        deps["archives"] = strings()
    fields: dict[str, Any] = {
        "arguments": strings(),
        "batchScheduler": STRING,
        "batchSchedulerOptions": OPAQUE,
        "deps": obj(**deps),
        "driver": pod_spec(v2, driver=True),
        "executor": pod_spec(v2, driver=False),
        "failureRetries": INT32,
        "hadoopConf": STRING_MAP,
        "hadoopConfigMap": STRING,
        "image": STRING,
        "imagePullPolicy": STRING,
        "imagePullSecrets": strings(),
        "mainApplicationFile": STRING,
        "mainClass": STRING,
        "memoryOverheadFactor": STRING,
        "mode": {
            "type": "string",
            "enum": ["cluster", "client", "in-cluster-client"] if v2 else ["cluster", "client"],
        },
        "monitoring": OPAQUE,
        "nodeSelector": STRING_MAP,
        "proxyUser": STRING,
        "pythonVersion": {"type": "string", "enum": ["2", "3"]},
        "restartPolicy": obj(
            onFailureRetries={"type": "integer", "format": "int32", "minimum": 0},
            onFailureRetryInterval={"type": "integer", "format": "int64", "minimum": 1},
            onSubmissionFailureRetries={"type": "integer", "format": "int32", "minimum": 0},
            onSubmissionFailureRetryInterval={"type": "integer", "format": "int64", "minimum": 1},
            type={"type": "string", "enum": ["Never", "Always", "OnFailure"]},
        ),
        "retryInterval": INT64,
        "sparkConf": STRING_MAP,
        "sparkConfigMap": STRING,
        "sparkUIOptions": OPAQUE,
        "sparkVersion": STRING,
        "timeToLiveSeconds": INT64,
        "type": {"type": "string", "enum": ["Java", "Python", "Scala", "R"]},
        "volumes": array(volume()),
    }
    required = ("driver", "executor", "sparkVersion", "type")
    if v2:
        fields.update(
            driverIngressOptions=array(OPAQUE),
            dynamicAllocation=OPAQUE,
            suspend=BOOL,
        )
        required += ("mainApplicationFile",)
    return obj(required, **fields)


def status() -> dict[str, Any]:
    return obj(
        applicationState=obj(("state",), errorMessage=STRING, state=STRING),
        driverInfo=obj(
            podName=STRING,
            webUIAddress=STRING,
            webUIIngressAddress=STRING,
            webUIIngressName=STRING,
            webUIPort=INT32,
            webUIServiceName=STRING,
        ),
        executionAttempts=INT32,
        executorState=STRING_MAP,
        lastSubmissionAttemptTime={"type": "string", "format": "date-time", "nullable": True},
        sparkApplicationId=STRING,
        submissionAttempts=INT32,
        submissionID=STRING,
        terminationTime={"type": "string", "format": "date-time", "nullable": True},
    )


def crd(v2: bool) -> dict[str, Any]:
    """The whole CustomResourceDefinition of one spark-operator major version."""
    columns = [
        {"jsonPath": ".status.applicationState.state", "name": "Status", "type": "string"},
        {"jsonPath": ".status.executionAttempts", "name": "Attempts", "type": "string"},
        {"jsonPath": ".status.lastSubmissionAttemptTime", "name": "Start", "type": "string"},
        {"jsonPath": ".status.terminationTime", "name": "Finish", "type": "string"},
        {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"},
    ]
    root = obj(
        ("metadata", "spec"),
        apiVersion=STRING,
        kind=STRING,
        metadata={"type": "object"},
        spec=spec(v2),
        status=status(),
    )
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "sparkapplications.sparkoperator.k8s.io",
            "annotations": {
                "api-approved.kubernetes.io": "https://github.com/kubeflow/spark-operator/pull/1298"
            },
        },
        "spec": {
            "group": "sparkoperator.k8s.io",
            "names": {
                "kind": "SparkApplication",
                "listKind": "SparkApplicationList",
                "plural": "sparkapplications",
                "shortNames": ["sparkapp"],
                "singular": "sparkapplication",
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1beta2",
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def render(version: str) -> str:
    """The YAML file of ``version`` (``"1.x"`` or ``"2.x"``), header comment included."""
    header = [
        "SparkApplication CRD (sparkoperator.k8s.io/v1beta2) of Kubeflow spark-operator "
        f"{version},",
        "for sparkguard's kube bench. GENERATED by tests/kubebench/crds/generate.py: edit that.",
        "",
        f"Written field for field from kubeflow/spark-operator {SOURCES[version]}.",
        "Pruning is on: x-kubernetes-preserve-unknown-fields only where upstream has it"
        + (" (driver/executor.template)." if version == "2.x" else " (nowhere in 1.x)."),
        *LEFT_OUT.splitlines(),
    ]
    body = yaml.safe_dump(crd(version == "2.x"), sort_keys=False, width=100)
    return "".join(f"# {line}".rstrip() + "\n" for line in header) + "---\n" + body


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for version in SOURCES:
        (OUT / f"spark-operator-{version}.yaml").write_text(render(version), encoding="utf-8")


if __name__ == "__main__":
    main()
