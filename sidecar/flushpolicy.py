"""When a marker directory's flush starts, and which batch file it appends to.

Three flush policies (:class:`~sparkguard.sidecar.config.FlushMode`). ``adaptive`` (the
default) starts a directory's flush once ``batch_size`` names are queued, once its oldest queued
name has waited ``batch_interval_ms``, once no name has arrived for a fifth of that (the
arrivals paused: waiting longer would only delay the ones queued), or once every client
answered before that sent lately waits for an ack (no name is coming); ``interval`` starts a flush
of every directory with queued names each ``batch_interval_ms``; ``group-commit`` starts a
directory's flush as soon as a name is queued and none is running, so names that arrive during a
write ride on the next one. Up to ``batch_threads`` flushes of one directory run at a time
(group-commit: one), each on its own file: the first free file still under
:data:`FILE_FULL_BYTES`, so a directory holds few files and few are created (each creation
costs two outcome reads).

The batcher (:mod:`~sparkguard.sidecar.batcher`) applies the policies; the two decisions that
take computing, which file a flush appends to and when an adaptive queue is due, are the pure
functions here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final

#: a batch file this large takes no more appends while another file can (bounds each rewrite)
FILE_FULL_BYTES: Final = 64 * 1024
#: adaptive mode: a queue that got no new name for ``batch_interval_ms / _PAUSE_DIVISOR`` flushes
#: (unless names come fast enough to fill a batch within the interval: then a gap is a stall)
_PAUSE_DIVISOR: Final = 5
#: adaptive mode: weight of the newest batch in the directory's arrival rate (names per second)
RATE_WEIGHT: Final = 0.25
#: adaptive mode: a client that sent nothing for this many intervals no longer counts as one
#: that may send the next name (forgotten at the next flush)
CLIENT_MEMORY_INTERVALS: Final = 2


def pick_batch_file(sizes: Mapping[int, int], busy: Collection[int], threads: int) -> int:
    """The index of the batch file a flush appends to, among ``threads`` files of which those in
    ``busy`` are being written; ``sizes`` maps the files that exist (or are known) to their size.

    The lowest free file under :data:`FILE_FULL_BYTES`, else the lowest free index not created
    yet, else the smallest free file. A purely computational function with no side-effects; at
    least one index must be free.
    """
    free = [index for index in range(threads) if index not in busy]
    for index in free:
        if index in sizes and sizes[index] < FILE_FULL_BYTES:
            return index
    for index in free:
        if index not in sizes:
            return index
    return min(free, key=lambda index: (sizes[index], index))


def flush_due(
    *, queued_at: float, arrived_at: float, rate: float, interval_s: float, batch_size: int
) -> float:
    """Adaptive mode: when a queue whose oldest name came at ``queued_at`` and newest at
    ``arrived_at`` is due for a flush (unless it reaches ``batch_size`` first).

    At ``queued_at + interval_s`` at the latest; at a pause of a fifth of the interval after the
    newest name while ``rate`` (names per second) is too slow to fill a batch within the
    interval. A purely computational function with no side-effects.
    """
    due = queued_at + interval_s
    if rate * interval_s < batch_size:
        due = min(due, arrived_at + interval_s / _PAUSE_DIVISOR)
    return due
