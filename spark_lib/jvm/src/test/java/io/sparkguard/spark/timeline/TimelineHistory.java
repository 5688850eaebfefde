package io.sparkguard.spark.timeline;

import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.timeline.Commits.Commit;
import io.sparkguard.spark.timeline.Commits.DataFile;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.hadoop.fs.Path;

/**
 * Test helper: writes a table's timeline instant by instant (the documents the writers write,
 * with chosen instant ids and commit order) and keeps the ground truth: every commit in order,
 * before any compaction, so visible files and committed writes can be compared after one.
 */
final class TimelineHistory {
  final AtomicStore store;
  final Path table;
  final Timeline timeline;
  private final List<Commit> truth = new ArrayList<>();
  private final Map<String, TreeSet<Integer>> writes = new TreeMap<>();
  private long clock = 20260101000000000L;

  TimelineHistory(AtomicStore store, Path table) {
    this.store = store;
    this.table = table;
    this.timeline = new Timeline(store, table);
  }

  /** The next instant id of {@code job} (one millisecond after the previous one). */
  String nextId(String job) {
    clock++;
    return clock + "-" + job;
  }

  void putInflight(String id, String operation, int write, Map<String, Object> extra)
      throws IOException {
    Map<String, Object> body = new TreeMap<>();
    body.put("instant", id);
    body.put("jobId", id.substring(18));
    body.put("owner", "job:" + id.substring(18));
    body.put("write", write);
    body.put("attempt", 0);
    body.put("markerType", "DIRECT");
    body.put("operation", operation);
    body.put("started", "2026-01-01T00:00:00Z");
    body.put("extra", extra);
    store.putIfAbsent(timeline.file(id, ".inflight"), Timeline.encode(Timeline.INFLIGHT_KIND, body));
  }

  /** Files named {@code path:size:rows}. */
  static List<DataFile> files(String... specs) {
    List<DataFile> files = new ArrayList<>();
    for (String spec : specs) {
      String[] parts = spec.split(":");
      files.add(new DataFile(parts[0], Long.parseLong(parts[1]), Long.parseLong(parts[2])));
    }
    return files;
  }

  /** A committed write of {@code job} (markers already deleted, W10 done). */
  String commit(String job, String operation, int write, List<DataFile> files,
      List<String> partitions) throws IOException {
    return commit(job, operation, write, files, partitions, null);
  }

  String commit(String job, String operation, int write, List<DataFile> files,
      List<String> partitions, Map<String, Object> microBatch) throws IOException {
    String id = nextId(job);
    Map<String, Object> extra = new TreeMap<>();
    if (microBatch != null) {
      extra.put(MicroBatch.EXTRA_KEY, microBatch);
    }
    putInflight(id, operation, write, extra);
    Map<String, Object> outcomeExtra = new TreeMap<>(extra);
    outcomeExtra.put("operation", operation);
    outcomeExtra.put("format", "parquet");
    outcomeExtra.put("committedAt", id.substring(0, 17) + "000");
    if (operation.equals("overwrite-partitions")) {
      outcomeExtra.put("partitions", partitions);
    }
    List<Object> json = new ArrayList<>();
    files.forEach(f -> json.add(f.toJson()));
    Map<String, Object> body = new TreeMap<>();
    body.put("instant", id);
    body.put("outcome", "committed");
    body.put("decided", "2026-01-01T00:00:00Z");
    body.put("files", json);
    body.put("write", write);
    body.put("extra", outcomeExtra);
    store.putIfAbsent(timeline.file(id, ".outcome"), Timeline.encode(Timeline.OUTCOME_KIND, body));
    truth.add(new Commit(id.substring(0, 17) + "000", id, job, operation, files, "parquet", null,
        write, operation.equals("overwrite-partitions") ? partitions : List.of()));
    if (!operation.startsWith("stream-")) {
      writes.computeIfAbsent(job, k -> new TreeSet<>()).add(write);
    }
    return id;
  }

  String append(String job, int write, String... files) throws IOException {
    return commit(job, "append", write, files(files), List.of());
  }

  /** A write rolled back completely ({@code .rolledback} complete, no markers). */
  String rolledBack(String job, int write, String... marked) throws IOException {
    String id = nextId(job);
    putInflight(id, "append", write, new TreeMap<>());
    timeline.claimRollback(id);
    Map<String, Object> body = new TreeMap<>();
    body.put("owner", "job:" + job);
    body.put("marked", List.of(marked));
    body.put("complete", true);
    body.put("passes", 1);
    store.putIfAbsent(timeline.file(id, ".rolledback"),
        Timeline.encode(Timeline.ROLLEDBACK_KIND, body));
    return id;
  }

  /** An undecided write (INFLIGHT) with a marker directory. */
  String inflight(String job, int write) throws IOException {
    String id = nextId(job);
    putInflight(id, "append", write, new TreeMap<>());
    store.putIfAbsent(new Path(timeline.markerDirectory(id), "MARKERS.type"),
        "DIRECT".getBytes(StandardCharsets.UTF_8));
    return id;
  }

  /** The visible files of the whole history (no snapshot involved). */
  Map<String, DataFile> expectedVisible() {
    return Commits.visible(truth);
  }

  Map<String, List<Integer>> expectedWrites() {
    Map<String, List<Integer>> result = new TreeMap<>();
    writes.forEach((job, set) -> result.put(job, new ArrayList<>(set)));
    return result;
  }

  /** The expected.json of a shared vector. */
  Map<String, Object> expectedJson() {
    Map<String, Object> visible = new TreeMap<>();
    expectedVisible().forEach((path, file) -> {
      Map<String, Object> entry = new TreeMap<>();
      entry.put("size", file.size());
      entry.put("rows", file.rows());
      visible.put(path, entry);
    });
    Map<String, Object> expected = new TreeMap<>();
    expected.put("visible", visible);
    expected.put("committedWrites", expectedWrites());
    return expected;
  }
}
