package io.sparkguard.spark;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.util.EnumSet;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileContext;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.StreamCapabilities;

/**
 * HDFS and HDFS-like filesystems ({@code hdfs://}, {@code viewfs://}) through the Hadoop {@code
 * FileContext} API (rename store). How it meets {@link AtomicStore}'s guarantees, with the
 * mechanism of the checkpoint manager's {@link RenameAtomicFiles}:
 *
 * <ul>
 *   <li>put-if-absent: write {@code .<name>.sg-tmp-<12 hex>} in the target's directory, {@code
 *       hsync} where the stream supports it, close, then {@code FileContext.rename(temp, target,
 *       Rename.NONE)}: HDFS's NameNode refuses atomically when the name exists ({@code
 *       FileAlreadyExistsException}, which is {@code false} here, and the temp file is deleted),
 *       so of racing creators exactly one wins;
 *   <li>publish: {@code FileContext.rename(work, target, Rename.OVERWRITE)} of the temp name the
 *       task wrote ({@link #workPath}, the same naming as {@link LocalAtomicStore}) onto the final
 *       name, replacing an older file in one NameNode operation. Spark's writer closed the file
 *       (on HDFS: its blocks are complete) before the protocol publishes it;
 *   <li>a crash leaves at most a temp file, which readers skip (leading dot) and {@link
 *       #deleteLeftovers} (a listing of the directory) removes.
 * </ul>
 *
 * <p>Everything else (read, size, listing, delete) goes through the {@code FileSystem} API. On a
 * filesystem whose {@code rename(NONE)} is a check-then-rename (Hadoop's local filesystem, object
 * stores reached through a connector) put-if-absent is only as safe as that check; the store is
 * chosen for {@code hdfs}/{@code viewfs} only ({@link AtomicStore#forTable(Path, Configuration)}).
 *
 * <p>Serializable: the Hadoop {@code Configuration} it was opened with travels with it (as {@code
 * Writable}); each JVM opens the {@code FileContext} and {@code FileSystem} from it once.
 */
public final class HadoopRenameAtomicStore extends HadoopFileSystemStore {
  private static final long serialVersionUID = 1L;

  private transient FileContext fc;

  private HadoopRenameAtomicStore(URI root, Configuration conf, FileSystem fs) {
    super(root, conf, fs);
  }

  /** The store of {@code table}'s filesystem, opened with (a copy of) {@code conf}. */
  static HadoopRenameAtomicStore open(Path table, Configuration conf) throws IOException {
    Configuration copy = new Configuration(conf);
    FileSystem fs = table.getFileSystem(copy);
    return new HadoopRenameAtomicStore(fs.getUri(), copy, fs);
  }

  private FileContext fc() throws IOException {
    if (fc == null) {
      fc = FileContext.getFileContext(root, conf());
    }
    return fc;
  }

  @Override
  public boolean putIfAbsent(Path path, byte[] data) throws IOException {
    // Temp file + hsync + rename(NONE); FileAlreadyExistsException is false, the temp goes.
    return new RenameAtomicFiles(fc()).putIfAbsent(path, data);
  }

  @Override
  public void createMarker(Path path) throws IOException {
    // An empty file is whole at every moment: create it under its name (CREATE without
    // OVERWRITE fails on an existing name, on HDFS atomically in the NameNode).
    try (FSDataOutputStream out =
        fc().create(path, EnumSet.of(CreateFlag.CREATE), Options.CreateOpts.createParent())) {
      if (out.hasCapability(StreamCapabilities.HSYNC)) {
        out.hsync();
      }
    } catch (FileAlreadyExistsException e) {
      // a retried or duplicate attempt: the marker is already there
    }
  }

  @Override
  public Path workPath(Path target) {
    return new Path(target.getParent(), LocalAtomicStore.tempName(target.getName()));
  }

  @Override
  public void prepareWrite(Path target) {
    // The temp name from workPath is fresh: Spark's create(overwrite=false) succeeds.
  }

  @Override
  public void publish(Path work, Path target) throws IOException {
    RenameAtomicFiles.rename(fc(), work, target, true);
  }

  @Override
  public int deleteLeftovers(Path target) throws IOException {
    String prefix = "." + target.getName() + ".sg-tmp-";
    FileStatus[] entries;
    try {
      entries = fs().listStatus(target.getParent());
    } catch (FileNotFoundException e) {
      return 0;
    }
    int removed = 0;
    for (FileStatus entry : entries) {
      if (entry.isFile() && entry.getPath().getName().startsWith(prefix)
          && fs().delete(entry.getPath(), false)) {
        removed++;
      }
    }
    return removed;
  }
}
