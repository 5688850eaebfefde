package io.sparkguard.spark.store;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.TestSpark;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@link HadoopRenameAtomicStore}, HDFS's mechanism (temp file, hsync where supported, {@code
 * FileContext.rename}), exercised on Hadoop's local filesystem ({@code file:///tmp/...}) through
 * the same {@code FileContext}/{@code FileSystem} API, not on a real HDFS cluster. The racing
 * put-if-absent runs on {@link AtomicRenameLocalFs} (an atomic {@code rename(NONE)}, as HDFS's).
 */
class HadoopRenameAtomicStoreTest {
  @TempDir java.nio.file.Path tmp;
  private Path dir;
  private AtomicStore store;
  private FileSystem fs;

  @BeforeEach
  void open() throws Exception {
    dir = new Path(tmp.toUri());
    Configuration conf = new Configuration();
    conf.setBoolean(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL, true);
    store = AtomicStore.forTable(dir, conf);
    fs = dir.getFileSystem(conf);
  }

  private Path path(String name) {
    return new Path(dir, name);
  }

  private void write(Path p, String text) throws Exception {
    try (FSDataOutputStream out = fs.create(p, false)) {  // as Spark's writer opens a file
      out.write(text.getBytes(StandardCharsets.UTF_8));
    }
  }

  private String read(Path p) throws Exception {
    return new String(store.read(p), StandardCharsets.UTF_8);
  }

  @Test
  void theStoreIsChosenForHdfsLikeSchemesAndLocalOnlyWhenForced() throws Exception {
    assertInstanceOf(HadoopRenameAtomicStore.class, store);
    assertInstanceOf(LocalFileSystem.class, fs);
    assertInstanceOf(LocalAtomicStore.class, AtomicStore.forTable(dir, new Configuration()));
    assertInstanceOf(LocalAtomicStore.class, AtomicStore.forTable(dir));
  }

  @Test
  void putIfAbsentOfAnExistingNameIsFalseAndLeavesNoTemp() throws Exception {
    Path target = path("timeline/1.outcome");
    assertTrue(store.putIfAbsent(target, "first".getBytes(StandardCharsets.UTF_8)));
    assertFalse(store.putIfAbsent(target, "second".getBytes(StandardCharsets.UTF_8)));
    assertEquals("first", read(target));
    assertEquals(List.of("1.outcome"), store.listFiles(path("timeline")));
    try (java.util.stream.Stream<java.nio.file.Path> files = java.nio.file.Files.list(tmp.resolve("timeline"))) {
      assertTrue(files.noneMatch(p -> p.getFileName().toString().contains(".sg-tmp-")));
    }
  }

  /**
   * The race through the store's real code path (temp, close, {@code FileContext.rename(NONE)},
   * {@code FileAlreadyExistsException} = lost), on {@link AtomicRenameLocalFs}: Hadoop's own
   * local {@code FileContext} renames with a check then a rename, which is not atomic (see there).
   */
  @Test
  void ofRacingPutIfAbsentExactlyOneWinsAndTheFileIsWhole() throws Exception {
    Configuration conf = new Configuration();
    conf.set("fs.AbstractFileSystem.file.impl", AtomicRenameLocalFs.class.getName());
    AtomicStore store = HadoopRenameAtomicStore.open(dir, conf);
    int writers = 8;
    for (int round = 0; round < 100; round++) {
      Path target = path("timeline/" + round + ".outcome");
      CyclicBarrier barrier = new CyclicBarrier(writers);
      ExecutorService pool = Executors.newFixedThreadPool(writers);
      List<Future<Boolean>> results = new ArrayList<>();
      for (int i = 0; i < writers; i++) {
        byte[] data = ("writer-" + i + "\n").repeat(1000).getBytes(StandardCharsets.UTF_8);
        results.add(pool.submit(() -> {
          barrier.await();
          return store.putIfAbsent(target, data);
        }));
      }
      int won = 0;
      for (Future<Boolean> result : results) {
        won += result.get() ? 1 : 0;
      }
      pool.shutdown();
      assertEquals(1, won, "round " + round + ": exactly one racing creator wins");
      String content = new String(store.read(target), StandardCharsets.UTF_8);
      assertEquals(content.substring(0, content.indexOf('\n') + 1).repeat(1000), content);
    }
    // No temp file left.
    List<String> names = store.listFiles(path("timeline"));
    assertEquals(100, names.size(), names.toString());
    assertTrue(names.stream().noneMatch(n -> n.contains(".sg-tmp-")), names.toString());
    try (java.util.stream.Stream<java.nio.file.Path> files = java.nio.file.Files.list(tmp.resolve("timeline"))) {
      assertTrue(files.noneMatch(p -> p.getFileName().toString().contains(".sg-tmp-")));
    }
    assertFalse(store.putIfAbsent(path("timeline/0.outcome"), new byte[] {1}));
  }

  @Test
  void workPathIsATempNameInTheTargetsDirectory() {
    Path target = path("p=1/part-00000-j-c000.parquet");
    Path work = store.workPath(target);
    assertEquals(target.getParent(), work.getParent());
    assertTrue(work.getName().matches("\\.part-00000-j-c000\\.parquet\\.sg-tmp-[0-9a-f]{12}"), work.getName());
    assertFalse(work.equals(store.workPath(target)), "a fresh temp name per attempt");
  }

  @Test
  void publishReplacesTheNameAtomicallyAndLeftoversAreOnlyTempsOfThatName() throws Exception {
    Path target = path("part-00000-j-c000.parquet");
    write(target, "old run");
    Path stale = store.workPath(target);  // a failed attempt's temp file
    write(stale, "partial");
    Path other = store.workPath(path("part-00001-j-c000.parquet"));
    write(other, "another name's temp");
    Path work = store.workPath(target);
    store.prepareWrite(work);
    write(work, "new run");
    store.publish(work, target);
    assertEquals("new run", read(target));
    assertEquals(7, store.size(target));
    assertEquals(-1, store.size(work));
    assertEquals(1, store.deleteLeftovers(target));
    assertEquals(-1, store.size(stale));
    assertEquals("another name's temp", read(other));
    assertEquals(0, store.deleteLeftovers(target));
    assertEquals(0, store.deleteLeftovers(path("missing/part-00000-j-c000.parquet")));
    // Hadoop's checksum moved with the file: nothing but the published names and the other temp.
    assertEquals(List.of(other.getName(), "part-00000-j-c000.parquet"), store.listFiles(dir));
  }

  @Test
  void aMarkerMayBeCreatedTwiceAndDirectoriesGo() throws Exception {
    Path marker = path("m/sub/part-00000-j-c000.parquet.marker.CREATE");
    store.createMarker(marker);
    store.createMarker(marker);
    assertArrayEquals(new byte[0], store.read(marker));
    assertEquals(List.of("sub/part-00000-j-c000.parquet.marker.CREATE"), store.listFiles(path("m")));
    assertTrue(store.delete(marker));
    assertFalse(store.delete(marker));
    store.deleteDirectory(path("m"));
    store.deleteDirectory(path("m"));
    assertEquals(List.of(), store.listFiles(path("m")));
  }

  @Test
  void theStoreTravelsToExecutorsSerialized() throws Exception {
    AtomicStore copy = TestSpark.shipped(store);
    assertTrue(copy.putIfAbsent(path("x"), "x".getBytes(StandardCharsets.UTF_8)));
    assertFalse(store.putIfAbsent(path("x"), "y".getBytes(StandardCharsets.UTF_8)));
    assertEquals("x", read(path("x")));
  }

  @Test
  void itsOwnHdfsClientsPollACompletedCloseSoonerUnlessTheUserChose() {
    Configuration plain = new Configuration();
    Configuration prompt = HadoopRenameAtomicStore.promptClose(plain);
    assertEquals(25, prompt.getInt(HadoopRenameAtomicStore.CLOSE_DELAY_KEY, -1));
    assertEquals(10, prompt.getInt(HadoopRenameAtomicStore.CLOSE_RETRIES_KEY, -1));
    // At least the patience of HDFS's defaults (400 ms doubling, 5 retries: 12.4 s).
    assertTrue(25L * ((1L << 10) - 1) >= 400L * ((1L << 5) - 1));
    assertFalse("25".equals(plain.get(HadoopRenameAtomicStore.CLOSE_DELAY_KEY)), "a copy");
    // The store's own FileContext (its put-if-absent files) is opened with it.
    assertEquals(25, ((HadoopRenameAtomicStore) store).conf()
        .getInt(HadoopRenameAtomicStore.CLOSE_DELAY_KEY, -1));

    Configuration chosen = new Configuration();
    chosen.setInt(HadoopRenameAtomicStore.CLOSE_DELAY_KEY, 1000);
    chosen.setInt(HadoopRenameAtomicStore.CLOSE_RETRIES_KEY, 3);
    Configuration kept = HadoopRenameAtomicStore.promptClose(chosen);
    assertEquals(1000, kept.getInt(HadoopRenameAtomicStore.CLOSE_DELAY_KEY, -1));
    assertEquals(3, kept.getInt(HadoopRenameAtomicStore.CLOSE_RETRIES_KEY, -1));
  }
}
