"""Owner claims: who may open writes of a job on a table (the atomic half of rule O4).

O4 says a writer refuses to start while another owner has an undecided write of the same job
id on the table: both would write the same file names. Checking the timeline and then writing
``.inflight`` is check-then-act: two owners that start within milliseconds both pass. So the
owners of a job on a table take turns through a sequence of claims, each written put-if-absent
(docs/storage-contract.md, "Owner claims")::

    <table>/_sparkguard/owners/<jobId>/<epoch:010d>.json   {"jobId", "owner", "epoch", "claimed"}

The claim with the highest epoch is the current one. A writer whose owner holds it writes on;
another owner takes the next epoch, after finding no undecided instant of the job (O4), and of
two owners racing for one epoch exactly one gets it. After writing its ``.inflight`` a writer
*confirms* (:func:`sparkguard.spark_lib.storage.rollback.confirm_sole_writer`): an epoch after
its own means another owner took over while it was starting, so it backs off; an instant of
another owner that appeared meanwhile is waited for until it is decided. Epochs are dense
(epoch n+1 is only ever written by someone who saw n), so "was I superseded?" is one existence
check.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, formats, paths
from sparkguard.spark_lib.storage import timeline

OWNERS_DIR: Final = "owners"
CLAIM_KIND: Final = "sparkguard.owner-claim"
VERSION: Final = 1
_CLAIM_NAME: Final = re.compile(r"^(?P<epoch>[0-9]{10})\.json$")
#: Racing writers re-read the claims after losing a put; this many rounds is far beyond any race.
_MAX_ROUNDS: Final = 100


@dataclasses.dataclass(frozen=True)
class Claim:
    """One owner's turn at writing a job on a table."""

    epoch: int
    owner: str


class OwnerClaims:
    """The owner claims of one job on one table."""

    def __init__(self, manager: filemanager.FileManager, table: str, job_id: str) -> None:
        self.manager = manager
        self.job_id = timeline.validate_job_id(job_id)
        self.directory = paths.join(
            paths.validate_base(table, what="table path"),
            timeline.SPARKGUARD_DIR,
            OWNERS_DIR,
            job_id,
        )

    def path(self, epoch: int) -> str:
        """Where the claim of ``epoch`` is."""
        return paths.join(self.directory, f"{epoch:010d}.json")

    def current(self) -> Claim | None:
        """The claim with the highest epoch, or ``None`` when the job was never claimed here."""
        epochs = []
        for info in self.manager.list(self.directory):
            if info.name.startswith("."):
                continue  # a temp file of a put in progress (or a store's own hidden file)
            match = _CLAIM_NAME.fullmatch(info.name)
            if match is None:
                raise errors.CorruptFileError(
                    f"unexpected file {info.path} among the owner claims of job {self.job_id!r}; "
                    "move it elsewhere"
                )
            epochs.append(int(match["epoch"]))
        if not epochs:
            return None
        return self.read(max(epochs))

    def read(self, epoch: int) -> Claim:
        """The claim of ``epoch``; :class:`FileNotFoundError` when there is none."""
        path = self.path(epoch)
        body = formats.decode(
            self.manager.read_bytes(path),
            kind=CLAIM_KIND,
            versions=frozenset({VERSION}),
            source=path,
        )
        owner = body.get("owner")
        if body.get("epoch") != epoch or not isinstance(owner, str) or not owner:
            raise errors.CorruptFileError(
                f"{path}: an owner claim needs 'epoch' {epoch} and a non-empty 'owner'; "
                "it was not written by sparkguard: move it elsewhere"
            )
        return Claim(epoch=epoch, owner=owner)

    def acquire(self, owner: str) -> Claim:
        """This owner's claim: the current one when it is this owner's, else a new epoch.

        Call it only after finding no undecided instant of another owner (O4). Of owners racing
        for one epoch exactly one gets it; the others read again and take the next one (and
        the confirmation after ``.inflight`` sorts out who writes).
        """
        for _ in range(_MAX_ROUNDS):
            current = self.current()
            if current is not None and current.owner == owner:
                return current
            epoch = 0 if current is None else current.epoch + 1
            body = {
                "jobId": self.job_id,
                "owner": owner,
                "epoch": epoch,
                "claimed": datetime.datetime.now(datetime.UTC).isoformat(),
            }
            if self.manager.put_if_absent(
                self.path(epoch), formats.encode(CLAIM_KIND, VERSION, body)
            ):
                return Claim(epoch=epoch, owner=owner)
        raise errors.SparkguardError(
            f"could not claim job {self.job_id!r} in {self.directory} after {_MAX_ROUNDS} "
            "rounds of racing owners; run the write again"
        )

    def successor(self, claim: Claim) -> Claim | None:
        """The claim that took over from ``claim`` (another owner's turn), or ``None``."""
        try:
            return self.read(claim.epoch + 1)
        except FileNotFoundError:
            return None
