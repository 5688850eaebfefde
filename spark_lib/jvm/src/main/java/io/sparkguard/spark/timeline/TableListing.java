package io.sparkguard.spark.timeline;

import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.store.CountingAtomicStore;
import io.sparkguard.spark.store.ObjectStoreAtomicStore;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.hadoop.fs.Path;

/**
 * One read of a table's {@code _sparkguard/} state for one job: the names in {@code timeline/},
 * in {@code owners/<jobId>/}, {@code snapshots/} and {@code archive/}, and whether {@code
 * streams/} holds anything. On an object store with raw listings ({@link
 * ObjectStoreAtomicStore#listSkipping}) it is ONE recursive, delimiter-less LIST of {@code
 * _sparkguard/} while the tree is small (compaction keeps it so), paging when not, and jumping
 * over what no check reads ({@code markers/}, other jobs' owner claims, {@code streams/} after
 * its first key); elsewhere one listing per directory, as the checks made before.
 *
 * <p>Which listing serves which check (docs/storage-contract.md, "A write, step by step"; the
 * order of each read relative to the writes it orders against is unchanged):
 *
 * <ul>
 *   <li>the first listing of {@code setupJob}, before anything is written: the table's
 *       existence ({@code createdLocation}), C0's known instants, O4 (W1's fence), C2's current
 *       claim, W1's rerun check over the hot timeline, and whether compaction is due;
 *   <li>a second listing, after the first (its snapshot part must not precede the hot listing,
 *       "Reading with snapshots"), for the rerun check's archived part, when it is reached: on
 *       S3 only, where the one listing reads {@code snapshots/} before {@code timeline/} (key
 *       order); the listings per directory read the timeline first, so the first serves;
 *   <li>C4's confirmation, after the {@code .inflight}: a fresh listing each poll, which answers
 *       both whether claim n+1 exists and which instants of the job are in the timeline.
 * </ul>
 *
 * <p>Each listing is a snapshot of when it was taken, like the separate listings it replaces
 * (which were each taken at their own moment, with no write of this writer in between, but for
 * the fence's claims of this owner's earlier instants: when one loses, the protocol lists again
 * before the rerun check).
 */
public final class TableListing {
  /** Names in {@code timeline/}, sorted. */
  public final List<String> timeline;
  /** Names in {@code owners/<jobId>/}, sorted. */
  public final List<String> claims;
  /** Names in {@code snapshots/}, sorted. */
  public final List<String> snapshots;
  /** Names in {@code archive/}, sorted. */
  public final List<String> archive;
  /** Whether {@code streams/} holds any file. */
  final boolean streams;
  /** Whether anything at all is under {@code _sparkguard/} (markers included). */
  public final boolean any;
  /**
   * Whether {@code snapshots/} (and {@code archive/}) were listed after {@code timeline/}
   * finished, as {@link Snapshots#load} needs them: true for the listings per directory; false
   * for the one S3 listing, where {@code snapshots/} precedes {@code timeline/} in key order.
   */
  public final boolean snapshotsAfterTimeline;

  private TableListing(List<String> timeline, List<String> claims, List<String> snapshots,
      List<String> archive, boolean streams, boolean any, boolean snapshotsAfterTimeline) {
    this.snapshotsAfterTimeline = snapshotsAfterTimeline;
    this.timeline = timeline;
    this.claims = claims;
    this.snapshots = snapshots;
    this.archive = archive;
    this.streams = streams;
    this.any = any;
  }

  static Path stateDirectory(Path table) {
    return new Path(table, Timeline.SPARKGUARD_DIR);
  }

  /** List the state of {@code table} for job {@code jobId} (see the class comment). */
  public static TableListing list(AtomicStore store, Path table, String jobId) throws IOException {
    return list(store, table, jobId, true);
  }

  /**
   * C4's listing: the job's claims and the timeline (on an object store the same one request
   * as {@link #list(AtomicStore, Path, String)}; elsewhere only those two directories).
   */
  static TableListing claimsAndTimeline(AtomicStore store, Path table, String jobId)
      throws IOException {
    return list(store, table, jobId, false);
  }

  private static TableListing list(AtomicStore store, Path table, String jobId, boolean full)
      throws IOException {
    Path dir = stateDirectory(table);
    AtomicStore inner = store instanceof CountingAtomicStore counting ? counting.inner() : store;
    if (inner instanceof ObjectStoreAtomicStore objects) {
      String ownDir = "owners/" + jobId + "/";
      boolean[] marked = new boolean[2];  // [0]: markers seen, [1]: streams seen
      List<ObjectStoreAtomicStore.Listed> listed =
          objects.listSkipping(dir, name -> skip(jobId, name, marked));
      if (listed != null) {
        if (store != inner) {
          ((CountingAtomicStore) store).countListing(dir, listed.size());
        }
        List<String> timeline = new ArrayList<>();
        List<String> claims = new ArrayList<>();
        List<String> snapshots = new ArrayList<>();
        List<String> archive = new ArrayList<>();
        for (ObjectStoreAtomicStore.Listed object : listed) {
          String name = object.name();
          if (name.startsWith("timeline/")) {
            timeline.add(name.substring("timeline/".length()));
          } else if (name.startsWith(ownDir)) {
            claims.add(name.substring(ownDir.length()));
          } else if (name.startsWith("snapshots/")) {
            snapshots.add(name.substring("snapshots/".length()));
          } else if (name.startsWith("archive/")) {
            archive.add(name.substring("archive/".length()));
          }
        }
        return new TableListing(timeline, claims, snapshots, archive, marked[1],
            marked[0] || marked[1] || !listed.isEmpty(), false);
      }
    }
    // The claims, then the timeline, then the snapshots (after the timeline: the order
    // Snapshots.load reads them in).
    List<String> claims = store.listFiles(new Path(new Path(dir, "owners"), jobId));
    List<String> timeline = store.listFiles(new Path(dir, "timeline"));
    if (!full) {
      return new TableListing(timeline, claims, List.of(), List.of(), false,
          !timeline.isEmpty() || !claims.isEmpty(), false);
    }
    List<String> snapshots = store.listFiles(new Path(dir, "snapshots"));
    List<String> archive = store.listFiles(new Path(dir, "archive"));
    boolean streams = !store.listFiles(new Path(dir, "streams")).isEmpty();
    boolean any = !timeline.isEmpty() || !claims.isEmpty() || !snapshots.isEmpty()
        || !archive.isEmpty() || streams;
    return new TableListing(timeline, claims, snapshots, archive, streams, any, true);
  }

  /**
   * Where the one listing of {@code _sparkguard/} jumps to from {@code name}: past {@code
   * markers/} (no check before the {@code .inflight} reads other instants' markers), past
   * {@code streams/} once it is known to hold something, and over other jobs' owner claims;
   * null for a name the checks read. {@code seen[0]}/{@code seen[1]}: a marker/a stream file
   * was seen.
   */
  static String skip(String jobId, String name, boolean[] seen) {
    String ownDir = "owners/" + jobId + "/";
    if (name.startsWith("markers/")) {
      seen[0] = true;
      return "markers0";  // '0' follows '/': past every markers/ key
    }
    if (name.startsWith("streams/")) {
      seen[1] = true;
      return "streams0";
    }
    if (name.startsWith("owners/") && !name.startsWith(ownDir)) {
      return name.compareTo(ownDir) < 0 ? ownDir : "owners0";
    }
    return null;
  }

  /**
   * Instants in the timeline with an {@code .inflight} (decided or not, any job): at most how
   * many hot instants compaction can count after this write, before its own.
   */
  public int hotInstants() {
    int hot = 0;
    for (String name : timeline) {
      if (name.endsWith(".inflight")) {
        hot++;
      }
    }
    return hot;
  }
}
