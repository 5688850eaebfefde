package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.protocol.WriteCounter;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.store.ForwardingStore;
import io.sparkguard.spark.store.LocalAtomicStore;
import io.sparkguard.spark.timeline.TableListing;
import io.sparkguard.spark.timeline.Timeline;
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

/** Real Spark (local mode, task retries) writing through the protocol on local disk. */
class CommitProtocolWriteTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static SparkSession spark;
  @TempDir Path dir;

  @BeforeAll
  static void startSpark() {
    spark = TestSpark.local("local[2,4]", "sparkguard-commit-protocol-test")
        .config("spark.sql.sources.commitProtocolClass", SparkguardCommitProtocol.class.getName())
        .getOrCreate();
    TestSpark.registerFailure(spark, "failOnceAt30", 30L, false);
    TestSpark.registerFailure(spark, "failAlwaysAt7", 7L, true);
  }

  @AfterAll
  static void stopSpark() {
    spark.stop();
  }

  @BeforeEach
  void newDriverRun() throws IOException {
    spark.conf().set("spark.sparkguard.jobId", "nightly-1");
    spark.conf().unset("spark.sparkguard.rerun");
    spark.conf().unset("spark.sql.sources.partitionOverwriteMode");
    forgetWriteCounts();
  }

  /** What a restarted driver starts with (the Python writer's new_driver_run does the same). */
  private static void forgetWriteCounts() throws IOException {
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
    return spark.range(0, n, 1, partitions).toDF("n");
  }

  private static List<String> dataFiles(Path table) throws IOException {
    try (Stream<Path> walk = Files.walk(table)) {
      return walk.filter(Files::isRegularFile)
          .map(p -> table.relativize(p).toString())
          .filter(p -> !p.startsWith("_sparkguard/"))
          .filter(p -> !(p.endsWith(".crc") && !p.contains(".sg-tmp-")))  // Hadoop's checksums
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

  @Test
  void appendWritesDeterministicNamesAndCommitsTheInstantOnce() throws IOException {
    Path table = dir.resolve("t");
    rows(100, 4).write().mode("append").parquet(table.toString());

    assertEquals(
        List.of(
            "part-00000-nightly-1-w000-c000.snappy.parquet",
            "part-00001-nightly-1-w000-c000.snappy.parquet",
            "part-00002-nightly-1-w000-c000.snappy.parquet",
            "part-00003-nightly-1-w000-c000.snappy.parquet"),
        dataFiles(table));
    JsonNode inflight = timeline(table, ".inflight").get(0);
    assertEquals("sparkguard.instant.inflight", inflight.get("kind").asText());
    assertEquals(1, inflight.get("version").asInt());
    assertEquals("job:nightly-1", inflight.get("owner").asText());
    assertEquals("DIRECT", inflight.get("markerType").asText());
    String instant = inflight.get("instant").asText();
    assertTrue(instant.matches("[0-9]{17}-nightly-1"), instant);

    JsonNode outcome = timeline(table, ".outcome").get(0);
    assertEquals("committed", outcome.get("outcome").asText());
    assertEquals(instant, outcome.get("instant").asText());
    assertEquals(4, outcome.get("files").size());
    long rows = 0;
    for (JsonNode file : outcome.get("files")) {
      assertEquals(Files.size(table.resolve(file.get("path").asText())), file.get("size").asLong());
      rows += file.get("rows").asLong();
    }
    assertEquals(100, rows);
    assertEquals("parquet", outcome.get("extra").get("format").asText());
    assertEquals("append", outcome.get("extra").get("operation").asText());
    assertFalse(Files.exists(table.resolve("_sparkguard/markers/" + instant)), "markers removed after commit");
    assertEquals(100, spark.read().parquet(table.toString()).count());
  }

  @Test
  void aWriteToAPathThatDidNotExistRecordsThatItCreatedTheLocation() throws IOException {
    Path table = dir.resolve("t");
    rows(10, 2).write().mode("append").parquet(table.toString());
    Files.createDirectories(dir.resolve("empty"));
    rows(10, 2).write().mode("append").parquet(dir.resolve("empty").toString());
    rows(10, 2).write().mode("append").parquet(table.toString());

    List<JsonNode> written = timeline(table, ".inflight");
    assertTrue(written.get(0).get("extra").get("createdLocation").asBoolean());
    assertFalse(written.get(1).get("extra").has("createdLocation"));  // the table existed
    JsonNode intoEmpty = timeline(dir.resolve("empty"), ".inflight").get(0);
    assertFalse(intoEmpty.get("extra").has("createdLocation"));  // an existing empty directory
  }

  @Test
  void aRerunWithRewriteRewritesTheSameNamesNoDuplicates() throws IOException {
    Path table = dir.resolve("t");
    rows(100, 4).write().mode("append").parquet(table.toString());
    List<String> first = dataFiles(table);
    forgetWriteCounts();  // the rerun is a new driver run: its first write is write 0 again
    spark.conf().set("spark.sparkguard.rerun", "rewrite");
    rows(100, 4).write().mode("append").parquet(table.toString());

    assertEquals(first, dataFiles(table));
    List<String> operations = new ArrayList<>();
    for (JsonNode outcome : timeline(table, ".outcome")) {
      operations.add(outcome.get("extra").get("operation").asText());
    }
    assertEquals(List.of("append", "rewrite"), operations);
    assertEquals(100, spark.read().parquet(table.toString()).count());
  }

  @Test
  void aRerunOfACommittedWriteIsSkippedEvenWithAnotherPartitionCount() throws IOException {
    Path table = dir.resolve("t");
    rows(100, 4).write().mode("append").parquet(table.toString());
    List<String> first = dataFiles(table);
    forgetWriteCounts();  // the job failed after its write committed and is run again
    rows(100, 2).write().mode("append").parquet(table.toString());

    assertEquals(first, dataFiles(table));  // untouched: nothing of the rerun reached the table
    assertEquals(1, timeline(table, ".inflight").size());
    assertEquals(100, spark.read().parquet(table.toString()).count());
    assertEquals(100, spark.read().parquet(table.toString()).select("n").distinct().count());
  }

  @Test
  void twoWritesOfOneRunAreWritesZeroAndOneWithTheirOwnNames() throws IOException {
    Path table = dir.resolve("t");
    rows(10, 1).write().mode("append").parquet(table.toString());
    rows(10, 1).write().mode("append").parquet(table.toString());

    assertEquals(
        List.of("part-00000-nightly-1-w000-c000.snappy.parquet", "part-00000-nightly-1-w001-c000.snappy.parquet"),
        dataFiles(table));
    List<Integer> writes = new ArrayList<>();
    for (JsonNode inflight : timeline(table, ".inflight")) {
      writes.add(inflight.get("write").asInt());
    }
    writes.sort(null);
    assertEquals(List.of(0, 1), writes);
    for (JsonNode outcome : timeline(table, ".outcome")) {
      assertTrue(outcome.get("files").get(0).get("path").asText().contains("-w" + String.format("%03d", outcome.get("write").asInt()) + "-"));
    }
    assertEquals(20, spark.read().parquet(table.toString()).count());
  }

  @Test
  void maxRecordsPerFileSplitsATaskIntoSequencedNamesAndARerunSkipsThem() throws IOException {
    Path table = dir.resolve("t");
    // 100 rows in 2 tasks of 50, at most 20 rows a file: c000 (20), c001 (20), c002 (10) each.
    rows(100, 2).write().option("maxRecordsPerFile", 20).mode("append").parquet(table.toString());

    List<String> expected = new ArrayList<>();
    for (int p = 0; p < 2; p++) {
      for (int c = 0; c < 3; c++) {
        expected.add(String.format("part-%05d-nightly-1-w000-c%03d.snappy.parquet", p, c));
      }
    }
    assertEquals(expected, dataFiles(table));
    JsonNode outcome = timeline(table, ".outcome").get(0);
    assertEquals(6, outcome.get("files").size());
    long rows = 0;
    for (JsonNode file : outcome.get("files")) {
      assertTrue(file.get("rows").asLong() <= 20, file.toString());
      rows += file.get("rows").asLong();
    }
    assertEquals(100, rows);

    // The driver restarts and the job runs again: the committed write is skipped, no duplicate.
    forgetWriteCounts();
    rows(100, 2).write().option("maxRecordsPerFile", 20).mode("append").parquet(table.toString());
    assertEquals(expected, dataFiles(table));
    assertEquals(100, spark.read().parquet(table.toString()).count());
  }

  @Test
  void aFailedTaskAttemptLeavesNothingAndTheRetryCommits() throws IOException {
    Path table = dir.resolve("t");
    rows(100, 4).selectExpr("failOnceAt30(n) AS n").write().mode("append").parquet(table.toString());

    List<String> files = dataFiles(table);
    assertEquals(4, files.size(), files.toString());
    assertTrue(files.stream().noneMatch(f -> f.contains(".sg-tmp-")), files.toString());
    assertEquals(100, spark.read().parquet(table.toString()).select("n").distinct().count());
  }

  @Test
  void partitionedWritesKeepHiveDirectoriesAndRecordTheColumns() throws IOException {
    Path table = dir.resolve("t");
    rows(100, 2).selectExpr("n", "n % 2 AS k").write().partitionBy("k").mode("append").parquet(table.toString());

    List<String> files = dataFiles(table);
    assertEquals(4, files.size(), files.toString());
    assertTrue(files.contains("k=0/part-00000-nightly-1-w000-c000.snappy.parquet"), files.toString());
    JsonNode outcome = timeline(table, ".outcome").get(0);
    assertEquals("k", outcome.get("extra").get("partitionBy").get(0).asText());
  }

  private static List<String> operations(Path table) throws IOException {
    List<String> operations = new ArrayList<>();
    for (JsonNode outcome : timeline(table, ".outcome")) {
      operations.add(outcome.get("outcome").asText() + ":" + outcome.get("extra").path("operation").asText());
    }
    return operations;
  }

  @Test
  void overwriteReplacesTheTableAndDeletesWhatItSupersededAfterTheCommit() throws IOException {
    Path table = dir.resolve("t");
    rows(10, 1).write().mode("append").parquet(table.toString());
    // A file written before the table opted in (no instant lists it): Spark's overwrite deletes it.
    Files.copy(table.resolve("part-00000-nightly-1-w000-c000.snappy.parquet"),
        table.resolve("part-00000-3f0c-legacy-c000.snappy.parquet"));

    spark.range(100, 105, 1, 1).toDF("n").write().mode("overwrite").parquet(table.toString());

    assertEquals(List.of("part-00000-nightly-1-w001-c000.snappy.parquet"), dataFiles(table));
    assertEquals(List.of("committed:append", "committed:overwrite"), operations(table));
    assertEquals(5, spark.read().parquet(table.toString()).count());
    assertEquals(100, spark.read().parquet(table.toString()).agg(org.apache.spark.sql.functions.min("n")).first().getLong(0));
    assertTrue(Files.isDirectory(table.resolve("_sparkguard/timeline")), "the timeline survives the overwrite");
  }

  @Test
  void aFailedOverwriteLeavesTheOldDataInPlaceAndTheInstantClaimed() throws IOException {
    Path table = dir.resolve("t");
    rows(10, 1).write().mode("append").parquet(table.toString());
    Path old = table.resolve("part-00000-nightly-1-w000-c000.snappy.parquet");
    byte[] before = Files.readAllBytes(old);

    // Row 7 is in the second of 2 tasks: every attempt of it fails, the write aborts.
    assertThrows(Exception.class, () -> rows(10, 2).selectExpr("failAlwaysAt7(n) AS n")
        .write().mode("overwrite").parquet(table.toString()));

    assertTrue(Files.exists(old), "nothing was deleted up front");
    assertTrue(java.util.Arrays.equals(before, Files.readAllBytes(old)));
    assertEquals(List.of("committed:append", "rolled_back:"), operations(table));
    // Only the old file and published files of the failed write (marked: a rollback deletes them).
    for (String file : dataFiles(table)) {
      assertTrue(file.equals(old.getFileName().toString()) || file.contains("-w001-"), file);
    }
    assertEquals(10, spark.read().parquet(old.toString()).count());
  }

  @Test
  void dynamicPartitionOverwriteReplacesOnlyThePartitionsItWrites() throws IOException {
    Path table = dir.resolve("t");
    rows(30, 1).selectExpr("n", "n % 3 AS k").write().partitionBy("k").mode("append").parquet(table.toString());
    spark.conf().set("spark.sql.sources.partitionOverwriteMode", "dynamic");
    spark.range(100, 104, 1, 1).toDF("n").selectExpr("n", "1 AS k")
        .write().partitionBy("k").mode("overwrite").parquet(table.toString());

    assertEquals(
        List.of(
            "k=0/part-00000-nightly-1-w000-c000.snappy.parquet",
            "k=1/part-00000-nightly-1-w001-c000.snappy.parquet",
            "k=2/part-00000-nightly-1-w000-c000.snappy.parquet"),
        dataFiles(table));
    JsonNode outcome = timeline(table, ".outcome").get(1);
    assertEquals("overwrite-partitions", outcome.get("extra").get("operation").asText());
    assertEquals("[\"k=1\"]", outcome.get("extra").get("partitions").toString());
    assertEquals(10 + 4 + 10, spark.read().parquet(table.toString()).count());
    assertEquals(4, spark.read().parquet(table.toString()).where("k = 1").count());
  }

  @Test
  void insertOverwriteOfAStaticPartitionReplacesThatPartitionOnly() throws IOException {
    Path table = dir.resolve("t");
    rows(20, 1).selectExpr("n", "CAST(n % 2 AS INT) AS k").write().partitionBy("k").mode("append").parquet(table.toString());
    spark.sql("CREATE TABLE sg_static (n BIGINT, k INT) USING parquet PARTITIONED BY (k) LOCATION '"
        + table.toUri() + "'");
    try {
      spark.sql("MSCK REPAIR TABLE sg_static");
      spark.sql("INSERT OVERWRITE sg_static PARTITION (k = 1) SELECT id FROM range(100, 103, 1, 1)");

      assertEquals(
          List.of(
              "k=0/part-00000-nightly-1-w000-c000.snappy.parquet",
              "k=1/part-00000-nightly-1-w001-c000.snappy.parquet"),
          dataFiles(table));
      JsonNode outcome = timeline(table, ".outcome").get(1);
      assertEquals("overwrite-partitions", outcome.get("extra").get("operation").asText());
      assertEquals("[\"k=1\"]", outcome.get("extra").get("partitions").toString());
      assertEquals(10 + 3, spark.read().parquet(table.toString()).count());
    } finally {
      spark.sql("DROP TABLE IF EXISTS sg_static");
    }
  }

  @Test
  void aWriteWithoutAJobIdFailsNamingTheKey() {
    spark.conf().unset("spark.sparkguard.jobId");
    Exception error = assertThrows(Exception.class,
        () -> rows(10, 1).write().mode("append").parquet(dir.resolve("t").toString()));
    assertTrue(rootMessage(error).startsWith("spark.sparkguard.jobId is not set"), rootMessage(error));
  }

  private static Timeline timelineOf(Path table) {
    return new Timeline(new LocalAtomicStore(), new org.apache.hadoop.fs.Path(table.toUri()));
  }

  @Test
  void anUndecidedWriteOfAnotherOwnerMakesTheWriteRefuseNamingTheOwnerAndTheFix() throws IOException {
    Path table = dir.resolve("t");
    ProtocolSettings other = ProtocolSettings.parse(
        Map.of("spark.sparkguard.jobId", "nightly-1", "spark.sparkguard.owner", "k8s:ns/other/1")::get);
    String instant = timelineOf(table).start(other, "append", Map.of());

    Exception error = assertThrows(Exception.class,
        () -> rows(10, 1).write().mode("append").parquet(table.toString()));
    String message = rootMessage(error);
    assertTrue(message.contains("instant " + instant + " of job nightly-1 is undecided"), message);
    assertTrue(message.contains("belongs to owner 'k8s:ns/other/1', not 'job:nightly-1'"), message);
    assertTrue(message.contains("sparkguard rollback --job-id nightly-1 --journal <journal> --owner 'k8s:ns/other/1'"), message);
    assertEquals(List.of(), dataFiles(table));
    assertEquals(1, timeline(table, ".inflight").size());  // no instant of its own was opened
  }

  @Test
  void anUndecidedWriteOfTheSameOwnerIsClaimedSoItCanNeverCommit() throws IOException {
    Path table = dir.resolve("t");
    ProtocolSettings same = ProtocolSettings.parse(Map.of("spark.sparkguard.jobId", "nightly-1")::get);
    String earlier = timelineOf(table).start(same, "append", Map.of());

    rows(10, 1).write().mode("append").parquet(table.toString());

    JsonNode decided = JSON.readTree(table.resolve("_sparkguard/timeline/" + earlier + ".outcome").toFile());
    assertEquals("rolled_back", decided.get("outcome").asText());
    assertEquals(List.of("committed", "rolled_back"),
        timeline(table, ".outcome").stream().map(d -> d.get("outcome").asText()).sorted().collect(Collectors.toList()));
  }

  @Test
  void anEarlierAttemptCommittedBetweenTheSetupListingAndItsClaimIsSeenByTheRerunCheck()
      throws Exception {
    // The setup lists the timeline once (TableListing); the fence then claims this owner's
    // undecided instants. An earlier attempt whose driver is still alive can commit in between:
    // its claim loses, and the rerun check must see that commit (write 0 is committed: skip),
    // as it did when it listed the timeline after the fence.
    Path table = dir.resolve("t");
    ProtocolSettings same = ProtocolSettings.parse(Map.of("spark.sparkguard.jobId", "nightly-1")::get);
    Timeline earlier = timelineOf(table);
    String instant = earlier.start(same, "append", Map.of(), 0);
    SparkguardCommitProtocol protocol =
        new SparkguardCommitProtocol("spark-job-1", table.toString(), false);
    AtomicStore racing = new ForwardingStore(new LocalAtomicStore()) {
      private boolean committed;

      @Override
      protected void before(String op, org.apache.hadoop.fs.Path path) throws IOException {
        if (!committed && op.equals("putIfAbsent") && path.getName().equals(instant + ".outcome")) {
          committed = true;  // the earlier driver's W9, just before this run's claim
          earlier.commit(instant, List.of(), Map.of("operation", "append"), 0);
        }
      }
    };
    java.lang.reflect.Field store = SparkguardCommitProtocol.class.getDeclaredField("store");
    store.setAccessible(true);
    store.set(protocol, racing);

    protocol.setupJob(null);

    assertEquals(null, protocol.instant(), "write 0 is committed: the rerun skips it");
    assertEquals(List.of("committed"),
        timeline(table, ".outcome").stream().map(d -> d.get("outcome").asText()).collect(Collectors.toList()));
    assertEquals(1, timeline(table, ".inflight").size());  // no instant of its own was opened
  }

  /** Which of two attempts of one task Spark's OutputCommitCoordinator lets commit, and when the other ends. */
  private enum LoserEnds { ABORTED_BEFORE_THE_WINNER_COMMITS, ABORTED_AFTER_THE_WINNER_COMMITS, NEVER_ABORTED }

  /** The bytes of a whole Parquet file of {@code n} rows, written by Spark to a scratch table. */
  private byte[] parquetOf(int n, String scratch) throws IOException {
    Path table = dir.resolve(scratch);
    rows(n, 1).write().mode("append").parquet(table.toString());
    List<String> files = dataFiles(table);
    assertEquals(1, files.size(), files.toString());
    return Files.readAllBytes(table.resolve(files.get(0)));
  }

  /** Spark's writer: create(overwrite=false) on the path the protocol returned, through Hadoop's local FS (with its .crc). */
  private static void writeThroughHadoop(String path, byte[] data, org.apache.hadoop.conf.Configuration conf) throws IOException {
    org.apache.hadoop.fs.FileSystem fs = org.apache.hadoop.fs.FileSystem.getLocal(conf);
    try (java.io.OutputStream out = fs.create(new org.apache.hadoop.fs.Path(path), false)) {
      out.write(data);
    }
  }

  /** A driver's protocol of {@code table} and its job, set up (W2, W3) as Spark's writer does. */
  private record DriverJob(SparkguardCommitProtocol driver, org.apache.hadoop.mapreduce.JobContext job) {
    static DriverJob setUp(Path table, org.apache.hadoop.conf.Configuration conf) {
      SparkguardCommitProtocol driver = (SparkguardCommitProtocol) org.apache.spark.internal.io.FileCommitProtocol
          .instantiate(SparkguardCommitProtocol.class.getName(), "0", table.toString(), false);
      org.apache.hadoop.mapreduce.JobContext job = new org.apache.hadoop.mapreduce.task.JobContextImpl(
          conf, new org.apache.hadoop.mapreduce.JobID("20250101000000", 0));
      driver.setupJob(job);
      return new DriverJob(driver, job);
    }
  }

  /**
   * Two attempts of task 0 (speculation): both write the same deterministic name under their
   * own temp names, the coordinator lets one commit, the other is aborted (or its executor is
   * lost and it is never aborted). Only the winner's file is published, whole, and listed.
   */
  private void duplicateAttemptOfOneTask(LoserEnds loserEnds) throws Exception {
    byte[] winnerBytes = parquetOf(3, "scratch-winner");
    byte[] loserBytes = parquetOf(5, "scratch-loser");
    assertFalse(java.util.Arrays.equals(winnerBytes, loserBytes));
    Path table = dir.resolve("t");
    org.apache.hadoop.conf.Configuration conf = spark.sparkContext().hadoopConfiguration();

    DriverJob started = DriverJob.setUp(table, conf);
    SparkguardCommitProtocol driver = started.driver();
    org.apache.hadoop.mapreduce.JobContext job = started.job();
    assertTrue(driver.instant() != null, "setupJob opened an instant");

    SparkguardCommitProtocol[] protocols = new SparkguardCommitProtocol[2];
    org.apache.hadoop.mapreduce.TaskAttemptContext[] contexts = new org.apache.hadoop.mapreduce.TaskAttemptContext[2];
    String[] work = new String[2];
    for (int attempt = 0; attempt < 2; attempt++) {
      protocols[attempt] = TestSpark.shipped(driver);  // the task's own copy
      contexts[attempt] = new org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl(conf,
          new org.apache.hadoop.mapreduce.TaskAttemptID("20250101000000", 0,
              org.apache.hadoop.mapreduce.TaskType.MAP, 0, attempt));
      protocols[attempt].setupTask(contexts[attempt]);
      work[attempt] = protocols[attempt].newTaskTempFile(
          contexts[attempt], scala.Option.empty(), new org.apache.spark.internal.io.FileNameSpec("", ".parquet"));
    }
    String name = "part-00000-nightly-1-w000.parquet";
    assertTrue(work[0].contains("." + name + ".sg-tmp-"), work[0]);
    assertTrue(work[1].contains("." + name + ".sg-tmp-"), work[1]);
    assertFalse(work[0].equals(work[1]), "the two attempts must not share one temp name: " + work[0]);
    // Attempt 1 (the speculative copy) wins: attempt 0 wrote first but is the slow one.
    writeThroughHadoop(work[0], loserBytes, conf);
    writeThroughHadoop(work[1], winnerBytes, conf);

    if (loserEnds == LoserEnds.ABORTED_BEFORE_THE_WINNER_COMMITS) {
      protocols[0].abortTask(contexts[0]);
      assertFalse(Files.exists(Path.of(new org.apache.hadoop.fs.Path(work[0]).toUri().getPath())), "the loser's temp file goes with its abort");
    }
    org.apache.spark.internal.io.FileCommitProtocol.TaskCommitMessage winner = protocols[1].commitTask(contexts[1]);
    if (loserEnds == LoserEnds.ABORTED_AFTER_THE_WINNER_COMMITS) {
      protocols[0].abortTask(contexts[0]);
    }
    // On local disk the driver publishes (W9a), after the outcome: not the task, and not as the
    // task's commit reaches the driver (W5b only makes the temp file durable).
    assertFalse(Files.exists(table.resolve(name)), "the task itself publishes nothing on local disk");
    driver.onTaskCommit(winner);
    assertFalse(Files.exists(table.resolve(name)), "nothing is published before the outcome");
    driver.commitJob(job, scala.jdk.javaapi.CollectionConverters.asScala(List.of(winner)).toList());

    assertTrue(java.util.Arrays.equals(winnerBytes, Files.readAllBytes(table.resolve(name))),
        "the loser's abort must never delete or replace the winner's published file");
    List<String> everything;
    try (Stream<Path> walk = Files.walk(table)) {
      everything = walk.filter(Files::isRegularFile).map(p -> table.relativize(p).toString())
          .filter(p -> !p.startsWith("_sparkguard/")).sorted().collect(Collectors.toList());
    }
    // The file and Hadoop's checksum of it (moved with it by the publish); no .sg-tmp- of either attempt.
    assertEquals(List.of("." + name + ".crc", name), everything);
    JsonNode outcome = timeline(table, ".outcome").get(0);
    assertEquals("committed", outcome.get("outcome").asText());
    assertEquals(driver.instant(), outcome.get("instant").asText());
    assertEquals(1, outcome.get("files").size(), outcome.toString());
    JsonNode file = outcome.get("files").get(0);
    assertEquals(name, file.get("path").asText());
    assertEquals(new org.apache.hadoop.fs.Path(work[1]).getName(), file.get("temp").asText(),
        "the outcome names the winner's temp file: what a rollback publishes after a crash");
    assertEquals(winnerBytes.length, file.get("size").asLong());
    assertEquals(3, file.get("rows").asLong());
    assertFalse(Files.exists(table.resolve("_sparkguard/markers/" + driver.instant())), "markers removed after commit");
    // Read through Hadoop's checksummed FS and Spark: the checksum beside it is the winner's.
    assertEquals(3, spark.read().parquet(table.toString()).count());
    assertEquals(3, spark.read().parquet(table.toString()).select("n").distinct().count());
  }

  /**
   * The driver makes a local task's temp file durable (W5b) before W7 and publishes it only
   * after the outcome (W9a); a temp file that is gone by then (deleted under the job) fails the
   * commit naming the file, nothing is committed and nothing is published.
   */
  @Test
  void aTempFileGoneBeforeTheDriverPublishesItFailsTheCommitNamingTheFile() throws Exception {
    Path table = dir.resolve("t");
    org.apache.hadoop.conf.Configuration conf = spark.sparkContext().hadoopConfiguration();
    DriverJob started = DriverJob.setUp(table, conf);
    SparkguardCommitProtocol driver = started.driver();
    org.apache.hadoop.mapreduce.JobContext job = started.job();
    org.apache.spark.internal.io.FileCommitProtocol.TaskCommitMessage[] commits =
        new org.apache.spark.internal.io.FileCommitProtocol.TaskCommitMessage[2];
    String[] work = new String[2];
    for (int task = 0; task < 2; task++) {
      SparkguardCommitProtocol protocol = TestSpark.shipped(driver);
      org.apache.hadoop.mapreduce.TaskAttemptContext context = new org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl(conf,
          new org.apache.hadoop.mapreduce.TaskAttemptID("20250101000000", 0,
              org.apache.hadoop.mapreduce.TaskType.MAP, task, 0));
      protocol.setupTask(context);
      work[task] = protocol.newTaskTempFile(
          context, scala.Option.empty(), new org.apache.spark.internal.io.FileNameSpec("", ".parquet"));
      writeThroughHadoop(work[task], parquetOf(2, "scratch-" + task), conf);
      commits[task] = protocol.commitTask(context);
    }
    String gone = "part-00001-nightly-1-w000.parquet";
    assertTrue(work[1].contains("." + gone + ".sg-tmp-"), work[1]);
    driver.onTaskCommit(commits[0]);  // made durable in the background; task 1's commit is the job's
    Files.delete(Path.of(new org.apache.hadoop.fs.Path(work[1]).toUri().getPath()));
    Exception error = assertThrows(Exception.class, () -> driver.commitJob(
        job, scala.jdk.javaapi.CollectionConverters.asScala(List.of(commits)).toList()));
    String message = rootMessage(error) + " / " + error.getMessage();
    assertTrue(error.getCause() != null && error.getCause().getMessage().contains(
        "cannot make " + gone) && error.getCause().getMessage().contains("rerun it"), message);
    assertTrue(timeline(table, ".outcome").isEmpty(), "nothing committed");
    assertFalse(Files.exists(table.resolve("part-00000-nightly-1-w000.parquet")),
        "nothing is published before the outcome, not even the file whose task's commit came first");
    assertTrue(Files.exists(Path.of(new org.apache.hadoop.fs.Path(work[0]).toUri().getPath())),
        "its temp file, hidden from directory readers, is left for the rollback");
  }

  @Test
  void aDuplicateAttemptAbortedBeforeTheWinnerCommitsLeavesOnlyTheWinnersFile() throws Exception {
    duplicateAttemptOfOneTask(LoserEnds.ABORTED_BEFORE_THE_WINNER_COMMITS);
  }

  @Test
  void aDuplicateAttemptAbortedAfterTheWinnerCommitsNeverDeletesTheWinnersFile() throws Exception {
    duplicateAttemptOfOneTask(LoserEnds.ABORTED_AFTER_THE_WINNER_COMMITS);
  }

  @Test
  void aDuplicateAttemptNeverAbortedLeavesNoTempFileAfterTheCommit() throws Exception {
    duplicateAttemptOfOneTask(LoserEnds.NEVER_ABORTED);
  }

  private static String rootMessage(Throwable error) {
    Throwable cause = error;
    while (cause.getCause() != null && cause.getCause() != cause) {
      cause = cause.getCause();
    }
    return String.valueOf(cause.getMessage());
  }
}
