package io.sparkguard.spark.store;

import io.sparkguard.spark.common.Concurrently;
import io.sparkguard.spark.common.SparkVersions;
import io.sparkguard.spark.common.SparkguardException.UnsupportedWriteException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.BBPartHandle;
import org.apache.hadoop.fs.BBUploadHandle;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.MultipartUploader;
import org.apache.hadoop.fs.PartHandle;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.UploadHandle;

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
 *       by a check-then-create (two writers would both "win"). Each create carries a random
 *       write id in its object metadata ({@code x-amz-meta-sparkguard-write}, as the Python
 *       writer's): when the store applied a create but its answer was lost (a reset, a
 *       timeout) and the connector's retry is refused with 412, one HEAD tells whether the
 *       object is this very create, so a create that landed is ours, not a lost race;
 *   <li>publish: no rename. A data file is written under its final name ({@link #workPath} is
 *       the target itself), and an object appears only when its upload completes, whole. Where
 *       the connector offers Hadoop's {@code MultipartUploader} ({@link #pendingUploads}: S3A),
 *       the batch protocol's tasks leave each data file as a multipart upload they do not
 *       complete, and the driver completes them after the outcome ({@link #completeUpload}): no
 *       directory reader sees a file of a running or failed write (the magic committer's
 *       trick, without its {@code __magic} paths and {@code .pendingset} files: the upload
 *       travels in the task's commit message and the outcome);
 *   <li>Spark's writers open files with {@code create(path, overwrite=false)}. Where the
 *       connector creates in performance mode ({@code fs.s3a.create.performance=true}) that is
 *       one PUT that replaces an older object; otherwise it probes the name first (HEAD + LIST)
 *       and fails on an existing object, so {@link #prepareWrite} deletes an uncommitted
 *       leftover of the name first (the protocol never asks it to for a committed name). The
 *       batch protocol avoids both where it can: its tasks open data files through {@link
 *       io.sparkguard.spark.OwnedFileSystem} ({@code sg-s3a://}), whose create is S3A's
 *       per-file performance create (one PUT, replacing a leftover), with nothing to prepare;
 *   <li>leftovers: incomplete multipart uploads of the names, found by one listing of the
 *       uploads under their directory (S3A's {@code listMultipartUploads}; for a commit's
 *       names together, one listing under the table: {@link #deleteLeftovers(Path,
 *       java.util.Collection)}), one abort each; connectors without that listing: the generic
 *       {@code MultipartUploader.abortUploadsUnderPath} per name. Uploads nobody ever aborts (a crashed task whose name no rollback
 *       reads) are left to the bucket's lifecycle rule ({@code AbortIncompleteMultipartUpload})
 *       or {@code fs.s3a.multipart.purge}.
 * </ul>
 *
 * <p>Serializable: the Hadoop {@code Configuration} it was opened with travels with it (as
 * {@code Writable}), and each JVM opens the filesystem from it once (Hadoop's filesystem cache).
 */
public final class ObjectStoreAtomicStore extends HadoopFileSystemStore {
  private static final long serialVersionUID = 1L;
  private static final org.slf4j.Logger LOG =
      org.slf4j.LoggerFactory.getLogger(ObjectStoreAtomicStore.class);

  /** The create option (hadoop-common {@code Options.CreateFileOptionKeys}) and capability. */
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";
  /** S3A's switch for conditional create (default true), named in the refusal. */
  static final String S3A_CONDITIONAL_SETTING = "fs.s3a.create.conditional.enabled";
  /** The object metadata key of a create's write id (the Python writer's too). */
  static final String WRITE_ID_KEY = "sparkguard-write";
  /** S3A's create option prefix for object metadata ({@code Constants.FS_S3A_CREATE_HEADER}). */
  static final String S3A_CREATE_HEADER = "fs.s3a.create.header";
  /** How S3A names an object's metadata entry among its extended attributes. */
  static final String S3A_XATTR_HEADER = "header.";
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
    SparkVersions.requireConditionalCreate(table.toUri().getScheme());
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
    Path parent = table.getParent();
    ConditionalCreateProbe.require(fs, parent == null ? table : parent);
    boolean replaces = fs.hasPathCapability(table, S3A_CREATE_PERFORMANCE);
    return new ObjectStoreAtomicStore(fs.getUri(), copy, fs, replaces);
  }

  @Override
  public boolean putIfAbsent(Path path, byte[] data) throws IOException {
    String writeId = newWriteId();
    FSDataOutputStreamBuilder<?, ?> create = fs().createFile(path);
    create.must(CONDITIONAL_CREATE, true);
    withWriteId(create, writeId);
    // createFile() is a raw builder type in Hadoop: its build() result needs the cast.
    try (FSDataOutputStream out = (FSDataOutputStream) create.build()) {
      out.write(data);
    } catch (FileAlreadyExistsException e) {
      return storedBy(fs(), path, writeId);
    } catch (IOException e) {
      if (isPreconditionFailed(e)) {
        return storedBy(fs(), path, writeId);
      }
      throw e;
    }
    return true;
  }

  /** A fresh write id for one conditional create (see {@link #withWriteId}). */
  static String newWriteId() {
    return UUID.randomUUID().toString();
  }

  /** {@code builder} with {@code writeId} in the object's metadata (S3A; others ignore it). */
  static void withWriteId(FSDataOutputStreamBuilder<?, ?> builder, String writeId) {
    builder.opt(S3A_CREATE_HEADER + "." + WRITE_ID_KEY, writeId);
  }

  /**
   * After a refused conditional create: whether the object at {@code path} is that create's own
   * ({@code writeId}): an earlier attempt of it was applied and its answer lost, so the
   * connector's retry met it. A connector without extended attributes, or an object gone since,
   * is a refusal.
   */
  static boolean storedBy(FileSystem fs, Path path, String writeId) throws IOException {
    byte[] stored;
    try {
      stored = fs.getXAttr(path, S3A_XATTR_HEADER + WRITE_ID_KEY);
    } catch (UnsupportedOperationException | FileNotFoundException e) {
      return false;
    }
    if (stored != null && writeId.equals(new String(stored, StandardCharsets.UTF_8))) {
      LOG.info("a retried conditional create of {} found its own earlier attempt stored (its"
          + " answer was lost): it is this create's, not a lost race", path);
      return true;
    }
    return false;
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
  public int deleteLeftovers(Path dir, java.util.Collection<Path> targets, java.util.Set<String> keep)
      throws IOException {
    return abortUploads(dir, targets, keep, new java.util.HashSet<>()).count();
  }

  @Override
  public boolean deleteLeftoversSeeing(Path dir, java.util.Collection<Path> targets,
      java.util.Set<String> keep, java.util.Set<String> seen) throws IOException {
    return abortUploads(dir, targets, keep, seen).listed();
  }

  /** What {@link #abortUploads} did: how many uploads it aborted, whether it listed them. */
  private record Aborted(int count, boolean listed) {}

  /**
   * The listing and aborts of {@link #deleteLeftovers(Path, java.util.Collection,
   * java.util.Set)}; adds the ids of {@code keep} it listed to {@code seen}. {@code listed}:
   * it listed the uploads (so {@code seen} is complete).
   */
  private Aborted abortUploads(Path dir, java.util.Collection<Path> targets,
      java.util.Set<String> keep, java.util.Set<String> seen) throws IOException {
    // keep: the upload ids the driver completes after the outcome (the accepted attempts'
    // pending uploads); every other incomplete upload of these names goes.
    FileSystem fs = fs();
    if (targets.isEmpty()
        || !fs.hasPathCapability(dir, CommonPathCapabilities.FS_MULTIPART_UPLOADER)) {
      return new Aborted(0, false);
    }
    java.lang.reflect.Method list;
    java.lang.reflect.Method abort;
    try {
      list = fs.getClass().getMethod("listMultipartUploads", String.class);
      abort = fs.getClass().getMethod("abortMultipartUpload", String.class, String.class);
    } catch (NoSuchMethodException e) {
      return new Aborted(eachLeftovers(targets), false);
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
          String id = (String) upload.getClass().getMethod("uploadId").invoke(upload);
          if (keep.contains(id)) {
            seen.add(id);
          } else {
            try {
              abort.invoke(fs, key, id);
            } catch (java.lang.reflect.InvocationTargetException e) {
              if (!uploadGone(e.getCause())) {
                throw e;
              }
              // Gone already: this abort applied and its answer was lost, so the SDK's retry
              // met NoSuchUpload (404); or another cleaner aborted it first. Either way it is
              // aborted, which is all this step asks.
            }
            aborted++;
          }
        }
      }
    } catch (java.lang.reflect.InvocationTargetException e) {
      Throwable cause = e.getCause();
      throw cause instanceof IOException io ? io
          : new IOException("cannot abort the incomplete uploads under " + dir, cause);
    } catch (ReflectiveOperationException e) {
      return new Aborted(eachLeftovers(targets), false);
    }
    return new Aborted(aborted, true);
  }

  /**
   * Whether {@code error} (or a cause of it) says the multipart upload does not exist: S3A
   * translated it to {@link FileNotFoundException}, or the AWS SDK's {@code
   * NoSuchUploadException} (the store's 404 NoSuchUpload) came through untranslated. Matched by
   * name: the SDK is not on this module's compile classpath.
   */
  static boolean uploadGone(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause() == t ? null : t.getCause()) {
      if (t instanceof FileNotFoundException
          || "NoSuchUploadException".equals(t.getClass().getSimpleName())) {
        return true;
      }
    }
    return false;
  }

  private int eachLeftovers(java.util.Collection<Path> targets) throws IOException {
    int removed = 0;
    for (Path target : targets) {
      removed += abortUnderPath(target);
    }
    return removed;
  }

  /** S3 Express One Zone buckets: listings are not in key order there (no ranged listing). */
  private static final String S3_EXPRESS_SUFFIX = "--x-s3";
  /** S3A's setting for the listing API version; raw listings use V2 only where S3A does. */
  private static final String S3A_LIST_VERSION = "fs.s3a.list.version";

  /** One object of a listing: its key relative to the listed prefix, and its size. */
  public record Listed(String name, long size) {}

  /**
   * Where the raw listings below cannot be used (a connector other than S3A, an S3A without
   * {@code getS3AInternals}, a store listed with V1, an S3 Express bucket): null, and the
   * callers fall back to the {@code FileSystem} API.
   */
  private transient RawLister raw;
  private transient boolean rawChecked;

  private RawLister raw() throws IOException {
    if (!rawChecked) {
      raw = RawLister.of(fs(), conf(), root);
      rawChecked = true;
    }
    return raw;
  }

  /** One page of a listing of the keys under {@code prefix}: see {@link RawLister#page}. */
  public interface PageSource {
    Page page(String prefix, String startAfter, String token, int maxKeys) throws IOException;
  }

  /**
   * S3 ListObjectsV2 through S3A's own client ({@code getS3AInternals().getAmazonS3Client()}),
   * by reflection (the jar does not compile against hadoop-aws): one request per page of 1000
   * keys, and no existence probes. S3A's {@code listFiles} of an empty prefix adds a HEAD and a
   * second LIST to learn whether the path is a file; a raw listing learns absence from the
   * listing itself. S3's listings are strongly consistent (a LIST after a PUT or DELETE sees it).
   */
  private static final class RawLister implements PageSource {
    private static final String MODEL = "software.amazon.awssdk.services.s3.model.";
    private final Object client;
    private final String bucket;
    private final java.lang.reflect.Method list;
    // The SDK's methods, looked up once per lister (a page asks for them for every key).
    private final java.lang.reflect.Method builder;
    private final java.lang.reflect.Method bucketOf;
    private final java.lang.reflect.Method prefixOf;
    private final java.lang.reflect.Method tokenOf;
    private final java.lang.reflect.Method startAfterOf;
    private final java.lang.reflect.Method maxKeysOf;
    private final java.lang.reflect.Method build;
    private final java.lang.reflect.Method contents;
    private final java.lang.reflect.Method isTruncated;
    private final java.lang.reflect.Method nextToken;
    private final java.lang.reflect.Method key;
    private final java.lang.reflect.Method size;

    private RawLister(Object client, String bucket, ClassLoader loader)
        throws ReflectiveOperationException {
      this.client = client;
      this.bucket = bucket;
      Class<?> request = Class.forName(MODEL + "ListObjectsV2Request", true, loader);
      Class<?> builderType = Class.forName(MODEL + "ListObjectsV2Request$Builder", true, loader);
      Class<?> response = Class.forName(MODEL + "ListObjectsV2Response", true, loader);
      Class<?> object = Class.forName(MODEL + "S3Object", true, loader);
      this.list = Class.forName("software.amazon.awssdk.services.s3.S3Client", true, loader)
          .getMethod("listObjectsV2", request);
      this.builder = request.getMethod("builder");
      this.bucketOf = builderType.getMethod("bucket", String.class);
      this.prefixOf = builderType.getMethod("prefix", String.class);
      this.tokenOf = builderType.getMethod("continuationToken", String.class);
      this.startAfterOf = builderType.getMethod("startAfter", String.class);
      this.maxKeysOf = builderType.getMethod("maxKeys", Integer.class);
      this.build = builderType.getMethod("build");
      this.contents = response.getMethod("contents");
      this.isTruncated = response.getMethod("isTruncated");
      this.nextToken = response.getMethod("nextContinuationToken");
      this.key = object.getMethod("key");
      this.size = object.getMethod("size");
    }

    static RawLister of(FileSystem fs, Configuration conf, URI root) {
      String bucket = root.getHost();
      if (!"s3a".equals(root.getScheme()) || bucket == null
          || bucket.endsWith(S3_EXPRESS_SUFFIX) || conf.getInt(S3A_LIST_VERSION, 2) != 2) {
        return null;
      }
      try {
        Object internals = fs.getClass().getMethod("getS3AInternals").invoke(fs);
        Class<?> internalsType = Class.forName(
            "org.apache.hadoop.fs.s3a.S3AInternals", true, fs.getClass().getClassLoader());
        Object client = internalsType.getMethod("getAmazonS3Client", String.class)
            .invoke(internals, "sparkguard listing");
        return new RawLister(client, bucket, client.getClass().getClassLoader());
      } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
        return null;
      }
    }

    /**
     * One page: the objects whose keys start with {@code prefix}, after {@code startAfter}
     * (a full key, or null), or from {@code token} (a continuation, or null).
     */
    @Override
    public Page page(String prefix, String startAfter, String token, int maxKeys)
        throws IOException {
      try {
        Object b = builder.invoke(null);
        bucketOf.invoke(b, bucket);
        prefixOf.invoke(b, prefix);
        if (token != null) {
          tokenOf.invoke(b, token);
        } else if (startAfter != null) {
          startAfterOf.invoke(b, startAfter);
        }
        maxKeysOf.invoke(b, maxKeys);
        Object response = list.invoke(client, build.invoke(b));
        List<Listed> objects = new ArrayList<>();
        for (Object object : (List<?>) contents.invoke(response)) {
          Long bytes = (Long) size.invoke(object);
          objects.add(new Listed((String) key.invoke(object), bytes == null ? 0 : bytes));
        }
        Boolean truncated = (Boolean) isTruncated.invoke(response);
        String next = (String) nextToken.invoke(response);
        return new Page(objects, Boolean.TRUE.equals(truncated) ? next : null);
      } catch (java.lang.reflect.InvocationTargetException e) {
        Throwable cause = e.getCause();
        if (cause instanceof IOException io) {
          throw io;
        }
        throw new IOException("sparkguard: cannot list s3a://" + bucket + "/" + prefix + ": "
            + cause, cause);
      } catch (ReflectiveOperationException e) {
        throw new IOException("sparkguard: cannot list s3a://" + bucket + "/" + prefix, e);
      }
    }
  }

  /** A page of a raw listing: full keys, and the continuation token when there is more. */
  public record Page(List<Listed> objects, String next) {}

  /** The largest page S3 returns. */
  static final int PAGE_KEYS = 1000;

  /**
   * The files under {@code dir} (relative names, sorted, with sizes), one request per page,
   * skipping ranges: for a name {@code skip} maps to a non-null relative name, every name up to
   * and including that one is left out, and a page ending in such a range is followed by a
   * listing from the range's end instead of the next page. Null when the raw listing is not
   * available here.
   */
  public List<Listed> listSkipping(Path dir, java.util.function.UnaryOperator<String> skip)
      throws IOException {
    RawLister lister = raw();
    if (lister == null) {
      return null;
    }
    try {
      return listSkipping(lister, key(dir) + "/", skip);
    } catch (IOException e) {
      return rawFailed(dir, e);
    }
  }

  /**
   * A raw listing failed (the SDK's own retries are S3A's request settings, not its retry
   * policy; an auditor may refuse requests outside S3A's spans): the caller falls back to the
   * {@code FileSystem} API for this call, which retries as S3A does, or fails with S3A's error.
   */
  private static <T> T rawFailed(Path dir, IOException e) {
    LOG.warn("sparkguard: a raw listing of {} failed ({}); listing through S3A instead", dir,
        e.toString());
    return null;
  }

  /** {@link #listSkipping(Path, java.util.function.UnaryOperator)} of the keys under {@code
   * prefix} (ending with {@code /}) as {@code source} pages them. */
  public static List<Listed> listSkipping(PageSource source, String prefix,
      java.util.function.UnaryOperator<String> skip) throws IOException {
    PageSource lister = source;
    List<Listed> found = new ArrayList<>();
    String startAfter = null;
    String token = null;
    while (true) {
      Page page = lister.page(prefix, startAfter, token, PAGE_KEYS);
      String resume = null;
      for (Listed object : page.objects()) {
        String name = object.name().substring(prefix.length());
        if (name.isEmpty() || name.endsWith("/")) {
          continue;  // a directory marker
        }
        if (resume != null && name.compareTo(resume) <= 0) {
          continue;
        }
        String to = skip.apply(name);
        if (to != null && to.compareTo(name) >= 0) {
          resume = to;
          continue;
        }
        found.add(new Listed(name, object.size()));
      }
      if (page.next() == null) {
        return found;
      }
      String last = page.objects().get(page.objects().size() - 1).name();
      if (resume != null && resume.compareTo(last.substring(prefix.length())) > 0) {
        startAfter = prefix + resume;  // the rest of the skipped range: not listed at all
        token = null;
      } else {
        token = page.next();
        startAfter = null;
      }
    }
  }

  /**
   * The sizes of {@code names} (in the directory whose key prefix is {@code dir}) that one page
   * listed from just before the first of them: -1 for a name the page's range covers but does
   * not hold (absent); no entry for a name beyond the page (the caller asks for it otherwise).
   */
  public static Map<String, Long> listedSizes(PageSource source, String dir,
      java.util.SortedSet<String> names) throws IOException {
    String first = names.first();
    Page page = source.page(dir, dir + first.substring(0, first.length() - 1), null, PAGE_KEYS);
    String through = page.next() == null || page.objects().isEmpty() ? null
        : page.objects().get(page.objects().size() - 1).name().substring(dir.length());
    Map<String, Long> sizes = new java.util.HashMap<>();
    for (Listed object : page.objects()) {
      String name = object.name().substring(dir.length());
      if (names.contains(name)) {
        sizes.put(name, object.size());
      }
    }
    for (String name : names) {
      if (!sizes.containsKey(name) && (through == null || name.compareTo(through) <= 0)) {
        sizes.put(name, -1L);  // within the listed range and not there: absent
      }
    }
    return sizes;
  }

  /** Every file under {@code dir}: one raw LIST per page where possible (no probes). */
  @Override
  public List<String> listFiles(Path dir) throws IOException {
    List<Listed> listed = listSkipping(dir, name -> null);
    if (listed == null) {
      return super.listFiles(dir);
    }
    List<String> names = new ArrayList<>();
    for (Listed object : listed) {
      names.add(object.name());
    }
    return names;
  }

  /**
   * Whether any object is under {@code dir} (or is its directory marker): one LIST of one key.
   * Null when the raw listing is not available here.
   */
  public Boolean anyUnder(Path dir) throws IOException {
    RawLister lister = raw();
    if (lister == null) {
      return null;
    }
    try {
      return !lister.page(key(dir) + "/", null, null, 1).objects().isEmpty();
    } catch (IOException e) {
      return rawFailed(dir, e);
    }
  }

  /**
   * W7's sizes with one LIST per directory instead of a HEAD per file (no probe per file where
   * one listing of the directory answers for all its names): per directory, one
   * page of up to 1000 keys from just before its first name (keys sort, so the names of one
   * write are close together). A name up to the page's last key (or anywhere, when the page
   * was the last one) that the page does not hold is absent (-1): S3's listings are strongly
   * consistent, as a HEAD is. Names beyond the page (a directory with many other files in
   * between) are asked with a HEAD each, in parallel, as before.
   */
  @Override
  public long[] sizes(List<Path> paths) throws IOException {
    RawLister lister = raw();
    if (lister == null || paths.isEmpty()) {
      return super.sizes(paths);
    }
    Map<String, java.util.TreeSet<String>> byDir = new java.util.TreeMap<>();
    for (Path path : paths) {
      byDir.computeIfAbsent(key(path.getParent()) + "/", d -> new java.util.TreeSet<>())
          .add(path.getName());
    }
    List<String> dirs = new ArrayList<>(byDir.keySet());
    List<Map<String, Long>> listed;
    try {
      listed = Concurrently.map(dirs, PARALLEL_REQUESTS,
          "sparkguard-sizes", dir -> listedSizes(lister, dir, byDir.get(dir)));
    } catch (IOException e) {
      rawFailed(paths.get(0).getParent(), e);
      return super.sizes(paths);
    }
    long[] result = new long[paths.size()];
    List<Integer> unknown = new ArrayList<>();
    for (int i = 0; i < paths.size(); i++) {
      Path path = paths.get(i);
      Long size = listed.get(dirs.indexOf(key(path.getParent()) + "/")).get(path.getName());
      if (size == null) {
        unknown.add(i);
      } else {
        result[i] = size;
      }
    }
    if (!unknown.isEmpty()) {
      List<Path> rest = new ArrayList<>();
      for (int i : unknown) {
        rest.add(paths.get(i));
      }
      long[] headed = super.sizes(rest);
      for (int j = 0; j < headed.length; j++) {
        result[unknown.get(j)] = headed[j];
      }
    }
    return result;
  }

  /** The object key of {@code path} (its path without the leading {@code /}). */
  private static String key(Path path) {
    String p = path.toUri().getPath();
    return p.startsWith("/") ? p.substring(1) : p;
  }

  @Override
  public boolean pendingUploads() {
    try {
      return fs().hasPathCapability(new Path(root), CommonPathCapabilities.FS_MULTIPART_UPLOADER);
    } catch (IOException e) {
      return false;
    }
  }

  /**
   * Through the connector's {@code MultipartUploader} (S3A: one CompleteMultipartUpload, retried
   * by S3A's policy). When the store no longer knows the upload (S3A: {@code
   * FileNotFoundException}, the store's 404 {@code NoSuchUpload}), one HEAD tells whether the
   * object is there with {@code size} bytes: then it was completed already (see {@link
   * AtomicStore#completeUpload}).
   */
  @Override
  public void completeUpload(Path target, byte[] upload, List<byte[]> parts, long size)
      throws IOException {
    Map<Integer, PartHandle> handles = new java.util.TreeMap<>();
    for (int i = 0; i < parts.size(); i++) {
      handles.put(i + 1, BBPartHandle.from(java.nio.ByteBuffer.wrap(parts.get(i))));
    }
    UploadHandle handle = BBUploadHandle.from(java.nio.ByteBuffer.wrap(upload));
    try (MultipartUploader uploader = fs().createMultipartUploader(target.getParent()).build()) {
      uploader.complete(handle, target, handles).get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted completing the upload of " + target);
    } catch (ExecutionException e) {
      Throwable cause = e.getCause();
      long found = size(target);
      if (found == size) {
        LOG.info("sparkguard: the upload of {} was completed already ({} bytes)", target, size);
        return;
      }
      String why = "the upload " + new String(upload, StandardCharsets.UTF_8) + " of " + target
          + " cannot be completed (" + cause + ") and the object is "
          + (found < 0 ? "not there" : "there with " + found + " bytes, not " + size);
      if (cause instanceof FileNotFoundException) {
        FileNotFoundException gone = new FileNotFoundException(why);
        gone.initCause(cause);
        throw gone;
      }
      throw new IOException(why, cause);
    }
  }

  @Override
  public int deleteLeftovers(Path target, java.util.Set<String> keep) throws IOException {
    // The listing of the name's directory: the key's own uploads (abortUploadsUnderPath of the
    // name does not abort them on S3A) and their ids, for keep.
    return deleteLeftovers(target.getParent(), List.of(target), keep);
  }

  /**
   * Connectors without {@code listMultipartUploads}: Hadoop's generic {@code
   * MultipartUploader.abortUploadsUnderPath} of the name; returns how many it aborted.
   */
  private int abortUnderPath(Path target) throws IOException {
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
