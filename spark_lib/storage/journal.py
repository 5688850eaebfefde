"""The job journal: which tables and instants a job opened, so rollback needs only the job id.

Layout: ``<journal>/<jobId>/<instant>~<table-hash>.json``, one small put-if-absent file per
(table, instant), written before the job writes any data file of that instant. Appending never
rewrites a shared file, so concurrent writers of one job (several tables at once) cannot lose
each other's entries.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from typing import Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, formats, paths
from sparkguard.spark_lib.storage import timeline

KIND: Final = "sparkguard.journal-entry"
VERSION: Final = 1


@dataclasses.dataclass(frozen=True)
class JournalEntry:
    """One instant a job opened on one table."""

    job_id: str
    table: str
    instant: str
    attempt: int
    opened: str


def _table_key(table: str) -> str:
    return hashlib.sha256(table.encode()).hexdigest()[:16]


class Journal:
    """The journal of one job, stored under ``<root>/<jobId>/``."""

    def __init__(self, manager: filemanager.FileManager, root: str, job_id: str) -> None:
        self.manager = manager
        self.job_id = timeline.validate_job_id(job_id)
        self.root = paths.validate_base(root, what="journal location")
        self.directory = paths.join(self.root, job_id)

    def record(self, *, table: str, instant: str, attempt: int) -> JournalEntry:
        """Record that this job opened ``instant`` on ``table`` (a table URL). Idempotent."""
        if timeline.job_of_instant(instant) != self.job_id:
            raise errors.ConfigError(
                f"instant {instant} belongs to job {timeline.job_of_instant(instant)!r}, not "
                f"{self.job_id!r}; each job records only its own instants"
            )
        entry = JournalEntry(
            job_id=self.job_id,
            table=table,
            instant=instant,
            attempt=attempt,
            opened=datetime.datetime.now(datetime.UTC).isoformat(),
        )
        data = formats.encode(
            KIND,
            VERSION,
            {
                "jobId": entry.job_id,
                "table": entry.table,
                "instant": entry.instant,
                "attempt": entry.attempt,
                "opened": entry.opened,
            },
        )
        self.manager.mkdirs(self.directory)
        self.manager.put_if_absent(
            paths.join(self.directory, f"{instant}~{_table_key(table)}.json"), data
        )
        return entry

    def entries(self) -> list[JournalEntry]:
        """Every recorded (table, instant) of the job, in instant order."""
        result = []
        for info in self.manager.list(self.directory):
            if filemanager.is_temp_name(info.name):
                continue
            if not info.name.endswith(".json") or "~" not in info.name:
                raise errors.CorruptFileError(
                    f"unexpected file {info.path} in the journal of job {self.job_id}; "
                    "move it elsewhere"
                )
            data = self.manager.read_bytes(info.path)
            doc = formats.decode(data, kind=KIND, versions=frozenset({VERSION}), source=info.path)
            result.append(
                JournalEntry(
                    job_id=formats.require(doc, "jobId", str, source=info.path),
                    table=formats.require(doc, "table", str, source=info.path),
                    instant=formats.require(doc, "instant", str, source=info.path),
                    attempt=formats.require(doc, "attempt", int, source=info.path),
                    opened=formats.require(doc, "opened", str, source=info.path),
                )
            )
        return sorted(result, key=lambda e: (e.instant, e.table))

    def tables(self) -> list[str]:
        """The distinct tables the job opened instants on."""
        return sorted({e.table for e in self.entries()})
