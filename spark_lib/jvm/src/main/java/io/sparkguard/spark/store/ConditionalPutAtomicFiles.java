package io.sparkguard.spark.store;

import io.sparkguard.spark.common.SparkguardException;
import java.io.IOException;
import java.io.OutputStream;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;

/**
 * Object stores through S3A ({@code s3a:}). How it meets {@link AtomicFiles}' guarantees:
 *
 * <ul>
 *   <li>the bytes go straight to the final key: S3 makes an object visible only when its upload
 *       completes (one PUT at {@code close()} for a small file, a multipart upload completed at
 *       {@code close()} for a large one), so a reader never sees a partial object and there is
 *       no copy or delete;
 *   <li>put-if-absent: the upload is conditional ({@code If-None-Match: *}, Hadoop's
 *       {@code fs.option.create.conditional.overwrite}): one request, no HEAD or LIST; a loser's
 *       {@code close()} gets 412, which S3A reports as {@code RemoteFileChangedException} and
 *       this class as {@link FileAlreadyExistsException}; S3A aborts a losing multipart upload.
 *       Each create carries a write id in its metadata, so a create whose answer was lost and
 *       whose retry met its own object is a success, not a lost race
 *       ({@link ObjectStoreAtomicStore#storedBy});
 *   <li>overwrite: a plain PUT in S3A's create-performance mode (no existence or parent probes);
 *   <li>{@code cancel()}: {@code abort()} on S3A's stream, so nothing is uploaded (a small file)
 *       or the pending multipart upload is aborted (a large one).
 * </ul>
 *
 * <p>Needs S3A's conditional create ({@code fs.s3a.create.conditional.enabled}, on by default in
 * Hadoop 3.4.2+); a store whose S3 endpoint lacks {@code If-None-Match} answers the first
 * put-if-absent with an error rather than silently racing.
 */
public final class ConditionalPutAtomicFiles implements AtomicFiles {
  /** S3A's switch for conditional create; without it put-if-absent cannot be exclusive. */
  public static final String CONDITIONAL_ENABLED = "fs.s3a.create.conditional.enabled";
  /** S3A's create-performance option: skip the existence and parent probes of a create. */
  static final String CREATE_PERFORMANCE = "fs.s3a.create.performance";
  /** The class S3A reports a refused conditional PUT (412) with; not on our compile classpath. */
  static final String PRECONDITION_FAILED_CLASS = "org.apache.hadoop.fs.s3a.RemoteFileChangedException";

  private final FileSystem fs;

  public ConditionalPutAtomicFiles(FileSystem fs, Configuration conf) {
    if (!conf.getBoolean(CONDITIONAL_ENABLED, true)) {
      throw new SparkguardException.ConfigException(
          CONDITIONAL_ENABLED + "=false: sparkguard's checkpoint file manager needs S3A's"
              + " conditional create to make put-if-absent exclusive on " + fs.getUri()
              + "; remove that setting (the default is true), or unset"
              + " spark.sql.streaming.checkpointFileManagerClass to use Spark's default manager");
    }
    this.fs = fs;
  }

  @Override
  public String mechanism() {
    return "direct PUT, conditional (If-None-Match: *) for put-if-absent";
  }

  @Override
  public AtomicOutput create(Path path, boolean overwrite) throws IOException {
    FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path);
    builder.overwrite(true).recursive();
    String writeId = null;
    if (overwrite) {
      builder.must(CREATE_PERFORMANCE, true);
    } else {
      Path parent = path.getParent();
      ConditionalCreateProbe.require(fs, parent == null ? path : parent);
      builder.must(Options.CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE, true);
      writeId = ObjectStoreAtomicStore.newWriteId();
      ObjectStoreAtomicStore.withWriteId(builder, writeId);
    }
    return new Output(fs, path, writeId, (FSDataOutputStream) builder.build());
  }

  /** True when {@code e} (or a cause) is S3A's report of a refused conditional PUT. */
  static boolean isPreconditionFailed(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      for (Class<?> c = t.getClass(); c != null; c = c.getSuperclass()) {
        if (c.getName().equals(PRECONDITION_FAILED_CLASS)) {
          return true;
        }
      }
      if (t.getCause() == t) {
        break;
      }
    }
    return false;
  }

  private static final class Output extends AtomicOutput {
    private final FileSystem fs;
    private final Path path;
    /** The conditional create's write id; {@code null} for an overwrite. */
    private final String writeId;
    private final FSDataOutputStream out;

    Output(FileSystem fs, Path path, String writeId, FSDataOutputStream out) {
      this.fs = fs;
      this.path = path;
      this.writeId = writeId;
      this.out = out;
    }

    @Override
    protected OutputStream out() {
      return out;
    }

    @Override
    protected void publish() throws IOException {
      try {
        out.close();
      } catch (IOException e) {
        if (isPreconditionFailed(e)) {
          if (writeId != null && ObjectStoreAtomicStore.storedBy(fs, path, writeId)) {
            return; // this create's own object: an earlier attempt landed, its answer was lost
          }
          FileAlreadyExistsException exists = new FileAlreadyExistsException(
              path + " already exists: another writer created it first (the conditional PUT"
                  + " was refused with 412; nothing was published)");
          exists.initCause(e);
          throw exists;
        }
        throw e;
      }
    }

    @Override
    protected void discard() {
      try {
        out.abort();
      } catch (RuntimeException e) {
        // abort() is best effort by contract; an unsent single PUT leaves nothing anyway.
      }
    }
  }
}
