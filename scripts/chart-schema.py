"""Type the chart's free-form Kubernetes values with the Kubernetes JSON schemas.

``operator.affinity``, ``operator.tolerations``, ``operator.extraEnv``, ``imagePullSecrets``,
``webhook.namespaceSelector``, ``injected.containers.securityContext`` and the resources blocks
are copied into the Deployment, the webhook configuration and the injected containers as they
are, so ``values.schema.json`` must know their Kubernetes types or a typo (``nodeAfinity``,
``keyy``, ``nam``) is silently dropped by the API server. This script takes those types, and
every type they reach, from the schemas the ``kubernetes-validate`` package ships (strict:
``additionalProperties: false``), and writes them into ``values.schema.json`` as local
``definitions`` (Helm validates offline: no remote refs).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/chart-schema.py          # rewrite the schema
    PYTHONSAFEPATH=1 .venv/bin/python scripts/chart-schema.py --check  # exit 1 if out of date

Every value's ``description`` is its ``# --`` comment in ``values.yaml`` (one text for the file
and the schema, so editors and ``helm show values`` readers see the same words).

Everything else in ``values.schema.json`` is written by hand; only the ``$ref`` of the paths in
:data:`TYPED`, the ``description`` of every documented value and the ``definitions`` section
belong to this script.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import re
import sys
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parents[1] / "charts" / "sparkguard" / "values.schema.json"
VALUES = SCHEMA.with_name("values.yaml")
#: the Kubernetes version whose schemas are used (the newest kubernetes-validate ships)
KUBERNETES = "1.37.0"
CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."

#: value path (properties, then "[]" for list items) -> Kubernetes type
TYPED: dict[tuple[str, ...], str] = {
    ("imagePullSecrets", "[]"): CORE + "LocalObjectReference",
    ("operator", "resources"): CORE + "ResourceRequirements",
    ("operator", "extraEnv", "[]"): CORE + "EnvVar",
    ("operator", "tolerations", "[]"): CORE + "Toleration",
    ("operator", "affinity"): CORE + "Affinity",
    ("operator", "envFrom", "[]"): CORE + "EnvFromSource",
    ("operator", "extraVolumes", "[]"): CORE + "Volume",
    ("operator", "extraVolumeMounts", "[]"): CORE + "VolumeMount",
    ("operator", "podSecurityContext"): CORE + "PodSecurityContext",
    ("operator", "securityContext"): CORE + "SecurityContext",
    ("operator", "topologySpreadConstraints", "[]"): CORE + "TopologySpreadConstraint",
    ("networkPolicy", "metricsFrom", "[]"): "io.k8s.api.networking.v1.NetworkPolicyPeer",
    ("webhook", "namespaceSelector"): META + "LabelSelector",
    ("sidecar", "resources"): CORE + "ResourceRequirements",
    ("injected", "containers", "securityContext"): CORE + "SecurityContext",
    ("injected", "initContainers", "resources"): CORE + "ResourceRequirements",
}


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9]*):")


def descriptions(text: str) -> dict[tuple[str, ...], str]:
    """Each documented value's ``# --`` comment (joined lines), by its path in ``text``.

    A purely computational function with no side-effects.
    """
    found: dict[tuple[str, ...], str] = {}
    path: list[tuple[int, str]] = []
    comment: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if comment is not None:
                comment.append(stripped[1:].strip())
            continue
        match = _KEY.match(line)
        if match is None:
            comment = None if not stripped else comment
            continue
        indent = len(match["indent"])
        path = [(i, k) for i, k in path if i < indent]
        path.append((indent, match["key"]))
        if comment is not None:
            found[tuple(k for _, k in path)] = " ".join(comment)
        comment = None
    return found


def kubernetes_definitions() -> dict[str, Any]:
    """Every definition of the strict local schemas, by name."""
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    path = root / f"v{KUBERNETES}-local-strict" / "_definitions.json"
    loaded: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return loaded


def _rewrite(node: Any, reached: set[str]) -> Any:
    """``node`` without descriptions, its ``$ref``s local to our schema (names collected)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "description":
                continue
            if key == "$ref":
                name = value.rsplit("/", 1)[-1]
                reached.add(name)
                out[key] = f"#/definitions/{name}"
            else:
                out[key] = _rewrite(value, reached)
        return out
    if isinstance(node, list):
        return [_rewrite(item, reached) for item in node]
    return node


def closure(roots: set[str], available: dict[str, Any]) -> dict[str, Any]:
    """The definitions of ``roots`` and of every type they refer to, rewritten."""
    done: dict[str, Any] = {}
    todo = sorted(roots)
    while todo:
        name = todo.pop()
        if name in done:
            continue
        reached: set[str] = set()
        done[name] = _rewrite(available[name], reached)
        todo.extend(sorted(reached - done.keys()))
    return dict(sorted(done.items()))


def _at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = schema
    for step in path[:-1]:
        node = node["items"] if step == "[]" else node["properties"][step]
    return node


def generate(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the typed paths pointing at fresh ``definitions``."""
    result = json.loads(json.dumps(schema))
    for path, kind in TYPED.items():
        parent = _at(result, path)
        ref = {"$ref": f"#/definitions/{kind}"}
        if path[-1] == "[]":
            parent["items"] = ref
        else:
            parent["properties"][path[-1]] = ref
    for path, text in descriptions(VALUES.read_text()).items():
        _at(result, path)["properties"][path[-1]]["description"] = text
    result["definitions"] = closure(set(TYPED.values()), kubernetes_definitions())
    return result


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the schema is stale")
    args = parser.parse_args(argv)
    current = SCHEMA.read_text()
    wanted = render(generate(json.loads(current)))
    if args.check:
        if wanted != current:
            print(
                f"{SCHEMA} is out of date: run scripts/chart-schema.py to regenerate it",
                file=sys.stderr,
            )
            return 1
        return 0
    SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
