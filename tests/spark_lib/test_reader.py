"""Visibility rules (pure) and settings parsing, property-style where it pays."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.storage import reader, timeline


def _commit(order: int, job: str, op: reader.Operation, names: list[str]) -> reader.Commit:
    return reader.Commit(
        order=f"{order:020d}",
        source=f"{order:017d}-{job}",
        job_id=job,
        operation=op,
        files=tuple(timeline.DataFile(path=n, size=1, rows=1) for n in names),
    )


def test_overwrite_and_rewrite_supersede() -> None:
    commits = [
        _commit(1, "a", reader.Operation.APPEND, ["a1", "a2"]),
        _commit(2, "b", reader.Operation.APPEND, ["b1"]),
        _commit(3, "a", reader.Operation.REWRITE, ["a1"]),
    ]
    assert set(reader.visible_files(commits)) == {"a1", "b1"}
    assert reader.superseded_files(commits) == {"a2"}
    commits.append(_commit(4, "c", reader.Operation.OVERWRITE, ["c1"]))
    assert set(reader.visible_files(commits)) == {"c1"}
    assert reader.superseded_files(commits) == {"a1", "a2", "b1"}


OPS = st.sampled_from(
    [
        reader.Operation.APPEND,
        reader.Operation.OVERWRITE,
        reader.Operation.REWRITE,
        reader.Operation.STREAM_BATCH,
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), OPS, st.integers(0, 3)), max_size=12))
def test_visible_files_follow_the_last_overwrite(
    spec: list[tuple[str, reader.Operation, int]],
) -> None:
    commits = [
        _commit(i, job, op, [f"{job}-{i}-{n}" for n in range(count)])
        for i, (job, op, count) in enumerate(spec)
    ]
    visible = set(reader.visible_files(commits))
    last_overwrite = max(
        (i for i, (_, op, _) in enumerate(spec) if op is reader.Operation.OVERWRITE), default=-1
    )
    # Nothing committed before the last overwrite is visible; every file after it is, unless
    # a later rewrite of the same job replaced it.
    for i, commit in enumerate(commits):
        for f in commit.files:
            replaced = any(
                spec[j][1] is reader.Operation.REWRITE and spec[j][0] == commit.job_id
                for j in range(i + 1, len(spec))
            )
            assert (f.path in visible) == (i >= last_overwrite and not replaced)
    assert visible.isdisjoint(reader.superseded_files(commits))


def test_overwrite_partitions_supersedes_only_its_partitions() -> None:
    commits = [
        _commit(1, "a", reader.Operation.APPEND, ["k=0/a0", "k=1/a1", "k=10/a10", "top"]),
        dataclasses.replace(
            _commit(2, "b", reader.Operation.OVERWRITE_PARTITIONS, ["k=1/b1"]),
            partitions=("k=1",),
        ),
    ]
    # k=10 is another partition, not under k=1; a file at the top is in no partition.
    assert set(reader.visible_files(commits)) == {"k=0/a0", "k=1/b1", "k=10/a10", "top"}
    assert reader.superseded_files(commits) == {"k=1/a1"}
    # A later append to the replaced partition is visible again.
    commits.append(_commit(3, "c", reader.Operation.APPEND, ["k=1/c1"]))
    assert set(reader.visible_files(commits)) >= {"k=1/b1", "k=1/c1"}


def _committed_status(extra: dict[str, object]) -> timeline.InstantStatus:
    return timeline.InstantStatus(
        instant="20260101000000000-j",
        info=None,
        outcome=timeline.Outcome.COMMITTED,
        files=(),
        rolledback=None,
        extra=extra,
    )


def test_an_unknown_operation_or_bad_partitions_fail_clearly() -> None:
    # What a reader that predates an operation does: refuse, naming the fix, never guess.
    with pytest.raises(errors.CorruptFileError, match="unknown operation 'merge'; upgrade"):
        reader.commit_of_status(_committed_status({"operation": "merge"}))
    with pytest.raises(errors.CorruptFileError, match=r"without a valid extra\.partitions"):
        reader.commit_of_status(
            _committed_status({"operation": "overwrite-partitions", "partitions": ["../x"]})
        )
    commit = reader.commit_of_status(
        _committed_status({"operation": "overwrite-partitions", "partitions": ["k=1"]})
    )
    assert commit is not None
    assert commit.partitions == ("k=1",)
