package io.sparkguard.spark;

import io.sparkguard.spark.SparkguardException.UnsupportedWriteException;
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
 * SparkguardCommitProtocol}, W4-W10) and the streaming file sink's ({@link
 * SparkguardStreamingCommitProtocol}, S3-S10) run the same way: choosing the store's write
 * mechanism, marking a file before it is opened, deleting what a failed task attempt opened,
 * verifying and cleaning up before the commit, and deleting the markers after it. Only the
 * steps; what differs (names, what decides the commit) stays in each protocol.
 */
final class ProtocolSteps {
  private static final Logger LOG = LoggerFactory.getLogger(ProtocolSteps.class);
  static final String SPECULATION_KEY = "spark.speculation";
  static final String MARKER_SUFFIX = ".marker.CREATE";

  private ProtocolSteps() {}

  /** The Hadoop configuration of the running session ({@code spark.hadoop.*} included): the
   * thread's active session, else the default one. */
  static Configuration hadoopConf() {
    Option<SparkSession> session = SparkSession.getActiveSession();
    if (!session.isDefined()) {
      session = SparkSession.getDefaultSession();
    }
    return session.isDefined()
        ? new Configuration(session.get().sparkContext().hadoopConfiguration())
        : new Configuration();
  }

  /** The marker sidecar's client when the settings ask for batched markers, else null. */
  static SidecarMarkerClient sidecar(ProtocolSettings settings) {
    return settings.sidecarMarkers()
        ? new SidecarMarkerClient(settings.markerEndpoint(), settings.tokenFile())
        : null;
  }

  /** True when tasks write data files of {@code table} under their final names (object stores:
   * no temp name, no publish). */
  static boolean writesDirectly(AtomicStore store, String table) {
    Path probe = new Path(table, "probe");
    return store.workPath(probe).equals(probe);
  }

  /**
   * Refuse {@code spark.speculation=true} where data files are written directly under their final
   * names: a speculative copy killed after its twin won closes its writer, which on an object
   * store completes a whole file of partial rows over the winner's (SPARK-10063).
   */
  static void refuseSpeculation(AtomicStore store, String table) {
    if (writesDirectly(store, table)
        && SQLConf.get().getConfString(SPECULATION_KEY, "false").trim().equalsIgnoreCase("true")) {
      throw new UnsupportedWriteException(
          "sparkguard: " + table + " is written directly under its final names (object store),"
              + " where a speculative task copy that is killed publishes a file of partial rows"
              + " over the winner's: set " + SPECULATION_KEY + "=false for this job");
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
  static Path markAndPrepare(
      AtomicStore store, SidecarMarkerClient sidecar, Path markers, Path target, String relative)
      throws IOException {
    if (sidecar != null) {
      sidecar.create(markerDirName(markers), relative + MARKER_SUFFIX);
    } else {
      store.createMarker(new Path(markers, relative + MARKER_SUFFIX));
    }
    Path work = store.workPath(target);
    store.prepareWrite(work);
    return work;
  }

  /**
   * A failed task attempt: delete only the files it opened ({@code pending}: relative path to
   * the path it wrote). Rename stores: its temp files, never a published name (a previous run,
   * or another attempt, may own it). Direct-write stores: Spark closed the aborted writer, which
   * completed the upload under the final name with partial rows; the protocols never let a
   * write's names be committed ones there, so they go now, before a plain reader sees them.
   * A failed delete is logged: the commit (W8/S6) or a rollback removes the file.
   */
  static void deleteAttemptFiles(AtomicStore store, String table, Map<String, Path> pending) {
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
  }

  /**
   * W7/W8 (S6): every reported file is there with the size its task saw (else a {@link
   * SparkguardException} ending with {@code notCommitted}); then the marked names no task
   * reported (a failed attempt's names) are deleted, and the leftovers (temp files, incomplete
   * uploads) of every marked name.
   */
  static void verifyAndClean(
      AtomicStore store, String table, Path markers, Map<String, Long> reported,
      String notCommitted) throws IOException {
    for (Map.Entry<String, Long> file : reported.entrySet()) {
      long size = store.size(new Path(table, file.getKey()));
      if (size != file.getValue()) {
        throw new SparkguardException(
            "sparkguard: " + file.getKey() + " of " + table + " has " + size + " bytes, its task"
                + " reported " + file.getValue() + "; " + notCommitted);
      }
    }
    Set<String> marked = SparkguardCommitProtocol.markedFiles(store, markers);
    for (String relative : marked) {
      Path target = new Path(table, relative);
      if (!reported.containsKey(relative)) {
        store.delete(target);
      }
      store.deleteLeftovers(target);
    }
  }

  /** W10/S10: delete the instant's marker directory (through the sidecar when it keeps them). */
  static void deleteMarkers(AtomicStore store, SidecarMarkerClient sidecar, Path markers)
      throws IOException {
    if (sidecar != null) {
      sidecar.deleteDir(markerDirName(markers));
    } else {
      store.deleteDirectory(markers);
    }
  }

  /**
   * The outcome's {@code extra.partitionBy} (the {@code key=} directories of the first file)
   * and {@code extra.format} (from its extension, when known), put into {@code extra}.
   */
  static void putLayout(Map<String, Object> extra, Iterable<String> relativePaths) {
    List<String> partitionBy = new ArrayList<>();
    for (String relative : relativePaths) {
      String[] parts = relative.split("/");
      for (int i = 0; i < parts.length - 1; i++) {
        int eq = parts[i].indexOf('=');
        if (eq > 0) {
          partitionBy.add(parts[i].substring(0, eq));
        }
      }
      String format = SparkguardCommitProtocol.formatOf(parts[parts.length - 1]);
      if (format != null) {
        extra.put("format", format);
      }
      break;
    }
    extra.put("partitionBy", partitionBy);
  }
}
