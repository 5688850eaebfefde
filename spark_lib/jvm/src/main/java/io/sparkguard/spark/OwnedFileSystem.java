package io.sparkguard.spark;

import io.sparkguard.spark.store.HadoopRenameAtomicStore;
import io.sparkguard.spark.store.LocalAtomicStore;
import java.io.ByteArrayInputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.StandardOpenOption;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Abortable;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.StreamCapabilities;
import org.apache.hadoop.fs.Syncable;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;
import org.apache.parquet.ParquetReadOptions;
import org.apache.parquet.format.converter.ParquetMetadataConverter;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;

/**
 * The filesystem Spark's writers open sparkguard's data files through on object stores: {@code
 * sg-s3a://bucket/key} is {@code s3a://bucket/key}, and every call is the S3A filesystem's,
 * except two.
 *
 * <ul>
 *   <li>{@code create} replaces, without probing: Spark's writers call {@code create(path,
 *       overwrite=false)}, for which S3A first makes HEAD and LIST requests to refuse an existing
 *       object or directory. A data file's name is deterministic and owned by the write that
 *       marked it (docs/storage-contract.md, W4): an object already there is an uncommitted
 *       leftover of an earlier attempt of the same write (the protocol never writes a committed
 *       name on an object store), and replacing it is what the rerun wants. So the file is
 *       created with {@code createFile(path).overwrite(true).must("fs.s3a.create.performance",
 *       true)}, S3A's per-file performance create (Hadoop 3.4+): no request before the upload.
 *       The rest of the job's S3A use keeps its settings: this is per file, for the protocol's
 *       own files only (the protocol hands out {@code sg-} paths only for names it marked).
 *   <li>The stream records what it wrote: its length and, for Parquet, the rows of the footer it
 *       wrote last (parsed from the stream's tail in memory). The task's commit takes them
 *       ({@link #take}) instead of a HEAD and a footer read per file, and {@code getFileStatus}
 *       of a file this JVM has just written and not yet committed answers with the written
 *       length instead of a HEAD (Spark's {@code BasicWriteTaskStatsTracker} asks it for every
 *       file it closes). The commit still checks every reported size against the store (W7).
 *   <li>A name the protocol announced ({@link #expectPendingUpload}: the batch protocol's data
 *       files on S3A) is written as a {@link PendingUpload}: a multipart upload whose close
 *       leaves it open, for the driver to complete after the write's outcome; no listing shows
 *       the object before that. The record ({@link #take}) then carries the upload.
 * </ul>
 *
 * <p>On rename stores the tasks write their temp files through it too ({@link
 * OwnedLocalFileSystem}, {@code sg-file://}; {@link OwnedHdfsFileSystem}, {@code sg-hdfs://},
 * whose HDFS client is its own, polling a closed file's completion promptly: {@link
 * HadoopRenameAtomicStore#promptClose}), for the record of the written length and rows. On
 * local disk the stream also starts the file's writeback as it goes ({@link LocalFile}): every
 * {@link #WRITEBACK_BYTES} written, a background thread flushes what the kernel holds of the
 * file, so that the fsync of its publication (W6) finds little left to write instead of the
 * whole file after the task has ended. A local file's stream buffers at least {@link
 * #LOCAL_BUFFER_BYTES}, so that Parquet's many small writes reach the kernel as few calls.
 *
 * <p>Local data files are written without Hadoop's checksum sidecar ({@code .<name>.crc}, which
 * {@code LocalFileSystem} writes beside every file): the owned scheme wraps {@code
 * RawLocalFileSystem}. The sidecar is a second file that cannot be published atomically with its
 * data file, so after a power loss a committed file could sit beside a checksum that does not
 * match it, which Hadoop's reader refuses ({@code ChecksumException}); and it costs the task a
 * CRC of every byte and twice the write calls. Parquet's own page checksums (written by default
 * since parquet-mr 1.12; {@code parquet.page.verify-checksum.enabled} checks them on read) cover
 * the data instead. The publication removes a checksum left by an older file of the name.
 *
 * <p>Found by Hadoop through its {@code fs.sg-<scheme>.impl} setting ({@code sparkguard
 * spark-conf} sets {@code spark.hadoop.fs.sg-s3a.impl}, {@code sg-file}, {@code sg-hdfs}) or the
 * jar's {@code META-INF/services} entries. When neither resolves on the driver, the protocol
 * writes plain paths as before ({@link #available}).
 */
public class OwnedFileSystem extends FileSystem {
  /** The scheme prefix: {@code sg-<scheme>} is {@code <scheme>} with owned creates. */
  static final String PREFIX = "sg-";
  /** The scheme this class registers under by {@code META-INF/services}. */
  static final String S3A_SCHEME = PREFIX + "s3a";
  /** The scheme {@link OwnedLocalFileSystem} registers under by {@code META-INF/services}. */
  static final String LOCAL_SCHEME = PREFIX + "file";
  /** The scheme {@link OwnedHdfsFileSystem} registers under by {@code META-INF/services}. */
  static final String HDFS_SCHEME = PREFIX + "hdfs";
  /** S3A's per-file option: create without the existence and parent probes. */
  static final String CREATE_PERFORMANCE = "fs.s3a.create.performance";
  /** How much of a stream's end is kept to read a Parquet footer from. */
  static final int TAIL_BYTES = 256 * 1024;
  /** A local data file's writeback is started each time this much more of it was written. */
  static final long WRITEBACK_BYTES = 8L << 20;
  /**
   * The least buffer of a local data file's stream. Spark hands {@code create} Hadoop's {@code
   * io.file.buffer.size} (4 KiB by default), and Parquet writes a row group as many small
   * pieces (a page header, then its page, ...), so a 26 MiB file took about 3,500 {@code
   * write} calls; with 1 MiB, about 30. docs/benchmarks.md, "fewer write calls".
   */
  static final int LOCAL_BUFFER_BYTES = 1 << 20;

  /** Parquet's defaults for reading a footer (the no-argument converter has no size limit set);
   * built on first use (it loads a Hadoop configuration once per JVM). */
  private static final class Footers {
    static final ParquetMetadataConverter CONVERTER =
        new ParquetMetadataConverter(ParquetReadOptions.builder().build());
  }

  /** Files written through this class in this JVM and not yet taken by a commit, by real path. */
  private static final Map<String, Written> WRITTEN = new ConcurrentHashMap<>();
  /**
   * Names the protocol announced as pending uploads ({@link #expectPendingUpload}) and no create
   * has opened yet, by real path: their create leaves the upload open ({@link PendingUpload}).
   */
  private static final java.util.Set<String> PENDING = ConcurrentHashMap.newKeySet();

  private URI uri;
  private String innerScheme;
  private FileSystem inner;
  /** True when {@link #inner} is this instance's own (not Hadoop's cached one): closed with it. */
  private boolean ownsInner;
  private Path workingDir;

  /**
   * What a closed stream wrote: its length, its rows ({@code -1}: not known) and, for a pending
   * upload, the upload it left open ({@code null}: the file is in the store).
   */
  public static final class Written {
    final long length;
    final long rows;
    final long closedMillis;
    final PendingUpload.Upload upload;

    Written(long length, long rows, long closedMillis, PendingUpload.Upload upload) {
      this.length = length;
      this.rows = rows;
      this.closedMillis = closedMillis;
      this.upload = upload;
    }

    PendingUpload.Upload upload() {
      return upload;
    }

    public long length() {
      return length;
    }

    public long rows() {
      return rows;
    }
  }

  public OwnedFileSystem() {
    // Hadoop instantiates filesystems reflectively; initialize() does the work.
  }

  @Override
  public String getScheme() {
    return uri == null ? S3A_SCHEME : uri.getScheme();
  }

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    String scheme = name.getScheme();
    if (scheme == null || !scheme.startsWith(PREFIX) || scheme.length() == PREFIX.length()) {
      throw new IOException("sparkguard: " + name + " is not a " + PREFIX + "<scheme> URI");
    }
    innerScheme = scheme.substring(PREFIX.length());
    String authority = name.getAuthority() == null ? "" : name.getAuthority();
    uri = URI.create(scheme + "://" + (authority.isEmpty() ? "/" : authority));
    URI innerUri = URI.create(innerScheme + "://" + authority + "/");
    if ("hdfs".equals(innerScheme)) {
      // A client of its own (closed with this one), which polls a closed file's completion
      // promptly (HadoopRenameAtomicStore#promptClose); Hadoop's cached one keeps its settings.
      inner = FileSystem.newInstance(innerUri, HadoopRenameAtomicStore.promptClose(conf));
      ownsInner = true;
    } else if ("file".equals(innerScheme)) {
      // Hadoop's local filesystem without its checksum layer: no .<name>.crc beside the data
      // file (see the class comment).
      inner = FileSystem.getLocal(conf).getRawFileSystem();
    } else {
      inner = FileSystem.get(innerUri, conf);
    }
    workingDir = owned(inner.getWorkingDirectory());
    setConf(conf);
  }

  /** The jar's owned class for each store scheme it has one for. */
  private static final Map<String, Class<? extends OwnedFileSystem>> CLASSES = Map.of(
      "s3a", OwnedFileSystem.class,
      "file", OwnedLocalFileSystem.class,
      "hdfs", OwnedHdfsFileSystem.class);

  /** {@code fs.sg-<scheme>.impl}: Hadoop's setting of the owned scheme's class. */
  static String implKey(String scheme) {
    return "fs." + PREFIX + scheme + ".impl";
  }

  /**
   * True when the protocol may hand out owned paths for {@code table}: Hadoop resolves {@code
   * sg-<scheme of table>} to this class with {@code conf} (its setting or the service entry), or
   * nothing sets it and the jar has a class for the scheme, which {@link #configure} then puts
   * in the job's configuration. The second case is a session that has the jar in {@code
   * spark.jars} only: Hadoop reads the service entries once per JVM, from the class loader of
   * the moment, which is not the one that loads {@code spark.jars}. A setting of the user's that
   * names another class is kept, and the protocol writes plain paths.
   */
  static boolean available(Path table, Configuration conf) {
    String scheme = table.toUri().getScheme();
    if (scheme == null) {
      return false;
    }
    if (unset(conf, scheme) != null) {
      return true;
    }
    try {
      return OwnedFileSystem.class.isAssignableFrom(
          FileSystem.getFileSystemClass(PREFIX + scheme, conf));
    } catch (IOException | RuntimeException e) {
      return false;
    }
  }

  /**
   * Name the owned class of {@code table}'s scheme in a job's configuration, the one its tasks
   * open their files with, unless a setting names one already ({@link #available}).
   */
  static void configure(Configuration jobConf, Path table) {
    String scheme = table.toUri().getScheme();
    Class<? extends OwnedFileSystem> owned = unset(jobConf, scheme);
    if (owned != null) {
      jobConf.set(implKey(scheme), owned.getName());
    }
  }

  /** The jar's owned class for {@code scheme} when no setting names one; else {@code null}. */
  private static Class<? extends OwnedFileSystem> unset(Configuration conf, String scheme) {
    return scheme == null || conf.get(implKey(scheme)) != null ? null : CLASSES.get(scheme);
  }

  /** {@code s3a://b/k} as {@code sg-s3a://b/k}. */
  static Path owned(Path real) {
    URI u = real.toUri();
    return new Path(PREFIX + u.getScheme(), u.getAuthority(), u.getPath());
  }

  /** The registry key of a real (or owned) path: {@code <scheme>://<authority><path>}. */
  static String key(Path path) {
    URI u = path.toUri();
    String scheme = u.getScheme() == null ? "" : u.getScheme();
    if (scheme.startsWith(PREFIX)) {
      scheme = scheme.substring(PREFIX.length());
    }
    return scheme + "://" + (u.getAuthority() == null ? "" : u.getAuthority()) + u.getPath();
  }

  /**
   * What the stream of {@code real} wrote, removed from the registry; {@code null} when it was
   * not written through this class in this JVM (or was taken already).
   */
  static Written take(Path real) {
    return WRITTEN.remove(key(real));
  }

  /** Forget what was recorded for {@code real} (an aborted task attempt). */
  static void forget(Path real) {
    WRITTEN.remove(key(real));
    PENDING.remove(key(real));
  }

  /**
   * The next create of {@code real} (an S3A name the protocol marked) leaves its multipart
   * upload open for the driver to complete after the outcome ({@link PendingUpload}); what the
   * close left is in {@link #take}'s record.
   */
  static void expectPendingUpload(Path real) {
    PENDING.add(key(real));
  }

  private Path real(Path path) {
    Path qualified = path.isAbsolute() ? path : new Path(workingDir, path);
    URI u = qualified.toUri();
    String authority = u.getAuthority() != null ? u.getAuthority() : uri.getAuthority();
    return new Path(innerScheme, authority, u.getPath());
  }

  private FileStatus owned(FileStatus status) throws IOException {
    FileStatus copy = new FileStatus(status);
    copy.setPath(owned(status.getPath()));
    return copy;
  }

  @Override
  public URI getUri() {
    return uri;
  }

  @Override
  public void close() throws IOException {
    try {
      super.close();
    } finally {
      if (ownsInner) {
        inner.close();
      }
    }
  }

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    return inner.open(real(f), bufferSize);
  }

  @Override
  public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite,
      int bufferSize, short replication, long blockSize, Progressable progress)
      throws IOException {
    Path target = real(f);
    if ("s3a".equals(innerScheme) && PENDING.remove(key(target))) {
      WRITTEN.remove(key(target));  // an earlier attempt's record is not this file's
      PendingUpload pending = new PendingUpload(inner, target, getConf());
      FSDataOutputStream out = new FSDataOutputStream(pending, null);
      return new FSDataOutputStream(new Recording(target, out, null, pending), statistics);
    }
    FSDataOutputStreamBuilder<?, ?> builder = inner.createFile(target);
    boolean local = "file".equals(innerScheme);
    builder.overwrite(true).recursive()
        .bufferSize(local ? Math.max(bufferSize, LOCAL_BUFFER_BYTES) : bufferSize)
        .replication(replication)
        .blockSize(blockSize);
    if (permission != null) {
      builder.permission(permission);
    }
    if (progress != null) {
      builder.progress(progress);
    }
    if ("s3a".equals(innerScheme)) {
      builder.must(CREATE_PERFORMANCE, true);
    } else {
      builder.opt(CREATE_PERFORMANCE, true);
    }
    FSDataOutputStream out = (FSDataOutputStream) builder.build();
    WRITTEN.remove(key(target));  // an earlier attempt's record is not this file's
    LocalFile file = local ? new LocalFile(LocalAtomicStore.local(target)) : null;  // Recording
    return new FSDataOutputStream(new Recording(target, out, file, null), statistics);
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress)
      throws IOException {
    throw new UnsupportedOperationException("sparkguard: data files are never appended to: " + f);
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    return inner.rename(real(src), real(dst));
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    WRITTEN.remove(key(real(f)));
    return inner.delete(real(f), recursive);
  }

  @Override
  public FileStatus[] listStatus(Path f) throws FileNotFoundException, IOException {
    FileStatus[] statuses = inner.listStatus(real(f));
    FileStatus[] result = new FileStatus[statuses.length];
    for (int i = 0; i < statuses.length; i++) {
      result[i] = owned(statuses[i]);
    }
    return result;
  }

  @Override
  public void setWorkingDirectory(Path dir) {
    workingDir = dir.isAbsolute() ? dir : new Path(workingDir, dir);
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDir;
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    return inner.mkdirs(real(f), permission);
  }

  /**
   * A file this JVM wrote and closed through this class and no commit has taken yet: its written
   * length, without a request (the upload completed with exactly these bytes). Anything else:
   * the store's answer.
   */
  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    Path target = real(f);
    Written written = WRITTEN.get(key(target));
    if (written != null) {
      return new FileStatus(written.length, false, 1, getDefaultBlockSize(f),
          written.closedMillis, owned(target));
    }
    return owned(inner.getFileStatus(target));
  }

  @Override
  public long getDefaultBlockSize(Path f) {
    return inner.getDefaultBlockSize(real(f));
  }

  @Override
  public short getDefaultReplication(Path f) {
    return inner.getDefaultReplication(real(f));
  }

  @Override
  public byte[] getXAttr(Path path, String name) throws IOException {
    return inner.getXAttr(real(path), name);
  }

  @Override
  public boolean hasPathCapability(Path path, String capability) throws IOException {
    return inner.hasPathCapability(real(path), capability);
  }

  /**
   * Rows of a Parquet file from the last {@code length} bytes of it in {@code tail} (the footer,
   * its length and {@code PAR1}); {@code -1} when they do not hold a whole plain footer.
   */
  static long parquetRows(byte[] tail, int length) {
    if (length < 12 || !new String(tail, length - 4, 4, StandardCharsets.US_ASCII).equals("PAR1")) {
      return -1;
    }
    int footer = (tail[length - 8] & 0xff) | (tail[length - 7] & 0xff) << 8
        | (tail[length - 6] & 0xff) << 16 | (tail[length - 5] & 0xff) << 24;
    if (footer <= 0 || footer > length - 8) {
      return -1;
    }
    try {
      ParquetMetadata metadata = Footers.CONVERTER.readParquetMetadata(
          new ByteArrayInputStream(tail, length - 8 - footer, footer),
          ParquetMetadataConverter.NO_FILTER);
      long rows = 0;
      for (BlockMetaData block : metadata.getBlocks()) {
        rows += block.getRowCount();
      }
      return rows;
    } catch (IOException | RuntimeException e) {
      return -1;
    }
  }

  /**
   * Counts the bytes and records them, with the rows of the footer in the last {@link
   * #TAIL_BYTES}, at a successful close. Where the file is remote the stream keeps those last
   * bytes as they pass (a ring; the commit would otherwise GET the footer back). Where it is
   * local ({@code local} set) it reads them back from the file at the close instead: one
   * read of the page cache rather than a copy of every byte the task writes.
   */
  private static final class Recording extends OutputStream
      implements Syncable, StreamCapabilities, Abortable {
    private final Path target;
    private final FSDataOutputStream out;
    private final LocalFile local;
    /** The stream below when it is a pending upload: its close leaves the upload to report. */
    private final PendingUpload pending;
    private final byte[] ring;
    private long count;
    private long writebackAt = WRITEBACK_BYTES;
    private boolean closed;

    Recording(Path target, FSDataOutputStream out, LocalFile local, PendingUpload pending) {
      this.target = target;
      this.out = out;
      this.local = local;
      this.pending = pending;
      this.ring = local == null ? new byte[TAIL_BYTES] : null;
    }

    private void wrote(long bytes) throws IOException {
      count += bytes;
      if (local != null && count >= writebackAt) {
        writebackAt = count + WRITEBACK_BYTES;
        // No flush of the streams below: what they buffer (up to LOCAL_BUFFER_BYTES) goes
        // with the next writeback or the publication's fsync.
        local.startWriteback();
      }
    }

    @Override
    public void write(int b) throws IOException {
      out.write(b);
      if (ring != null) {
        ring[(int) (count % TAIL_BYTES)] = (byte) b;
      }
      wrote(1);
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
      out.write(b, off, len);
      int skip = ring == null ? len : Math.max(0, len - TAIL_BYTES);  // the last TAIL_BYTES
      for (int done = skip; done < len; ) {
        int at = (int) ((count + done) % TAIL_BYTES);
        int n = Math.min(len - done, TAIL_BYTES - at);
        System.arraycopy(b, off + done, ring, at, n);
        done += n;
      }
      wrote(len);
    }

    @Override
    public void flush() throws IOException {
      out.flush();
    }

    @Override
    public void close() throws IOException {
      if (closed) {
        return;
      }
      closed = true;
      out.close();
      PendingUpload.Upload upload = pending == null ? null : pending.upload();
      WRITTEN.put(key(target), new Written(count, rows(), System.currentTimeMillis(), upload));
    }

    private long rows() {
      int length = (int) Math.min(count, TAIL_BYTES);
      byte[] tail = new byte[length];
      if (ring == null) {
        return local.readTail(tail, count) ? parquetRows(tail, length) : -1;
      }
      int start = (int) ((count - length) % TAIL_BYTES);
      int first = Math.min(length, TAIL_BYTES - start);
      System.arraycopy(ring, start, tail, 0, first);
      System.arraycopy(ring, 0, tail, first, length - first);
      return parquetRows(tail, length);
    }

    @Override
    public void hflush() throws IOException {
      out.hflush();
    }

    @Override
    public void hsync() throws IOException {
      out.hsync();
    }

    @Override
    public boolean hasCapability(String capability) {
      return out.hasCapability(capability);
    }

    @Override
    public AbortableResult abort() {
      closed = true;
      return out.abort();
    }
  }

  /**
   * A local file being written through a {@link Recording}, reached by its path on the side.
   * {@link #startWriteback} asks a background thread to flush what the kernel holds of the file
   * ({@code fdatasync} through a channel of its own), unless such a flush is already waiting.
   * Only a head start for the kernel: the publication's fsync (W6) is what makes the file
   * durable, so a flush that fails (the file renamed or deleted meanwhile, a filesystem that
   * refuses it) is ignored. The task's CPU goes on encoding while the disk writes, which it
   * would otherwise do only after the task's last byte. {@link #readTail} reads the footer's
   * bytes back at the close.
   */
  static final class LocalFile {
    /** One thread for the JVM: the disk, not the CPU, is what a flush waits for. */
    private static final ExecutorService THREAD = Executors.newSingleThreadExecutor(runnable -> {
      Thread thread = new Thread(runnable, "sparkguard-writeback");
      thread.setDaemon(true);
      return thread;
    });

    /** Flushes done and flushes that failed (ignored), in this JVM: for the tests. */
    static final AtomicLong FLUSHED = new AtomicLong();
    static final AtomicLong IGNORED = new AtomicLong();

    private final java.nio.file.Path file;
    private final AtomicBoolean waiting = new AtomicBoolean();

    LocalFile(java.nio.file.Path file) {
      this.file = file;
    }

    void startWriteback() {
      if (waiting.compareAndSet(false, true)) {
        THREAD.execute(this::flush);
      }
    }

    private void flush() {
      waiting.set(false);
      try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ)) {
        channel.force(false);
        FLUSHED.incrementAndGet();
      } catch (IOException | RuntimeException e) {
        IGNORED.incrementAndGet();  // a head start only (see above)
      }
    }

    /**
     * Fill {@code tail} with the bytes that end at {@code length} in the file; false when they
     * cannot be read (the commit then reads the footer itself).
     */
    boolean readTail(byte[] tail, long length) {
      java.nio.ByteBuffer buffer = java.nio.ByteBuffer.wrap(tail);
      try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ)) {
        long at = length - tail.length;
        while (buffer.hasRemaining()) {
          int n = channel.read(buffer, at + buffer.position());
          if (n < 0) {
            return false;
          }
        }
        return true;
      } catch (IOException | RuntimeException e) {
        return false;
      }
    }

    /** Wait until the flushes asked for so far are done (tests). */
    static void drain() throws InterruptedException, ExecutionException {
      THREAD.submit(() -> { }).get();
    }
  }
}
