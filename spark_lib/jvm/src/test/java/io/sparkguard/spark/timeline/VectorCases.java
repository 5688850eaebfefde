package io.sparkguard.spark.timeline;

import io.sparkguard.spark.store.LocalAtomicStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.fs.Path;

/**
 * The {@code jvm-*} cases of the shared timeline vectors ({@code tests/vectors/timeline/}), each
 * a table history compacted by {@link Compactor} and then left in one of the states readers must
 * handle. {@link TimelineVectorsTest#writeJvmVectors} writes them (run on demand, committed as
 * fixtures); {@link TimelineVectorsTest#everyVectorReadsAsExpected} checks every case.
 */
final class VectorCases {
  private VectorCases() {}

  interface Case {
    void build(TimelineHistory h) throws IOException;
  }

  static final Map<String, Case> CASES = Map.of(
      "jvm-overwrite-covered", VectorCases::overwriteCovered,
      "jvm-torn-snapshot", VectorCases::tornSnapshot,
      "jvm-stale-latest", VectorCases::staleLatest,
      "jvm-snapshot-racing-commit", VectorCases::snapshotRacingCommit);

  private static Compactor compactor(TimelineHistory h) {
    return new Compactor(h.store, h.table);
  }

  /** Overwrites, a rewrite and partition overwrites covered by a snapshot; two hot commits after. */
  static void overwriteCovered(TimelineHistory h) throws IOException {
    CompactorTest.richHistory(h);
    compactor(h).run(1, -1);
    h.commit("etl", "overwrite-partitions", 6, TimelineHistory.files("k=1/n.parquet:30:3"),
        List.of("k=1"));
    h.append("other", 3, "k=7/m.parquet:31:4");
  }

  /** Snapshot 2 (whose archive step finished) is torn: readers use snapshot 1 + archive 2. */
  static void tornSnapshot(TimelineHistory h) throws IOException {
    h.append("etl", 0, "a.parquet:1:1", "b.parquet:2:2");
    h.append("etl", 1, "c.parquet:3:3");
    compactor(h).run(1, -1);
    h.commit("etl", "overwrite", 2, TimelineHistory.files("d.parquet:4:4"), List.of());
    h.append("other", 0, "e.parquet:5:5");
    compactor(h).run(1, -1);
    h.append("etl", 3, "f.parquet:6:6");
    java.nio.file.Path second = LocalAtomicStore.local(
        new Path(Snapshots.snapshotsDir(h.table), Snapshots.snapshotName(2)));
    byte[] whole = Files.readAllBytes(second);
    Files.write(second, java.util.Arrays.copyOf(whole, whole.length / 2));
  }

  /** Three snapshots; {@code LATEST} still names the first. */
  static void staleLatest(TimelineHistory h) throws IOException {
    h.append("etl", 0, "a.parquet:1:1");
    compactor(h).run(1, -1);
    h.commit("etl", "rewrite", 0, TimelineHistory.files("a2.parquet:2:2"), List.of());
    compactor(h).run(1, -1);
    h.rolledBack("etl", 1, "x.parquet");
    h.append("etl", 1, "x.parquet:3:3");
    compactor(h).run(1, -1);
    h.append("etl", 2, "y.parquet:4:4");
    Files.writeString(LocalAtomicStore.local(new Path(Snapshots.snapshotsDir(h.table), "LATEST")),
        "1\n");
  }

  /**
   * A commit whose W10 had not happened when the snapshot was written (so it, and every commit
   * after it, stayed hot), a zombie's void outcome without {@code .inflight}, and an undecided
   * write.
   */
  static void snapshotRacingCommit(TimelineHistory h) throws IOException {
    h.append("etl", 0, "a.parquet:1:1");
    String racing = h.commit("slow", "overwrite", 0, TimelineHistory.files("s.parquet:2:2"),
        List.of());
    Path markers = new Path(h.timeline.markerDirectory(racing), "MARKERS.type");
    h.store.putIfAbsent(markers, "DIRECT".getBytes(StandardCharsets.UTF_8));
    h.append("etl", 1, "b.parquet:3:3");
    h.append("other", 0, "c.parquet:4:4");
    compactor(h).run(1, -1);
    h.store.deleteDirectory(h.timeline.markerDirectory(racing));  // its W10, after the snapshot
    h.inflight("etl", 2);
    String zombie = h.nextId("ghost");
    Map<String, Object> body = new java.util.TreeMap<>();
    body.put("instant", zombie);
    body.put("outcome", "committed");
    body.put("decided", "2026-01-01T00:00:00Z");
    body.put("files", List.of(Map.of("path", "ghost.parquet", "size", 9, "rows", 9)));
    body.put("write", 0);
    body.put("extra", Map.of("operation", "overwrite", "committedAt", "29990101000000000000"));
    h.store.putIfAbsent(h.timeline.file(zombie, ".outcome"),
        Timeline.encode(Timeline.OUTCOME_KIND, body));
  }
}
