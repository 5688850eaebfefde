"""Running the operator in-process against kmock's Kubernetes emulator."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import kmock
import kopf
from kubernetes import client

from sparkguard.operator import config as config_
from sparkguard.operator import kube, main
from sparkguard.operator import runtime as runtime_
from tests.operator.apps import APACHE_GROUP, APACHE_VERSION, GROUP, PLURAL, VERSION

APPS = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}"
EPOCH = datetime.datetime(2026, 11, 22, tzinfo=datetime.UTC)
_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


def declare_resources(server: kmock.KubernetesEmulator) -> None:
    """What kopf must discover: namespaces (it waits for them), events, secrets, pods (the
    driver pod watch), our CRD."""
    server.resources["v1/namespaces"] = kmock.ResourceInfo(
        kind="Namespace", namespaced=False, verbs=_VERBS
    )
    server.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True, verbs=_VERBS)
    server.resources["v1/secrets"] = kmock.ResourceInfo(
        kind="Secret", namespaced=True, verbs=_VERBS
    )
    server.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs=_VERBS)
    server.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind="SparkApplication",
        namespaced=True,
        verbs=_VERBS,
        subresources={"status"},
        shortnames={"sparkapp"},
    )
    server.resources[f"{APACHE_GROUP}/{APACHE_VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind="SparkApplication",
        namespaced=True,
        verbs=_VERBS,
        subresources={"status"},
        shortnames={"sparkapp"},
    )
    server.resources["admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"] = (
        kmock.ResourceInfo(kind="MutatingWebhookConfiguration", namespaced=False, verbs=_VERBS)
    )


def api_client(server: kmock.KubernetesEmulator) -> client.ApiClient:
    """A kubernetes client pointed at kmock (plain HTTP, no credentials)."""
    return client.ApiClient(client.Configuration(host=str(server.url).rstrip("/")))


@dataclasses.dataclass
class FakeSummary:
    """Stands in for the library's RollbackSummary."""

    instants_rolled_back: tuple[str, ...] = ("20261122100000000-job",)
    instants_committed: tuple[str, ...] = ()
    files_deleted: int = 2
    files_kept: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FakeRollback:
    """A rollback_job that records its calls; optionally blocks until released."""

    summary: FakeSummary = dataclasses.field(default_factory=FakeSummary)
    calls: list[tuple[str, str, Mapping[str, Any] | None]] = dataclasses.field(default_factory=list)
    #: the ``owner=`` of each call, in order
    owners: list[str | None] = dataclasses.field(default_factory=list)
    gate: threading.Event | None = None
    entered: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: set before releasing the gate to make the blocked call fail, as if its process died
    abandoned: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: Exception | None = None

    def __call__(
        self,
        job_id: str,
        journal: str,
        *,
        owner: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> FakeSummary:
        self.owners.append(owner)
        self.calls.append((job_id, journal, storage_options))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
            if self.abandoned.is_set():
                raise RuntimeError("the operator stopped during this rollback")
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.summary


@dataclasses.dataclass
class Decisions:
    """Records what an operator decided about each app: the signal tests wait for."""

    seen: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    def __call__(self, key: Any, decision: Any) -> None:
        self.seen.append((key.name, str(decision.action), decision.reason))

    def count(self, name: str, action: str, *, containing: str = "") -> int:
        """How many decisions about ``name`` were ``action`` (with ``containing`` in the reason)."""
        return sum(
            1 for n, a, reason in self.seen if n == name and a == action and containing in reason
        )


def loop_clock() -> Callable[[], datetime.datetime]:
    """A wall clock that follows the event loop's (possibly fake, looptime) time."""
    loop = asyncio.get_running_loop()
    return lambda: EPOCH + datetime.timedelta(seconds=loop.time())


def make_runtime(
    server: kmock.KubernetesEmulator,
    *,
    config: config_.OperatorConfig,
    rollback: FakeRollback,
    **kwargs: Any,
) -> runtime_.Runtime:
    """A runtime wired to kmock, with a fake rollback and the loop's clock."""
    return runtime_.Runtime(
        config=config,
        kube=kube.KubeClient(api_client(server)),
        rollback=rollback,
        clock=loop_clock(),
        **kwargs,
    )


@contextlib.asynccontextmanager
async def operating(runtime: runtime_.Runtime) -> AsyncIterator[asyncio.Task[None]]:
    """Run the operator in this loop; always stop it on exit (else teardown waits on retries)."""
    stop = asyncio.Event()
    ready = asyncio.Event()
    settings = kopf.OperatorSettings()
    settings.queueing.idle_timeout = 0.2  # idle per-object workers exit fast: quick shutdowns
    before = asyncio.all_tasks()
    task = asyncio.create_task(
        main.run(runtime, stop_flag=stop, ready_flag=ready, settings=settings)
    )
    readiness = asyncio.create_task(ready.wait())
    try:
        done, _ = await asyncio.wait(
            [task, readiness], timeout=30, return_when=asyncio.FIRST_COMPLETED
        )
        if task in done:
            task.result()  # raises what stopped it
        yield task
    finally:
        stop.set()
        readiness.cancel()
        # kopf stops its root tasks at once, then gives every other task created since it
        # started 5 s to end: here those include kmock's handlers of kopf's finished watch
        # requests, which only end when cancelled. The operator's own tasks (its handlers
        # among them) get up to 2 s; kmock's are not waited for.
        await _operator_tasks_ended(task, before | {readiness}, within=2.0)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)


async def _operator_tasks_ended(
    run: asyncio.Task[None], earlier: set[asyncio.Task[Any]], *, within: float
) -> None:
    """Wait until ``run`` ended, or every task it started but kmock's server handlers did,
    or ``within`` seconds passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    me = asyncio.current_task()
    while not run.done() and loop.time() < deadline:
        left = [
            t
            for t in asyncio.all_tasks()
            if t not in earlier and t is not run and t is not me and not _served_by_kmock(t)
        ]
        if not left:
            return
        await asyncio.sleep(0.01)


def _served_by_kmock(task: asyncio.Task[Any]) -> bool:
    """A task of kmock's HTTP server (aiohttp's request handling), not of the operator."""
    code = getattr(task.get_coro(), "cr_code", None)
    filename = code.co_filename if code is not None else ""
    return "/aiohttp/web" in filename or "/kmock/" in filename


async def eventually(check: Callable[[], Any], *, within: float = 20.0) -> Any:
    """Poll ``check`` until it returns a truthy value (the value) or raise AssertionError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s: {check}")
        await asyncio.sleep(0.05)


async def create_app(server: kmock.KubernetesEmulator, app: Mapping[str, Any]) -> None:
    ns = app["metadata"]["namespace"]
    async with server.post(APPS.format(ns=ns), json=dict(app)) as resp:
        assert resp.status < 300, await resp.text()


async def patch_app(
    server: kmock.KubernetesEmulator, ns: str, name: str, patch: Mapping[str, Any], *, status: bool
) -> None:
    path = APPS.format(ns=ns) + f"/{name}" + ("/status" if status else "")
    async with server.patch(
        path, json=dict(patch), headers={"Content-Type": "application/merge-patch+json"}
    ) as resp:
        assert resp.status < 300, await resp.text()


def stored(server: kmock.KubernetesEmulator, ns: str, name: str) -> dict[str, Any]:
    """The app as kmock stores it now (a plain dict)."""
    key = (kmock.resource(GROUP, VERSION, PLURAL), ns, name)
    return dict(server.objects[key].raw) if key in server.objects else {}


def exists(server: kmock.KubernetesEmulator, ns: str, name: str) -> bool:
    """Whether kmock still stores the app (a deleted one held by finalizers counts)."""
    key = (kmock.resource(GROUP, VERSION, PLURAL), ns, name)
    return key in server.objects and not server.objects[key].deleted


async def delete_app(server: kmock.KubernetesEmulator, ns: str, name: str) -> None:
    """DELETE the app, as spark-operator's TTL or a ScheduledSparkApplication's history does."""
    async with server.delete(APPS.format(ns=ns) + f"/{name}") as resp:
        assert resp.status < 300, await resp.text()


def notes(server: kmock.KubernetesEmulator, ns: str, name: str) -> dict[str, str]:
    return dict((stored(server, ns, name).get("metadata") or {}).get("annotations") or {})


def app_patches(server: kmock.KubernetesEmulator, name: str) -> list[dict[str, Any]]:
    """Bodies of every PATCH of the app (not its /status) in kmock's request log."""
    return [
        r.data
        for r in list(server)
        if str(r.method).upper().endswith("PATCH")
        and r.resource is not None
        and r.resource.plural == PLURAL
        and r.name == name
        and not r.subresource
    ]


def resubmissions(server: kmock.KubernetesEmulator, name: str) -> list[str]:
    """The attempts written into spec.sparkConf by PATCHes (each one is a resubmission)."""
    found = []
    for data in app_patches(server, name):
        conf = ((data or {}).get("spec") or {}).get("sparkConf") or {}
        if "spark.sparkguard.attempt" in conf:
            found.append(conf["spark.sparkguard.attempt"])
    return found


def posted_events(server: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    """Bodies of the Events the operator posted."""
    return [
        r.data
        for r in list(server)
        if str(r.method).upper().endswith("POST")
        and r.resource is not None
        and r.resource.plural == "events"
    ]


def event_reasons(server: kmock.KubernetesEmulator, name: str) -> list[str]:
    return [
        e["reason"]
        for e in posted_events(server)
        if (e.get("involvedObject") or {}).get("name") == name
    ]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
