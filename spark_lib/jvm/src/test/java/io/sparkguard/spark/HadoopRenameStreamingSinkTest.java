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
import java.nio.file.attribute.FileTime;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeSet;
import java.util.concurrent.TimeoutException;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.StreamingQueryException;
import org.apache.spark.sql.streaming.Trigger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Spark's streaming file sink through {@link SparkguardStreamingCommitProtocol} with {@link
 * HadoopRenameAtomicStore} forced on a {@code file://} sink: the HDFS mechanism (temp name,
 * {@code FileContext.rename}) over Hadoop's local filesystem, not a real HDFS cluster. A task
 * attempt fails mid-batch and is retried: the batch still commits once, under the deterministic
 * names, with no temp file left.
 */
class HadoopRenameStreamingSinkTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String JOB = "hdfs-stream-1";
  private static SparkSession spark;
  @TempDir Path dir;

  @BeforeAll
  static void startSpark() {
    spark = TestSpark.local("local[2,4]", "sparkguard-hadoop-rename-streaming-sink-test")
        .config("spark.sql.streaming.commitProtocolClass",
            SparkguardStreamingCommitProtocol.class.getName())
        .config("spark.sparkguard.jobId", JOB)
        .getOrCreate();
    spark.sparkContext().hadoopConfiguration().setBoolean(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL, true);
    TestSpark.registerFailure(spark, "failOnceAt1500", 1500L, false);
  }

  @AfterAll
  static void stopSpark() {
    spark.sparkContext().hadoopConfiguration().unset(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL);
    spark.stop();
  }

  /** {@code count} JSON files of 1000 rows of {@code n}, one micro-batch each, oldest first. */
  private static void inputs(Path input, int count) throws IOException {
    Files.createDirectories(input);
    for (int i = 0; i < count; i++) {
      StringBuilder text = new StringBuilder();
      for (long n = i * 1000L; n < (i + 1) * 1000L; n++) {
        text.append("{\"n\":").append(n).append("}\n");
      }
      Path file = input.resolve(String.format("input-%03d.json", i));
      Files.writeString(file, text);
      Files.setLastModifiedTime(file, FileTime.fromMillis(1_700_000_000_000L + 10_000L * i));
    }
  }

  private static List<String> files(Path sink) throws IOException {
    try (Stream<Path> walk = Files.walk(sink)) {
      return walk.filter(Files::isRegularFile)
          .map(p -> sink.relativize(p).toString())
          .filter(p -> !p.startsWith("_sparkguard/") && !p.startsWith("_spark_metadata/"))
          .sorted()
          .collect(Collectors.toList());
    }
  }

  private static List<JsonNode> outcomes(Path sink) throws IOException {
    List<JsonNode> found = new ArrayList<>();
    try (Stream<Path> timeline = Files.list(sink.resolve("_sparkguard/timeline"))) {
      for (Path p : (Iterable<Path>) timeline.sorted()::iterator) {
        if (p.getFileName().toString().endsWith(".outcome")) {
          found.add(JSON.readTree(p.toFile()));
        }
      }
    }
    return found;
  }

  @Test
  void aStreamWithAFailedTaskAttemptPublishesByRenameAndCommitsEachBatchOnce()
      throws IOException, TimeoutException, StreamingQueryException {
    Path input = dir.resolve("input");
    Path sink = dir.resolve("sink");
    inputs(input, 3);
    StreamingQuery query = spark.readStream().schema("n LONG").option("maxFilesPerTrigger", 1)
        .json(input.toString())
        .repartition(2)
        .selectExpr("failOnceAt1500(n) AS n")
        .selectExpr("n", "n % 2 AS k")
        .writeStream().format("parquet")
        .option("checkpointLocation", dir.resolve("checkpoint").toString())
        .partitionBy("k")
        .trigger(Trigger.AvailableNow())
        .start(sink.toString());
    query.awaitTermination();

    List<String> files = files(sink);
    // The failed attempt's temp files are gone (abortTask), the published ones renamed with
    // their checksums; no temp name is left anywhere.
    assertTrue(files.stream().noneMatch(f -> f.contains(".sg-tmp-")), files.toString());
    List<String> data = files.stream().filter(f -> !f.endsWith(".crc")).collect(Collectors.toList());
    List<String> expected = new ArrayList<>();
    for (int k = 0; k < 2; k++) {
      for (int b = 0; b < 3; b++) {
        for (int p = 0; p < 2; p++) {
          expected.add(String.format("k=%d/part-%05d-%s-b%010d-c000.snappy.parquet", k, p, JOB, b));
        }
      }
    }
    java.util.Collections.sort(expected);
    assertEquals(expected, data);
    for (String f : data) {
      int slash = f.lastIndexOf('/');
      String crc = f.substring(0, slash + 1) + "." + f.substring(slash + 1) + ".crc";
      assertTrue(files.contains(crc), "checksum of " + f + " in " + files);
    }

    // One instant per batch execution: three, each committed with the files of its batch.
    List<JsonNode> outcomes = outcomes(sink);
    assertEquals(3, outcomes.size());
    TreeSet<String> committed = new TreeSet<>();
    TreeSet<Long> batches = new TreeSet<>();
    for (JsonNode outcome : outcomes) {
      assertEquals("committed", outcome.get("outcome").asText());
      assertEquals("parquet", outcome.get("extra").get("format").asText());
      assertEquals("k", outcome.get("extra").get("partitionBy").get(0).asText());
      batches.add(outcome.get("extra").get("batchId").asLong());
      for (JsonNode file : outcome.get("files")) {
        String path = file.get("path").asText();
        assertEquals(Files.size(sink.resolve(path)), file.get("size").asLong());
        committed.add(path);
      }
      String instant = outcome.get("instant").asText();
      assertFalse(Files.exists(sink.resolve("_sparkguard/markers/" + instant)), "markers removed");
    }
    assertEquals(new TreeSet<>(List.of(0L, 1L, 2L)), batches);
    assertEquals(new TreeSet<>(data), committed);
    // Through _spark_metadata: every row once.
    assertEquals(3000, spark.read().parquet(sink.toString()).count());
    assertEquals(3000, spark.read().parquet(sink.toString()).select("n").distinct().count());
  }
}
