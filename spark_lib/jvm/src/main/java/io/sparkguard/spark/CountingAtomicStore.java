package io.sparkguard.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.hadoop.fs.Path;

/**
 * Tests and benchmarks only: an {@link AtomicStore} that counts the storage operations it
 * forwards, per instant. Selected by the Hadoop setting {@link #KEY} ({@code
 * spark.hadoop.sparkguard.test.countStoreOps=true}); never otherwise. Counts live in this JVM
 * (a local-mode Spark run: driver and tasks share them). A new bucket starts at each {@code
 * .inflight} put, so bucket i holds the operations from instant i's start to instant i+1's
 * (its tasks, its commit, its compaction, and the next write's checks before its start).
 */
final class CountingAtomicStore implements AtomicStore {
  private static final long serialVersionUID = 1L;
  static final String KEY = "sparkguard.test.countStoreOps";
  private static final List<long[]> BUCKETS = new ArrayList<>();

  private final AtomicStore inner;

  CountingAtomicStore(AtomicStore inner) {
    this.inner = inner;
  }

  private static synchronized void count(Path path, boolean isPut) {
    if (isPut && path.getName().endsWith(".inflight")) {
      BUCKETS.add(new long[1]);
    }
    if (BUCKETS.isEmpty()) {
      BUCKETS.add(new long[1]);
    }
    BUCKETS.get(BUCKETS.size() - 1)[0]++;
  }

  /** Operations per bucket (see the class comment), oldest first. */
  static synchronized long[] perInstant() {
    long[] counts = new long[BUCKETS.size()];
    for (int i = 0; i < counts.length; i++) {
      counts[i] = BUCKETS.get(i)[0];
    }
    return counts;
  }

  /** Forget every count. */
  static synchronized void reset() {
    BUCKETS.clear();
  }

  @Override
  public boolean putIfAbsent(Path path, byte[] data) throws IOException {
    count(path, true);
    return inner.putIfAbsent(path, data);
  }

  @Override
  public void createMarker(Path path) throws IOException {
    count(path, false);
    inner.createMarker(path);
  }

  @Override
  public Path workPath(Path target) {
    return inner.workPath(target);
  }

  @Override
  public void publish(Path work, Path target) throws IOException {
    count(target, false);
    inner.publish(work, target);
  }

  @Override
  public void prepareWrite(Path target) throws IOException {
    inner.prepareWrite(target);
  }

  @Override
  public int deleteLeftovers(Path target) throws IOException {
    count(target, false);
    return inner.deleteLeftovers(target);
  }

  @Override
  public byte[] read(Path path) throws IOException {
    count(path, false);
    return inner.read(path);
  }

  @Override
  public long size(Path path) throws IOException {
    count(path, false);
    return inner.size(path);
  }

  @Override
  public List<String> listFiles(Path dir) throws IOException {
    count(dir, false);
    return inner.listFiles(dir);
  }

  @Override
  public boolean delete(Path path) throws IOException {
    count(path, false);
    return inner.delete(path);
  }

  @Override
  public void deleteDirectory(Path dir) throws IOException {
    count(dir, false);
    inner.deleteDirectory(dir);
  }

  @Override
  public void overwrite(Path path, byte[] data) throws IOException {
    count(path, false);
    inner.overwrite(path, data);
  }

  @Override
  public void deleteAll(Path dir, List<Path> paths) throws IOException {
    count(dir, false);
    inner.deleteAll(dir, paths);
  }
}
