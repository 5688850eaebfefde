package io.sparkguard.spark.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.common.SparkguardException.UnsupportedWriteException;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.store.ForwardingStore;
import io.sparkguard.spark.store.ObjectStoreAtomicStoreTest;
import io.sparkguard.spark.timeline.SupersededFiles;
import io.sparkguard.spark.timeline.Timeline;
import java.io.IOException;
import java.nio.file.Files;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.internal.SQLConf$;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The steps both commit protocols share, per store kind without Spark: a direct-write store (the
 * local filesystem under another scheme with conditional create, standing in for S3A) and a
 * rename store (local disk).
 */
class ProtocolStepsTest {
  @TempDir java.nio.file.Path dir;

  /** The local filesystem as an object store with conditional create (S3A's stand-in). */
  static Configuration directStore() {
    Configuration conf = new Configuration(false);
    conf.set("fs.sgtest.impl", ObjectStoreAtomicStoreTest.FakeStoreFileSystem.class.getName());
    conf.setBoolean("fs.sgtest.impl.disable.cache", true);
    conf.setBoolean("sgtest.conditional", true);
    return conf;
  }

  private String directTable() {
    return "sgtest://" + dir.resolve("table").toUri().getPath();
  }

  private static void withSpeculation(String value, Runnable body) {
    SQLConf conf = new SQLConf();
    conf.setConfString(ProtocolSteps.SPECULATION_KEY, value);
    SQLConf$.MODULE$.withExistingConf(conf, () -> {
      body.run();
      return null;
    });
  }

  @Test
  void speculationIsRefusedOnlyWhereFilesAreWrittenUnderTheirFinalNames() {
    String table = directTable();
    AtomicStore direct = AtomicStore.forTable(new Path(table), directStore());
    assertTrue(ProtocolSteps.writesDirectly(direct, table));
    withSpeculation("true", () -> {
      UnsupportedWriteException e = assertThrows(UnsupportedWriteException.class,
          () -> ProtocolSteps.refuseSpeculation(direct, table));
      assertTrue(e.getMessage().contains("spark.speculation=false"), e.getMessage());
    });
    withSpeculation("false", () -> ProtocolSteps.refuseSpeculation(direct, table));
    String local = dir.resolve("local").toString();
    AtomicStore rename = AtomicStore.forTable(new Path(local));
    assertFalse(ProtocolSteps.writesDirectly(rename, local));
    withSpeculation("true", () -> ProtocolSteps.refuseSpeculation(rename, local));
  }

  @Test
  void theSidecarNamesLocalMarkerDirectoriesWithoutSchemeAndOthersByUrl() {
    assertEquals("/t/_sparkguard/markers/i",
        ProtocolSteps.markerDirName(new Path("file:/t/_sparkguard/markers/i")));
    assertEquals("/t/_sparkguard/markers/i",
        ProtocolSteps.markerDirName(new Path("/t/_sparkguard/markers/i")));
    assertEquals("s3a://b/t/_sparkguard/markers/i",
        ProtocolSteps.markerDirName(new Path("s3a://b/t/_sparkguard/markers/i")));
  }

  @Test
  void aFailedAttemptOnADirectStoreLosesTheNamesItOpenedOnARenameStoreOnlyItsTempFiles()
      throws IOException {
    // Direct: the final name itself is the work path; a dead execution's object of the name
    // is deleted before the writer opens it (the fake store probes, like S3A without
    // create-performance); abort deletes what the failed attempt completed. (The fake's
    // builder has no conditional create, so the marker step runs on the rename store below.)
    String table = directTable();
    AtomicStore direct = AtomicStore.forTable(new Path(table), directStore());
    Path target = new Path(table, "k=0/part-00000-j-b0000000001-c000.snappy.parquet");
    Path work = direct.workPath(target);
    assertEquals(target, work);
    Files.createDirectories(dir.resolve("table/k=0"));
    Files.write(dir.resolve("table/k=0/part-00000-j-b0000000001-c000.snappy.parquet"), new byte[] {9});
    direct.prepareWrite(work);
    assertEquals(-1, direct.size(target), "a dead execution's object is out of the writer's way");
    Files.write(dir.resolve("table/k=0/part-00000-j-b0000000001-c000.snappy.parquet"), new byte[] {1});
    Map<String, Path> pending = new LinkedHashMap<>();
    pending.put("k=0/part-00000-j-b0000000001-c000.snappy.parquet", work);
    ProtocolSteps.deleteAttemptFiles(direct, table, pending);
    assertEquals(-1, direct.size(target), "the partial object under the final name is deleted");

    // Rename: a published file of the name survives, the attempt's temp file goes.
    String local = dir.resolve("local").toString();
    AtomicStore rename = AtomicStore.forTable(new Path(local));
    Path published = new Path(local, "part-00000-j-b0000000001-c000.json");
    Files.createDirectories(dir.resolve("local"));
    Files.write(dir.resolve("local/part-00000-j-b0000000001-c000.json"), new byte[] {1, 2});
    Path temp = ProtocolSteps.markAndPrepare(rename, null, new Path(local, "_sparkguard/markers/i2"),
        published, "part-00000-j-b0000000001-c000.json");
    assertFalse(temp.equals(published));
    assertEquals(List.of("part-00000-j-b0000000001-c000.json.marker.CREATE"),
        rename.listFiles(new Path(local, "_sparkguard/markers/i2")));
    Files.write(java.nio.file.Paths.get(temp.toUri().getPath()), new byte[] {3});
    pending.clear();
    pending.put("part-00000-j-b0000000001-c000.json", temp);
    ProtocolSteps.deleteAttemptFiles(rename, local, pending);
    assertEquals(-1, rename.size(temp));
    assertEquals(2, rename.size(published));
  }

  @Test
  void verifyAndCleanRefusesAWrongSizeAndDeletesMarkedNamesNoTaskReported() throws IOException {
    String local = dir.resolve("t").toString();
    AtomicStore store = AtomicStore.forTable(new Path(local));
    Path markers = new Path(local, "_sparkguard/markers/i");
    for (String name : List.of("a.parquet", "b.parquet")) {
      ProtocolSteps.markAndPrepare(store, null, markers, new Path(local, name), name);
      Files.write(dir.resolve("t").resolve(name), new byte[] {1, 2, 3});
    }
    Map<String, Long> reported = new TreeMap<>(Map.of("a.parquet", 4L));
    SparkguardException e = assertThrows(SparkguardException.class,
        () -> ProtocolSteps.verifyAndClean(store, local, markers, reported, Map.of(), "not committed"));
    assertTrue(e.getMessage().endsWith("reported 4; not committed"), e.getMessage());
    assertEquals(3, store.size(new Path(local, "b.parquet")), "nothing deleted before the check");
    reported.put("a.parquet", 3L);
    ProtocolSteps.verifyAndClean(store, local, markers, reported, Map.of(), "not committed");
    assertEquals(3, store.size(new Path(local, "a.parquet")));
    assertEquals(-1, store.size(new Path(local, "b.parquet")), "marked, not reported: deleted");
  }

  /** A table on local disk with instant {@code instant} of job {@code j} open (an .inflight). */
  private Timeline openInstant(AtomicStore store, String table, String instant) throws IOException {
    Timeline timeline = new Timeline(store, new Path(table));
    Map<String, Object> body = new TreeMap<>();
    body.put("instant", instant);
    body.put("jobId", "j");
    body.put("owner", "job:j");
    body.put("operation", "stream-batch");
    store.putIfAbsent(timeline.file(instant, ".inflight"),
        Timeline.encode(Timeline.INFLIGHT_KIND, body));
    return timeline;
  }

  private static final String BATCH_NAME = "k=0/part-00000-j-b0000000001-c000.snappy.parquet";
  private static final String NEVER_WRITTEN = "k=1/part-00001-j-b0000000001-c000.snappy.parquet";

  @Test
  void aClaimedAbortDeletesOnlyWhatExistsRecordsItThenDeletesTheMarkers() throws IOException {
    String table = dir.resolve("t").toString();
    AtomicStore store = AtomicStore.forTable(new Path(table));
    String instant = "20260101000000000-j";
    Timeline timeline = openInstant(store, table, instant);
    Path markers = timeline.markerDirectory(instant);
    store.putIfAbsent(new Path(markers, "MARKERS.type"), "DIRECT".getBytes());
    for (String name : List.of(BATCH_NAME, NEVER_WRITTEN)) {
      ProtocolSteps.markAndPrepare(store, null, markers, new Path(table, name), name);
    }
    Files.createDirectories(dir.resolve("t/k=0"));
    Files.write(dir.resolve("t").resolve(BATCH_NAME), new byte[] {1, 2, 3});
    Files.write(dir.resolve("t/k=0/.part-00000-j-b0000000001-c000.snappy.parquet.sg-tmp-0123456789ab"),
        new byte[] {4});
    assertTrue(timeline.claimRollback(instant));

    Map<String, Object> done = ProtocolSteps.finishClaimedRollback(
        store, null, timeline, table, instant, "j", java.util.Set.of(), "p");
    assertEquals(List.of(BATCH_NAME), done.get("deleted"));
    assertEquals(List.of(NEVER_WRITTEN), done.get("absent"));
    assertEquals(1, done.get("filesDeleted"));
    assertEquals(1, done.get("tempFilesRemoved"));
    assertEquals(-1, store.size(new Path(table, BATCH_NAME)));
    assertFalse(Files.exists(
        dir.resolve("t/k=0/.part-00000-j-b0000000001-c000.snappy.parquet.sg-tmp-0123456789ab")));
    assertFalse(Files.exists(dir.resolve("t/_sparkguard/markers/" + instant)));
    com.fasterxml.jackson.databind.JsonNode record = new com.fasterxml.jackson.databind.ObjectMapper()
        .readTree(store.read(timeline.file(instant, ".rolledback")));
    assertEquals("sparkguard.instant.rolledback", record.get("kind").asText());
    assertEquals(1, record.get("version").asInt());
    assertEquals(BATCH_NAME, record.get("deleted").get(0).asText());
    assertEquals(NEVER_WRITTEN, record.get("absent").get(0).asText());
    assertEquals(2, record.get("marked").size());
    assertTrue(record.get("complete").asBoolean());
    assertEquals("job:j", record.get("owner").asText());
  }

  @Test
  void aClaimedAbortLeavesUnusualMarkersAndProtectedNamesToTheRollback() throws IOException {
    String table = dir.resolve("t").toString();
    AtomicStore store = AtomicStore.forTable(new Path(table));
    String instant = "20260101000000000-j";
    Timeline timeline = openInstant(store, table, instant);
    Path markers = timeline.markerDirectory(instant);
    // A torn last line in a batch file: only the Python rollback looks its file up by prefix.
    store.putIfAbsent(new Path(markers, "MARKERS0"),
        (BATCH_NAME + ".marker.CREATE\nk=1/part-00001-j-b00").getBytes());
    Files.createDirectories(dir.resolve("t/k=0"));
    Files.write(dir.resolve("t").resolve(BATCH_NAME), new byte[] {1});
    assertTrue(timeline.claimRollback(instant));
    assertEquals(null, ProtocolSteps.finishClaimedRollback(
        store, null, timeline, table, instant, "j", java.util.Set.of(), "p"));
    assertEquals(1, store.size(new Path(table, BATCH_NAME)));
    assertEquals(-1, store.size(timeline.file(instant, ".rolledback")));

    // O2: another undecided instant of the job marked the same name.
    String other = "20260101000000001-j";
    String live = "20260101000000002-j";
    openInstant(store, table, other);
    openInstant(store, table, live);
    ProtocolSteps.markAndPrepare(store, null, timeline.markerDirectory(other),
        new Path(table, BATCH_NAME), BATCH_NAME);
    ProtocolSteps.markAndPrepare(store, null, timeline.markerDirectory(live),
        new Path(table, BATCH_NAME), BATCH_NAME);
    assertTrue(timeline.claimRollback(other));
    assertEquals(null, ProtocolSteps.finishClaimedRollback(
        store, null, timeline, table, other, "j", java.util.Set.of(), "p"));
    assertEquals(1, store.size(new Path(table, BATCH_NAME)));
    // ... and a name a commit lists.
    assertTrue(timeline.claimRollback(live));
    assertEquals(null, ProtocolSteps.finishClaimedRollback(
        store, null, timeline, table, other, "j", java.util.Set.of(BATCH_NAME), "p"));
    assertEquals(1, store.size(new Path(table, BATCH_NAME)));
    assertEquals(-1, store.size(timeline.file(other, ".rolledback")));
  }

  @Test
  void supersededFilesGoInOneBulkDeletePerDirectory() throws IOException {
    String table = dir.resolve("s").toString();
    List<String> relative = List.of("a.parquet", "k=0/b.parquet", "k=0/c.parquet", "k=1/d.parquet");
    for (String name : relative) {
      Files.createDirectories(dir.resolve("s").resolve(name).getParent());
      Files.write(dir.resolve("s").resolve(name), new byte[] {1});
    }
    List<String> calls = new java.util.ArrayList<>();
    AtomicStore store = new ForwardingStore(AtomicStore.forTable(new Path(table))) {
      private static final long serialVersionUID = 1L;

      @Override
      protected void before(String op, Path path) {
        calls.add(op);
      }

      @Override
      public void deleteAll(Path directory, List<Path> paths) throws IOException {
        calls.add("deleteAll " + directory.getName() + " " + paths.size());
        inner.deleteAll(directory, paths);
      }
    };
    SupersededFiles.deleteByDirectory(store, new Path(table), relative);
    assertEquals(List.of("deleteAll s 1", "deleteAll k=0 2", "deleteAll k=1 1"), calls);
    for (String name : relative) {
      assertFalse(Files.exists(dir.resolve("s").resolve(name)), name);
    }
  }

  @Test
  void aClaimedAbortRemovesManyNamesConcurrentlyAndReportsEachInOrder() throws IOException {
    String table = dir.resolve("m").toString();
    AtomicStore store = AtomicStore.forTable(new Path(table));
    List<String> names = new java.util.ArrayList<>();
    for (int i = 0; i < 40; i++) {
      String name = String.format("k=%d/part-%05d-j-c000.parquet", i % 3, i);
      names.add(name);
      if (i % 2 == 0) {
        Files.createDirectories(dir.resolve("m").resolve(name).getParent());
        Files.write(dir.resolve("m").resolve(name), new byte[] {1});
      }
    }
    List<ProtocolSteps.Removed> removed = ProtocolSteps.removeConcurrently(store, table, names);
    assertEquals(names, removed.stream().map(ProtocolSteps.Removed::relative).toList());
    for (int i = 0; i < names.size(); i++) {
      assertEquals(i % 2 == 0, removed.get(i).existed(), names.get(i));
      assertFalse(Files.exists(dir.resolve("m").resolve(names.get(i))), names.get(i));
    }
  }

  @Test
  void theLayoutComesFromTheFirstFile() {
    Map<String, Object> extra = new TreeMap<>();
    ProtocolSteps.putLayout(extra, List.of("d=1/k=0/part-0.snappy.parquet", "x.orc"));
    assertEquals(List.of("d", "k"), extra.get("partitionBy"));
    assertEquals("parquet", extra.get("format"));
    Map<String, Object> none = new TreeMap<>();
    ProtocolSteps.putLayout(none, List.of());
    assertEquals(List.of(), none.get("partitionBy"));
    assertFalse(none.containsKey("format"));
  }
}
