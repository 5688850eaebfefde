package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.store.AtomicFiles;
import io.sparkguard.spark.store.AtomicOutput;
import io.sparkguard.spark.store.ConditionalPutAtomicFiles;
import io.sparkguard.spark.store.RenameAtomicFiles;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The checkpoint manager on local disk. The first five tests are the shared vectors of the atomic
 * file manager: the same names as the Python tests in tests/spark_lib/test_filemanager.py, and as
 * the S3 run of tests/jvm/test_checkpoint_manager.py (through S3A on the test S3 server).
 */
class SparkguardCheckpointFileManagerTest {
  @TempDir java.nio.file.Path tmp;

  private SparkguardCheckpointFileManager manager() throws IOException {
    return new SparkguardCheckpointFileManager(new Path(tmp.toUri()), new Configuration());
  }

  private Path path(String relative) {
    return new Path(tmp.resolve(relative).toUri());
  }

  private byte[] read(CheckpointFileManager fm, Path p) throws IOException {
    try (InputStream in = fm.open(p)) {
      return in.readAllBytes();
    }
  }

  /** Every name in {@code dir}, including dot files (temp names, checksums). */
  private List<String> names(String dir) throws IOException {
    java.nio.file.Path d = tmp.resolve(dir);
    if (!Files.isDirectory(d)) {
      return List.of();
    }
    try (Stream<java.nio.file.Path> s = Files.list(d)) {
      return s.map(p -> p.getFileName().toString()).sorted().collect(Collectors.toList());
    }
  }

  @Test
  void publishesOnlyOnClose() throws IOException {
    SparkguardCheckpointFileManager fm = manager();
    Path target = path("offsets/0");
    CancellableFSDataOutputStream out = fm.createAtomic(target, false);
    out.write("hello ".getBytes(StandardCharsets.UTF_8));
    out.write("world".getBytes(StandardCharsets.UTF_8));
    assertFalse(fm.exists(target), "a reader must not see the file before close()");
    out.close();
    assertArrayEquals("hello world".getBytes(StandardCharsets.UTF_8), read(fm, target));
    out.close(); // closing twice is a no-op
    out.cancel(); // and cancel after close does nothing
    assertEquals(List.of("0"), names("offsets"));
    assertTrue(fm.mechanism().startsWith("local"), fm.mechanism());
  }

  @Test
  void cancelLeavesNothing() throws IOException {
    SparkguardCheckpointFileManager fm = manager();
    Path target = path("commits/0");
    CancellableFSDataOutputStream out = fm.createAtomic(target, false);
    out.write(new byte[1000]);
    out.cancel();
    out.cancel();
    assertFalse(fm.exists(target));
    assertEquals(List.of(), names("commits"));
    assertThrows(IOException.class, () -> out.write(1));
  }

  @Test
  void createIfAbsentRefusesExisting() throws IOException {
    SparkguardCheckpointFileManager fm = manager();
    Path target = path("offsets/1");
    try (CancellableFSDataOutputStream first = fm.createAtomic(target, false)) {
      first.write("first".getBytes(StandardCharsets.UTF_8));
    }
    CancellableFSDataOutputStream second = fm.createAtomic(target, false);
    second.write("second".getBytes(StandardCharsets.UTF_8));
    // What HDFSMetadataLog catches to report a concurrent query on the same checkpoint.
    assertThrows(FileAlreadyExistsException.class, second::close);
    second.cancel();
    assertArrayEquals("first".getBytes(StandardCharsets.UTF_8), read(fm, target));
    assertEquals(List.of("1"), names("offsets"));
  }

  @Test
  void racingCreatorsExactlyOneWins() throws Exception {
    SparkguardCheckpointFileManager fm = manager();
    Path target = path("offsets/7");
    int writers = 8;
    CyclicBarrier barrier = new CyclicBarrier(writers);
    ExecutorService pool = Executors.newFixedThreadPool(writers);
    try {
      List<Future<String>> outcomes = new ArrayList<>();
      for (int i = 0; i < writers; i++) {
        byte[] payload = ("writer-" + i).repeat(1000).getBytes(StandardCharsets.UTF_8);
        outcomes.add(pool.submit(() -> {
          CancellableFSDataOutputStream out = fm.createAtomic(target, false);
          out.write(payload);
          barrier.await();
          try {
            out.close();
            return new String(payload, StandardCharsets.UTF_8);
          } catch (FileAlreadyExistsException e) {
            out.cancel();
            return null;
          }
        }));
      }
      List<String> winners = new ArrayList<>();
      for (Future<String> f : outcomes) {
        if (f.get() != null) {
          winners.add(f.get());
        }
      }
      assertEquals(1, winners.size(), "exactly one racing creator publishes");
      assertEquals(winners.get(0), new String(read(fm, target), StandardCharsets.UTF_8));
      assertEquals(List.of("7"), names("offsets"), "the losers leave no temp file");
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void overwriteReplaces() throws IOException {
    SparkguardCheckpointFileManager fm = manager();
    Path target = path("state/0/1.delta");
    for (String payload : new String[] {"old", "new"}) {
      try (CancellableFSDataOutputStream out = fm.createAtomic(target, true)) {
        out.write(payload.getBytes(StandardCharsets.UTF_8));
      }
    }
    assertArrayEquals("new".getBytes(StandardCharsets.UTF_8), read(fm, target));
  }

  @Test
  void overwriteRemovesAStaleHadoopChecksum() throws IOException {
    // A file Spark's default manager wrote has .<name>.crc beside it; a replacement written
    // without one must not be checked against the old checksum.
    SparkguardCheckpointFileManager fm = manager();
    Path target = path("state/0/2.delta");
    try (var out = target.getFileSystem(new Configuration()).create(target, true)) {
      out.write("written by Spark's default manager".getBytes(StandardCharsets.UTF_8));
    }
    assertTrue(names("state/0").contains(".2.delta.crc"));
    try (CancellableFSDataOutputStream out = fm.createAtomic(target, true)) {
      out.write("replaced".getBytes(StandardCharsets.UTF_8));
    }
    assertArrayEquals("replaced".getBytes(StandardCharsets.UTF_8), read(fm, target));
    assertEquals(List.of("2.delta"), names("state/0"));
  }

  @Test
  void theRenamePathForHdfsKeepsTheSameVectors() throws IOException {
    // HDFS's mechanism (FileContext + rename), exercised on the local filesystem.
    AtomicFiles files = new RenameAtomicFiles(new Path(tmp.toUri()), new Configuration());
    Path target = path("hdfs/0");
    AtomicOutput out = files.create(target, false);
    out.write("whole".getBytes(StandardCharsets.UTF_8));
    assertFalse(Files.exists(tmp.resolve("hdfs/0")));
    out.close();
    assertArrayEquals("whole".getBytes(StandardCharsets.UTF_8), Files.readAllBytes(tmp.resolve("hdfs/0")));
    assertFalse(files.putIfAbsent(target, "again".getBytes(StandardCharsets.UTF_8)));
    AtomicOutput cancelled = files.create(path("hdfs/1"), false);
    cancelled.write(1);
    cancelled.cancel();
    AtomicOutput replaced = files.create(target, true);
    replaced.write("new".getBytes(StandardCharsets.UTF_8));
    replaced.close();
    assertArrayEquals("new".getBytes(StandardCharsets.UTF_8), Files.readAllBytes(tmp.resolve("hdfs/0")));
    List<String> visible = names("hdfs").stream()
        .filter(n -> !n.endsWith(".crc")).collect(Collectors.toList());
    assertEquals(List.of("0"), visible, "no temp file, nothing of the cancelled stream");
  }

  @Test
  void sparkInstantiatesItFromTheConf() throws IOException {
    Configuration conf = new Configuration();
    conf.set("spark.sql.streaming.checkpointFileManagerClass", SparkguardCheckpointFileManager.class.getName());
    CheckpointFileManager fm = CheckpointFileManager.create(new Path(tmp.toUri()), conf);
    assertInstanceOf(SparkguardCheckpointFileManager.class, fm);
    assertTrue(fm.isLocal());
    Path dir = fm.createCheckpointDirectory();
    assertEquals("file", dir.toUri().getScheme());
    fm.mkdirs(path("a/b"));
    assertTrue(fm.exists(path("a/b")));
    FileStatus[] listed = fm.list(path("a"));
    assertEquals(List.of("b"), Arrays.stream(listed).map(s -> s.getPath().getName()).collect(Collectors.toList()));
    fm.delete(path("a"));
    fm.delete(path("a")); // missing is fine
    assertFalse(fm.exists(path("a")));
    assertThrows(java.io.FileNotFoundException.class, () -> fm.open(path("missing")));
  }

  @Test
  void s3aWithoutConditionalCreateIsRefusedNamingTheSetting() {
    Configuration conf = new Configuration();
    conf.setBoolean(ConditionalPutAtomicFiles.CONDITIONAL_ENABLED, false);
    SparkguardException.ConfigException e = assertThrows(SparkguardException.ConfigException.class,
        () -> new ConditionalPutAtomicFiles(new org.apache.hadoop.fs.RawLocalFileSystem(), conf));
    assertTrue(e.getMessage().contains("fs.s3a.create.conditional.enabled=false"), e.getMessage());
    assertTrue(e.getMessage().contains("spark.sql.streaming.checkpointFileManagerClass"), e.getMessage());
  }
}
