package io.sparkguard.spark.timeline;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.common.SparkguardException.InstantDecidedException;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.store.ForwardingStore;
import io.sparkguard.spark.store.LocalAtomicStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Compaction (C1-C7) on local disk without Spark: readers see the same committed set before
 * and after, at a crash after any storage operation, with racing compactors, and a zombie's
 * commit after its instant was archived publishes nothing.
 */
class CompactorTest {
  @TempDir java.nio.file.Path dir;

  private TimelineHistory history(String name) {
    return new TimelineHistory(new LocalAtomicStore(), new Path(dir.resolve(name).toUri()));
  }

  /** A history with appends, an overwrite, a rewrite, partition overwrites and a rollback. */
  static void richHistory(TimelineHistory h) throws IOException {
    h.append("etl", 0, "a.parquet:10:1", "b.parquet:11:2");
    h.rolledBack("etl", 1, "c.parquet");
    h.append("etl", 1, "c.parquet:12:3");
    h.commit("etl", "overwrite", 2, TimelineHistory.files("d.parquet:13:4"), List.of());
    h.append("etl", 3, "k=1/e.parquet:14:5", "k=2/f.parquet:15:6");
    h.commit("etl", "rewrite", 3, TimelineHistory.files("k=1/e2.parquet:16:7"), List.of());
    h.append("other", 0, "k=3/g.parquet:17:8");
    h.commit("other", "overwrite-partitions", 1, TimelineHistory.files("k=3/h.parquet:18:9"),
        List.of("k=3"));
    h.append("other", 2, "k=2/i.parquet:19:10");
    h.commit("etl", "overwrite-partitions", 4, TimelineHistory.files(), List.of("k=2"));
    h.append("etl", 5, "k=4/j.parquet:20:11");
  }

  private static void assertSameState(TimelineHistory h) throws IOException {
    TableState state = TableState.load(h.store, h.table, false);
    assertEquals(h.expectedVisible(), state.visibleFiles());
    assertEquals(h.expectedWrites(), state.committedWrites());
  }

  private static List<String> hot(TimelineHistory h) throws IOException {
    return h.store.listFiles(h.timeline.directory());
  }

  @Test
  void compactionKeepsTheCommittedSetAndEmptiesTheHotTimeline() throws IOException {
    TimelineHistory h = history("t");
    richHistory(h);
    h.inflight("etl", 6);  // undecided: never covered
    assertSameState(h);
    assertEquals(Compactor.Result.COMPACTED, new Compactor(h.store, h.table).run(1, -1));
    assertSameState(h);
    List<String> left = hot(h);
    assertEquals(1, left.size(), left.toString());
    assertTrue(left.get(0).endsWith("-etl.inflight"), left.toString());
    // every covered write identity is still found for rerun skip, now in the snapshot
    assertNotNull(h.timeline.committedWrite("etl", 3));
    assertNotNull(h.timeline.committedWrite("other", 2));
    assertNull(h.timeline.committedWrite("etl", 9));
    // more commits, a second snapshot built on the first
    h.append("etl", 7, "k=5/x.parquet:1:1");
    h.commit("other", "overwrite", 3, TimelineHistory.files("y.parquet:2:2"), List.of());
    assertEquals(Compactor.Result.COMPACTED, new Compactor(h.store, h.table).run(1, -1));
    assertSameState(h);
    assertEquals(1, hot(h).size());
  }

  @Test
  void belowTheThresholdNothingIsWrittenAndTheWriteCountsAreKept() throws IOException {
    TimelineHistory h = history("t");
    h.append("etl", 0, "a.parquet:1:1");
    assertEquals(Compactor.Result.BELOW_THRESHOLD, new Compactor(h.store, h.table).run(10, -1));
    assertTrue(h.store.listFiles(Snapshots.snapshotsDir(h.table)).isEmpty());
  }

  @Test
  void aCommittedInstantWithMarkersBoundsTheSnapshotToAPrefixOfTheCommitOrder() throws IOException {
    TimelineHistory h = history("t");
    h.append("etl", 0, "a.parquet:1:1");
    String pending = h.commit("slow", "overwrite", 0, TimelineHistory.files("b.parquet:2:2"), List.of());
    h.store.putIfAbsent(new Path(h.timeline.markerDirectory(pending), "MARKERS.type"),
        "DIRECT".getBytes(StandardCharsets.UTF_8));  // W9b/W10 not done yet
    String later = h.append("etl", 1, "c.parquet:3:3");
    new Compactor(h.store, h.table).run(1, -1);
    List<String> left = hot(h);
    assertTrue(left.contains(pending + ".outcome"), left.toString());
    assertTrue(left.contains(later + ".outcome"), "after the unsettled commit: " + left);
    assertSameState(h);
    h.store.deleteDirectory(h.timeline.markerDirectory(pending));  // W10 lands
    new Compactor(h.store, h.table).run(1, -1);
    assertTrue(hot(h).isEmpty(), hot(h).toString());
    assertSameState(h);
  }

  /** A store that fails every operation after the first {@code budget}. */
  static final class FailingStore extends ForwardingStore {
    private static final long serialVersionUID = 1L;
    final AtomicInteger budget;

    FailingStore(AtomicStore inner, int budget) {
      super(inner);
      this.budget = new AtomicInteger(budget);
    }

    @Override
    protected void before(String op, Path path) throws IOException {
      if (budget.decrementAndGet() < 0) {
        throw new IOException("injected crash before " + op + " " + path);
      }
    }
  }

  @Test
  void aCrashAfterAnyStorageOperationKeepsTheCommittedSetAndTheNextRunRepairs()
      throws IOException {
    int crashes = 0;
    for (int budget = 0; ; budget++) {
      TimelineHistory h = history("crash-" + budget);
      richHistory(h);
      new Compactor(h.store, h.table).run(1, -1);  // snapshot 1
      h.append("etl", 8, "z.parquet:5:5");
      h.rolledBack("other", 9, "w.parquet");
      h.append("other", 10, "k=9/v.parquet:6:6");
      FailingStore failing = new FailingStore(h.store, budget);
      Compactor.Result result;
      try {
        result = new Compactor(failing, h.table).run(1, 0);
      } catch (IOException e) {
        crashes++;
        assertSameState(h);  // the crash leaves the committed set as it was
        Compactor.Result next = new Compactor(h.store, h.table).run(1, 0);
        assertTrue(List.of(Compactor.Result.COMPACTED, Compactor.Result.FINISHED_ARCHIVE,
            Compactor.Result.NOTHING_TO_DO).contains(next), "crash at " + budget + ": " + next);
        assertSameState(h);
        assertTrue(hot(h).isEmpty(), "crash at " + budget + ": " + hot(h));
        continue;
      }
      assertEquals(Compactor.Result.COMPACTED, result);
      assertSameState(h);
      break;
    }
    assertTrue(crashes > 10, "every operation of a compaction was crashed at: " + crashes);
  }

  @Test
  void aHalfDeletedInstantAndAVoidOutcomeAreIgnoredByReadersAndRemoved() throws IOException {
    TimelineHistory h = history("t");
    richHistory(h);
    assertThrows(IOException.class, () -> new Compactor(h.store, h.table, step -> {
      if (step.equals("C6.outcome")) {
        throw new IOException("crash after the .inflight deletes");
      }
    }).run(1, -1));
    // the covered instants are half-deleted: outcomes without .inflight; still the same set
    assertTrue(hot(h).stream().allMatch(n -> n.endsWith(".outcome") || n.endsWith(".rolledback")));
    assertSameState(h);
    // a zombie's void outcome (crashed before withdrawing it)
    String zombie = h.nextId("ghost");
    Map<String, Object> body = new java.util.TreeMap<>();
    body.put("instant", zombie);
    body.put("outcome", "committed");
    body.put("files", List.of(Map.of("path", "ghost.parquet", "size", 1, "rows", 1)));
    body.put("extra", Map.of("operation", "overwrite", "committedAt", "99990101000000000000"));
    h.store.putIfAbsent(h.timeline.file(zombie, ".outcome"), Timeline.encode(Timeline.OUTCOME_KIND, body));
    assertSameState(h);
    h.append("etl", 11, "late.parquet:1:1");
    new Compactor(h.store, h.table).run(1, -1);
    assertTrue(hot(h).isEmpty(), hot(h).toString());
    assertSameState(h);
  }

  @Test
  void aStrayRolledbackWithoutInflightIsVoidAndRemoved() throws IOException {
    TimelineHistory h = history("t");
    String claimed = h.rolledBack("etl", 0, "a.parquet");
    h.append("etl", 1, "b.parquet:1:1");
    new Compactor(h.store, h.table).run(1, -1);
    // a rollback pass rewrites .rolledback after C6 deleted the instant
    h.store.putIfAbsent(h.timeline.file(claimed, ".rolledback"),
        Timeline.encode(Timeline.ROLLEDBACK_KIND, Map.of("owner", "job:etl", "complete", true)));
    assertSameState(h);
    assertEquals(Compactor.Result.FINISHED_ARCHIVE, new Compactor(h.store, h.table).run(1, -1));
    assertTrue(hot(h).isEmpty(), hot(h).toString());
  }

  @Test
  void everySnapshotDamagedWithTheOldArchivesGoneIsAnErrorNamingTheFile() throws IOException {
    TimelineHistory h = history("t");
    for (int i = 0; i < 5; i++) {
      h.append("etl", i, "f" + i + ".parquet:1:1");
      new Compactor(h.store, h.table).run(1, 0);  // retention 0: old archives go with C7
    }
    List<String> names = h.store.listFiles(Snapshots.snapshotsDir(h.table));
    for (String name : names) {
      if (name.endsWith(".snapshot")) {
        Files.writeString(LocalAtomicStore.local(new Path(Snapshots.snapshotsDir(h.table), name)), "{");
      }
    }
    SparkguardException e = assertThrows(SparkguardException.class,
        () -> TableState.load(h.store, h.table, false));
    assertTrue(e.getMessage().contains(Snapshots.snapshotName(5)), e.getMessage());
    assertTrue(e.getMessage().contains("restore"), e.getMessage());
  }

  @Test
  void aZombieCommitAfterArchivingIsWithdrawnAndFails() throws IOException {
    TimelineHistory h = history("t");
    h.append("etl", 0, "a.parquet:1:1");
    String claimed = h.rolledBack("etl", 1, "b.parquet");
    new Compactor(h.store, h.table).run(1, -1);
    assertFalse(hot(h).contains(claimed + ".outcome"), "archived: the fence is gone");
    InstantDecidedException e = assertThrows(InstantDecidedException.class,
        () -> h.timeline.commit(claimed,
            List.of(Map.of("path", "b.parquet", "size", 1, "rows", 1)),
            Map.of("operation", "append"), 1));
    assertTrue(e.getMessage().contains("archived"), e.getMessage());
    assertTrue(hot(h).isEmpty(), "the zombie's outcome was withdrawn: " + hot(h));
    assertSameState(h);
    assertNull(h.timeline.committedWrite("etl", 1));
  }

  @Test
  void racingCompactorsAndWritersKeepTheCommittedSet() throws Exception {
    TimelineHistory h = history("t");
    richHistory(h);
    for (int round = 0; round < 15; round++) {
      h.append("etl", 20 + round, "r" + round + ".parquet:1:1");
      if (round % 5 == 0) {
        h.commit("etl", "overwrite", 100 + round, TimelineHistory.files("o" + round + ".parquet:2:2"),
            List.of());
      }
      List<Thread> threads = new ArrayList<>();
      List<Throwable> errors = java.util.Collections.synchronizedList(new ArrayList<>());
      for (int t = 0; t < 3; t++) {
        threads.add(new Thread(() -> {
          try {
            new Compactor(h.store, h.table).run(1, 0);
            assertSameState(h);
          } catch (Throwable e) {
            errors.add(e);
          }
        }));
      }
      threads.forEach(Thread::start);
      assertSameState(h);  // a reader while they run
      for (Thread thread : threads) {
        thread.join();
      }
      assertTrue(errors.isEmpty(), errors.toString());
      assertSameState(h);
    }
    new Compactor(h.store, h.table).run(1, 0);
    assertTrue(hot(h).isEmpty(), hot(h).toString());
    // C7 kept 3 snapshots, and (retention 0) only their archives
    List<String> snapshots = h.store.listFiles(Snapshots.snapshotsDir(h.table));
    assertEquals(4, snapshots.size(), snapshots.toString());  // 3 + LATEST
  }

  @Test
  void aTornNewestSnapshotFallsBackToTheOlderOneAndItsArchive() throws IOException {
    TimelineHistory h = history("t");
    VectorCases.tornSnapshot(h);
    assertSameState(h);
  }

  @Test
  void committedWriteOfAMicroBatchIsFoundInTheSnapshot() throws IOException {
    TimelineHistory h = history("t");
    Map<String, Object> b7 = Map.of("queryId", "q-1", "batchId", 7L);
    Map<String, Object> b8 = Map.of("queryId", "q-1", "batchId", 8L);
    String first = h.commit("fb", "append", 0, TimelineHistory.files("q7.parquet:1:1"), List.of(), b7);
    String second = h.commit("fb", "append", 0, TimelineHistory.files("q8.parquet:1:1"), List.of(), b8);
    new Compactor(h.store, h.table).run(1, -1);
    assertTrue(hot(h).isEmpty());
    assertEquals(second, h.timeline.committedWrite("fb", 0, new MicroBatch("q-1", 8, "r")));
    assertNull(h.timeline.committedWrite("fb", 0, new MicroBatch("q-1", 9, "r")));
    assertNull(h.timeline.committedWrite("fb", 0), "a plain write never matches a micro-batch's");
    assertNotNull(first);
  }

  @Test
  void settingsAreParsedStrictly() {
    Map<String, String> base = Map.of("spark.sparkguard.jobId", "j");
    assertEquals(10, ProtocolSettings.parse(base::get).snapshotEvery());
    assertEquals(-1, ProtocolSettings.parse(base::get).archiveRetentionDays());
    for (String key : List.of(ProtocolSettings.SNAPSHOT_EVERY_KEY, ProtocolSettings.ARCHIVE_RETENTION_KEY)) {
      for (String bad : List.of("-1", "ten", "1.5", "99999999999")) {
        Map<String, String> conf = new java.util.HashMap<>(base);
        conf.put(key, bad);
        SparkguardException.ConfigException e = assertThrows(
            SparkguardException.ConfigException.class, () -> ProtocolSettings.parse(conf::get));
        assertTrue(e.getMessage().startsWith(key + " '" + bad + "' is not valid: give a"
            + " non-negative integer"), e.getMessage());
      }
    }
    Map<String, String> off = new java.util.HashMap<>(base);
    off.put(ProtocolSettings.SNAPSHOT_EVERY_KEY, " 0 ");
    off.put(ProtocolSettings.ARCHIVE_RETENTION_KEY, "30");
    assertEquals(0, ProtocolSettings.parse(off::get).snapshotEvery());
    assertEquals(30, ProtocolSettings.parse(off::get).archiveRetentionDays());
  }

  @Test
  void bulkDeleteThroughHadoopDeletesEveryFile() throws IOException {
    java.nio.file.Path d = Files.createDirectories(dir.resolve("bulk"));
    List<Path> paths = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      Files.writeString(d.resolve("f" + i), "x");
      paths.add(new Path(d.resolve("f" + i).toUri()));
    }
    org.apache.hadoop.conf.Configuration conf = new org.apache.hadoop.conf.Configuration();
    conf.setBoolean(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL, true);
    AtomicStore store = AtomicStore.forTable(new Path(d.toUri()), conf);
    store.deleteAll(new Path(d.toUri()), paths);
    assertEquals(List.of(), store.listFiles(new Path(d.toUri())));
  }
}
