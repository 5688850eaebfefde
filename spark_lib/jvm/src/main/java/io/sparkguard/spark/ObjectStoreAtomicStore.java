package io.sparkguard.spark;

import io.sparkguard.spark.SparkguardException.UnsupportedWriteException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.URI;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.MultipartUploader;
import org.apache.hadoop.fs.Path;

/**
 * An object store reached through the Hadoop {@code FileSystem} API ({@code s3a://}, and any
 * store whose connector has conditional create). How it meets {@link AtomicStore}'s guarantees:
 *
 * <ul>
 *   <li>put-if-absent: one conditional create, {@code createFile(p).must(
 *       "fs.option.create.conditional.overwrite", true)}: on S3A a single PUT with {@code
 *       If-None-Match: *}. Of racing creators the store accepts one; the others get HTTP 412
 *       (S3A: {@code RemoteFileChangedException} at {@code close()}), which is {@code false}
 *       here. A store without the capability is refused when the store is opened, never served
 *       by a check-then-create (two writers would both "win");
 *   <li>publish: none. A data file is written directly under its final name: an object appears
 *       only when its upload completes, whole (the "no copy-rename" of object stores);
 *       {@link #workPath} is the target itself;
 *   <li>Spark's writers open files with {@code create(path, overwrite=false)}. Where the
 *       connector creates in performance mode ({@code fs.s3a.create.performance=true}) that is
 *       one PUT that replaces an older object; otherwise it probes the name first (HEAD + LIST)
 *       and fails on an existing object, so {@link #prepareWrite} deletes an uncommitted
 *       leftover of the name first (the protocol never asks it to for a committed name). The
 *       batch protocol avoids both where it can: its tasks open data files through {@link
 *       OwnedFileSystem} ({@code sg-s3a://}), whose create is S3A's per-file performance create
 *       (one PUT, replacing a leftover), with nothing to prepare;
 *   <li>leftovers: incomplete multipart uploads of the name, aborted through the generic
 *       {@code MultipartUploader} ({@code abortUploadsUnderPath}: one LIST of uploads under the
 *       key, one abort each; for a commit's names together, one listing under the table:
 *       {@link #deleteLeftovers(Path, java.util.Collection)}). Uploads nobody ever aborts (a crashed task whose name no rollback
 *       reads) are left to the bucket's lifecycle rule ({@code AbortIncompleteMultipartUpload})
 *       or {@code fs.s3a.multipart.purge}.
 * </ul>
 *
 * <p>Serializable: the Hadoop {@code Configuration} it was opened with travels with it (as
 * {@code Writable}), and each JVM opens the filesystem from it once (Hadoop's filesystem cache).
 */
public final class ObjectStoreAtomicStore extends HadoopFileSystemStore {
  private static final long serialVersionUID = 1L;

  /** The create option (hadoop-common {@code Options.CreateFileOptionKeys}) and capability. */
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";
  /** S3A's switch for conditional create (default true), named in the refusal. */
  static final String S3A_CONDITIONAL_SETTING = "fs.s3a.create.conditional.enabled";
  /** S3A's path capability: {@code create()} skips the overwrite probes (and so replaces). */
  static final String S3A_CREATE_PERFORMANCE = "fs.s3a.create.performance.enabled";

  private final boolean replacesOnCreate;

  private ObjectStoreAtomicStore(URI root, Configuration conf, FileSystem fs, boolean replaces) {
    super(root, conf, fs);
    this.replacesOnCreate = replaces;
  }

  /**
   * Open the store of {@code table} with {@code conf} and check it can give the guarantees.
   *
   * @throws UnsupportedWriteException when its connector has no conditional create, naming the
   *     setting that turns it on
   */
  public static ObjectStoreAtomicStore open(Path table, Configuration conf) throws IOException {
    Configuration copy = new Configuration(conf);
    FileSystem fs = table.getFileSystem(copy);
    if (!fs.hasPathCapability(table, CONDITIONAL_CREATE)) {
      String scheme = table.toUri().getScheme();
      String fix =
          "s3a".equals(scheme)
              ? "S3A supports it (hadoop-aws 3.4.2+) unless it is switched off: set "
                  + S3A_CONDITIONAL_SETTING + "=true (spark.hadoop." + S3A_CONDITIONAL_SETTING
                  + "=true), and use a store that honours If-None-Match: *"
              : "write it with Spark's default protocol (unset"
                  + " spark.sql.sources.commitProtocolClass) or through the Python writer";
      throw new UnsupportedWriteException(
          "sparkguard: " + table + " is on a filesystem (" + fs.getClass().getName()
              + ") without conditional create (path capability " + CONDITIONAL_CREATE + "):"
              + " the timeline's put-if-absent cannot be made safe there, and a check-then-create"
              + " would let two writers both win. " + fix);
    }
    boolean replaces = fs.hasPathCapability(table, S3A_CREATE_PERFORMANCE);
    return new ObjectStoreAtomicStore(fs.getUri(), copy, fs, replaces);
  }

  @Override
  public boolean putIfAbsent(Path path, byte[] data) throws IOException {
    // createFile() is a raw builder type in Hadoop: its build() result needs the cast.
    try (FSDataOutputStream out =
        (FSDataOutputStream) fs().createFile(path).must(CONDITIONAL_CREATE, true).build()) {
      out.write(data);
    } catch (FileAlreadyExistsException e) {
      return false;
    } catch (IOException e) {
      if (isPreconditionFailed(e)) {
        return false;
      }
      throw e;
    }
    return true;
  }

  /**
   * The store's "the object exists" answer to a conditional create: HTTP 412, which S3A raises
   * as {@code RemoteFileChangedException} (connectors may also say {@code
   * FileAlreadyExistsException}, or surface the SDK's exception with its status code).
   */
  static boolean isPreconditionFailed(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      String name = t.getClass().getSimpleName();
      if (name.equals("RemoteFileChangedException") || name.equals("FileAlreadyExistsException")) {
        return true;
      }
      try {
        Object status = t.getClass().getMethod("statusCode").invoke(t);
        if (Integer.valueOf(412).equals(status)) {
          return true;
        }
      } catch (ReflectiveOperationException | RuntimeException e) {
        // not an SDK service exception
      }
    }
    return false;
  }

  @Override
  public void createMarker(Path path) throws IOException {
    putIfAbsent(path, new byte[0]);  // already there: a retried or duplicate attempt
  }

  @Override
  public Path workPath(Path target) {
    return target;
  }

  @Override
  public void publish(Path work, Path target) {
    // Nothing to do: the object under the final name appeared whole when its upload completed.
  }

  /** True when the connector creates without the overwrite probe, replacing an older object. */
  public boolean replacesOnCreate() {
    return replacesOnCreate;
  }

  @Override
  public void prepareWrite(Path target) throws IOException {
    if (!replacesOnCreate) {
      fs().delete(target, false);
    }
  }

  /**
   * One listing of the objects under {@code dir}, then a bulk delete of them (one request per
   * page of keys): what the connector's recursive delete does, without the existence probes it
   * makes first. Objects created under {@code dir} after the listing stay, as with the
   * connector's own delete.
   */
  @Override
  public void deleteDirectory(Path dir) throws IOException {
    List<Path> objects = new ArrayList<>();
    for (String name : listFiles(dir)) {
      objects.add(new Path(dir, name));
    }
    deleteAll(dir, objects);
  }

  /**
   * The leftovers of many names with one listing: S3A's {@code listMultipartUploads(prefix)}
   * of {@code dir} (one request per 1000 uploads under it, however many names), then an abort
   * of each upload whose key is one of the names' keys or starts with one (as {@code
   * abortUploadsUnderPath} of each name would). Connectors without that method: one listing
   * per name ({@link #deleteLeftovers(Path)}).
   */
  @Override
  public int deleteLeftovers(Path dir, java.util.Collection<Path> targets) throws IOException {
    FileSystem fs = fs();
    if (targets.isEmpty()
        || !fs.hasPathCapability(dir, CommonPathCapabilities.FS_MULTIPART_UPLOADER)) {
      return 0;
    }
    java.lang.reflect.Method list;
    java.lang.reflect.Method abort;
    try {
      list = fs.getClass().getMethod("listMultipartUploads", String.class);
      abort = fs.getClass().getMethod("abortMultipartUpload", String.class, String.class);
    } catch (NoSuchMethodException e) {
      return eachLeftovers(targets);
    }
    java.util.TreeSet<String> keys = new java.util.TreeSet<>();
    for (Path target : targets) {
      keys.add(key(target));
    }
    int aborted = 0;
    try {
      for (Object upload : (java.util.List<?>) list.invoke(fs, key(dir) + "/")) {
        String key = (String) upload.getClass().getMethod("key").invoke(upload);
        String name = keys.floor(key);
        if (name != null && key.startsWith(name)) {
          abort.invoke(fs, key, (String) upload.getClass().getMethod("uploadId").invoke(upload));
          aborted++;
        }
      }
    } catch (java.lang.reflect.InvocationTargetException e) {
      Throwable cause = e.getCause();
      throw cause instanceof IOException io ? io
          : new IOException("cannot abort the incomplete uploads under " + dir, cause);
    } catch (ReflectiveOperationException e) {
      return eachLeftovers(targets);
    }
    return aborted;
  }

  private int eachLeftovers(java.util.Collection<Path> targets) throws IOException {
    int removed = 0;
    for (Path target : targets) {
      removed += deleteLeftovers(target);
    }
    return removed;
  }

  /** The object key of {@code path} (its path without the leading {@code /}). */
  private static String key(Path path) {
    String p = path.toUri().getPath();
    return p.startsWith("/") ? p.substring(1) : p;
  }

  @Override
  public int deleteLeftovers(Path target) throws IOException {
    FileSystem fs = fs();
    if (!fs.hasPathCapability(target, CommonPathCapabilities.FS_MULTIPART_UPLOADER)) {
      return 0;
    }
    try (MultipartUploader uploader = fs.createMultipartUploader(target.getParent()).build()) {
      Integer aborted = uploader.abortUploadsUnderPath(target).get();
      return aborted == null || aborted < 0 ? 0 : aborted;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted aborting the uploads of " + target);
    } catch (ExecutionException e) {
      throw new IOException("cannot abort the incomplete uploads of " + target, e.getCause());
    } catch (UnsupportedOperationException e) {
      return 0;
    }
  }
}
