package io.sparkguard.spark.store;

import java.io.IOException;
import java.io.OutputStream;

/**
 * A stream whose bytes become visible under its target name only when {@link #close()} returns
 * normally, and never after {@link #cancel()}.
 *
 * <p>The guarantee every implementation gives (the Python {@code AtomicStream}'s, see
 * {@code spark_lib/filemanager/}):
 *
 * <ul>
 *   <li><b>atomic visibility</b>: until {@code close()} returns, a reader of the target sees the
 *       previous file or nothing; after it, the whole new file, never a prefix;
 *   <li><b>exclusive create</b>: opened with {@code overwrite=false}, of several racing writers of
 *       one name exactly one {@code close()} succeeds; the others throw {@link
 *       org.apache.hadoop.fs.FileAlreadyExistsException} and publish nothing;
 *   <li><b>cancel leaves nothing</b>: after {@code cancel()} (or a failed {@code close()}) the
 *       target is unchanged and no temp file or pending upload of this stream remains, unless the
 *       process dies first (then at most a temp name {@code .<name>.sg-tmp-<hex>} or an
 *       incomplete multipart upload, both invisible to readers).
 * </ul>
 *
 * <p>{@code close()} and {@code cancel()} are idempotent, and whichever comes first decides:
 * {@code cancel()} after {@code close()} does nothing, and the reverse. A failed {@code close()}
 * has already cleaned up, so the {@code cancel()} Spark calls after it is a no-op.
 */
public abstract class AtomicOutput extends OutputStream {
  private boolean terminated;

  /** The stream the bytes go to until publication. */
  protected abstract OutputStream out();

  /** Make the written bytes visible under the target name; clean up on failure. */
  protected abstract void publish() throws IOException;

  /** Drop what was written; best effort, never throws. */
  protected abstract void discard();

  @Override
  public final void write(int b) throws IOException {
    ensureOpen();
    out().write(b);
  }

  @Override
  public final void write(byte[] b, int off, int len) throws IOException {
    ensureOpen();
    out().write(b, off, len);
  }

  @Override
  public final void flush() throws IOException {
    // Nothing is visible before close() anyway; flushing early only costs requests.
    ensureOpen();
  }

  @Override
  public final synchronized void close() throws IOException {
    if (terminated) {
      return;
    }
    terminated = true;
    publish();
  }

  /** Abandon the stream: nothing of it is ever published. */
  public final synchronized void cancel() {
    if (terminated) {
      return;
    }
    terminated = true;
    discard();
  }

  private void ensureOpen() throws IOException {
    if (terminated) {
      throw new IOException("the atomic stream is already closed or cancelled: nothing more can be written");
    }
  }
}
