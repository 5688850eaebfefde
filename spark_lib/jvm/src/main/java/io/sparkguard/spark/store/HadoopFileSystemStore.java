package io.sparkguard.spark.store;

import io.sparkguard.spark.common.Concurrently;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.net.URI;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocatedFileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RemoteIterator;

/**
 * What the stores reached through the Hadoop {@code FileSystem} API share: reading, sizes,
 * recursive listing and deletes (the primitives whose guarantee every such filesystem gives as
 * it is), and carrying the Hadoop {@code Configuration} they were opened with to the executors.
 * Subclasses say how they meet the guarantees that differ per store: put-if-absent, markers and
 * publication ({@link ObjectStoreAtomicStore}, {@link HadoopRenameAtomicStore}).
 *
 * <p>Serializable: the {@code Configuration} travels as {@code Writable}, and each JVM opens the
 * filesystem from it once (Hadoop's filesystem cache).
 */
abstract class HadoopFileSystemStore implements AtomicStore {
  private static final long serialVersionUID = 1L;

  /** The filesystem's URI (scheme and authority). */
  protected final URI root;
  private transient Configuration conf;
  private transient FileSystem fs;

  HadoopFileSystemStore(URI root, Configuration conf, FileSystem fs) {
    this.root = root;
    this.conf = conf;
    this.fs = fs;
  }

  /** The Hadoop configuration this store was opened with. */
  protected final Configuration conf() {
    return conf;
  }

  /** The filesystem, opened from {@link #conf()} once per JVM. */
  protected final FileSystem fs() throws IOException {
    if (fs == null) {
      fs = FileSystem.get(root, conf);
    }
    return fs;
  }

  @Override
  public byte[] read(Path path) throws IOException {
    try (FSDataInputStream in = fs().open(path)) {
      return in.readAllBytes();
    }
  }

  @Override
  public long size(Path path) throws IOException {
    try {
      return fs().getFileStatus(path).getLen();
    } catch (FileNotFoundException e) {
      return -1;
    }
  }

  /** At most this many size requests in flight at once ({@link #sizes}). */
  static final int PARALLEL_REQUESTS = 16;

  @Override
  public long[] sizes(List<Path> paths) throws IOException {
    return Concurrently.map(paths, PARALLEL_REQUESTS, "sparkguard-sizes", this::size).stream()
        .mapToLong(Long::longValue).toArray();
  }

  @Override
  public List<String> listFiles(Path dir) throws IOException {
    FileSystem fs = fs();
    String prefix = fs.makeQualified(dir).toUri().getPath();
    prefix = prefix.endsWith("/") ? prefix : prefix + "/";
    List<String> names = new ArrayList<>();
    try {
      RemoteIterator<LocatedFileStatus> files = fs.listFiles(dir, true);  // S3A: one flat LIST
      while (files.hasNext()) {
        String file = files.next().getPath().toUri().getPath();
        if (file.startsWith(prefix)) {
          names.add(file.substring(prefix.length()));
        }
      }
    } catch (FileNotFoundException e) {
      return Collections.emptyList();
    }
    Collections.sort(names);
    return names;
  }

  @Override
  public boolean delete(Path path) throws IOException {
    return fs().delete(path, false);
  }

  @Override
  public void overwrite(Path path, byte[] data) throws IOException {
    AtomicStore.overwriteWith(AtomicFiles.forPath(path, conf), path, data);
  }

  /**
   * Hadoop's bulk delete ({@code FileSystem.createBulkDelete}, Hadoop 3.4.1+): on S3A one
   * DeleteObjects request per page of keys ({@code fs.s3a.bulk.delete.page.size}); elsewhere
   * Hadoop's default implementation, one delete per file.
   */
  @Override
  public void deleteAll(Path dir, java.util.List<Path> paths) throws IOException {
    if (paths.isEmpty()) {
      return;
    }
    String text = dir.toString();
    Path base = fs().makeQualified(text.endsWith("/") && text.length() > 1
        ? new Path(text.substring(0, text.length() - 1)) : dir);
    try (org.apache.hadoop.fs.BulkDelete bulk = fs().createBulkDelete(base)) {
      int page = Math.max(1, bulk.pageSize());
      java.util.List<Path> qualified = new java.util.ArrayList<>();
      for (Path path : paths) {
        qualified.add(fs().makeQualified(path));
      }
      for (int i = 0; i < qualified.size(); i += page) {
        java.util.List<Path> chunk = qualified.subList(i, Math.min(qualified.size(), i + page));
        java.util.List<java.util.Map.Entry<Path, String>> failed = bulk.bulkDelete(chunk);
        if (!failed.isEmpty()) {
          throw new IOException("sparkguard: bulk delete under " + base + " failed for "
              + failed.size() + " of " + chunk.size() + " files, e.g. " + failed.get(0).getKey()
              + ": " + failed.get(0).getValue());
        }
      }
    }
  }

  @Override
  public void deleteDirectory(Path dir) throws IOException {
    fs().delete(dir, true);
  }

  private void writeObject(ObjectOutputStream out) throws IOException {
    out.defaultWriteObject();
    conf.write(out);
  }

  private void readObject(ObjectInputStream in) throws IOException, ClassNotFoundException {
    in.defaultReadObject();
    conf = new Configuration(false);
    conf.readFields(in);
  }
}
