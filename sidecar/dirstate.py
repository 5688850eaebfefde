"""The in-memory state of one marker directory in the batcher.

What the sidecar knows of the directory (the acknowledged names, each batch file's content and
version, whether its instant is decided or its directory sealed), the names queued and the
futures of the requests waiting for them, the flushes running, and the adaptive policy's view
of the clients. Touched only from the event loop.
"""

from __future__ import annotations

import asyncio

from sparkguard.sidecar import outcomes, validation
from sparkguard.spark_lib import filemanager


class DirState:
    """In-memory state of one marker directory. Touched only from the event loop."""

    def __init__(self, marker_dir: validation.MarkerDir, manager: filemanager.FileManager) -> None:
        self.dir = marker_dir
        self.manager = manager
        self.path = marker_dir.path
        self.outcome_path = outcomes.outcome_path(marker_dir.path, marker_dir.instant)
        #: the instant's outcome exists (sticky: an instant is decided once and for all)
        self.decided = False
        #: the commit read the markers (W8): no marker is acknowledged from then on (sticky)
        self.sealed = False
        self.loaded = False
        self.load_lock = asyncio.Lock()
        self.type_lock = asyncio.Lock()
        self.type_written = False
        self.known: set[str] = set()
        self.files: dict[int, bytes] = {}
        #: index -> the version of ``MARKERS<index>`` this sidecar last wrote or read (absent:
        #: no such file known, the next flush to it creates it)
        self.versions: dict[int, str | None] = {}
        #: indices rewritten without a check since the last check that found the instant
        #: undecided (their newest markers may postdate a claim; see delete_dir)
        self.unchecked: set[int] = set()
        #: name -> future resolved when acknowledged (result: whether this sidecar wrote it);
        #: names queued or being written
        self.waiting: dict[str, asyncio.Future[bool]] = {}
        self.queue: list[str] = []
        #: event-loop time the oldest queued name was queued, and the newest (adaptive mode)
        self.queued_at = 0.0
        self.arrived_at = 0.0
        #: adaptive mode: the timer that considers a flush when the queue is due
        self.timer: asyncio.TimerHandle | None = None
        #: a flush was started and has not taken the queue yet (names arriving meanwhile join it)
        self.starting = False
        #: adaptive mode: names per second queued, a moving average over the recent batches
        self.rate = 0.0
        #: adaptive mode: each client (connection) answered before that sent a marker lately ->
        #: when it last did (a client's first marker does not count: at a job's start the
        #: pause rule batches the arrivals)
        self.clients: dict[object, float] = {}
        #: adaptive mode: clients waiting for an ack now -> how many of their requests wait
        self.blocked: dict[object, int] = {}
        #: adaptive mode: how many of ``clients`` are in ``blocked``
        self.clients_blocked = 0
        self.busy: set[int] = set()
        self.deleting = 0
        self.users = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def sent(self, client: object, now: float) -> None:
        """Adaptive mode: ``client`` (``None``: not counted) sent a marker and waits for it."""
        if client is None:
            return
        waiting = self.blocked.get(client, 0)
        self.blocked[client] = waiting + 1
        if client in self.clients:
            self.clients[client] = now
            self.clients_blocked += not waiting

    def answered(self, client: object, now: float) -> None:
        """Adaptive mode: one request of ``client`` (``None``: not counted) was answered."""
        if client is None:
            return
        left = self.blocked.pop(client) - 1
        if left:
            self.blocked[client] = left
        elif client in self.clients:
            self.clients_blocked -= 1
        self.clients[client] = now

    def every_client_waits(self) -> bool:
        """Adaptive mode: every client answered before that sent lately waits for an ack now,
        so no name is coming that waiting longer would add to the batch."""
        return 0 < len(self.clients) == self.clients_blocked

    def evictable(self) -> bool:
        """Whether nothing uses this state now (no request, flush, delete or load), so the
        batcher may drop it from its cache."""
        return (
            not self.waiting
            and not self.busy
            and not self.deleting
            and not self.users
            and not self.load_lock.locked()
        )


def forget_idle_clients(state: DirState, since: float) -> None:
    """Adaptive mode: forget the clients that sent nothing since ``since`` and wait for
    nothing (a task that ended, or one writing a long file: it is not about to send)."""
    for client in [c for c, seen in state.clients.items() if seen < since]:
        if client not in state.blocked:
            del state.clients[client]


def disarm(state: DirState) -> None:
    """Adaptive mode: cancel the timer that would consider a flush of ``state``, if armed."""
    if state.timer is not None:
        state.timer.cancel()
        state.timer = None
