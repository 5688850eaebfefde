package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.store.LocalAtomicFiles;
import io.sparkguard.spark.store.RenameAtomicFiles;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.spark.SparkConcurrentModificationException;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.execution.streaming.checkpointing.CommitLog;
import org.apache.spark.sql.execution.streaming.checkpointing.CommitMetadataBase;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Spark's own metadata log ({@code CommitLog}, an {@code HDFSMetadataLog}: what a streaming
 * query's {@code commits/<n>} goes through) racing for one batch with {@link
 * RacingCheckpointFileManager}: both writers are past Spark's existence check, so only
 * sparkguard's put-if-absent can stop the second. On local disk ({@code LocalAtomicFiles}: link)
 * and on HDFS's mechanism ({@code RenameAtomicFiles}: {@code FileContext.rename} without
 * overwrite) over Hadoop's local filesystem. No streaming query: a local SparkSession only
 * provides the Hadoop conf Spark's log builds its manager from.
 */
class RacingCheckpointFileManagerTest {
  private static SparkSession spark;
  @TempDir Path dir;

  @BeforeAll
  static void startSpark() {
    spark = TestSpark.local("local[1]", "sparkguard-racing-checkpoint-test")
        .getOrCreate();
  }

  @AfterAll
  static void stopSpark() {
    spark.stop();
  }

  @AfterEach
  void unsetRace() {
    spark.conf().unset("spark.sql.streaming.checkpointFileManagerClass");
    spark.conf().unset(RacingCheckpointFileManager.RACE_FILE);
    spark.conf().unset(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL);
  }

  private List<String> names(Path d) throws IOException {
    try (Stream<Path> s = Files.list(d)) {
      return s.map(p -> p.getFileName().toString()).sorted().collect(Collectors.toList());
    }
  }

  @ParameterizedTest(name = "hdfsMechanism={0}")
  @ValueSource(booleans = {false, true})
  void theLoserOfARaceBothPassedSparksCheckFailsWithSparksConcurrentQueryError(boolean hdfsMechanism)
      throws IOException {
    // Per session: newHadoopConf() copies the SQL conf into the conf Spark's log gets.
    spark.conf().set("spark.sql.streaming.checkpointFileManagerClass",
        RacingCheckpointFileManager.class.getName());
    spark.conf().set(RacingCheckpointFileManager.RACE_FILE, "commits/0");
    spark.conf().set(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL, String.valueOf(hdfsMechanism));
    Path commits = dir.resolve("commits");
    CommitLog log = new CommitLog(spark, commits.toUri().toString(), false);
    RacingCheckpointFileManager manager =
        assertInstanceOf(RacingCheckpointFileManager.class, log.fileManager());
    if (hdfsMechanism) {
      assertEquals("temp file + hsync + FileContext.rename", manager.mechanism());
    } else {
      assertTrue(manager.mechanism().startsWith("local"), manager.mechanism());
    }

    CommitMetadataBase ours = log.createMetadata(
        7L, log.createMetadata$default$2(), log.createMetadata$default$3(), CommitLog.VERSION_1());
    SparkConcurrentModificationException e =
        assertThrows(SparkConcurrentModificationException.class, () -> log.add(0L, ours));
    assertTrue(e.getMessage().contains("Multiple streaming queries are concurrently using"),
        e.getMessage());
    assertInstanceOf(FileAlreadyExistsException.class, e.getCause(),
        "what stopped the query is sparkguard's put-if-absent");

    // The winner's file is whole and is the competitor's: Spark parses it back.
    CommitLog reader = new CommitLog(spark, commits.toUri().toString(), false);
    CommitMetadataBase kept = reader.get(0L).get();
    assertEquals(RacingCheckpointFileManager.COMPETITOR_MARK, kept.nextBatchWatermarkMs());
    String text = Files.readString(commits.resolve("0"), StandardCharsets.UTF_8);
    assertTrue(text.startsWith("v1\n"), text);
    List<String> left = names(commits);
    assertFalse(left.stream().anyMatch(n -> n.contains(".sg-tmp-")), "no temp file left: " + left);
    assertEquals(List.of("0"), left.stream().filter(n -> !n.endsWith(".crc")).collect(Collectors.toList()));

    // Without a race, Spark's own existence check refuses a batch that exists (add = false,
    // which MicroBatchExecution reports as CONCURRENT_STREAM_LOG_UPDATE), and the next batch,
    // not raced, is written normally.
    assertFalse(log.add(0L, ours));
    assertTrue(log.add(1L, ours));
    assertEquals(7L, reader.get(1L).get().nextBatchWatermarkMs());
  }
}
