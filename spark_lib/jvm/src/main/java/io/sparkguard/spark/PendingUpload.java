package io.sparkguard.spark;

import java.io.BufferedOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Abortable;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.MultipartUploader;
import org.apache.hadoop.fs.PartHandle;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.UploadHandle;

/**
 * A data file written as a multipart upload that {@link #close} leaves open: the object does
 * not exist for any reader until the driver completes the upload after the write's outcome
 * (docs/storage-contract.md, "Publication after the outcome"). Hadoop's {@code
 * MultipartUploader} of the file's store (S3A's: its retry policy, its credentials) starts the
 * upload at the first full part, or at the close for a file smaller than a part; each part is
 * buffered in a local file ({@code fs.s3a.buffer.dir}, else {@code java.io.tmpdir}) of {@code
 * fs.s3a.multipart.size} bytes (at least S3's 5 MiB) and uploaded when full; the close uploads
 * the last one. {@link #upload} is what the task reports: the upload handle and the part
 * handles, which the driver completes ({@code AtomicStore#completeUpload}).
 *
 * <p>{@link #abort} (Spark's writer on a failed task) aborts the upload; a task that dies
 * leaves it, and the commit's W8 or the rollback's R6 aborts every upload of the write's marked
 * names but the accepted ones.
 */
final class PendingUpload extends OutputStream implements Abortable {
  /** S3's least part size (all parts but the last). */
  static final long MIN_PART_BYTES = 5L << 20;
  /** S3A's part size setting and its default. */
  static final String PART_SIZE_KEY = "fs.s3a.multipart.size";
  static final long DEFAULT_PART_BYTES = 64L << 20;

  /** What a closed pending upload leaves for the driver: Hadoop's handles, as bytes. */
  record Upload(byte[] handle, List<byte[]> parts) implements java.io.Serializable {
    /** The store's upload id (S3A's upload handle is its UTF-8 bytes). */
    String id() {
      return new String(handle, StandardCharsets.UTF_8);
    }
  }

  private final Path target;
  private final MultipartUploader uploader;
  private final long partBytes;
  private final File bufferDir;
  private final List<byte[]> parts = new ArrayList<>();
  private UploadHandle handle;
  private File buffer;
  private OutputStream out;
  private long buffered;
  private boolean closed;
  private Upload upload;

  PendingUpload(FileSystem fs, Path target, Configuration conf) throws IOException {
    this.target = target;
    this.partBytes = Math.max(MIN_PART_BYTES, conf.getLongBytes(PART_SIZE_KEY, DEFAULT_PART_BYTES));
    String dirs = conf.getTrimmed("fs.s3a.buffer.dir", "");
    String first = dirs.isEmpty() ? System.getProperty("java.io.tmpdir") : dirs.split(",")[0];
    this.bufferDir = new File(first);
    if (!bufferDir.isDirectory() && !bufferDir.mkdirs() && !bufferDir.isDirectory()) {
      throw new IOException("sparkguard: cannot make the upload buffer directory " + bufferDir);
    }
    this.uploader = fs.createMultipartUploader(target.getParent()).build();
    newBuffer();
  }

  private void newBuffer() throws IOException {
    buffer = File.createTempFile("sparkguard-part-", ".bin", bufferDir);
    out = new BufferedOutputStream(new FileOutputStream(buffer), 1 << 16);
    buffered = 0;
  }

  @Override
  public void write(int b) throws IOException {
    out.write(b);
    if (++buffered >= partBytes) {
      uploadPart(false);
    }
  }

  @Override
  public void write(byte[] b, int off, int len) throws IOException {
    while (len > 0) {
      int n = (int) Math.min(len, partBytes - buffered);
      out.write(b, off, n);
      buffered += n;
      off += n;
      len -= n;
      if (buffered >= partBytes) {
        uploadPart(false);
      }
    }
  }

  @Override
  public void flush() throws IOException {
    out.flush();  // a part goes to the store only when full, or at the close
  }

  /** Upload the buffered bytes as the next part; a new buffer unless it is the last part. */
  private void uploadPart(boolean last) throws IOException {
    out.close();
    try {
      if (handle == null) {
        handle = await(uploader.startUpload(target));
      }
      int number = parts.size() + 1;
      try (InputStream in = new FileInputStream(buffer)) {
        PartHandle part = await(uploader.putPart(handle, number, last, target, in, buffered));
        parts.add(part.toByteArray());
      }
    } finally {
      deleteBuffer();
    }
    if (!last) {
      newBuffer();
    }
  }

  private void deleteBuffer() {
    if (buffer != null && !buffer.delete() && buffer.exists()) {
      buffer.deleteOnExit();
    }
    buffer = null;
  }

  private <T> T await(CompletableFuture<T> future) throws IOException {
    try {
      return future.get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("sparkguard: interrupted uploading " + target);
    } catch (ExecutionException e) {
      Throwable cause = e.getCause();
      throw cause instanceof IOException io ? io
          : new IOException("sparkguard: cannot upload " + target, cause);
    }
  }

  /** Upload the last part and leave the upload open (see the class comment). */
  @Override
  public void close() throws IOException {
    if (closed) {
      return;
    }
    closed = true;
    try {
      uploadPart(true);
      upload = new Upload(handle.toByteArray(), List.copyOf(parts));
    } finally {
      deleteBuffer();
      uploader.close();
    }
  }

  /** The upload a successful {@link #close} left open; null before it. */
  Upload upload() {
    return upload;
  }

  /** A failed writer's end: no part more, the upload aborted (best effort: W8/R6 also do). */
  @Override
  public AbortableResult abort() {
    boolean wasClosed = closed;
    closed = true;
    IOException failure = null;
    try {
      out.close();
    } catch (IOException e) {
      failure = e;
    }
    deleteBuffer();
    try {
      if (handle != null) {
        await(uploader.abort(handle, target));
      }
    } catch (IOException e) {
      failure = failure == null ? e : failure;
    } finally {
      try {
        uploader.close();
      } catch (IOException e) {
        failure = failure == null ? e : failure;
      }
    }
    IOException seen = failure;
    return new AbortableResult() {
      @Override
      public boolean alreadyClosed() {
        return wasClosed;
      }

      @Override
      public IOException anyCleanupException() {
        return seen;
      }
    };
  }
}
