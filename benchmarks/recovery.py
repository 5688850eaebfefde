"""Operator at scale: N opted-in apps, a tenth failing at once, two replicas, the leader killed.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/recovery.py [--quick] [--apps N]
        [--failing-fraction F] [--rollback-seconds S] [--no-kill] [--profile DIR]
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/recovery.py --real-operator [--rounds N]

``--real-operator`` is another benchmark (``benchmarks/_restart.py`` says what it times):
upstream's spark-operator with real pods, a killed driver's next driver reached through
sparkguard's rollback and resubmission against spark-operator's own OnFailure restart.

On the real kube-apiserver bench (tests/kubebench). Two operator replicas run as processes
(``tests/operator/replica.py``: the product's kopf handlers, leader election, claims, patches
and Events; only the storage rollback is a stand-in that takes ``--rollback-seconds``), as the
ServiceAccount ``operator`` (so the apiserver's audit log counts exactly their requests). A tenth
of the apps are set FAILED at once; once the leader has started a few rollbacks it is SIGKILLed
and the other replica takes over (Lease ``--lease`` and claim ``--claim-ttl``).

Reports, per failing app, the time from its FAILED status to the resubmission patch (both as
the API server stored them: the ``stageTimestamp`` of the benchmark's status patch and of the
operator's patch in the audit log, so the benchmark's own client and watch are not counted;
the same figure as the benchmark's watch saw it is logged beside it) minus the rollback's own
duration (from ``last-rollback``),
and that again without the rollback's wait for a slot (``last-rollback.queued``, stamped when
the rollback actually starts), so the queue's share and the operator's own are apart;
how many apps were resubmitted exactly once, twice, never (from their spec generation); the
replicas' RSS (VmRSS before the burst, VmHWM peak after); and the operator's apiserver requests
per recovery (audit log; watches, lists and Lease traffic counted apart). Last line:

    operator: apps=<n> resubmitted-once=<a> twice=<b> never=<c> p99=<s>s rss=<m>MiB

(``rss`` = the peak of the replica that finished the recovery).

``--profile DIR`` attaches ``py-spy record --gil`` (a dev dependency) to each replica from the
burst until the survivor settled: samples of the thread holding the GIL, i.e. where the
replica's Python CPU went (not its waits). It leaves the collapsed stacks in
``DIR/replica-<a|b>.txt`` (``py-spy``'s ``raw`` format: one line per distinct stack, its
sample count last) and logs their sum by layer (kopf, the Kubernetes client, ssl, json,
sparkguard, asyncio...).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import datetime
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, beside this file

from _common import REPO, log, percentile
from kubernetes import client, watch

from sparkguard.operator.finalizers import FINALIZER
from tests.kubebench.bench import KubeBench
from tests.operator.apps import GROUP, PLURAL, VERSION, failed_status, spark_app
from tests.support import netguard

REPLICA = REPO / "tests" / "operator" / "replica.py"
NAMESPACE = "bench-apps"
SYSTEM = "bench-operator"


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Replicas:
    """The two replica processes and their records."""

    def __init__(self, bench: KubeBench, workdir: Path, args: argparse.Namespace) -> None:
        self.workdir = workdir
        self.kubeconfig = bench.service_account_kubeconfig(SYSTEM, "operator")
        self.calls = workdir / "rollbacks.jsonl"
        self.decisions = workdir / "decisions.jsonl"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SPARKGUARD_")},
            "PYTHONSAFEPATH": "1",
            "SPARKGUARD_NAMESPACES": NAMESPACE,
            "SPARKGUARD_WEBHOOK_MODE": "disabled",
            "SPARKGUARD_JOURNAL_ROOT": "s3://warehouse/_journal",
            "SPARKGUARD_METRICS_PORT": "0",
            "SPARKGUARD_LIVENESS_PORT": "0",
            "SPARKGUARD_LEADER_ELECTION": "true",
            "SPARKGUARD_LEASE_NAMESPACE": SYSTEM,
            "SPARKGUARD_LEASE_NAME": "sparkguard",
            "SPARKGUARD_LEASE_DURATION": args.lease,
            "SPARKGUARD_CLAIM_TTL": args.claim_ttl,
            "SPARKGUARD_RESUBMIT_TIMEOUT": "10m",  # count resubmissions, not nudges
            "SPARKGUARD_MAX_CONCURRENT_ROLLBACKS": str(args.concurrent_rollbacks),
        }
        self.rollback_seconds = args.rollback_seconds
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.profile: Path | None = args.profile
        self.profilers: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> subprocess.Popen[bytes]:
        log_file = (self.workdir / f"replica-{name}.log").open("wb")
        command = [sys.executable, str(REPLICA), "--kubeconfig", self.kubeconfig]
        command += ["--calls", str(self.calls), "--decisions", str(self.decisions)]
        command += ["--rollback-seconds", str(self.rollback_seconds)]
        process = subprocess.Popen(
            command, env={**self.env, "SPARKGUARD_POD_NAME": name}, stdout=log_file, stderr=log_file
        )
        self.processes[name] = process
        return process

    def profile_burst(self) -> None:
        """Start ``py-spy`` on every replica (``--profile``): samples of the thread that holds
        the GIL (Python's CPU), until :meth:`stop_profiling`."""
        if self.profile is None:
            return
        self.profile.mkdir(parents=True, exist_ok=True)
        for name, process in self.processes.items():
            spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking"]
            spy += ["--gil", "--format", "raw", "--pid", str(process.pid)]
            spy += ["-o", str(self.profile / f"replica-{name}.txt")]
            spy_log = (self.workdir / f"py-spy-{name}.log").open("wb")
            self.profilers.append(subprocess.Popen(spy, stdout=spy_log, stderr=spy_log))

    def stop_profiling(self) -> None:
        """Stop every ``py-spy``; each writes its file as it ends."""
        for profiler in self.profilers:
            if profiler.poll() is None:
                profiler.send_signal(signal.SIGINT)
        for profiler in self.profilers:
            try:
                profiler.wait(60)
            except subprocess.TimeoutExpired:
                profiler.kill()
        self.profilers.clear()

    def identity(self, name: str) -> str:
        path = self.workdir / f"replica-{name}.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            first = path.read_text().split("\n", 1)[0]
            if first.startswith("replica "):
                return first.split()[1]
            time.sleep(0.05)
        raise RuntimeError(f"replica {name} did not start: {path.read_text()[-2000:]}")

    def lines(self, path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        self.stop_profiling()


#: where a profile's samples go, by the first of these found in a stack (innermost first)
LAYERS = (
    ("logging", ("logging/__init__.py", "logging/handlers.py")),
    ("json", ("json/",)),
    ("ssl", ("ssl.py",)),
    ("kubernetes client (with urllib3)", ("kubernetes/", "urllib3/", "http/client.py")),
    ("kopf", ("kopf/",)),
    ("aiohttp", ("aiohttp/", "yarl/", "multidict/")),
    ("sparkguard", ("sparkguard/", "operator/", "replica.py")),
    ("asyncio", ("asyncio/",)),
    ("threads", ("threading.py", "concurrent/")),
)


def profile_summary(path: Path) -> str:
    """Samples of a ``py-spy --format raw`` file by layer (innermost matching frame wins)."""
    totals: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        layer = "other"
        for frame in reversed(frames):
            found = next((n for n, marks in LAYERS if any(m in frame for m in marks)), None)
            if found is not None:
                layer = found
                break
        totals[layer] += int(count)
    whole = sum(totals.values()) or 1
    parts = ", ".join(f"{k} {100 * v / whole:.0f}%" for k, v in totals.most_common())
    return f"{whole} samples: {parts}"


def _wait(check: Any, *, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def _grant_operator(bench: KubeBench) -> None:
    bench.ensure_service_account(SYSTEM, "operator")
    bench.apply_manifest(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": SYSTEM}],
        }
    )


class Watcher:
    """The benchmark's own watch: when each app's resubmission (attempt 1) first appears.

    It lists the apps once (``seen`` fills up) and then continues from the last
    resourceVersion it saw: a watch started anew without one would replay every app (1,000
    objects through the API server and this process every few seconds, in the middle of the
    burst it measures).
    """

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.resubmitted: dict[str, float] = {}
        self.seen: set[str] = set()
        self.version: str | None = None
        self.recovering = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            stream = watch.Watch()
            since = {"resource_version": self.version} if self.version else {}
            try:
                self._follow(stream, since)
            except client.ApiException as exc:
                if exc.status != 410:  # expired: list again
                    raise
                self.version = None

    def _follow(self, stream: watch.Watch, since: dict[str, str]) -> None:
        for event in stream.stream(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            NAMESPACE,
            PLURAL,
            timeout_seconds=5,
            **since,
        ):
            app = event["object"]
            if event.get("type") == "ERROR":
                raise client.ApiException(status=app.get("code") or 500, reason=str(app))
            self.version = app["metadata"].get("resourceVersion") or self.version
            name = app["metadata"]["name"]
            self.seen.add(name)
            notes = app["metadata"].get("annotations") or {}
            if notes.get("sparkguard.io/phase") == "Recovering":
                self.recovering.set()
            conf = app["spec"].get("sparkConf") or {}
            if conf.get("spark.sparkguard.attempt") == "1" and name not in self.resubmitted:
                self.resubmitted[name] = time.time()
            if self.stop.is_set():
                stream.stop()


def _at(stamp: str) -> float:
    """An audit timestamp (RFC 3339, microseconds, UTC) as epoch seconds."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclasses.dataclass(frozen=True)
class _Stored:
    """When the API server stored an app's FAILED status and its resubmission (audit clock)."""

    failed: float
    resubmitted: float


def _stored_times(
    audit: list[dict[str, Any]],
    failing: list[str],
    failed_at: dict[str, float],
    seen_at: dict[str, float],
) -> dict[str, _Stored]:
    """Per failing app, when its FAILED status and its resubmission were stored.

    The FAILED write is the benchmark's status patch of the app (the last one before
    ``failed_at``, when its call returned); the resubmission is the operator's last patch of
    the app stored before the benchmark's watch saw the resubmitted spec (``seen_at``). Both
    are ``stageTimestamp`` of the API server's audit events, so neither the benchmark's client
    nor its watch's delivery is counted in the operator's reaction. An app without such events
    falls back to the client-side times."""
    status: dict[str, list[float]] = collections.defaultdict(list)
    patched: dict[str, list[float]] = collections.defaultdict(list)
    operator = f"system:serviceaccount:{SYSTEM}:operator"
    for event in audit:
        ref = event.get("objectRef") or {}
        if event.get("verb") != "patch" or ref.get("resource") != PLURAL:
            continue
        name = ref.get("name")
        if name not in failed_at:
            continue
        done = _at(event["stageTimestamp"])
        who = event.get("user", {}).get("username")
        if ref.get("subresource") == "status" and who != operator:
            status[name].append(done)
        elif not ref.get("subresource") and who == operator:
            patched[name].append(done)
    times = {}
    for name in failing:
        failed = max((t for t in status[name] if t <= failed_at[name]), default=failed_at[name])
        seen = seen_at[name]
        resubmitted = max((t for t in patched[name] if failed < t <= seen), default=seen)
        times[name] = _Stored(failed=failed, resubmitted=resubmitted)
    return times


def _breakdown(
    audit: list[dict[str, Any]],
    failing: list[str],
    failed_at: dict[str, float],
    seen_at: dict[str, float],
) -> list[str]:
    """Where each recovery's time went, from the API server's audit log (its clock is ours):
    the FAILED write to the operator's first patch of the app arriving (watch delivery, kopf,
    the handler, the slot), each patch's time inside the API server, the gap between the
    operator's patches (the rollback's thread, the client), and the last patch to the
    benchmark's watch seeing it. p50/p99 over the failing apps, in seconds."""
    patches: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for event in audit:
        ref = event.get("objectRef") or {}
        if event.get("verb") != "patch" or ref.get("resource") != PLURAL:
            continue
        if ref.get("subresource") or ref.get("name") not in failed_at:
            continue
        received = _at(event["requestReceivedTimestamp"])
        patches[ref["name"]].append((received, _at(event["stageTimestamp"])))
    parts: dict[str, list[float]] = collections.defaultdict(list)
    for name in failing:
        mine = sorted(patches.get(name, []))
        if not mine or name not in seen_at:
            continue
        parts["FAILED -> first patch arrives"].append(mine[0][0] - failed_at[name])
        for received, done in mine:
            parts["a patch inside the API server"].append(done - received)
        for (_, done), (received, _) in itertools.pairwise(mine):
            parts["between two patches"].append(received - done)
        parts["last patch -> benchmark's watch"].append(seen_at[name] - mine[-1][1])
        parts["FAILED -> last patch stored (rollback included)"].append(
            mine[-1][1] - failed_at[name]
        )
        parts["patches per recovery"].append(len(mine))
    return [
        f"breakdown: {what}: p50 {percentile(v, 0.5):.3f} p99 {percentile(v, 0.99):.3f}"
        for what, v in parts.items()
    ]


def run(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="sg-bench-operator-") as tmp, KubeBench() as bench:
        workdir = Path(tmp)
        api = bench.api_client()
        custom = client.CustomObjectsApi(api)
        bench.ensure_namespace(NAMESPACE)
        _grant_operator(bench)
        if args.profile is not None:
            args.profile = args.profile.resolve()
        log(f"creating {args.apps} opted-in apps")
        for i in range(args.apps):
            app = spark_app(f"app-{i:04d}", namespace=NAMESPACE)
            app["metadata"]["annotations"]["sparkguard.io/backoff"] = "0"
            # as admission stores an opted-in app (the webhook is off here): with the finalizer,
            # else the leader spends its first minute adding it to every app, burst or not
            app["metadata"]["finalizers"] = [FINALIZER]
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, app)
        replicas = Replicas(bench, workdir, args)
        failing = [f"app-{i:04d}" for i in range(0, args.apps, round(1 / args.failing_fraction))]
        watcher = Watcher(api)
        try:
            leader = replicas.start("a")
            leader_id = replicas.identity("a")
            coordination = client.CoordinationV1Api(api)

            def holder() -> str:
                try:
                    lease = coordination.read_namespaced_lease("sparkguard", SYSTEM)
                except client.ApiException:
                    return ""
                return str(lease.spec.holder_identity or "")

            _wait(lambda: holder() == leader_id, what="replica a to lead", timeout=60)
            follower = replicas.start("b")
            follower_id = replicas.identity("b")

            def listed(who: str) -> bool:
                seen = {d["app"] for d in replicas.lines(replicas.decisions) if d["replica"] == who}
                return len(seen) >= args.apps

            _wait(
                lambda: listed(leader_id) and listed(follower_id), what="both to list", timeout=120
            )
            watcher.thread.start()
            _wait(lambda: len(watcher.seen) >= args.apps, what="our watch to list", timeout=120)
            rss_before = {n: _status_kib(p.pid, "VmRSS") for n, p in replicas.processes.items()}
            generations = {
                name: custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)[
                    "metadata"
                ]["generation"]
                for name in failing
            }
            replicas.profile_burst()
            log(f"{len(failing)} apps fail at once")
            failed_at: dict[str, float] = {}

            def fail(name: str) -> None:
                custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, NAMESPACE, PLURAL, name, {"status": failed_status()}
                )
                failed_at[name] = time.time()

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(fail, failing))
            kill_after = max(1, len(failing) // 5)

            def leader_mid_recovery() -> bool:
                started = [c for c in replicas.lines(replicas.calls) if c["replica"] == leader_id]
                return len(started) >= kill_after

            _wait(leader_mid_recovery, what="the leader to start rollbacks", timeout=120)
            survivor_id, survivor = leader_id, leader
            killed_at = float("inf")
            if not args.no_kill:
                leader.send_signal(signal.SIGKILL)
                leader.wait()
                killed_at = time.time()
                survivor_id, survivor = follower_id, follower
                log(f"SIGKILLed the leader after {kill_after} rollback(s) had started")
            _wait(
                lambda: set(failing) <= watcher.resubmitted.keys(),
                what="every failing app to be resubmitted",
                timeout=max(120, len(failing) * 2.0),
            )

            def settled() -> bool:
                seen = {
                    d["app"]
                    for d in replicas.lines(replicas.decisions)
                    if d["replica"] == survivor_id and "resubmitted attempt 1" in d["reason"]
                }
                return set(failing) <= seen

            _wait(settled, what="the surviving replica to settle", timeout=120)
            replicas.stop_profiling()
            peak = _status_kib(survivor.pid, "VmHWM")
            rss_now = _status_kib(survivor.pid, "VmRSS")
            calls = replicas.lines(replicas.calls)
        finally:
            watcher.stop.set()
            replicas.stop()
        everyone = bench.audit_events()
        stored = _stored_times(everyone, failing, failed_at, watcher.resubmitted)
        counts: collections.Counter[int] = collections.Counter()
        reactions, reactions_after_kill, unqueued, queue_waits = [], [], [], []
        watched: list[float] = []
        for name in failing:
            app = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
            counts[app["metadata"]["generation"] - generations[name]] += 1
            last = json.loads(
                app["metadata"]["annotations"].get("sparkguard.io/last-rollback", "{}")
            )
            rollback = float(last.get("seconds") or 0.0)
            queued = float(last.get("queued") or 0.0)
            watched.append(watcher.resubmitted[name] - failed_at[name] - rollback)
            reaction = stored[name].resubmitted - stored[name].failed - rollback
            reactions.append(reaction)
            # the operator's own share: without the wait for a rollback slot either
            unqueued.append(reaction - queued)
            queue_waits.append(queued)
            if watcher.resubmitted[name] > killed_at:
                reactions_after_kill.append(reaction)
        user = f"system:serviceaccount:{SYSTEM}:operator"
        requests: collections.Counter[str] = collections.Counter()
        audit = [e for e in everyone if e.get("user", {}).get("username") == user]
        breakdown = _breakdown(audit, failing, failed_at, watcher.resubmitted)
        for event in audit:
            ref = event.get("objectRef") or {}
            resource = ref.get("resource") or "discovery"
            resource += "/" + ref["subresource"] if ref.get("subresource") else ""
            requests[f"{event['verb']} {resource}"] += 1
        api.close()
    per_job = collections.Counter(c["job"] for c in calls)
    log(
        f"rollback calls: {len(calls)} for {len(failing)} apps "
        f"({sum(1 for n in per_job.values() if n > 1)} apps rolled back again by the new leader)"
    )
    once, twice, never = counts[1], counts[2], counts[0]
    p50, p99 = percentile(reactions, 0.5), percentile(reactions, 0.99)
    log(
        f"FAILED -> resubmit patch, rollback excluded: p50 {p50:.2f}s p99 {p99:.2f}s "
        f"(max {max(reactions):.2f}s); resubmitted after the kill: {len(reactions_after_kill)}"
    )
    log(
        f"the same as the benchmark's own watch saw the resubmission (its watch's delivery "
        f"included): p50 {percentile(watched, 0.5):.2f}s p99 {percentile(watched, 0.99):.2f}s"
    )
    log(
        f"of which waiting for one of {args.concurrent_rollbacks} rollback slots "
        f"(last-rollback.queued): p50 {percentile(queue_waits, 0.5):.2f}s "
        f"p99 {percentile(queue_waits, 0.99):.2f}s; without that wait (the operator's own "
        f"share): p50 {percentile(unqueued, 0.5):.2f}s p99 {percentile(unqueued, 0.99):.2f}s"
    )
    for line in breakdown:
        log(line)
    mib = {n: round(kib / 1024) for n, kib in rss_before.items()}
    log(
        f"RSS before the burst: {mib} MiB; survivor now {rss_now / 1024:.0f} MiB, "
        f"peak {peak / 1024:.0f} MiB"
    )
    recovery = {k: v for k, v in requests.items() if "lease" not in k and k.split()[0] not in (
        "watch", "list") and "discovery" not in k}  # fmt: skip
    per = {k: round(v / len(failing), 2) for k, v in sorted(recovery.items())}
    log(f"apiserver requests per recovery (both replicas): {per}")
    other = {k: v for k, v in sorted(requests.items()) if k not in recovery}
    log(f"other requests in the whole run (watches, lists, Lease, discovery): {other}")
    if args.profile is not None:
        for path in sorted(args.profile.glob("replica-*.txt")):
            log(f"profile {path.name}: {profile_summary(path)}")
    return (
        f"operator: apps={args.apps} resubmitted-once={once} twice={twice} never={never} "
        f"p99={p99:.2f}s rss={peak / 1024:.0f}MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 apps (about a minute)")
    parser.add_argument("--apps", type=int, default=1000)
    parser.add_argument("--failing-fraction", type=float, default=0.1)
    parser.add_argument("--rollback-seconds", type=float, default=0.5)
    parser.add_argument("--concurrent-rollbacks", type=int, default=16)  # the chart's default
    parser.add_argument("--lease", default="5s", help="SPARKGUARD_LEASE_DURATION")
    parser.add_argument("--claim-ttl", default="6s", help="SPARKGUARD_CLAIM_TTL")
    parser.add_argument("--no-kill", action="store_true", help="leave the leader alive")
    parser.add_argument(
        "--profile", type=Path, help="py-spy each replica; collapsed stacks into this folder"
    )
    parser.add_argument(
        "--real-operator",
        action="store_true",
        help="instead: a driver's death to the next driver's first task on upstream's "
        "spark-operator with real pods, sparkguard against spark-operator's own restart",
    )
    parser.add_argument("--rounds", type=int, default=2, help="--real-operator: rounds")
    args = parser.parse_args()
    if args.quick:
        args.apps = 100
    # The kube bench runs only inside the network guard: re-run this command there.
    netguard.reexec_inside()
    if args.real_operator:
        if args.rounds < 1:
            print("operator benchmark: --rounds must be >= 1")
            return 2
        import _restart  # beside this file; starts nothing on import

        started = time.monotonic()
        line = _restart.run(args.rounds)
        log(f"took {time.monotonic() - started:.0f}s")
        print(line, flush=True)
        return 0
    if not 0 < args.failing_fraction <= 1 or args.apps < 10:
        print("operator benchmark: --apps must be >= 10 and --failing-fraction in (0, 1]")
        return 2
    started = time.monotonic()
    line = run(args)
    log(f"took {time.monotonic() - started:.0f}s")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
