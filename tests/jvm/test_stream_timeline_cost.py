"""A streaming file sink's per-batch cost stays flat as its timeline ages.

Without compaction every batch lists the whole timeline (``undecided``), so the names listed per
batch grow with the batches run; with ``snapshotEvery`` the hot timeline holds at most a few
dozen names. The full 2,000-batch run is ``benchmarks/stream_timeline.py`` (batches 100-200
against the last 100, a snapshot every 10 batches); this is the same measurement, shorter and
with a snapshot every 5 batches, so that each window still spans four compaction cycles (and
two of Spark's own sink-log compactions, every 10 batches): batches 20-40 against the last 20 of
100 (the timeline five times older at the end), on the counts only (storage operations, names
listed, S3-style requests; the benchmark reports the latencies too). Without compaction, 40
batches are enough to see the listing grow (batches 5-15 against the last 15).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jvm import stream_cost

pytestmark = pytest.mark.spark

BATCHES = 100
SNAPSHOT_EVERY = 5
BATCHES_UNCOMPACTED = 40


def test_cost_per_batch_is_flat_with_compaction(tmp_path: Path) -> None:
    result = stream_cost.measure(tmp_path / "on", BATCHES, SNAPSHOT_EVERY)
    assert result["batches"] == BATCHES
    summary = stream_cost.windows(result, (20, 40), last=20)
    assert stream_cost.within(summary, ("ops", "listed", "requests")) == [], summary
    # Counts only: tests never time things (a shared machine's load moves latencies by more
    # than 10%); the latency figures are the benchmark's (docs/benchmarks.md).
    hot = list((tmp_path / "on" / "sink" / "_sparkguard" / "timeline").iterdir())
    # At most a few dozen names: without compaction 100 batches leave 200 (.inflight, .outcome).
    assert len(hot) <= 2 * 20, sorted(p.name for p in hot)


def test_without_compaction_the_listing_grows(tmp_path: Path) -> None:
    result = stream_cost.measure(tmp_path / "off", BATCHES_UNCOMPACTED, snapshot_every=0)
    summary = stream_cost.windows(result, (5, 15), last=15)
    assert "listed" in " ".join(stream_cost.within(summary, ("listed",))), summary
