"""A real Prometheus for the bench: built by ``build-prometheus.sh``, scraping loopback targets.

The bench has no kubelet that runs the chart's pods and Prometheus is built without Kubernetes
service discovery (its Services would have no endpoints on loopback anyway), so the targets a
prometheus-operator would derive from the chart's ServiceMonitor and PodMonitor are written as
static scrape configs by :func:`static_scrape_config`: the same path and interval, the same
target labels prometheus-operator's generated relabelings set (``job``, ``namespace``,
``service``, ``pod``, ``container``, ``endpoint``, and what the monitor's own relabelings add),
with the process the test started at the address service discovery would have found.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from tests.kubebench import bench as kubebench
from tests.kubebench.bench import HERE, JsonObj, KubeBenchError
from tests.support import cached_jars

BUILD_SCRIPT = HERE / "build-prometheus.sh"


def is_built() -> bool:
    """Whether both binaries of the script's pinned version are in the cache already (a cheap
    look, for test timers: a build may still be needed if the stamp changed)."""
    found = re.search(r"^version=(\S+)", BUILD_SCRIPT.read_text(), re.MULTILINE)
    cache = cached_jars.cache_root()
    bin_dir = cache / "prometheus" / (found.group(1) if found else "?") / "bin"
    return all(os.access(bin_dir / b, os.X_OK) for b in ("prometheus", "promtool"))


def ensure_prometheus(*, timeout: float = 3 * 3600.0) -> Path:
    """Build ``prometheus`` and ``promtool`` if needed (a no-op when the stamp matches); the
    bin dir. A failure raises :class:`KubeBenchError`, never a skip."""
    return kubebench.run_build_script(
        BUILD_SCRIPT, what="Prometheus", binaries=("prometheus", "promtool"), timeout=timeout
    )


@dataclasses.dataclass(frozen=True)
class Target:
    """One process a monitor would find: its loopback address and the pod it stands for."""

    address: str
    pod: str
    namespace: str
    #: the pod's labels (a PodMonitor's relabelings read them)
    pod_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _pod_label_meta(labels: Mapping[str, str] | None) -> dict[str, str]:
    """``__meta_kubernetes_pod_label_<name>`` as Prometheus's service discovery names them."""
    out: dict[str, str] = {}
    for key, value in (labels or {}).items():
        sanitized = "".join(c if c.isalnum() else "_" for c in key)
        out[f"__meta_kubernetes_pod_label_{sanitized}"] = value
    return out


def _relabel(labels: dict[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """The ``replace`` and ``keep`` relabelings a monitor may carry (full-match regexes, as
    Prometheus anchors them); ``None`` when a ``keep`` drops the target."""
    for rule in rules:
        source = ";".join(labels.get(name, "") for name in rule.get("sourceLabels", ()))
        match = re.fullmatch(str(rule.get("regex", "(.*)")), source)
        action = str(rule.get("action", "replace")).lower()
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                labels[str(rule["targetLabel"])] = match.expand(
                    str(rule.get("replacement", r"\1")).replace("$1", r"\1")
                )
        else:
            raise ValueError(f"relabel action {action} is not modelled")
    return labels


def static_scrape_config(
    monitor: Mapping[str, Any], *, targets: Sequence[Target], container: str, service: str = ""
) -> JsonObj:
    """The scrape config prometheus-operator would generate for ``monitor`` (a rendered
    ServiceMonitor or PodMonitor with one endpoint), with ``targets`` as static targets.

    Labels as prometheus-operator sets them: ``namespace``, ``pod``, ``container``,
    ``endpoint`` (the port name); a ServiceMonitor's targets also get ``service`` and ``job`` =
    the Service's name; a PodMonitor's ``job`` is ``<namespace>/<name>``. The monitor's own
    relabelings (``keep``/``replace`` on ``__meta_kubernetes_pod_*``) are applied here, at
    config time, to what service discovery would have seen. The scrape interval is the
    Prometheus's global one (the tests scrape every second; the chart's 30 s would only make
    them wait)."""
    kind = monitor["kind"]
    spec = monitor["spec"]
    (endpoint,) = spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    meta = monitor["metadata"]
    groups: list[JsonObj] = []
    for target in targets:
        labels = {
            "namespace": target.namespace,
            "pod": target.pod,
            "container": container,
            "endpoint": str(endpoint["port"]),
            "__meta_kubernetes_pod_container_name": container,
            **_pod_label_meta(target.pod_labels),
        }
        if kind == "ServiceMonitor":
            labels.update(service=service, job=service)
        else:
            labels["job"] = f"{meta['namespace']}/{meta['name']}"
        kept = _relabel(labels, endpoint.get("relabelings", ()))
        if kept is None:
            continue
        public = {k: v for k, v in kept.items() if not k.startswith("__")}
        groups.append({"targets": [target.address], "labels": public})
    return {
        "job_name": f"{kind.lower()}/{meta['namespace']}/{meta['name']}/0",
        "metrics_path": str(endpoint.get("path", "/metrics")),
        "scheme": str(endpoint.get("scheme", "http")),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "static_configs": groups,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Prometheus:
    """``prometheus`` on a free loopback port with the given scrape configs and rule files."""

    def __init__(
        self,
        bin_dir: Path,
        *,
        scrape_configs: Sequence[JsonObj],
        rule_files: Sequence[Path] = (),
        interval: str = "1s",
    ) -> None:
        self.bin_dir = bin_dir
        self.workdir = Path(tempfile.mkdtemp(prefix="sparkguard-prometheus-"))
        self.config_file = self.workdir / "prometheus.yml"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": list(scrape_configs),
            "rule_files": [str(f) for f in rule_files],
        }
        self.config_file.write_text(json.dumps(config))  # JSON is YAML
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.workdir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start it and wait until ``/-/ready``."""
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    str(self.bin_dir / "prometheus"),
                    f"--config.file={self.config_file}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise KubeBenchError(f"prometheus exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as answer:  # noqa: S310 - loopback http
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise KubeBenchError(f"prometheus not ready in 60s: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Terminate it (then kill) and remove its data."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if not os.environ.get("SPARKGUARD_KUBEBENCH_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a successful answer."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as answer:  # noqa: S310 - loopback http
                body = json.load(answer)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: {exc.read().decode()[:500]}") from exc
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[JsonObj]:
        """The instant vector (or scalar, as one sample) ``expr`` evaluates to now."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[JsonObj] = data["result"]
        return result
