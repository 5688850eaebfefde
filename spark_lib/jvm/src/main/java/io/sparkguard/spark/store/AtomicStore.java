package io.sparkguard.spark.store;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * The few storage primitives the commit protocol needs, each with the guarantee it must give
 * (docs/storage-contract.md, "Atomic publication and temp files"). One implementation per kind
 * of store says how it meets them; everything else in the protocol is built on these.
 *
 * <p>Implementations are serializable: the protocol carries its store to the executors.
 */
public interface AtomicStore extends Serializable {

  /**
   * Create {@code path} with {@code data} only if it does not exist. Of several racing creators
   * exactly one returns {@code true}; the others return {@code false} and publish nothing. The
   * file is whole or absent at every moment (a crash leaves at most a temp file).
   */
  boolean putIfAbsent(Path path, byte[] data) throws IOException;

  /** Create an empty marker file at {@code path} if absent; an existing one is fine (a retry). */
  void createMarker(Path path) throws IOException;

  /**
   * Where a task writes the data file that will be published as {@code target}: a temp name in
   * the same directory on rename stores, so that a reader never sees a partial file under
   * {@code target}; {@code target} itself on stores where an object appears only when complete.
   */
  Path workPath(Path target);

  /**
   * Make the file written at {@code work} visible as {@code target}, replacing an older file of
   * that name (a retried attempt or a rerun writes the same name). Atomic: a reader of
   * {@code target} sees the old file or the new one, never a mix. The caller made {@code work}
   * durable first ({@link #persist}); the rename itself is made durable here.
   */
  void publish(Path work, Path target) throws IOException;

  /**
   * Whether the job's driver publishes the tasks' data files, after the outcome (W9, then W6
   * in docs/storage-contract.md, "A write, step by step"), instead of a task or a direct write
   * publishing them. True on rename stores: a task leaves its file under the temp name {@link
   * #workPath}, which no directory reader lists (leading dot), and reports it; the driver makes
   * the reported files durable ({@link #persist}, as each task's commit reaches it), writes the
   * outcome listing them with their temp names, then renames them ({@link #publish}). The driver
   * sees the tasks' files on such a store (W7 reads their sizes under the temp names).
   */
  default boolean publishesOnDriver() {
    return false;
  }

  /**
   * Whether a task may leave each data file as a multipart upload it does not complete, for the
   * driver to complete after the outcome ({@link #completeUpload}): object stores whose
   * connector offers Hadoop's {@code MultipartUploader} (S3A). No directory reader lists an
   * object whose upload is not complete, so a running or failed write stays invisible there
   * as a temp file does on a rename store.
   */
  default boolean pendingUploads() {
    return false;
  }

  /**
   * Complete the multipart upload {@code upload} of {@code target} (Hadoop's upload handle) with
   * {@code parts} (its part handles, in part order): the object appears whole, {@code size}
   * bytes. Idempotent: an upload no longer pending whose object has {@code size} bytes was
   * completed already (a retry whose answer was lost, a zombie driver, a rollback's roll
   * forward), which is success. Throws {@code FileNotFoundException} when the upload is gone
   * and the object is not there with that size.
   */
  default void completeUpload(Path target, byte[] upload, List<byte[]> parts, long size)
      throws IOException {
    throw new UnsupportedOperationException(
        getClass().getName() + " has no multipart uploads to complete (" + target + ")");
  }

  /**
   * Make the file a task wrote at {@code work} durable before an outcome names it: on local
   * disk an fsync of the file (and of Hadoop's checksum beside it); nothing where the writer's
   * close already made it durable (HDFS: its blocks are complete). Idempotent.
   */
  default void persist(Path work) throws IOException {}

  /**
   * Called by a task after the marker and before Spark's writer opens {@link #workPath}{@code
   * (target)} with {@code create(path, overwrite=false)}: make that create succeed. Nothing on
   * rename stores (the temp name is fresh); on object stores that probe before creating, delete
   * an older object of the name (only ever one no committed instant lists).
   */
  void prepareWrite(Path target) throws IOException;

  /**
   * Remove what an unfinished write of {@code target} left: its temp files (rename stores) or
   * incomplete uploads (object stores), except those whose file name is in {@code keep} (the
   * accepted attempt's temp file, which the driver publishes after the outcome); never {@code
   * target} itself. Returns how many.
   */
  int deleteLeftovers(Path target, java.util.Set<String> keep) throws IOException;

  /** {@link #deleteLeftovers(Path, java.util.Set)} keeping nothing. */
  default int deleteLeftovers(Path target) throws IOException {
    return deleteLeftovers(target, java.util.Collections.<String>emptySet());
  }

  /**
   * {@link #deleteLeftovers(Path, java.util.Set)} of every one of {@code targets}, all under
   * {@code dir}; returns how many leftovers were removed. Object stores may find them with one
   * listing.
   */
  default int deleteLeftovers(Path dir, java.util.Collection<Path> targets, java.util.Set<String> keep)
      throws IOException {
    int removed = 0;
    for (Path target : targets) {
      removed += deleteLeftovers(target, keep);
    }
    return removed;
  }

  /**
   * {@link #deleteLeftovers(Path, java.util.Collection, java.util.Set)} that also tells which of
   * {@code keep} it saw as pending uploads ({@link #pendingUploads}), by adding them to {@code
   * seen}; returns false when it cannot tell (a store without pending uploads, a connector that
   * lists no uploads), and {@code seen} is then left as it was.
   */
  default boolean deleteLeftoversSeeing(Path dir, java.util.Collection<Path> targets,
      java.util.Set<String> keep, java.util.Set<String> seen) throws IOException {
    deleteLeftovers(dir, targets, keep);
    return false;
  }

  /** {@link #deleteLeftovers(Path, java.util.Collection, java.util.Set)} keeping nothing. */
  default int deleteLeftovers(Path dir, java.util.Collection<Path> targets) throws IOException {
    return deleteLeftovers(dir, targets, java.util.Collections.<String>emptySet());
  }

  /** The whole content of the file {@code path} (published files are whole, see above). */
  byte[] read(Path path) throws IOException;

  /** Size in bytes of {@code path}, or -1 when it does not exist. */
  long size(Path path) throws IOException;

  /**
   * {@link #size} of each of {@code paths}, in their order. Object stores ask in parallel (one
   * request each, the latencies overlap).
   */
  default long[] sizes(List<Path> paths) throws IOException {
    long[] sizes = new long[paths.size()];
    for (int i = 0; i < sizes.length; i++) {
      sizes[i] = size(paths.get(i));
    }
    return sizes;
  }

  /** Every file under {@code dir}, recursively, as paths relative to {@code dir}; empty if none. */
  List<String> listFiles(Path dir) throws IOException;

  /** Delete the file {@code path}; true if it existed. */
  boolean delete(Path path) throws IOException;

  /** Delete {@code dir} and everything under it; missing is fine. */
  void deleteDirectory(Path dir) throws IOException;

  /**
   * Replace {@code path} with {@code data} (create or overwrite), atomically: a reader sees the
   * old file or the new one. For hints nothing depends on ({@code snapshots/LATEST}).
   */
  default void overwrite(Path path, byte[] data) throws IOException {
    overwriteWith(AtomicFiles.forPath(path, new Configuration()), path, data);
  }

  /** {@link #overwrite} through {@code files}. */
  static void overwriteWith(AtomicFiles files, Path path, byte[] data) throws IOException {
    AtomicOutput out = files.create(path, true);
    try {
      out.write(data);
      out.close();
    } finally {
      out.cancel();  // no-op after a close that ran
    }
  }

  /**
   * Delete every file of {@code paths} (all in the directory {@code dir}), in the given order;
   * missing ones are fine. Object stores batch the requests (Hadoop's bulk delete: one request
   * per page of keys) and may delete a page in any order, so callers that need an order call
   * this once per step.
   */
  default void deleteAll(Path dir, List<Path> paths) throws IOException {
    for (Path path : paths) {
      delete(path);
    }
  }

  /** The store for a local {@code table} (the journal, tests); see {@link #forTable(Path, Configuration)}. */
  static AtomicStore forTable(Path table) {
    return forTable(table, new Configuration());
  }

  /**
   * Hadoop setting (tests only): {@code true} makes a {@code file://} table use {@link
   * HadoopRenameAtomicStore} over Hadoop's local filesystem instead of {@link LocalAtomicStore},
   * so the HDFS mechanism runs through the same {@code FileContext} API without a cluster; the
   * checkpoint manager's {@link AtomicFiles#forPath} honours it too ({@link RenameAtomicFiles}).
   * Off by default; never read for any other scheme. In a Spark session: {@code
   * spark.hadoop.sparkguard.test.hadoopRenameStoreForLocal=true}.
   */
  String FORCE_HADOOP_RENAME_FOR_LOCAL = "sparkguard.test.hadoopRenameStoreForLocal";

  /**
   * The store for {@code table}, chosen by its scheme: local paths are a rename store on
   * java.nio ({@link LocalAtomicStore}); {@code hdfs} and {@code viewfs} a rename store through
   * Hadoop's {@code FileContext} ({@link HadoopRenameAtomicStore}); any other scheme must be an
   * object store with conditional create ({@link ObjectStoreAtomicStore}), else the write is
   * refused with a message naming the setting.
   */
  static AtomicStore forTable(Path table, Configuration conf) {
    String scheme = table.toUri().getScheme();
    if (conf.getBoolean(CountingAtomicStore.KEY, false)) {
      Configuration plain = new Configuration(conf);
      plain.setBoolean(CountingAtomicStore.KEY, false);
      return new CountingAtomicStore(forTable(table, plain));
    }
    boolean local = scheme == null || scheme.equals("file");
    try {
      if (local && !conf.getBoolean(FORCE_HADOOP_RENAME_FOR_LOCAL, false)) {
        return new LocalAtomicStore();
      }
      if (local || scheme.equals("hdfs") || scheme.equals("viewfs")) {
        return HadoopRenameAtomicStore.open(table, conf);
      }
      return ObjectStoreAtomicStore.open(table, conf);
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot open the filesystem of " + table, e);
    }
  }
}
