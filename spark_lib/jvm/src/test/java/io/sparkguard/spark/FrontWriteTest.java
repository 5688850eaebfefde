package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.protocol.WriteCounter;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.spark.SparkFiles;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code df.write.format("sparkguard")} with the jar on the classpath and no sparkguard conf on
 * the session: the JVM front ({@link SparkguardDataSource}) writes through the commit protocol
 * for that write only.
 */
class FrontWriteTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static SparkSession spark;
  @TempDir Path dir;

  @BeforeAll
  static void startSpark() {
    spark = TestSpark.local("local[2,4]", "sparkguard-front-test").getOrCreate();
  }

  @AfterAll
  static void stopSpark() {
    spark.stop();
  }

  @BeforeEach
  void newDriverRun() throws IOException {
    Path counts = Path.of(SparkFiles.getRootDirectory(), WriteCounter.DIRECTORY);
    if (Files.exists(counts)) {
      try (Stream<Path> files = Files.list(counts)) {
        for (Path f : files.collect(Collectors.toList())) {
          Files.delete(f);
        }
      }
    }
  }

  private Dataset<Row> rows(int n, int partitions) {
    return spark.range(0, n, 1, partitions).toDF("n").selectExpr("n", "n % 2 AS k");
  }

  private static List<String> dataFiles(Path table) throws IOException {
    try (Stream<Path> walk = Files.walk(table)) {
      return walk.filter(Files::isRegularFile)
          .map(p -> table.relativize(p).toString())
          .filter(p -> !p.startsWith("_sparkguard/") && !p.endsWith(".crc"))
          .sorted()
          .collect(Collectors.toList());
    }
  }

  private static List<JsonNode> timeline(Path table, String suffix) throws IOException {
    List<JsonNode> docs = new ArrayList<>();
    try (Stream<Path> files = Files.list(table.resolve("_sparkguard/timeline"))) {
      for (Path p : files.sorted().collect(Collectors.toList())) {
        if (p.getFileName().toString().endsWith(suffix)) {
          docs.add(JSON.readTree(p.toFile()));
        }
      }
    }
    return docs;
  }

  private static String messages(Throwable error) {
    StringBuilder text = new StringBuilder();
    for (Throwable t = error; t != null; t = t.getCause()) {
      text.append(t.getMessage()).append('\n');
    }
    return text.toString();
  }

  @Test
  void theFormatNameWritesThroughTheProtocolForThatWriteOnly() throws IOException {
    Path table = dir.resolve("t");
    rows(100, 4).write().format("sparkguard").option("jobId", "front-1").mode("append")
        .save(table.toString());

    assertEquals(
        List.of(
            "part-00000-front-1-w000-c000.snappy.parquet",
            "part-00001-front-1-w000-c000.snappy.parquet",
            "part-00002-front-1-w000-c000.snappy.parquet",
            "part-00003-front-1-w000-c000.snappy.parquet"),
        dataFiles(table));
    JsonNode outcome = timeline(table, ".outcome").get(0);
    assertEquals("committed", outcome.get("outcome").asText());
    assertEquals(0, outcome.get("write").asInt());
    assertEquals(SparkguardCommitProtocol.PROTOCOL, outcome.get("extra").get("protocol").asText());
    assertEquals(100, outcome.get("extra").get("rows").asLong());
    assertEquals("job:front-1", timeline(table, ".inflight").get(0).get("owner").asText());
    assertEquals(100, spark.read().parquet(table.toString()).count());

    // The session's conf is untouched: a plain write afterwards uses Spark's own protocol.
    assertEquals("org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol",
        spark.conf().get(SparkguardDataSource.COMMIT_PROTOCOL_KEY));
    assertFalse(spark.conf().getOption(ProtocolSettings.JOB_ID_KEY).isDefined());
    Path plain = dir.resolve("plain");
    rows(10, 1).write().parquet(plain.toString());
    assertFalse(Files.exists(plain.resolve("_sparkguard")));
    assertTrue(Files.exists(plain.resolve("_SUCCESS")));  // Spark's own committer wrote it
  }

  @Test
  void aRerunIsSkippedAndTheOptionsOfThePythonWriterKeepTheirMeaning() throws IOException {
    Path table = dir.resolve("t");
    for (int run = 0; run < 2; run++) {
      newDriverRun();  // the second run is a rerun of the job: write 0 again, already committed
      rows(40, 2).write().format("sparkguard").mode("append")
          .option("jobId", "front-2").option("partitionBy", "k")
          .option("maxRecordsPerFile", "15").option("format", "json")
          .option("owner", "k8s:ns/app/uid-1")
          .save(table.toString());
    }
    List<String> files = dataFiles(table);
    // 20 rows per task, 10 per partition directory: one file each; json through Spark's writer.
    assertEquals(4, files.size(), files.toString());
    for (String name : files) {
      assertTrue(name.matches("k=[01]/part-0000[01]-front-2-w000-c000\\.json"), name);
    }
    assertEquals(1, timeline(table, ".outcome").size());
    assertEquals("k8s:ns/app/uid-1", timeline(table, ".inflight").get(0).get("owner").asText());
    assertEquals(40, spark.read().json(table.toString()).count());

    Path split = dir.resolve("split");
    rows(40, 1).write().format("sparkguard").option("jobId", "front-3")
        .option("maxRecordsPerFile", "15").save(split.toString());
    assertEquals(
        List.of(
            "part-00000-front-3-w000-c000.snappy.parquet",
            "part-00000-front-3-w000-c001.snappy.parquet",
            "part-00000-front-3-w000-c002.snappy.parquet"),
        dataFiles(split));
  }

  @Test
  void anOverwriteThroughTheFormatNameReplacesTheTable() throws IOException {
    Path table = dir.resolve("t");
    rows(10, 2).write().format("sparkguard").option("jobId", "front-4").save(table.toString());
    rows(30, 2).write().format("sparkguard").option("jobId", "front-4").mode("overwrite")
        .save(table.toString());
    assertEquals(30, spark.read().parquet(table.toString()).count());
    List<JsonNode> outcomes = timeline(table, ".outcome");
    assertEquals("overwrite", outcomes.get(outcomes.size() - 1).get("extra").get("operation")
        .asText());
  }

  @Test
  void badOptionsAreRefusedNamingTheOptionAndTheFix() {
    Path table = dir.resolve("t");
    Map<String, String[]> cases = Map.of(
        "jobId", new String[] {"Bad_Id", "write option 'jobId' (spark.sparkguard.jobId) 'Bad_Id'"
            + " is not valid"},
        "storageOptions", new String[] {"{}", "option 'storageOptions' configures the fsspec"
            + " path"},
        "format", new String[] {"avro", "option 'format'='avro' is not supported; use one of"},
        "maxRecordsPerFile", new String[] {"-2", "option 'maxRecordsPerFile'='-2' must be an"
            + " integer >= 0"},
        "markerType", new String[] {"BATCHES", "write option 'markerType'"
            + " (spark.sparkguard.markers.type) 'BATCHES' is not valid: use sidecar"});
    for (Map.Entry<String, String[]> bad : cases.entrySet()) {
      Exception error = assertThrows(Exception.class, () -> rows(4, 1).write()
          .format("sparkguard").option("jobId", "front-5")
          .option(bad.getKey(), bad.getValue()[0]).save(table.toString()));
      assertTrue(messages(error).contains(bad.getValue()[1]), messages(error));
    }
    Exception noJob = assertThrows(Exception.class,
        () -> rows(4, 1).write().format("sparkguard").save(table.toString()));
    assertTrue(messages(noJob).contains("spark.sparkguard.jobId is not set"), messages(noJob));
    assertFalse(Files.exists(table), "nothing was written");
  }

  @Test
  void aLocationHadoopCannotOpenNamesBothFixes() {
    Exception error = assertThrows(Exception.class, () -> rows(4, 1).write()
        .format("sparkguard").option("jobId", "front-6").save("nosuchfs://bucket/t"));
    assertTrue(messages(error).contains("Hadoop has no FileSystem for nosuchfs://bucket/t"),
        messages(error));
    assertTrue(messages(error).contains("sparkguard.spark_lib.spark.writer.register(spark)"),
        messages(error));
  }
}
