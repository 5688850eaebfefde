package io.sparkguard.spark;

import io.sparkguard.spark.common.SparkVersions;
import io.sparkguard.spark.store.AtomicFiles;
import io.sparkguard.spark.store.AtomicOutput;
import java.io.FileNotFoundException;
import java.io.IOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;

/**
 * Spark's {@code CheckpointFileManager} (SPARK-23966) for a Structured Streaming query's
 * checkpoint: offsets, commits, source metadata, state store files and the file sink's
 * {@code _spark_metadata}. Selected with
 * {@code spark.sql.streaming.checkpointFileManagerClass=io.sparkguard.spark.SparkguardCheckpointFileManager}
 * (Spark instantiates it with its {@code (Path, Configuration)} constructor).
 *
 * <p>The guarantee of {@link #createAtomic} on every store, which Spark's metadata logs rely on:
 *
 * <ul>
 *   <li>a reader never sees a partial checkpoint file: it appears whole on {@code close()};
 *   <li>with {@code overwriteIfPossible=false}, of two writers of one file exactly one
 *       succeeds; the other's {@code close()} throws {@link
 *       org.apache.hadoop.fs.FileAlreadyExistsException}, which {@code HDFSMetadataLog} turns
 *       into its "multiple streaming queries are concurrently using this checkpoint" error;
 *   <li>{@code cancel()} leaves nothing: no file, no temp file, no pending upload.
 * </ul>
 *
 * <p>How, per store ({@link AtomicFiles#forPath}): on S3A one direct PUT of the final object,
 * conditional ({@code If-None-Match: *}) for a new file, where Spark's default manager writes a
 * temp object, copies it and deletes it (several requests and a window where a crash leaves a
 * temp object or, with overwrite, a missing file); on local disk a temp file, fsync,
 * link/rename, fsync of the directory; on HDFS and other stores a temp file, hsync and
 * {@code FileContext.rename} as Spark's default does. Everything else ({@code open},
 * {@code list}, {@code mkdirs}, {@code exists}, {@code delete}) goes to the Hadoop
 * {@code FileSystem} of the checkpoint's path unchanged.
 */
public class SparkguardCheckpointFileManager implements CheckpointFileManager {
  private final Path path;
  private final FileSystem fs;
  private final AtomicFiles files;

  /** The constructor Spark calls ({@code CheckpointFileManager.create}). */
  public SparkguardCheckpointFileManager(Path path, Configuration hadoopConf) throws IOException {
    CheckpointFileManager.$init$(this);
    SparkVersions.requireSupported();
    this.path = path;
    this.fs = path.getFileSystem(hadoopConf);
    this.files = AtomicFiles.forPath(path, hadoopConf);
  }

  /** How this manager publishes files on its store (for logs and tests). */
  public String mechanism() {
    return files.mechanism();
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    try {
      return new Stream(files.create(path, overwriteIfPossible));
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public FSDataInputStream open(Path path) {
    try {
      return fs.open(path);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public FileStatus[] list(Path path, PathFilter filter) {
    try {
      return fs.listStatus(path, filter);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public void mkdirs(Path path) {
    try {
      fs.mkdirs(path, FsPermission.getDirDefault());
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public boolean exists(Path path) {
    try {
      return fs.getFileStatus(path) != null;
    } catch (FileNotFoundException e) {
      return false;
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public void delete(Path path) {
    try {
      fs.delete(path, true);
    } catch (FileNotFoundException e) {
      // Already gone: what the caller wanted.
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public boolean isLocal() {
    return fs instanceof LocalFileSystem || fs instanceof RawLocalFileSystem;
  }

  @Override
  public Path createCheckpointDirectory() {
    Path qualified = fs.makeQualified(path);
    mkdirs(qualified);
    return qualified;
  }

  /**
   * Rethrow a checked {@code IOException} unchanged: Spark's Scala callers catch the exact
   * Hadoop exceptions (e.g. {@code FileNotFoundException} from {@code open}), so wrapping them
   * would change their behaviour.
   */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
    throw (E) e;
  }

  /** Spark's cancellable stream over an {@link AtomicOutput}. */
  static final class Stream extends CancellableFSDataOutputStream {
    private final AtomicOutput atomic;

    Stream(AtomicOutput atomic) {
      super(atomic);
      this.atomic = atomic;
    }

    @Override
    public void cancel() {
      atomic.cancel();
    }
  }
}
