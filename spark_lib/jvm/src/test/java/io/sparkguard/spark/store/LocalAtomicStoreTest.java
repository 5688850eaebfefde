package io.sparkguard.spark.store;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class LocalAtomicStoreTest {
  @TempDir java.nio.file.Path dir;
  private final LocalAtomicStore store = new LocalAtomicStore();

  private Path path(String name) {
    return new Path(dir.resolve(name).toUri());
  }

  @Test
  void ofRacingPutIfAbsentExactlyOneWinsAndTheFileIsWhole() throws Exception {
    int writers = 8;
    ExecutorService pool = Executors.newFixedThreadPool(writers);
    CountDownLatch start = new CountDownLatch(1);
    List<Future<Boolean>> results = new ArrayList<>();
    for (int i = 0; i < writers; i++) {
      byte[] data = ("writer-" + i + "\n").repeat(1000).getBytes(StandardCharsets.UTF_8);
      Callable<Boolean> put = () -> {
        start.await();
        return store.putIfAbsent(path("x.outcome"), data);
      };
      results.add(pool.submit(put));
    }
    start.countDown();
    int won = 0;
    for (Future<Boolean> result : results) {
      won += result.get() ? 1 : 0;
    }
    pool.shutdown();
    assertEquals(1, won);
    String content = Files.readString(dir.resolve("x.outcome"));
    assertEquals(content.substring(0, content.indexOf('\n') + 1).repeat(1000), content);
    assertEquals(List.of("x.outcome"), store.listFiles(new Path(dir.toUri())));  // no temp left
  }

  @Test
  void publishReplacesTheNameAtomicallyAndLeftoversAreOnlyTempsOfThatName() throws Exception {
    Path target = path("part-00000-j-c000.parquet");
    Files.writeString(dir.resolve("part-00000-j-c000.parquet"), "old run");
    Path stale = store.workPath(target);  // a failed attempt's temp file
    Files.writeString(dir.resolve(stale.getName()), "partial");
    Path other = store.workPath(path("part-00001-j-c000.parquet"));
    Files.writeString(dir.resolve(other.getName()), "another name's temp");
    Path work = store.workPath(target);
    assertTrue(work.getName().matches("\\.part-00000-j-c000\\.parquet\\.sg-tmp-[0-9a-f]{12}"), work.getName());
    Files.writeString(dir.resolve(work.getName()), "new run");
    store.publish(work, target);
    assertEquals("new run", Files.readString(dir.resolve(target.getName())));
    assertEquals(1, store.deleteLeftovers(target));
    assertFalse(Files.exists(dir.resolve(stale.getName())));
    assertTrue(Files.exists(dir.resolve(other.getName())));
  }

  @Test
  void aChecksumMovesWithItsFileAndAnOlderFilesChecksumGoes() throws Exception {
    // Hadoop's .<name>.crc: a plain path's task writes one beside its temp file (it moves with
    // the file); the owned stream writes none, and the old file's one must not stay beside the
    // new file (Hadoop's reader would refuse it).
    Path target = path("part-00000-j-c000.parquet");
    Files.writeString(dir.resolve("part-00000-j-c000.parquet"), "old run");
    Files.writeString(dir.resolve(".part-00000-j-c000.parquet.crc"), "old run's checksum");
    Path work = store.workPath(target);
    Files.writeString(dir.resolve(work.getName()), "new run");
    Files.writeString(dir.resolve("." + work.getName() + ".crc"), "new run's checksum");
    store.publish(work, target);
    assertEquals("new run's checksum", Files.readString(dir.resolve(".part-00000-j-c000.parquet.crc")));
    assertFalse(Files.exists(dir.resolve("." + work.getName() + ".crc")));

    Path again = store.workPath(target);
    Files.writeString(dir.resolve(again.getName()), "a run through the owned stream");
    store.publish(again, target);
    assertEquals("a run through the owned stream", Files.readString(dir.resolve(target.getName())));
    assertFalse(Files.exists(dir.resolve(".part-00000-j-c000.parquet.crc")));
  }

  @Test
  void aMarkerMayBeCreatedTwice() throws Exception {
    Path marker = path("m/sub/part-00000-j-c000.parquet.marker.CREATE");
    store.createMarker(marker);
    store.createMarker(marker);
    assertArrayEquals(new byte[0], Files.readAllBytes(dir.resolve("m/sub/part-00000-j-c000.parquet.marker.CREATE")));
  }
}
