package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.databind.JsonNode;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.timeline.Commits.Commit;
import io.sparkguard.spark.timeline.Commits.DataFile;
import io.sparkguard.spark.timeline.Snapshots.Instant;
import io.sparkguard.spark.timeline.Snapshots.View;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A table's committed state read through its newest valid snapshot and the uncovered instants
 * (docs/storage-contract.md, "Reading with snapshots", steps 1-5): the Java counterpart of the
 * Python reader's {@code committed_files}, used by the shared test vectors and the compactor.
 */
final class TableState {
  private static final Logger LOG = LoggerFactory.getLogger(TableState.class);

  final View view;
  /** The uncovered decided instants (archived-hot ones included), by id; void ones left out. */
  final Map<String, Instant> uncovered;
  /** Uncovered hot instants without {@code .inflight} (whatever else they have): void. */
  final Set<String> voidOutcomes;

  private TableState(View view, Map<String, Instant> uncovered, Set<String> voidOutcomes) {
    this.view = view;
    this.uncovered = uncovered;
    this.voidOutcomes = voidOutcomes;
  }

  /** Thrown inside a read when a file listed a moment ago is gone (archived meanwhile). */
  private static final class Vanished extends IOException {
    private static final long serialVersionUID = 1L;

    Vanished(Path path) {
      super(path + " vanished");
    }
  }

  /**
   * Load the state of {@code table}. {@code withRolledBack}: also read the {@code .rolledback}
   * of uncovered instants (the compactor needs them; readers do not).
   */
  static TableState load(AtomicStore store, Path table, boolean withRolledBack)
      throws IOException {
    Vanished last = null;
    for (int attempt = 0; attempt < Snapshots.MAX_RESTARTS; attempt++) {
      try {
        return loadOnce(store, table, withRolledBack);
      } catch (Vanished e) {
        last = e;
      }
    }
    throw new SparkguardException("sparkguard: the timeline of " + table + " kept changing under"
        + " the reader (" + Snapshots.MAX_RESTARTS + " restarts: instants archived while read);"
        + " try again", last);
  }

  private static TableState loadOnce(AtomicStore store, Path table, boolean withRolledBack)
      throws IOException {
    View view = Snapshots.load(store, table);
    Timeline timeline = new Timeline(store, table);
    Map<String, Instant> uncovered = new TreeMap<>();
    for (Map.Entry<String, Instant> archived : view.archivedHot().entrySet()) {
      if (!view.covers(archived.getKey())) {
        uncovered.put(archived.getKey(), archived.getValue());
      }
    }
    Set<String> voids = new TreeSet<>();
    for (Map.Entry<String, Set<String>> entry : view.hotInstants().entrySet()) {
      String id = entry.getKey();
      Set<String> suffixes = entry.getValue();
      if (view.covers(id)) {
        continue;  // covered (archive step unfinished)
      }
      if (!suffixes.contains("inflight")) {
        // Void ("Void instants"): a zombie's outcome after archiving, or a .rolledback a
        // rollback pass rewrote after C6; or half-deleted by C6, with its documents in a
        // damaged snapshot's archive (then taken from there).
        if (!uncovered.containsKey(id)) {
          voids.add(id);
        }
        continue;
      }
      if (!suffixes.contains("outcome")) {
        continue;  // undecided
      }
      JsonNode outcome = Snapshots.json(mustRead(store, timeline.file(id, ".outcome")));
      JsonNode inflight = Snapshots.json(mustRead(store, timeline.file(id, ".inflight")));
      JsonNode rolledback = withRolledBack && suffixes.contains("rolledback")
          ? Snapshots.json(Snapshots.readIfExists(store, timeline.file(id, ".rolledback"))) : null;
      uncovered.put(id, new Instant(id, inflight, outcome, rolledback));
    }
    if (!voids.isEmpty()) {
      // An outcome without .inflight is void, or half-deleted by a compactor's C6 of a snapshot
      // newer than the one loaded: then read again, from that snapshot.
      for (String name : store.listFiles(Snapshots.snapshotsDir(table))) {
        java.util.regex.Matcher m = Snapshots.SNAPSHOT_NAME.matcher(name);
        if (m.matches() && (view.numbers().isEmpty()
            || Long.parseLong(m.group(1)) > view.numbers().last())) {
          throw new Vanished(Snapshots.snapshotsDir(table));
        }
      }
    }
    return new TableState(view, uncovered, voids);
  }

  private static byte[] mustRead(AtomicStore store, Path path) throws IOException {
    byte[] bytes = Snapshots.readIfExists(store, path);
    if (bytes == null) {
      throw new Vanished(path);
    }
    return bytes;
  }

  /** Every commit: the snapshot's, then the uncovered committed instants (no registrations). */
  List<Commit> commits() {
    List<Commit> commits = new ArrayList<>();
    String maxOrder = "";
    if (view.snapshot() != null) {
      commits.addAll(view.snapshot().commits());
      maxOrder = view.snapshot().maxOrder();
    }
    List<Commit> after = new ArrayList<>();
    for (Instant instant : uncovered.values()) {
      if (!instant.committed()) {
        continue;
      }
      Commit commit = Commits.ofInstant(instant.id(), node(instant.inflight()), instant.outcome());
      if (commit.operation().equals("stream-register")) {
        continue;
      }
      if (commit.order().compareTo(maxOrder) < 0) {
        LOG.warn("sparkguard: commit {} is ordered before snapshot {}'s newest commit ({} < {});"
            + " applied after the snapshot", instant.id(), view.snapshot().number(),
            commit.order(), maxOrder);
      }
      after.add(commit);
    }
    // "applied by committedAt as always", after the snapshot's commits: the snapshot's are
    // ordered first by construction (a prefix of the commit order).
    List<Commit> ordered = new ArrayList<>(Commits.compactedOrder(commits));
    after.sort(Commits.ORDER);
    ordered.addAll(after);
    return ordered;
  }

  private static JsonNode node(JsonNode inflight) {
    return inflight == null ? Snapshots.JSON.createObjectNode() : inflight;
  }

  /** Relative path -> visible file: the snapshot's commits, then the uncovered ones. */
  Map<String, DataFile> visibleFiles() {
    return Commits.visibleInSequence(commits());
  }

  /**
   * Job id -> the committed batch write identities (sorted, distinct): the snapshot's {@code
   * jobs.<job>.writes} and the uncovered committed instants (not {@code stream-*}).
   */
  Map<String, List<Integer>> committedWrites() {
    Map<String, Set<Integer>> writes = new TreeMap<>();
    if (view.snapshot() != null) {
      view.snapshot().jobs().fields().forEachRemaining(job -> {
        for (JsonNode entry : job.getValue().path("writes")) {
          writes.computeIfAbsent(job.getKey(), k -> new TreeSet<>()).add(entry.path("write").asInt(0));
        }
      });
    }
    for (Instant instant : uncovered.values()) {
      if (!instant.committed()) {
        continue;
      }
      String operation = node(instant.inflight()).path("operation").asText();
      String committedOp = instant.outcome().path("extra").path("operation").asText();
      if (operation.startsWith("stream-") || committedOp.startsWith("stream-")) {
        continue;
      }
      writes.computeIfAbsent(instant.jobId(), k -> new TreeSet<>())
          .add(node(instant.inflight()).path("write").asInt(0));
    }
    Map<String, List<Integer>> result = new TreeMap<>();
    writes.forEach((job, set) -> result.put(job, new ArrayList<>(set)));
    return result;
  }
}
