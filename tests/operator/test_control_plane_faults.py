"""The operator when the control plane misbehaves, on the kube bench (a real kube-apiserver and
etcd): kube-apiserver SIGKILLed and restarted on a compacted etcd (every watch cut, resumed
with 410 Gone, relisted), etcd frozen for longer than the lease, and an admission webhook too
slow for the API server's timeout.

The operator runs as replica processes (``replica.py``, recording each rollback call), as in
``test_real_apiserver.py``'s HA tests. Each scenario asserts exactly one resubmission per
failure (the app's generation, its ``Resubmitted`` Events, the recorded calls) and no app left
unrecovered. In the two recovery scenarios the failed app is a real Spark job: an unchanged
PySpark append through the JVM layer (the conf admission injects, for the app's job id and
journal) SIGKILLed mid-write; the replicas run the product's rollback on its table while the
control plane fails, and the test then runs the resubmitted app's job as spark-operator would:
every row once, read by a plain Spark reader. docs/operations.md ("When the infrastructure
misbehaves") says what each looks like to an operator.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import http.server
import itertools
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sparkguard.operator import appmeta
from sparkguard.spark_lib.spark import sparkconf
from sparkguard.spark_lib.storage import reader, timeline
from tests.jvm.conftest import job_command, kill_when, run_job
from tests.operator import test_real_apiserver
from tests.operator.apps import GROUP, VERSION, failed_status, spark_app
from tests.operator.test_real_apiserver import (
    Cluster,
    Replicas,
    _events_out,
    _eventually,
    _settled_in_every_replica,
)

# the fixtures of the real-apiserver tests: a fresh namespace, the replica processes
cluster = test_real_apiserver.cluster
replicas_factory = test_real_apiserver.replicas_factory

pytestmark = pytest.mark.kube

#: the real Spark job of a failed app: enough rows that a SIGKILL lands mid-write
ROWS = 400_000
PARTITIONS = 4


@dataclasses.dataclass(frozen=True)
class KilledWrite:
    """App ``name``'s Spark job, killed mid-write: its table and the conf it ran with."""

    name: str
    table: Path
    conf: dict[str, str]

    def files(self, pattern: str) -> list[str]:
        return sorted(p.name for p in self.table.glob(pattern))


def _killed_write(cluster: Cluster, name: str, journal_root: Path, workdir: Path) -> KilledWrite:
    """Run app ``name``'s job (``tests/jvm/jobs/plain_write.py``: a plain append, no sparkguard
    import) with the JVM layer's conf for the app's job id (``<namespace>.<name>``) and journal
    (``<journal root>/<namespace>``), as admission injects it; SIGKILL the whole driver once a
    data file is written (under its hidden temp name) and before the outcome."""
    job_id = appmeta.derive_job_id(namespace=cluster.namespace, name=name)
    conf = sparkconf.build_spark_conf(job_id, journal=f"{journal_root}/{cluster.namespace}")
    table = workdir / name
    outcomes = table / timeline.SPARKGUARD_DIR / "timeline"

    def mid_write() -> bool:
        return bool(list(table.glob(".part-*.sg-tmp-*"))) and not list(outcomes.glob("*.outcome"))

    command = job_command("plain_write.py", str(table), str(ROWS), str(PARTITIONS), conf=conf)
    kill_when(command, mid_write, log=workdir / f"{name}-killed.log")
    killed = KilledWrite(name, table, conf)
    assert killed.files(".part-*.sg-tmp-*"), "the kill came after a data file was written"
    return killed


def _rerun_exactly_once(cluster: Cluster, killed: KilledWrite) -> None:
    """The rollback left nothing of the killed write; then spark-operator's run of the
    resubmitted app (the job with the app's ``spark.sparkguard.*`` conf as resubmitted, e.g.
    its attempt) commits every row once, read back by a plain ``spark.read.parquet``."""
    assert killed.files("part-*") == [], "no data file of the killed write published"
    assert killed.files(".part-*.sg-tmp-*") == [], "the rollback removed the killed write's files"
    spec = cluster.get(killed.name)["spec"]["sparkConf"]
    conf = killed.conf | {k: v for k, v in spec.items() if k.startswith("spark.sparkguard.")}
    args = (str(killed.table), str(ROWS), str(PARTITIONS))
    assert run_job("plain_write.py", *args, conf=conf) == {"rows": ROWS, "ids": ROWS}
    committed = sorted(Path(p).name for p in reader.committed_paths(str(killed.table)))
    assert committed == killed.files("part-*"), "every data file in the table is committed"
    assert killed.files(".part-*.sg-tmp-*") == []
    assert killed.files(f"{timeline.SPARKGUARD_DIR}/markers/*/*") == []


def _resubmitted_once(cluster: Cluster, name: str, generation: int) -> None:
    app = cluster.get(name)
    assert app["metadata"]["generation"] == generation + 1, name  # one spec change
    assert app["spec"]["sparkConf"]["spark.sparkguard.attempt"] == "1", name
    reasons = cluster.event_reasons(name)
    assert reasons.count("Resubmitted") == 1, (name, reasons)


def _fail(cluster: Cluster, name: str) -> int:
    cluster.create(spark_app(name, annotations={appmeta.BACKOFF: "0"}))
    generation = int(cluster.get(name)["metadata"]["generation"])
    cluster.set_status(name, failed_status())
    return generation


def _until_resubmitted(cluster: Cluster, replicas: Replicas, names: list[str]) -> None:
    try:
        for name in names:
            _eventually(
                lambda n=name: cluster.notes(n).get(appmeta.PHASE) == "Resubmitted", timeout=90
            )
        _eventually(lambda: _events_out(cluster, names), timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{replicas.logs()}") from exc


@pytest.mark.spark
def test_apiserver_killed_mid_rollback_and_restarted_on_a_compacted_etcd(
    cluster: Cluster, replicas_factory: Callable[..., Replicas], tmp_path: Path
) -> None:
    """kube-apiserver is SIGKILLed while the leader rolls an app back; the rollback returns
    while it is down (so the rollback's record and the resubmission meet a dead API server);
    etcd is compacted, so every watch resumed after the restart ends with 410 Gone and is
    relisted; an app that fails right after the restart is found by that relist. The victim is
    a real Spark job killed mid-write: the repeated rollback leaves its table clean and the
    resubmitted run writes every row once."""
    replicas = replicas_factory(leader_election=True)
    replicas.env["SPARKGUARD_JOURNAL_ROOT"] = str(tmp_path / "journal")
    killed = _killed_write(cluster, "victim", tmp_path / "journal", tmp_path)
    gate = tmp_path / "gate"
    leader = replicas.start("a", gate=gate, extra_args=("--real-rollback",))
    leader_id = replicas.identity(leader)
    _eventually(lambda: cluster.lease_holder(replicas.lease) == leader_id)
    victim = _fail(cluster, "victim")
    _eventually(lambda: len(replicas.rollbacks()) == 1)
    assert cluster.notes("victim")[appmeta.PHASE] == "Recovering"

    compacted = cluster.bench.compact_etcd()
    cluster.bench.kill_apiserver()
    gate.touch()  # the rollback returns: its record and the resubmission find no API server
    time.sleep(3)  # longer than the lease (2 s) and the claim (3 s)
    cluster.bench.restart_apiserver()
    restarted = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    late = _fail(cluster, "late")  # before the operator's watches are back
    _until_resubmitted(cluster, replicas, ["victim", "late"])
    _eventually(lambda: _settled_in_every_replica(replicas, ["victim", "late"], [leader_id]))
    replicas.stop_all()

    _resubmitted_once(cluster, "victim", victim)
    _resubmitted_once(cluster, "late", late)
    jobs = [c["job"] for c in replicas.rollbacks()]
    assert jobs.count(f"{cluster.namespace}.late") == 1, jobs
    # The victim's rollback returned while its result could not be recorded: the recovery
    # repeats it (a rollback is idempotent) rather than resubmit without a record of one.
    assert jobs.count(f"{cluster.namespace}.victim") == 2, jobs
    _rerun_exactly_once(cluster, killed)
    # The watch resumed after the restart from a revision etcd had compacted: it ended with
    # 410 Gone (an ERROR event in the stream, so kopf logs it at DEBUG only) and kopf listed
    # the apps again, then watched from the list's revision. Seen in the audit log.
    steps = [
        (e["verb"], e["requestURI"])
        for e in cluster.bench.audit_events()
        if "/sparkapplications" in e["requestURI"]
        and "kopf" in e.get("userAgent", "")
        and e["stageTimestamp"] >= restarted
    ]

    # Every replica watches, so their steps interleave (the audit log does not say which
    # replica made a request): a watch resumed from a compacted revision, then a list, then a
    # watch from a revision etcd still had (the list's).
    def revision(uri: str) -> int | None:
        found = re.findall(r"resourceVersion=(\d+)", uri)
        return int(found[0]) if found else None

    stale = next(
        (i for i, (verb, uri) in enumerate(steps)
         if verb == "watch" and (revision(uri) or compacted) < compacted),
        None,
    )  # fmt: skip
    assert stale is not None, steps
    relist = next((i for i in range(stale, len(steps)) if steps[i][0] == "list"), None)
    assert relist is not None, steps
    assert any(
        verb == "watch" and (revision(uri) or 0) >= compacted for verb, uri in steps[relist:]
    ), steps


_LEASE_LINE = re.compile(r"^\[([\d-]+ [\d:,.]+)\].*(acquired|gave up) the lease")


def _leading_intervals(log: str) -> list[tuple[datetime.datetime, datetime.datetime | None]]:
    """When a replica held the lease, from its own log lines (acquired / gave up)."""
    intervals: list[tuple[datetime.datetime, datetime.datetime | None]] = []
    for line in log.splitlines():
        found = _LEASE_LINE.search(line)
        if not found:
            continue
        at = datetime.datetime.fromisoformat(found.group(1).replace(",", "."))
        if found.group(2) == "acquired":
            intervals.append((at, None))
        elif intervals and intervals[-1][1] is None:
            intervals[-1] = (intervals[-1][0], at)
    return intervals


@pytest.mark.spark
def test_etcd_paused_longer_than_the_lease(
    cluster: Cluster, replicas_factory: Callable[..., Replicas], tmp_path: Path
) -> None:
    """etcd frozen (SIGSTOP) for 6 s, three lease durations, while the leader rolls an app
    back: the leader steps down within its renew deadline although its renewal hangs; after
    etcd continues one replica leads (never two at once) and the app is resubmitted once. The
    app is a real Spark job killed mid-write: the resubmitted run writes every row once."""
    replicas = replicas_factory(leader_election=True)
    replicas.env["SPARKGUARD_JOURNAL_ROOT"] = str(tmp_path / "journal")
    killed = _killed_write(cluster, "frozen", tmp_path / "journal", tmp_path)
    real = ("--real-rollback",)
    first = replicas.start("a", rollback_seconds=2, extra_args=real)
    first_id = replicas.identity(first)
    _eventually(lambda: cluster.lease_holder(replicas.lease) == first_id)
    second = replicas.start("b", rollback_seconds=2, extra_args=real)
    second_id = replicas.identity(second)
    generation = _fail(cluster, "frozen")
    _eventually(lambda: len(replicas.rollbacks()) == 1)
    with cluster.bench.etcd_paused():
        time.sleep(6)
    _until_resubmitted(cluster, replicas, ["frozen"])
    _eventually(lambda: _settled_in_every_replica(replicas, ["frozen"], [first_id, second_id]))
    logs = {first_id: first.log.read_text(), second_id: second.log.read_text()}
    replicas.stop_all()

    _resubmitted_once(cluster, "frozen", generation)
    assert "stepping down" in logs[first_id], logs[first_id][-3000:]
    spans = [(who, span) for who, log in logs.items() for span in _leading_intervals(log)]
    spans.sort(key=lambda s: s[1][0])
    assert spans, logs  # the replicas' own word on when they led
    for (who, (_, ended)), (nxt, (started, _)) in itertools.pairwise(spans):
        assert ended is not None, (who, spans)
        assert ended <= started, (who, nxt, spans)
    calls = sorted(replicas.rollbacks(), key=lambda c: c["at"])
    assert 1 <= len(calls) <= 2, calls
    for one, two in itertools.pairwise(calls):  # never two rollbacks at once
        assert one["at"] + 2 <= two["at"], calls
    _rerun_exactly_once(cluster, killed)


# -- admission: a webhook slower than the API server waits --------------------------------------


class _SlowWebhook(http.server.BaseHTTPRequestHandler):
    delay = 3.0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(self.delay)
        self.send_response(500)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _slow_webhook(cluster: Cluster, failure_policy: str) -> Iterator[None]:
    """A MutatingWebhookConfiguration like the chart's (CREATE and UPDATE of opted-in apps,
    ``timeoutSeconds`` 1 instead of 10) at a server that answers after 3 s."""
    cert = cluster.bench.issue_certificate("slow-webhook", ip_addresses=("127.0.0.1",))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowWebhook)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert.cert_file), str(cert.key_file))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    name = f"slow.{cluster.namespace}.sparkguard.io"
    admission = client.AdmissionregistrationV1Api(cluster.api)
    admission.create_mutating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "mutate.sparkapplications.sparkguard.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": failure_policy,
                    "timeoutSeconds": 1,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{server.server_address[1]}/sparkapplications",
                        "caBundle": base64.b64encode(cluster.bench.ca_pem).decode("ascii"),
                    },
                    "rules": [
                        {
                            "apiGroups": [GROUP],
                            "apiVersions": [VERSION],
                            "resources": ["sparkapplications"],
                            "operations": ["CREATE", "UPDATE"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": cluster.namespace}
                    },
                }
            ],
        }
    )
    try:
        yield
    finally:
        admission.delete_mutating_webhook_configuration(name)
        server.shutdown()
        server.server_close()


def test_a_webhook_slower_than_its_timeout(cluster: Cluster) -> None:
    """The API server gives up on the webhook after ``timeoutSeconds``. With the chart's
    ``failurePolicy: Fail`` the creation is refused with the timeout and no app exists (the
    submitter sees the error; nothing is left to recover); with ``Ignore`` the app is created
    unmutated: not protected (sparkguard's admission never saw it)."""
    with _slow_webhook(cluster, "Fail"):

        def refused() -> ApiException:
            with pytest.raises(ApiException) as denied:
                cluster.create(spark_app("slow-fail"))
            return denied.value

        error = _eventually(refused)
        body = str(error.body)
        assert error.status == 500, body  # InternalError: the submitter may retry
        assert "context deadline exceeded" in body, body
        assert "mutate.sparkapplications.sparkguard.io" in body, body
        assert not cluster.exists("slow-fail")

    with _slow_webhook(cluster, "Ignore"):

        def admitted_after_the_timeout() -> bool:
            name = f"slow-ignore-{time.monotonic_ns()}"
            started = time.monotonic()
            created = cluster.create(spark_app(name))
            return time.monotonic() - started >= 1.0 and bool(created)

        _eventually(admitted_after_the_timeout)
        for app in cluster.custom.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, "sparkapplications"
        )["items"]:
            assert "spark.sparkguard.jobId" not in (app["spec"].get("sparkConf") or {})
