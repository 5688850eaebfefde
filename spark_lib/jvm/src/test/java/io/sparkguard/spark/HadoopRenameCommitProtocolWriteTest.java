package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.store.HadoopRenameAtomicStore;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Real Spark (local mode, task retries) writing through the protocol with {@link
 * HadoopRenameAtomicStore} forced on a {@code file://} table: HDFS's publication path (temp
 * name, {@code FileContext.rename}) over Hadoop's local filesystem, not a real HDFS cluster.
 */
class HadoopRenameCommitProtocolWriteTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static SparkSession spark;
  @TempDir Path dir;

  @BeforeAll
  static void startSpark() {
    spark = TestSpark.local("local[2,4]", "sparkguard-hadoop-rename-store-test")
        .config("spark.sql.sources.commitProtocolClass", SparkguardCommitProtocol.class.getName())
        .config("spark.sparkguard.jobId", "hdfs-path-1")
        .getOrCreate();
    // What spark.hadoop.<key>=true sets; on the live context in case getOrCreate reused one.
    spark.sparkContext().hadoopConfiguration().setBoolean(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL, true);
    TestSpark.registerFailure(spark, "failOnceAt30", 30L, false);
  }

  @AfterAll
  static void stopSpark() {
    spark.sparkContext().hadoopConfiguration().unset(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL);
    spark.stop();
  }

  private static List<String> files(Path table) throws IOException {
    try (Stream<Path> walk = Files.walk(table)) {
      return walk.filter(Files::isRegularFile)
          .map(p -> table.relativize(p).toString())
          .filter(p -> !p.startsWith("_sparkguard/"))
          .sorted()
          .collect(Collectors.toList());
    }
  }

  @Test
  void aWriteWithAFailedAttemptPublishesByRenameAndCommitsOnce() throws IOException {
    Path table = dir.resolve("t");
    spark.range(0, 100, 1, 4).toDF("n").selectExpr("failOnceAt30(n) AS n")
        .write().mode("append").parquet(table.toString());

    List<String> files = files(table);
    // No temp name is left, and no Hadoop checksum: the tasks write through the owned local
    // filesystem, which has none (OwnedFileSystem).
    assertTrue(files.stream().noneMatch(f -> f.contains(".sg-tmp-")), files.toString());
    assertTrue(files.stream().noneMatch(f -> f.endsWith(".crc")), files.toString());
    assertEquals(
        List.of(
            "part-00000-hdfs-path-1-w000-c000.snappy.parquet",
            "part-00001-hdfs-path-1-w000-c000.snappy.parquet",
            "part-00002-hdfs-path-1-w000-c000.snappy.parquet",
            "part-00003-hdfs-path-1-w000-c000.snappy.parquet"),
        files);
    List<JsonNode> outcomes;
    try (Stream<Path> timeline = Files.list(table.resolve("_sparkguard/timeline"))) {
      outcomes = timeline.filter(p -> p.getFileName().toString().endsWith(".outcome"))
          .map(p -> {
            try {
              return JSON.readTree(p.toFile());
            } catch (IOException e) {
              throw new java.io.UncheckedIOException(e);
            }
          })
          .collect(Collectors.toList());
    }
    assertEquals(1, outcomes.size());
    JsonNode outcome = outcomes.get(0);
    assertEquals("committed", outcome.get("outcome").asText());
    long rows = 0;
    for (JsonNode file : outcome.get("files")) {
      assertEquals(Files.size(table.resolve(file.get("path").asText())), file.get("size").asLong());
      rows += file.get("rows").asLong();
    }
    assertEquals(100, rows);
    String instant = outcome.get("instant").asText();
    assertFalse(Files.exists(table.resolve("_sparkguard/markers/" + instant)), "markers removed after commit");
    assertEquals(100, spark.read().parquet(table.toString()).select("n").distinct().count());
  }
}
