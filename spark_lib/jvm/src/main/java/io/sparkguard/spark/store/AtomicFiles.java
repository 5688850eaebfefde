package io.sparkguard.spark.store;

import java.io.IOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Atomic creation of one file on a Hadoop filesystem: the storage primitive of the checkpoint
 * file manager, and of anything else that needs put-if-absent on the same store (the streaming
 * file sink's commit log, for instance).
 *
 * <p>What {@link #create} must give, whatever the store (docs/storage-contract.md, "Atomic
 * publication and temp files"; the same contract as the Python {@code FileManager}):
 *
 * <ol>
 *   <li>a reader never sees a partial file: the file is absent (or the previous one) until the
 *       stream's {@code close()} returns, then whole;
 *   <li>{@code overwrite=false} is put-if-absent: of racing creators exactly one publishes, the
 *       others get {@link FileAlreadyExistsException} from {@code close()} (as Spark's metadata
 *       logs expect) and publish nothing;
 *   <li>{@code cancel()} leaves nothing behind;
 *   <li>{@code overwrite=true} replaces the file in one step: a reader sees old or new.
 * </ol>
 *
 * <p>One implementation per kind of store says how ({@link #forPath}):
 *
 * <ul>
 *   <li>{@link LocalAtomicFiles} ({@code file:}): temp file in the target's directory, fsync,
 *       {@code link} (put-if-absent) or {@code rename} (overwrite), fsync the directory;
 *   <li>{@link ConditionalPutAtomicFiles} ({@code s3a:}): the bytes go straight to the final key;
 *       S3 makes an object visible only when its upload completes; put-if-absent is one
 *       conditional PUT ({@code If-None-Match: *}); cancel aborts the upload;
 *   <li>{@link RenameAtomicFiles} (HDFS and every other scheme): temp file in the target's
 *       directory, {@code hsync} where the stream supports it, then {@code FileContext.rename}
 *       ({@code Rename.NONE} for put-if-absent: atomic on HDFS), exactly as Spark's default
 *       manager publishes.
 * </ul>
 */
public interface AtomicFiles {

  /** A stream that publishes {@code path} on {@code close()}, as described above. */
  AtomicOutput create(Path path, boolean overwrite) throws IOException;

  /** How this store publishes, for logs and error messages ("conditional-put", ...). */
  String mechanism();

  /**
   * Create {@code path} with {@code data} only if it does not exist: {@code true} if this call
   * published it, {@code false} if the file existed (or a racing creator won).
   */
  default boolean putIfAbsent(Path path, byte[] data) throws IOException {
    AtomicOutput out = create(path, false);
    try {
      out.write(data);
      out.close();
      return true;
    } catch (FileAlreadyExistsException e) {
      return false;
    } finally {
      out.cancel(); // no-op after a close that ran
    }
  }

  /**
   * The implementation for the store of {@code path} (see the class comment). Like {@link
   * AtomicStore#forTable(Path, Configuration)}, it honours the tests-only Hadoop setting {@link
   * AtomicStore#FORCE_HADOOP_RENAME_FOR_LOCAL}: a {@code file://} path then gets {@link
   * RenameAtomicFiles} (HDFS's mechanism) over Hadoop's local filesystem.
   */
  static AtomicFiles forPath(Path path, Configuration conf) throws IOException {
    FileSystem fs = path.getFileSystem(conf);
    String scheme = fs.getUri().getScheme();
    if ("file".equals(scheme)) {
      if (conf.getBoolean(AtomicStore.FORCE_HADOOP_RENAME_FOR_LOCAL, false)) {
        return new RenameAtomicFiles(path, conf);
      }
      return new LocalAtomicFiles();
    }
    if ("s3a".equals(scheme)) {
      return new ConditionalPutAtomicFiles(fs, conf);
    }
    return new RenameAtomicFiles(path, conf);
  }
}
