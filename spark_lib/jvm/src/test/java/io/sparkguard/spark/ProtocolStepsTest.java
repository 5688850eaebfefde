package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.SparkguardException.UnsupportedWriteException;
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

  private static Configuration directStore() {
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
        () -> ProtocolSteps.verifyAndClean(store, local, markers, reported, "not committed"));
    assertTrue(e.getMessage().endsWith("reported 4; not committed"), e.getMessage());
    assertEquals(3, store.size(new Path(local, "b.parquet")), "nothing deleted before the check");
    reported.put("a.parquet", 3L);
    ProtocolSteps.verifyAndClean(store, local, markers, reported, "not committed");
    assertEquals(3, store.size(new Path(local, "a.parquet")));
    assertEquals(-1, store.size(new Path(local, "b.parquet")), "marked, not reported: deleted");
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
