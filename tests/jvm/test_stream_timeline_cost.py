"""A streaming file sink's per-batch cost stays flat as its timeline ages.

Without compaction every batch lists the whole timeline (``undecided``), so the names listed per
batch grow with the batches run; with ``snapshotEvery`` the hot timeline holds at most a few
dozen names. The full 2,000-batch run is ``benchmarks/stream_timeline.py`` (batches 100-200
against the last 100); this is the same measurement, shorter: batches 40-80 against the last 40
of 200 (four compaction cycles in each window), on the counts only (storage operations, names
listed, S3-style requests; the benchmark reports the latencies too). Without compaction, 80
batches are enough to see the listing grow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jvm import stream_cost

pytestmark = pytest.mark.spark

BATCHES = 200
BATCHES_UNCOMPACTED = 80


def test_cost_per_batch_is_flat_with_compaction(tmp_path: Path) -> None:
    result = stream_cost.measure(tmp_path / "on", BATCHES, snapshot_every=10)
    assert result["batches"] == BATCHES
    summary = stream_cost.windows(result, (40, 80), last=40)
    assert stream_cost.within(summary, ("ops", "listed", "requests")) == [], summary
    # Counts only: tests never time things (a shared machine's load moves latencies by more
    # than 10%); the latency figures are the benchmark's (docs/benchmarks.md).
    hot = list((tmp_path / "on" / "sink" / "_sparkguard" / "timeline").iterdir())
    assert len(hot) <= 2 * 20, sorted(p.name for p in hot)


def test_without_compaction_the_listing_grows(tmp_path: Path) -> None:
    result = stream_cost.measure(tmp_path / "off", BATCHES_UNCOMPACTED, snapshot_every=0)
    summary = stream_cost.windows(result, (10, 30), last=20)
    assert "listed" in " ".join(stream_cost.within(summary, ("listed",))), summary
