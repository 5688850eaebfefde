"""The chart's dashboard and alerts against a real Prometheus scraping the operator and a sidecar.

One scenario (module-scoped, so it runs once): the operator as its own process
(``replica.py``: the product except a rollback stand-in) against the bench, a real marker
sidecar process, and Prometheus (``build-prometheus.sh``) scraping both every second through the
targets the chart's ServiceMonitor and PodMonitor would give it (``static_scrape_config``: no
kubelet runs the chart's pods here) and evaluating the chart's PrometheusRule. The scenario: an
app fails and is rolled back and resubmitted, one fails with ``max-retries: 0`` (exhausted),
one's rollback fails (storage unreachable), one's driver pod runs without sparkguard's
containers (unprotected); the sidecar acknowledges markers, then refuses one for a sealed
(being-decided) instant. Then every panel query and alert expression is asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sparkguard.operator import appmeta, protection
from tests.chart.conftest import render
from tests.chart.operator_harness import eventually
from tests.kubebench.bench import KubeBench
from tests.kubebench.fixtures import BUILD_BUDGET_SECONDS
from tests.kubebench.prometheus import (
    Prometheus,
    Target,
    ensure_prometheus,
    is_built,
    static_scrape_config,
)
from tests.operator.apps import failed_status, spark_app
from tests.operator.test_real_apiserver import Cluster, Replicas, _free_port, bench_cluster
from tests.sidecar.conftest import marker_dir_under

#: a first build of Prometheus (cold: 5 to 40 minutes on 2 cores, or waiting for the one
#: scripts/test.sh runs in the background) must not count against pytest-timeout's limit
pytestmark = [] if is_built() else [pytest.mark.timeout(BUILD_BUDGET_SECONDS + 600)]

#: the chart's monitoring, all on (release "sg" in namespace "sparkguard", as ``render`` does)
MONITORING = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}
RELEASE_NAMESPACE = "sparkguard"
#: what Grafana substitutes in a panel's query; the windows fit a 1 s scrape interval
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$job": ".*",
    "$app_namespace": ".*",
    "$namespace": ".*",
    "$app": ".*",
}
#: the alerts this scenario makes fire (the others' left-hand sides must still have data)
FIRED = {"SparkguardRetriesExhausted", "SparkguardAppUnprotected", "SparkguardRollbackFailures"}


def _of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


class Observed:
    """The scenario's cluster, processes and Prometheus, and the chart's monitoring objects."""

    def __init__(self, cluster: Cluster, prometheus: Prometheus, objects: list[dict[str, Any]]):
        self.cluster = cluster
        self.prometheus = prometheus
        self.objects = objects
        self.rules = _of_kind(objects, "PrometheusRule")
        configmap = _of_kind(objects, "ConfigMap")
        self.dashboard: dict[str, Any] = json.loads(configmap["data"]["sparkguard.json"])

    def panel_queries(self) -> list[tuple[str, str]]:
        """(panel title, query with Grafana's variables substituted) of every panel target."""
        out = []
        for panel in self.dashboard["panels"]:
            for target in panel.get("targets", ()):
                expr = target["expr"]
                for name, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(name, value)
                assert "$" not in expr, expr
                out.append((panel["title"], expr))
        return out

    def alerts(self) -> list[dict[str, Any]]:
        return [r for g in self.rules["spec"]["groups"] for r in g["rules"] if "alert" in r]


def _start_sidecar(root: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SPARKGUARD_SIDECAR_ALLOWED_ROOTS": str(root),
        "SPARKGUARD_SIDECAR_AUTH_DISABLED": "true",
        "SPARKGUARD_SIDECAR_HOST": "127.0.0.1",
        "SPARKGUARD_SIDECAR_PORT": str(port),
        "SPARKGUARD_SIDECAR_BATCH_INTERVAL_MS": "5",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sparkguard.sidecar"], env=env, stdout=out, stderr=out
        )


def _status(url: str, body: dict[str, Any] | None = None) -> int:
    """The HTTP status of a GET (or, with ``body``, a JSON POST) to ``url``; 0 when refused."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})  # noqa: S310 - loopback http
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback http
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _driver_pod(namespace: str, app: str) -> dict[str, Any]:
    """A driver pod as spark-operator creates it, without sparkguard's containers (its pod
    webhook off): what makes the app unprotected."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-driver",
            "namespace": namespace,
            "labels": {
                protection.ROLE_LABEL: protection.DRIVER_ROLE,
                protection.APP_NAME_LABEL: app,
            },
        },
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4.0.0"}]},
    }


@pytest.fixture(scope="module")
def observed(kube_bench: KubeBench, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    bin_dir = ensure_prometheus()
    workdir = tmp_path_factory.mktemp("observed")
    objects = render(MONITORING, namespace=RELEASE_NAMESPACE)
    service = _of_kind(objects, "Service")
    monitor = _of_kind(objects, "ServiceMonitor")
    # The ServiceMonitor must select the chart's Service and name one of its ports, whose
    # target is a port the operator's container declares.
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
    container = _of_kind(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert {p["name"] for p in service["spec"]["ports"]} >= {
        monitor["spec"]["endpoints"][0]["port"]
    }
    rules_file = workdir / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(_of_kind(objects, "PrometheusRule")["spec"]))

    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(bench_cluster(kube_bench, prefix="prom"))
        replicas = Replicas(cluster, workdir, leader_election=True)
        stack.callback(replicas.stop_all)
        operator_port, sidecar_port = _free_port(), _free_port()
        replicas.env.update(
            SPARKGUARD_METRICS_PORT=str(operator_port), SPARKGUARD_METRICS_ADDR="127.0.0.1"
        )
        replicas.start("operator-0", extra_args=("--fail-jobs", r"\.broken$"))
        root = workdir / "warehouse"
        sidecar = _start_sidecar(root, sidecar_port, workdir / "sidecar.log")
        stack.callback(sidecar.wait, 30)
        stack.callback(sidecar.terminate)

        driver = {protection.ROLE_LABEL: protection.DRIVER_ROLE, protection.APP_NAME_LABEL: "etl"}
        scrape = [
            static_scrape_config(
                monitor,
                targets=[Target(f"127.0.0.1:{operator_port}", "operator-0", RELEASE_NAMESPACE)],
                container="operator",
                service=service["metadata"]["name"],
            ),
            static_scrape_config(
                _of_kind(objects, "PodMonitor"),
                targets=[
                    Target(f"127.0.0.1:{sidecar_port}", "etl-driver", cluster.namespace, driver),
                ],
                container="sparkguard-markers",
            ),
        ]
        prometheus = stack.enter_context(
            Prometheus(bin_dir, scrape_configs=scrape, rule_files=[rules_file])
        )
        eventually(
            lambda: len(prometheus.query("up == 1")) == 2, what="both targets scraped", timeout=90
        )
        _run_scenario(cluster, sidecar_port, root)
        yield Observed(cluster, prometheus, objects)


def _run_scenario(cluster: Cluster, sidecar_port: int, root: Path) -> None:
    cluster.create(spark_app("etl", annotations={appmeta.BACKOFF: "0"}))
    cluster.create(spark_app("once", annotations={appmeta.MAX_RETRIES: "0"}))
    cluster.create(spark_app("broken", annotations={appmeta.BACKOFF: "0"}))
    cluster.create(spark_app("bare"))
    for name in ("etl", "once", "broken"):
        cluster.set_status(name, failed_status())
    client.CoreV1Api(cluster.api).create_namespaced_pod(
        cluster.namespace, _driver_pod(cluster.namespace, "bare")
    )
    # The sidecar: markers acknowledged, then one refused (409) for an instant being decided.
    base = f"http://127.0.0.1:{sidecar_port}/v1/markers"
    ready = f"http://127.0.0.1:{sidecar_port}/readyz"
    eventually(lambda: _status(ready) == 200, what="the sidecar is ready", timeout=60)
    directory = marker_dir_under(str(root), instant=f"20261206200000000-{uuid.uuid4().hex[:6]}")
    for i in range(5):
        body = {"markerdir": directory, "markername": f"part-{i:05d}.parquet"}
        assert _status(f"{base}/create", body) == 200
    assert _status(f"{base}/dir/seal", {"markerdir": directory}) == 200
    assert _status(f"{base}/create", {"markerdir": directory, "markername": "late.parquet"}) == 409

    eventually(
        lambda: cluster.notes("etl").get(appmeta.PHASE) == "Resubmitted",
        what="etl resubmitted",
        timeout=60,
    )
    eventually(
        lambda: cluster.notes("once").get(appmeta.PHASE) == "Exhausted",
        what="once exhausted",
        timeout=60,
    )
    eventually(
        lambda: cluster.notes("bare").get(appmeta.PROTECTION) == protection.UNPROTECTED,
        what="bare marked unprotected",
        timeout=60,
    )
    eventually(
        lambda: "RollbackFailed" in cluster.event_reasons("broken"),
        what="broken's rollback fails",
        timeout=60,
    )


def test_every_panel_query_returns_data(observed: Observed) -> None:
    queries = observed.panel_queries()
    assert len(queries) >= 20
    missing: list[tuple[str, str]] = []

    def all_answer() -> bool:
        missing[:] = [(t, q) for t, q in queries if not observed.prometheus.query(q)]
        return not missing

    with contextlib.suppress(AssertionError):
        eventually(all_answer, what="every panel query", timeout=60)
    assert missing == []


def _left_side(expr: str) -> str:
    """``expr`` without its top-level comparison to a number (``X > 0`` -> ``X``)."""
    match = re.fullmatch(r"(.*\S)\s*(?:>|<|==|!=|>=|<=)\s*[0-9.]+", expr.strip(), re.DOTALL)
    assert match is not None, f"not of the form <query> <comparison> <number>: {expr}"
    return match.group(1)


def test_every_alert_expression_returns_data_and_the_scenarios_alerts_fire(
    observed: Observed,
) -> None:
    alerts = {a["alert"]: a["expr"] for a in observed.alerts()}
    assert alerts.keys() >= FIRED
    prometheus = observed.prometheus
    for name, expr in alerts.items():
        assert prometheus.query(_left_side(expr)), f"{name}: {_left_side(expr)} has no data"
    fired = eventually(
        lambda: (
            {n for n, e in alerts.items() if prometheus.query(e)} >= FIRED
            and {n for n, e in alerts.items() if prometheus.query(e)}
        ),
        what=f"{sorted(FIRED)} firing",
        timeout=60,
    )
    # Nothing else fires: one leader, no flush failure, no recovery beyond its bound yet.
    assert fired == FIRED
    # Prometheus itself loaded the rendered rules and evaluates them without an error.
    groups = prometheus.api("rules")["groups"]
    evaluated = {r["name"]: r for g in groups for r in g["rules"]}
    assert evaluated.keys() == alerts.keys()
    assert all(r["health"] in ("ok", "unknown") for r in evaluated.values()), evaluated


def test_promtool_checks_the_rendered_rules(observed: Observed, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(observed.rules["spec"]))
    promtool = observed.prometheus.bin_dir / "promtool"
    checked = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(observed.alerts())} rules found" in checked.stdout
