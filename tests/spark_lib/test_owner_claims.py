"""O4 made atomic (docs/storage-contract.md, "Owner claims"): two owners that open a write of
one job id on one table at the same moment never both write.

The unit cases place each interleaving by hand; the race runs the writer's own driver step
(``SparkguardDataSource.writer``, what Spark's planner calls) in two processes released by one
barrier, at the same instant and a few milliseconds apart, round after round.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.storage import owners, rollback, timeline
from tests.spark_lib.spark_conftest import assert_exactly_once
from tests.spark_lib.test_rollback import PARTS, SCHEMA, _task

JOB = "nightly-1"


def _timeline(tmp_path: Path) -> timeline.Timeline:
    manager, path = filemanager.resolve(str(tmp_path / "t"))
    return timeline.Timeline(manager, path)


def _open(tl: timeline.Timeline, guard: rollback.WriteGuard) -> str:
    return tl.start(JOB, owner=guard.claim.owner, attempt=0, marker_type="DIRECT")


def test_claims_are_dense_and_taken_once_per_owner(tmp_path: Path) -> None:
    tl = _timeline(tmp_path)
    claims = owners.OwnerClaims(tl.manager, tl.table, JOB)
    assert claims.current() is None
    a = claims.acquire("k8s:ns/a/1")
    assert a == owners.Claim(0, "k8s:ns/a/1")
    assert claims.acquire("k8s:ns/a/1") == a  # the same owner keeps its turn
    b = claims.acquire("k8s:ns/b/2")
    assert b == owners.Claim(1, "k8s:ns/b/2")
    assert claims.successor(a) == b
    assert claims.successor(b) is None
    assert claims.current() == b


def test_a_writer_superseded_while_starting_backs_off_and_the_other_writes(
    tmp_path: Path,
) -> None:
    """Both found no undecided instant; B took the next epoch before A's ``.inflight``."""
    tl = _timeline(tmp_path)
    guard_a = rollback.guard_write(tl, job_id=JOB, owner="k8s:ns/a/1")
    guard_b = rollback.guard_write(tl, job_id=JOB, owner="k8s:ns/b/2")
    instant_a, instant_b = _open(tl, guard_a), _open(tl, guard_b)
    with pytest.raises(errors.OwnerConflictError, match="'k8s:ns/b/2' took over") as caught:
        rollback.confirm_sole_writer(tl, guard_a, instant=instant_a)
    assert "nothing was written" in str(caught.value)
    assert tl.status(instant_a).state is timeline.State.ROLLED_BACK
    rollback.confirm_sole_writer(tl, guard_b, instant=instant_b)  # B writes
    assert tl.status(instant_b).state is timeline.State.INFLIGHT


def test_the_newer_owner_waits_for_a_racing_instant_to_be_decided(tmp_path: Path) -> None:
    """B's confirmation sees A's instant still in flight: A backs off within the wait."""
    tl = _timeline(tmp_path)
    guard_a = rollback.guard_write(tl, job_id=JOB, owner="k8s:ns/a/1")
    guard_b = rollback.guard_write(tl, job_id=JOB, owner="k8s:ns/b/2")
    instant_a, instant_b = _open(tl, guard_a), _open(tl, guard_b)
    polls = []

    def a_backs_off_meanwhile(seconds: float) -> None:
        polls.append(seconds)
        with pytest.raises(errors.OwnerConflictError):
            rollback.confirm_sole_writer(tl, guard_a, instant=instant_a)

    rollback.confirm_sole_writer(tl, guard_b, instant=instant_b, sleep=a_backs_off_meanwhile)
    assert len(polls) == 1
    assert tl.status(instant_a).state is timeline.State.ROLLED_BACK


def _a_writes_then_b_claims(tl: timeline.Timeline) -> tuple[str, rollback.WriteGuard]:
    """A opens and confirms its write; B's O4 check ran before A's ``.inflight`` existed, so B
    claims the next epoch. Returns A's instant and B's guard."""
    guard_a = rollback.guard_write(tl, job_id=JOB, owner="k8s:ns/a/1")
    instant_a = _open(tl, guard_a)
    rollback.confirm_sole_writer(tl, guard_a, instant=instant_a)
    claim_b = owners.OwnerClaims(tl.manager, tl.table, JOB).acquire("k8s:ns/b/2")
    return instant_a, rollback.WriteGuard(claim=claim_b, known=frozenset())


def test_an_instant_still_in_flight_after_the_wait_makes_the_newer_owner_back_off(
    tmp_path: Path,
) -> None:
    """A confirmed before B claimed (so A writes); B must not write over it."""
    tl = _timeline(tmp_path)
    instant_a, guard_b = _a_writes_then_b_claims(tl)
    instant_b = _open(tl, guard_b)
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(errors.OwnerConflictError, match=f"instant {instant_a} .* in flight"):
        rollback.confirm_sole_writer(
            tl, guard_b, instant=instant_b, settle_timeout=1.0, sleep=sleep, clock=clock
        )
    assert now[0] >= 1.0
    assert tl.status(instant_b).state is timeline.State.ROLLED_BACK
    assert tl.status(instant_a).state is timeline.State.INFLIGHT  # A's write goes on


def test_an_instant_committed_meanwhile_makes_the_newer_owner_back_off(tmp_path: Path) -> None:
    """A wrote and committed between B's check and B's confirmation: B's write n would reuse
    A's committed names."""
    tl = _timeline(tmp_path)
    instant_a, guard_b = _a_writes_then_b_claims(tl)
    tl.commit(instant_a, [])
    instant_b = _open(tl, guard_b)
    with pytest.raises(errors.OwnerConflictError, match="committed meanwhile"):
        rollback.confirm_sole_writer(tl, guard_b, instant=instant_b)


def test_a_damaged_claim_is_named(tmp_path: Path) -> None:
    tl = _timeline(tmp_path)
    claims = owners.OwnerClaims(tl.manager, tl.table, JOB)
    claims.acquire("k8s:ns/a/1")
    tl.manager.write_bytes(paths.join(claims.directory, "notes.txt"), b"x")
    with pytest.raises(errors.CorruptFileError, match=r"notes\.txt.*owner claims"):
        claims.current()


# -- the race ------------------------------------------------------------------------------
ROUNDS = 50


def _writer_process(
    *,
    owner: str,
    table_root: str,
    options: dict[str, Any],
    rounds: int,
    delay: float,
    barrier: Any,
    results: Any,
) -> None:
    """One driver: per round, open a write of job JOB on table <root>/<round> (the writer's own
    driver step), then write one task's file and commit; report whether it wrote."""
    from sparkguard.spark_lib.spark import writer

    cls = writer.source_class(
        {
            "spark.sparkguard.jobId": JOB,
            "spark.sparkguard.owner": owner,
            "spark.sparkguard.storageOptions": json.dumps(options),
        }
    )
    for round_no in range(rounds):
        barrier.wait()
        if delay:
            time.sleep(delay)
        try:
            built = cls(options={"path": f"{table_root}/{round_no}"}).writer(SCHEMA, False)
        except errors.OwnerConflictError:
            results.put((round_no, owner, "refused"))
            continue
        if not isinstance(built, writer.BatchWriter):  # the other owner already committed
            results.put((round_no, owner, "skipped"))  # write 0 of the job: rerun=skip
            continue
        built.commit([_task(built, 0, PARTS[0])])
        results.put((round_no, owner, "wrote"))


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.003], ids=["same-moment", "3ms-apart"])
def test_two_processes_opening_one_job_at_once_exactly_one_writes(
    delay: float, tmp_path: Path
) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    results = context.Queue()
    root = str(tmp_path / "tables")
    processes = [
        context.Process(
            target=_writer_process,
            kwargs={
                "owner": owner,
                "table_root": root,
                "options": {},
                "rounds": ROUNDS,
                "delay": wait,
                "barrier": barrier,
                "results": results,
            },
        )
        for owner, wait in (("k8s:ns/a/1", 0.0), ("k8s:ns/b/2", delay))
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, list[tuple[str, str]]] = {}
    for _ in range(2 * ROUNDS):
        round_no, owner, result = results.get(timeout=120)
        outcomes.setdefault(round_no, []).append((owner, result))
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    raced = 0
    for round_no in range(ROUNDS):
        wrote = [owner for owner, result in outcomes[round_no] if result == "wrote"]
        assert len(wrote) == 1, (round_no, outcomes[round_no])
        url = f"{root}/{round_no}"
        manager, path = filemanager.resolve(url)
        tl = timeline.Timeline(manager, path)
        states = [s.state for s in tl.statuses()]
        assert states.count(timeline.State.COMMITTED) == 1, (round_no, states)
        assert timeline.State.INFLIGHT not in states
        raced += len(states) == 2  # the loser had opened its instant, then backed off
        assert_exactly_once(url, PARTS[0])
    # The race is real: in some rounds both writers got as far as opening an instant.
    print(f"rounds where both opened an instant: {raced}/{ROUNDS}")


def test_confirming_reads_nothing_of_a_long_decided_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The confirmation lists the timeline once and reads only instants in flight or new since
    the O4 check: a job with a long history (a micro-batch writer's instants) pays nothing per
    decided instant."""
    tl = _timeline(tmp_path)
    for _ in range(30):
        guard = rollback.guard_write(tl, job_id=JOB, owner="k8s:ns/a/1")
        earlier = _open(tl, guard)
        rollback.confirm_sole_writer(tl, guard, instant=earlier)
        tl.commit(earlier, [])
    guard = rollback.guard_write(tl, job_id=JOB, owner="k8s:ns/a/1")
    instant = _open(tl, guard)
    reads: list[str] = []
    original = tl.manager.read_bytes

    def counting(path: str) -> bytes:
        reads.append(path)
        return original(path)

    monkeypatch.setattr(tl.manager, "read_bytes", counting)
    rollback.confirm_sole_writer(tl, guard, instant=instant)
    assert all("/owners/" in r for r in reads), reads  # at most the successor check
    assert len(reads) <= 1
