package io.sparkguard.spark.store;

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
public final class CountingAtomicStore implements AtomicStore {
  private static final long serialVersionUID = 1L;
  static final String KEY = "sparkguard.test.countStoreOps";
  private static final List<long[]> BUCKETS = new ArrayList<>();

  private final AtomicStore inner;

  CountingAtomicStore(AtomicStore inner) {
    this.inner = inner;
  }

  /** Nanoseconds spent in the store's operations, added to the current bucket. */
  private static synchronized void took(long nanos) {
    if (!BUCKETS.isEmpty()) {
      BUCKETS.get(BUCKETS.size() - 1)[3] += nanos;
    }
  }

  /**
   * Per bucket: {operations, names listed, requests as on S3 (a listing: a page of 1000),
   * nanoseconds in the store}.
   */
  private static synchronized void count(Path path, boolean isPut) {
    if (isPut && path.getName().endsWith(".inflight")) {
      BUCKETS.add(new long[4]);
    }
    if (BUCKETS.isEmpty()) {
      BUCKETS.add(new long[4]);
    }
    BUCKETS.get(BUCKETS.size() - 1)[0]++;
    BUCKETS.get(BUCKETS.size() - 1)[2]++;
  }

  private static synchronized void listed(int names) {
    long[] bucket = BUCKETS.get(BUCKETS.size() - 1);
    bucket[1] += names;
    bucket[2] += Math.max(0, (names - 1) / 1000);  // further pages of a paged listing
  }

  /** {@code [[operations, names listed, S3-style requests, nanoseconds], ...]} per bucket. */
  public static synchronized String report() {
    StringBuilder json = new StringBuilder("[");
    for (int i = 0; i < BUCKETS.size(); i++) {
      long[] b = BUCKETS.get(i);
      json.append(i == 0 ? "" : ",").append('[').append(b[0]).append(',').append(b[1])
          .append(',').append(b[2]).append(',').append(b[3]).append(']');
    }
    return json.append(']').toString();
  }

  /** Operations per bucket (see the class comment), oldest first. */
  public static synchronized long[] perInstant() {
    long[] counts = new long[BUCKETS.size()];
    for (int i = 0; i < counts.length; i++) {
      counts[i] = BUCKETS.get(i)[0];
    }
    return counts;
  }

  /** Forget every count. */
  public static synchronized void reset() {
    BUCKETS.clear();
  }

  /** The store it counts for. */
  public AtomicStore inner() {
    return inner;
  }

  /** One listing of {@code dir} that returned {@code names} names, made on {@link #inner()}. */
  public void countListing(Path dir, int names) {
    count(dir, false);
    listed(names);
  }

  @Override
  public boolean putIfAbsent(Path path, byte[] data) throws IOException {
    count(path, true);
    long start = System.nanoTime();
    try {
      return inner.putIfAbsent(path, data);
    } finally {
      took(System.nanoTime() - start);
    }
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
  public boolean publishesOnDriver() {
    return inner.publishesOnDriver();
  }

  @Override
  public boolean pendingUploads() {
    return inner.pendingUploads();
  }

  @Override
  public void completeUpload(Path target, byte[] upload, List<byte[]> parts, long size)
      throws IOException {
    count(target, false);
    inner.completeUpload(target, upload, parts, size);
  }

  @Override
  public void persist(Path work) throws IOException {
    inner.persist(work);
  }

  @Override
  public void prepareWrite(Path target) throws IOException {
    inner.prepareWrite(target);
  }

  @Override
  public int deleteLeftovers(Path target, java.util.Set<String> keep) throws IOException {
    count(target, false);
    return inner.deleteLeftovers(target, keep);
  }

  @Override
  public int deleteLeftovers(Path dir, java.util.Collection<Path> targets, java.util.Set<String> keep)
      throws IOException {
    count(dir, false);
    return inner.deleteLeftovers(dir, targets, keep);
  }

  @Override
  public boolean deleteLeftoversSeeing(Path dir, java.util.Collection<Path> targets,
      java.util.Set<String> keep, java.util.Set<String> seen) throws IOException {
    count(dir, false);
    return inner.deleteLeftoversSeeing(dir, targets, keep, seen);
  }

  @Override
  public long[] sizes(List<Path> paths) throws IOException {
    for (Path path : paths) {
      count(path, false);
    }
    long start = System.nanoTime();
    try {
      return inner.sizes(paths);
    } finally {
      took(System.nanoTime() - start);
    }
  }

  @Override
  public byte[] read(Path path) throws IOException {
    count(path, false);
    long start = System.nanoTime();
    try {
      return inner.read(path);
    } finally {
      took(System.nanoTime() - start);
    }
  }

  @Override
  public long size(Path path) throws IOException {
    count(path, false);
    long start = System.nanoTime();
    try {
      return inner.size(path);
    } finally {
      took(System.nanoTime() - start);
    }
  }

  @Override
  public List<String> listFiles(Path dir) throws IOException {
    count(dir, false);
    long start = System.nanoTime();
    List<String> names = inner.listFiles(dir);
    took(System.nanoTime() - start);
    listed(names.size());
    return names;
  }

  @Override
  public boolean delete(Path path) throws IOException {
    count(path, false);
    long start = System.nanoTime();
    try {
      return inner.delete(path);
    } finally {
      took(System.nanoTime() - start);
    }
  }

  @Override
  public void deleteDirectory(Path dir) throws IOException {
    count(dir, false);
    long start = System.nanoTime();
    inner.deleteDirectory(dir);
    took(System.nanoTime() - start);
  }

  @Override
  public void overwrite(Path path, byte[] data) throws IOException {
    count(path, false);
    long start = System.nanoTime();
    inner.overwrite(path, data);
    took(System.nanoTime() - start);
  }

  @Override
  public void deleteAll(Path dir, List<Path> paths) throws IOException {
    count(dir, false);
    long start = System.nanoTime();
    inner.deleteAll(dir, paths);
    took(System.nanoTime() - start);
  }
}
