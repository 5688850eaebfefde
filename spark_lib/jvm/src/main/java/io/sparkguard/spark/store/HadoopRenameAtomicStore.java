package io.sparkguard.spark.store;

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
    Configuration copy = promptClose(conf);
    FileSystem fs = table.getFileSystem(copy);
    return new HadoopRenameAtomicStore(fs.getUri(), copy, fs);
  }

  /** The HDFS client's first wait before it asks the NameNode again to complete a file. */
  static final String CLOSE_DELAY_KEY = "dfs.client.block.write.locateFollowingBlock.initial.delay.ms";
  /** How many times it asks again, each wait twice the one before. */
  static final String CLOSE_RETRIES_KEY = "dfs.client.block.write.locateFollowingBlock.retries";
  /** sparkguard's own clients' first wait (HDFS's default: 400 ms). */
  static final int PROMPT_CLOSE_DELAY_MS = 25;
  /** ... and retries (HDFS's default: 5): 25 ms * (2^10 - 1) = 25.6 s of patience in all, more
   * than the default's 400 ms * (2^5 - 1) = 12.4 s. */
  static final int PROMPT_CLOSE_RETRIES = 10;

  /**
   * A copy of {@code conf} for the HDFS clients sparkguard opens itself (this store's {@code
   * FileContext}, {@link io.sparkguard.spark.OwnedHdfsFileSystem}'s filesystem): they poll the
   * NameNode's completion of a closed file every 25 ms, doubling, instead of 400 ms, doubling. A
   * file's {@code complete} RPC usually reaches the NameNode before the DataNode's report of its
   * last block, and the NameNode refuses to complete it until then; HDFS's client then sleeps 400
   * ms before asking again, although the report follows within milliseconds (measured on the
   * minicluster: 2 of every 5 closes of a small file waited 400 ms; docs/benchmarks.md). The
   * durability of a closed file does not change: the client still returns only once the NameNode
   * has completed it. A value the user set (anything but Hadoop's {@code *-default.xml}) is kept;
   * the rest of the job's clients keep their settings.
   */
  public static Configuration promptClose(Configuration conf) {
    Configuration copy = new Configuration(conf);
    if (isDefault(copy, CLOSE_DELAY_KEY)) {
      copy.setInt(CLOSE_DELAY_KEY, PROMPT_CLOSE_DELAY_MS);
    }
    if (isDefault(copy, CLOSE_RETRIES_KEY)) {
      copy.setInt(CLOSE_RETRIES_KEY, PROMPT_CLOSE_RETRIES);
    }
    return copy;
  }

  private static boolean isDefault(Configuration conf, String key) {
    String[] sources = conf.getPropertySources(key);
    if (sources == null) {
      return true;
    }
    for (String source : sources) {
      if (!source.endsWith("-default.xml")) {
        return false;
      }
    }
    return true;
  }

  /**
   * The {@code FileContext}s of {@code hdfs://} stores in this JVM, by filesystem URI and user: a
   * {@code FileContext} opens an HDFS client of its own (a NameNode proxy, a lease renewer and
   * a {@code getServerDefaults} RPC at its first create), and every task deserializes its own
   * store; like Hadoop's {@code FileSystem} cache, the first configuration of a key is the one
   * used. Other schemes open theirs per store instance.
   */
  private static final java.util.concurrent.ConcurrentHashMap<String, FileContext> HDFS_CONTEXTS =
      new java.util.concurrent.ConcurrentHashMap<>();

  private FileContext fc() throws IOException {
    if (fc == null) {
      if ("hdfs".equals(root.getScheme())) {
        String key = root + " " + org.apache.hadoop.security.UserGroupInformation.getCurrentUser();
        try {
          fc = HDFS_CONTEXTS.computeIfAbsent(key, k -> {
            try {
              return FileContext.getFileContext(root, conf());
            } catch (IOException e) {
              throw new java.io.UncheckedIOException(e);
            }
          });
        } catch (java.io.UncheckedIOException e) {
          throw e.getCause();
        }
      } else {
        fc = FileContext.getFileContext(root, conf());
      }
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
  public boolean publishesOnDriver() {
    return true;  // after the outcome: a temp name is hidden from every directory reader
  }

  @Override
  public void publish(Path work, Path target) throws IOException {
    RenameAtomicFiles.rename(fc(), work, target, true);
  }

  @Override
  public int deleteLeftovers(Path target, java.util.Set<String> keep) throws IOException {
    String prefix = "." + target.getName() + ".sg-tmp-";
    FileStatus[] entries;
    try {
      entries = fs().listStatus(target.getParent());
    } catch (FileNotFoundException e) {
      return 0;
    }
    int removed = 0;
    for (FileStatus entry : entries) {
      String name = entry.getPath().getName();
      if (entry.isFile() && name.startsWith(prefix) && !keep.contains(name)
          && fs().delete(entry.getPath(), false)) {
        removed++;
      }
    }
    return removed;
  }
}
