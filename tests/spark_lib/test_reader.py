"""Visibility rules (pure) and settings parsing, property-style where it pays."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkguard.spark_lib import reader, timeline


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
