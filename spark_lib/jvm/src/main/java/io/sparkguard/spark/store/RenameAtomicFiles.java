package io.sparkguard.spark.store;

import java.io.IOException;
import java.io.OutputStream;
import java.util.EnumSet;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileContext;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.StreamCapabilities;

/**
 * HDFS and every store without a more specific implementation. How it meets {@link
 * AtomicFiles}' guarantees (as Spark's {@code FileContextBasedCheckpointFileManager} does, plus
 * an {@code hsync}):
 *
 * <ul>
 *   <li>the bytes go to {@code .<name>.sg-tmp-<12 hex>} in the target's directory;
 *   <li>{@code close()}: {@code hsync} when the stream supports it (HDFS: the data is on the
 *       datanodes' disks before the name points at it), close, then {@code FileContext.rename}
 *       with {@code Rename.NONE} (put-if-absent: the NameNode refuses atomically when the name
 *       exists, {@code FileAlreadyExistsException}) or {@code Rename.OVERWRITE};
 *   <li>{@code cancel()} / a failed close: delete the temp file.
 * </ul>
 *
 * <p>On a store whose rename is not atomic (an object store other than S3A, reached through a
 * Hadoop connector) this is exactly as safe as Spark's default manager, no safer.
 */
public final class RenameAtomicFiles implements AtomicFiles {
  private final FileContext fc;

  public RenameAtomicFiles(Path anyPath, Configuration conf) throws IOException {
    this(FileContext.getFileContext(anyPath.toUri(), conf));
  }

  /** Over an open {@code FileContext} (the commit protocol's {@link HadoopRenameAtomicStore}). */
  RenameAtomicFiles(FileContext fc) {
    this.fc = fc;
  }

  /**
   * Publish the closed temp file {@code temp} as {@code path}: {@code FileContext.rename} with
   * {@code Rename.NONE} (put-if-absent: {@code FileAlreadyExistsException} when the name exists,
   * atomically on HDFS's NameNode) or {@code Rename.OVERWRITE} (replaces in one step).
   */
  static void rename(FileContext fc, Path temp, Path path, boolean overwrite) throws IOException {
    fc.rename(temp, path, overwrite ? Options.Rename.OVERWRITE : Options.Rename.NONE);
  }

  @Override
  public String mechanism() {
    return "temp file + hsync + FileContext.rename";
  }

  @Override
  public AtomicOutput create(Path path, boolean overwrite) throws IOException {
    Path temp = new Path(path.getParent(), LocalAtomicStore.tempName(path.getName()));
    FSDataOutputStream out = fc.create(
        temp, EnumSet.of(CreateFlag.CREATE, CreateFlag.OVERWRITE), Options.CreateOpts.createParent());
    return new Output(path, temp, out, overwrite);
  }

  private final class Output extends AtomicOutput {
    private final Path path;
    private final Path temp;
    private final FSDataOutputStream out;
    private final boolean overwrite;

    Output(Path path, Path temp, FSDataOutputStream out, boolean overwrite) {
      this.path = path;
      this.temp = temp;
      this.out = out;
      this.overwrite = overwrite;
    }

    @Override
    protected OutputStream out() {
      return out;
    }

    @Override
    protected void publish() throws IOException {
      boolean published = false;
      try {
        if (out.hasCapability(StreamCapabilities.HSYNC)) {
          out.hsync();
        }
        out.close();
        rename(fc, temp, path, overwrite);
        published = true;
      } finally {
        if (!published) {
          deleteTemp();
        }
      }
    }

    @Override
    protected void discard() {
      try {
        out.close();
      } catch (IOException e) {
        // The temp file goes below either way.
      }
      deleteTemp();
    }

    private void deleteTemp() {
      try {
        fc.delete(temp, false);
      } catch (IOException e) {
        // A temp name left behind is invisible to readers and to Spark's listings.
      }
    }
  }
}
