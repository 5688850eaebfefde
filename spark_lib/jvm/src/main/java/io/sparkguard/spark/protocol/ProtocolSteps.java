package io.sparkguard.spark.protocol;

import io.sparkguard.spark.common.Concurrently;
import io.sparkguard.spark.common.FirstWriteRules;
import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.common.SparkguardException.UnsupportedWriteException;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.timeline.Timeline;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.internal.SQLConf;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;

/**
 * The steps of docs/storage-contract.md that the batch protocol ({@link
 * io.sparkguard.spark.SparkguardCommitProtocol}, W4-W10) and the streaming file sink's ({@link
 * io.sparkguard.spark.SparkguardStreamingCommitProtocol}, S3-S10) run the same way: choosing the
 * store's write mechanism, marking a file before it is opened, deleting what a failed task attempt
 * opened, verifying and cleaning up before the commit, and deleting the markers after it. Only the
 * steps; what differs (names, what decides the commit) stays in each protocol.
 */
public final class ProtocolSteps {
  private static final Logger LOG = LoggerFactory.getLogger(ProtocolSteps.class);
  static final String SPECULATION_KEY = "spark.speculation";
  static final String MARKER_SUFFIX = ".marker.CREATE";

  private ProtocolSteps() {}

  /** The Hadoop configuration of the running session ({@code spark.hadoop.*} included): the
   * thread's active session, else the default one. */
  public static Configuration hadoopConf() {
    Option<SparkSession> session = SparkSession.getActiveSession();
    if (!session.isDefined()) {
      session = SparkSession.getDefaultSession();
    }
    return session.isDefined()
        ? new Configuration(session.get().sparkContext().hadoopConfiguration())
        : new Configuration();
  }

  /** The marker sidecar's client when the settings ask for batched markers, else null. */
  public static SidecarMarkerClient sidecar(ProtocolSettings settings) {
    return settings.sidecarMarkers()
        ? new SidecarMarkerClient(settings.markerEndpoint(), settings.tokenFile())
        : null;
  }

  /** True when tasks write data files of {@code table} under their final names (object stores:
   * no temp name, no publish). */
  public static boolean writesDirectly(AtomicStore store, String table) {
    Path probe = new Path(table, "probe");
    return store.workPath(probe).equals(probe);
  }

  /**
   * Refuse {@code spark.speculation=true} where data files are written directly under their final
   * names: a speculative copy killed after its twin won closes its writer, which on an object
   * store completes a whole file of partial rows over the winner's (SPARK-10063).
   */
  public static void refuseSpeculation(AtomicStore store, String table) {
    // the rule and its message are shared with the operator's admission (FirstWriteRules)
    String speculation = SQLConf.get().getConfString(SPECULATION_KEY, null);
    if (writesDirectly(store, table) && FirstWriteRules.refuses("speculation", speculation)) {
      throw new UnsupportedWriteException(
          "sparkguard: " + FirstWriteRules.message("speculation", table, speculation));
    }
  }

  /** The marker directory as the sidecar and the Python tools name it: a local absolute path
   * (no scheme) for local tables, the URL otherwise. */
  static String markerDirName(Path markers) {
    String scheme = markers.toUri().getScheme();
    return scheme == null || scheme.equals("file") ? markers.toUri().getPath() : markers.toString();
  }

  /**
   * W4/S3, then what the store needs before Spark's writer opens the file: the marker {@code
   * <relative>.marker.CREATE} in {@code markers} (direct, or through {@code sidecar} when not
   * null), then {@link AtomicStore#prepareWrite} of the work path (Spark's writer opens with
   * {@code create(overwrite=false)}). Returns the path the task writes.
   */
  public static Path markAndPrepare(
      AtomicStore store, SidecarMarkerClient sidecar, Path markers, Path target, String relative)
      throws IOException {
    mark(store, sidecar, markers, relative);
    Path work = store.workPath(target);
    store.prepareWrite(work);
    return work;
  }

  /** W4/S3: the marker {@code <relative>.marker.CREATE} in {@code markers} (direct, or through
   * {@code sidecar} when not null). */
  public static void mark(
      AtomicStore store, SidecarMarkerClient sidecar, Path markers, String relative)
      throws IOException {
    if (sidecar != null) {
      sidecar.create(markerDirName(markers), relative + MARKER_SUFFIX);
    } else {
      store.createMarker(new Path(markers, relative + MARKER_SUFFIX));
    }
  }

  /**
   * A failed task attempt: delete only the files it opened ({@code pending}: relative path to
   * the path it wrote). Rename stores: its temp files, never a published name (a previous run,
   * or another attempt, may own it). Direct-write stores: Spark closed the aborted writer, which
   * completed the upload under the final name with partial rows; the protocols never let a
   * write's names be committed ones there, so they go now, before a plain reader sees them.
   * A failed delete is logged: the commit (W8/S6) or a rollback removes the file.
   */
  public static void deleteAttemptFiles(
      AtomicStore store, String table, Map<String, Path> pending) {
    boolean direct = writesDirectly(store, table);
    for (Map.Entry<String, Path> entry : pending.entrySet()) {
      if (direct || !entry.getValue().equals(new Path(table, entry.getKey()))) {
        try {
          store.delete(entry.getValue());
        } catch (IOException e) {
          LOG.warn("sparkguard: cannot delete {} of an aborted task (a rollback removes it)",
              entry.getValue(), e);
        }
      }
    }
    if (direct && store.pendingUploads() && !pending.isEmpty()) {
      // The attempt's pending uploads (its writers' close left them open): one listing.
      try {
        store.deleteLeftovers(new Path(table), pending.values());
      } catch (IOException e) {
        LOG.warn("sparkguard: cannot abort the uploads of an aborted task of {} (a rollback"
            + " aborts them)", table, e);
      }
    }
  }

  /**
   * W7/W8 (S6): every reported file is there with the size its task saw (else a {@link
   * SparkguardException} ending with {@code notCommitted}); then the marked names no task
   * reported (a failed attempt's names) are deleted, and the leftovers (temp files, incomplete
   * uploads) of every marked name. {@code unpublished}: relative name to the temp file its
   * accepted attempt left for the driver to publish after the outcome ({@link
   * AtomicStore#publishesOnDriver}); that file is the one verified, and kept, while every other
   * temp file of the name (a speculative or failed attempt's) goes.
   */
  public static void verifyAndClean(
      AtomicStore store, String table, Path markers, Map<String, Long> reported,
      Map<String, Path> unpublished, String notCommitted) throws IOException {
    verifyAndClean(store, table, markers, reported, unpublished, Map.of(), notCommitted);
  }

  /**
   * {@link #verifyAndClean(AtomicStore, String, Path, Map, Map, String)} where some reported
   * files are pending uploads ({@link AtomicStore#pendingUploads}): {@code uploads}, relative
   * name to the upload id its accepted attempt left for the driver to complete after the
   * outcome. Such a file is not in the store yet, so its size is the task's report (its parts'
   * lengths); its upload is kept, while every other incomplete upload of the name goes.
   */
  public static void verifyAndClean(
      AtomicStore store, String table, Path markers, Map<String, Long> reported,
      Map<String, Path> unpublished, Map<String, String> uploads, String notCommitted)
      throws IOException {
    List<String> names = new ArrayList<>();
    List<Path> paths = new ArrayList<>();
    for (String relative : reported.keySet()) {
      if (uploads.containsKey(relative)) {
        continue;
      }
      names.add(relative);
      Path work = unpublished.get(relative);
      paths.add(work != null ? work : new Path(table, relative));
    }
    long[] sizes = store.sizes(paths);
    for (int i = 0; i < sizes.length; i++) {
      long expected = reported.get(names.get(i));
      if (sizes[i] != expected) {
        throw new SparkguardException(
            "sparkguard: " + names.get(i) + " of " + table + " has " + sizes[i] + " bytes, its"
                + " task reported " + expected + "; " + notCommitted);
      }
    }
    Set<String> keep = new java.util.HashSet<>(uploads.values());
    unpublished.values().forEach(work -> keep.add(work.getName()));
    Set<String> marked = Timeline.markedFiles(store, markers);
    List<Path> targets = new ArrayList<>();
    for (String relative : marked) {
      Path target = new Path(table, relative);
      if (!reported.containsKey(relative)) {
        store.delete(target);
      }
      targets.add(target);
    }
    Set<String> seen = new java.util.HashSet<>();
    if (store.deleteLeftoversSeeing(new Path(table), targets, keep, seen)) {
      // W7 of a pending upload: the store still holds it (its parts were acknowledged to the
      // task; an upload aborted since, by hand or by a lifecycle rule, cannot be completed).
      for (Map.Entry<String, String> upload : uploads.entrySet()) {
        if (!seen.contains(upload.getValue())) {
          throw new SparkguardException("sparkguard: " + upload.getKey() + " of " + table
              + " was left as upload " + upload.getValue() + ", which the store no longer"
              + " holds (aborted by a lifecycle rule or by hand?); " + notCommitted);
        }
      }
    }
  }

  /**
   * W8/S6, before the markers are read: the sidecar (if it keeps them) acknowledges no marker
   * of the instant from now on, so none postdates the read (docs/sidecar.md, "The commit's
   * seal"). Direct markers cannot be sealed.
   */
  public static void sealMarkers(SidecarMarkerClient sidecar, Path markers) {
    if (sidecar != null && !sidecar.seal(markerDirName(markers))) {
      LOG.warn("sparkguard: the marker sidecar has no seal route (an older version); a straggler's"
          + " marker for {} is acknowledged until the outcome exists", markers);
    }
  }

  /** W10/S10: delete the instant's marker directory (through the sidecar when it keeps them). */
  public static void deleteMarkers(AtomicStore store, SidecarMarkerClient sidecar, Path markers)
      throws IOException {
    if (sidecar != null) {
      sidecar.deleteDir(markerDirName(markers));
    } else {
      store.deleteDirectory(markers);
    }
  }

  /** How many marked names an abort deletes at once. */
  static final int REMOVAL_THREADS = 8;

  /** What deleting one marked name found: whether its file existed. */
  record Removed(String relative, boolean existed) {}

  /**
   * Delete the file of each of {@code relative}, up to {@link #REMOVAL_THREADS} at once (on an
   * object store each delete is a few sequential requests: independent names need not wait for
   * each other). The answer says which files existed, in the order of {@code relative}; the
   * first failure is thrown once every delete has ended. The caller removes the names'
   * leftovers first.
   */
  static List<Removed> removeConcurrently(AtomicStore store, String table, List<String> relative)
      throws IOException {
    return Concurrently.map(relative, REMOVAL_THREADS, "sparkguard-abort-delete",
        name -> new Removed(name, store.delete(new Path(table, name))));
  }

  /** How many names {@code .rolledback}'s lists record, as the Python rollback does. */
  static final int RECORDED_NAMES_LIMIT = 1000;

  /**
   * R4-R8 of docs/storage-contract.md ("Rollback, step by step") for {@code instant}, which the
   * caller's abort has just claimed as rolled back (its put-if-absent won, so no commit and no
   * other cleanup of it has started): delete the leftovers and the files of every marked name,
   * record {@code <instant>.rolledback} (put-if-absent, {@code complete}: the files are gone;
   * the names are recorded before any marker is deleted), then delete exactly the markers read.
   *
   * <p>Only when it is plainly safe: every file in the marker directory must be a marker, a
   * whole {@code MARKERS<i>} batch file (every line a marker name, ending with a newline) or
   * {@code MARKERS.type}; no other undecided instant of the job may mark one of the names (O2);
   * and {@code keep} (names a commit lists) must not meet them. Otherwise nothing is deleted and
   * the instant stays ROLLING_BACK for {@code sparkguard rollback}, which handles every case
   * (torn lines, protected and committed names). A task still running publishes its file
   * afterwards under a recorded name (the next rollback pass deletes it) or with a marker
   * created after the listing (kept here: the next rollback finds it).
   *
   * @return the {@code .rolledback} body written, or {@code null} when it left the instant
   */
  public static Map<String, Object> finishClaimedRollback(
      AtomicStore store, SidecarMarkerClient sidecar, Timeline timeline, String table,
      String instant, String jobId, Set<String> keep, String protocol) throws IOException {
    Path markers = timeline.markerDirectory(instant);
    List<String> files = store.listFiles(markers);
    Set<String> marked = plainMarkedNames(store, markers, files);
    if (marked == null || !java.util.Collections.disjoint(marked, keep)) {
      return null;
    }
    for (String other : timeline.undecided(jobId)) {
      Set<String> theirs = Timeline.markedFiles(store, timeline.markerDirectory(other));
      if (!other.equals(instant) && !java.util.Collections.disjoint(marked, theirs)) {
        return null;  // O2: a live instant marked one of these names
      }
    }
    List<String> deleted = new ArrayList<>();
    List<String> absent = new ArrayList<>();
    // Leftovers first (one uploads listing on an object store): an upload or temp file of a
    // name published meanwhile then fails to publish.
    List<Path> targets = new ArrayList<>();
    for (String relative : marked) {
      targets.add(new Path(table, relative));
    }
    int temps = store.deleteLeftovers(new Path(table), targets);
    for (Removed removed : removeConcurrently(store, table, new ArrayList<>(marked))) {
      (removed.existed ? deleted : absent).add(removed.relative);
    }
    Map<String, Object> body = new java.util.TreeMap<>();
    body.put("owner", timeline.ownerOf(instant));
    body.put("marked", new ArrayList<>(marked));
    body.put("filesDeleted", deleted.size());
    body.put("tempFilesRemoved", temps);
    body.put("filesKept", List.of());
    body.put("deleted", deleted.subList(0, Math.min(deleted.size(), RECORDED_NAMES_LIMIT)));
    body.put("absent", absent.subList(0, Math.min(absent.size(), RECORDED_NAMES_LIMIT)));
    body.put("passes", 1);
    body.put("complete", true);
    body.put("warnings", List.of());
    body.put("protocol", protocol);
    if (!timeline.recordRolledBack(instant, body)) {
      return null;  // a rollback got here first: the markers are its to delete
    }
    if (sidecar != null) {
      sidecar.deleteDir(markerDirName(markers));  // it refuses markers of a decided instant
    } else {
      // Exactly the markers read, MARKERS.type last: one created since the listing stays.
      for (String file : files) {
        if (!file.equals("MARKERS.type")) {
          store.delete(new Path(markers, file));
        }
      }
      store.delete(new Path(markers, "MARKERS.type"));
      if (store.listFiles(markers).isEmpty()) {
        store.deleteDirectory(markers);
      }
    }
    return body;
  }

  /**
   * The names marked in {@code markers} (whose files are {@code files}), or {@code null} when
   * any file there is not plainly a marker, a whole batch file or {@code MARKERS.type}.
   */
  private static Set<String> plainMarkedNames(AtomicStore store, Path markers, List<String> files)
      throws IOException {
    Set<String> marked = new java.util.TreeSet<>();
    for (String file : files) {
      if (file.equals("MARKERS.type")) {
        continue;
      }
      if (file.matches("MARKERS(0|[1-9][0-9]{0,5})")) {
        String text =
            new String(store.read(new Path(markers, file)), java.nio.charset.StandardCharsets.UTF_8);
        if (!text.isEmpty() && !text.endsWith("\n")) {
          return null;  // a torn last line
        }
        for (String line : text.split("\n")) {
          if (!line.isBlank() && !addMarkerName(marked, line.strip())) {
            return null;
          }
        }
      } else if (!addMarkerName(marked, file)) {
        return null;
      }
    }
    return marked;
  }

  private static boolean addMarkerName(Set<String> marked, String name) {
    for (String io : new String[] {".marker.CREATE", ".marker.MERGE", ".marker.APPEND"}) {
      String file = name.endsWith(io) ? name.substring(0, name.length() - io.length()) : "";
      if (!file.isEmpty() && !file.startsWith("/") && !file.contains("..")) {
        marked.add(file);
        return true;
      }
    }
    return false;
  }

  /**
   * The outcome's {@code extra.partitionBy} (the {@code key=} directories of the first file)
   * and {@code extra.format} (from its extension, when known), put into {@code extra}.
   */
  public static void putLayout(Map<String, Object> extra, Iterable<String> relativePaths) {
    List<String> partitionBy = new ArrayList<>();
    for (String relative : relativePaths) {
      String[] parts = relative.split("/");
      for (int i = 0; i < parts.length - 1; i++) {
        int eq = parts[i].indexOf('=');
        if (eq > 0) {
          partitionBy.add(parts[i].substring(0, eq));
        }
      }
      String format = formatOf(parts[parts.length - 1]);
      if (format != null) {
        extra.put("format", format);
      }
      break;
    }
    extra.put("partitionBy", partitionBy);
  }

  /** The Spark data source name of a data file, from its extension (null if unknown). */
  static String formatOf(String fileName) {
    for (String format : new String[] {"parquet", "orc", "json", "csv", "avro", "txt"}) {
      if (fileName.endsWith("." + format) || fileName.contains("." + format + ".")) {
        return format.equals("txt") ? "text" : format;
      }
    }
    return null;
  }
}
