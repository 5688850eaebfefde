package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.databind.JsonNode;
import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.timeline.Commits.Commit;
import io.sparkguard.spark.timeline.Snapshots.Instant;
import io.sparkguard.spark.timeline.Snapshots.Snapshot;
import io.sparkguard.spark.timeline.Snapshots.View;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Timeline compaction, steps C1-C7 of docs/storage-contract.md ("Compaction, step by step"):
 * a put-if-absent snapshot of the committed state of the settled instants no snapshot covers,
 * the {@code LATEST} hint, the archive, then the covered instants deleted from {@code
 * timeline/} ({@code .inflight} first). Every step is a put-if-absent or an idempotent delete:
 * any number of compactors may run at once and a crash anywhere is repaired by the next run.
 * The JVM protocols run it best effort at the end of {@code commitJob} ({@link
 * #afterCommit}).
 */
public final class Compactor {
  private static final Logger LOG = LoggerFactory.getLogger(Compactor.class);
  /** The late-file retention of {@code jobs.<job>.rolledBack} (docs/storage-contract.md). */
  static final Duration LATE_FILE_RETENTION = Duration.ofDays(7);
  /** C7: snapshots kept. */
  static final int KEEP_SNAPSHOTS = 3;

  /** What one run did. */
  enum Result { NOTHING_TO_DO, BELOW_THRESHOLD, SKIPPED_STREAM_LOGS, LOST_RACE, COMPACTED,
    FINISHED_ARCHIVE }

  /**
   * A test hook: called before each storage step (C3, C4, C5, each C6 batch, C7) with its name;
   * throwing from it simulates a crash there. Production code never sets it.
   */
  interface StepHook {
    void before(String step) throws IOException;
  }

  private final AtomicStore store;
  private final Path table;
  private final StepHook hook;
  /** The snapshot number the last successful run published (tests). */
  long published = -1;

  Compactor(AtomicStore store, Path table) {
    this(store, table, step -> { });
  }

  Compactor(AtomicStore store, Path table, StepHook hook) {
    this.store = store;
    this.table = table;
    this.hook = hook;
  }

  /**
   * The protocols' call after their own commit: compact when {@code settings.snapshotEvery()}
   * (not 0) settled uncovered instants are hot. Never throws: an error is logged as a warning.
   */
  public static void afterCommit(AtomicStore store, Path table, ProtocolSettings settings) {
    afterCommit(store, table, settings, -1);
  }

  /**
   * {@link #afterCommit(AtomicStore, Path, ProtocolSettings)} knowing {@code atMost}: how many
   * decided hot instants there can be now, counted from a listing the write made at its start
   * (every instant then, plus its own), or -1 when unknown. Below the threshold nothing is
   * listed: compaction is not due (a write opened and decided since that listing is counted by
   * the next commit, which compacts then).
   */
  public static void afterCommit(
      AtomicStore store, Path table, ProtocolSettings settings, int atMost) {
    if (settings.snapshotEvery() <= 0) {
      return;
    }
    if (settings.snapshotEvery() > 1 && atMost >= 0 && atMost < settings.snapshotEvery()) {
      return;  // the run would stop at BELOW_THRESHOLD: spare its two listings
    }
    try {
      new Compactor(store, table).run(settings.snapshotEvery(), settings.archiveRetentionDays());
    } catch (IOException | RuntimeException e) {
      LOG.warn("sparkguard: compacting the timeline of {} failed (the write is committed; the"
          + " next commit tries again): {}", table, e.toString());
    }
  }

  /**
   * Run C1-C7 once. {@code threshold}: the fewest eligible uncovered instants worth a snapshot
   * (1 for an explicit compaction). {@code retentionDays}: -1 keeps archives.
   */
  Result run(int threshold, int retentionDays) throws IOException {
    if (!store.listFiles(new Path(new Path(table, Timeline.SPARKGUARD_DIR), "streams")).isEmpty()) {
      // The Python sink's stream logs: their batches take part in the commit order; the Python
      // compactor (sparkguard compact) handles them.
      LOG.info("sparkguard: {} has Python stream logs; leaving its compaction to 'sparkguard"
          + " compact'", table);
      return Result.SKIPPED_STREAM_LOGS;
    }
    if (threshold > 1 && decidedHot() < threshold) {
      return Result.BELOW_THRESHOLD;  // one listing: fewer decided hot instants than needed
    }
    // C1
    TableState state = TableState.load(store, table, true);
    View view = state.view;
    Snapshot previous = view.snapshot();
    Set<String> markerDirs = new HashSet<>();
    for (String file : store.listFiles(new Path(new Path(table, Timeline.SPARKGUARD_DIR), "markers"))) {
      markerDirs.add(file.split("/", 2)[0]);
    }
    // C2: the eligible (settled) uncovered instants, a prefix of the commit order.
    Map<String, Instant> settled = new TreeMap<>();
    String bound = null;  // the smallest committedAt of a committed instant that is not settled
    for (Instant instant : state.uncovered.values()) {
      boolean markers = markerDirs.contains(instant.id());
      if (instant.committed()) {
        if (markers) {
          bound = min(bound, orderOf(instant));
        } else {
          settled.put(instant.id(), instant);
        }
      } else if (instant.rolledBack() && !markers && instant.rolledback() != null
          && instant.rolledback().path("complete").asBoolean(false)) {
        settled.put(instant.id(), instant);
      }
    }
    if (bound != null) {
      String limit = bound;
      settled.values().removeIf(i -> i.committed() && orderOf(i).compareTo(limit) >= 0);
    }
    if (settled.size() < Math.max(1, threshold)) {
      List<String> leftover = new ArrayList<>();
      for (String id : view.hotInstants().keySet()) {
        if (view.covers(id)) {
          leftover.add(id);
        }
      }
      if (previous != null && (!leftover.isEmpty() || !state.voidOutcomes.isEmpty())) {
        // An archive step that did not finish (a crash in C5/C6), or a zombie's void outcome:
        // finish them for the newest snapshot, which lists its still-hot instants.
        hook.before("C5");
        archive(previous.number(), leftover, view, state);
        delete(leftover, state.voidOutcomes);
        return Result.FINISHED_ARCHIVE;
      }
      return settled.isEmpty() ? Result.NOTHING_TO_DO : Result.BELOW_THRESHOLD;
    }
    long next = (view.numbers().isEmpty() ? 0 : view.numbers().last()) + 1;
    Map<String, Object> snapshot = build(next, previous, settled, view, state);
    @SuppressWarnings("unchecked")
    List<String> instants = (List<String>) snapshot.get("instants");
    // C3
    hook.before("C3");
    Path snapshots = Snapshots.snapshotsDir(table);
    if (!store.putIfAbsent(new Path(snapshots, Snapshots.snapshotName(next)),
        Timeline.encode(Snapshots.SNAPSHOT_KIND, snapshot))) {
      LOG.info("sparkguard: another compactor wrote snapshot {} of {}", next, table);
      return Result.LOST_RACE;
    }
    // C4 (a hint: nothing depends on it)
    hook.before("C4");
    store.overwrite(new Path(snapshots, "LATEST"), (next + "\n").getBytes(StandardCharsets.UTF_8));
    // C5
    hook.before("C5");
    archive(next, instants, view, state);
    // C6
    delete(instants, state.voidOutcomes);
    // C7
    hook.before("C7");
    retire(next, retentionDays);
    published = next;
    LOG.info("sparkguard: snapshot {} of {} covers {} more instants", next, table,
        settled.size());
    return Result.COMPACTED;
  }

  /** Hot instants with both {@code .inflight} and {@code .outcome}, from one listing. */
  private int decidedHot() throws IOException {
    Set<String> names = new HashSet<>(store.listFiles(new Timeline(store, table).directory()));
    int decided = 0;
    for (String name : names) {
      if (name.endsWith(".outcome") && names.contains(
          name.substring(0, name.length() - ".outcome".length()) + ".inflight")) {
        decided++;
      }
    }
    return decided;
  }

  private static String min(String a, String b) {
    return a == null || b.compareTo(a) < 0 ? b : a;
  }

  private static String orderOf(Instant instant) {
    String at = instant.outcome().path("extra").path("committedAt").asText("");
    return at.isEmpty() ? instant.id().substring(0, 17) : at;
  }

  /** C2: the document of snapshot {@code next}. */
  private Map<String, Object> build(long next, Snapshot previous, Map<String, Instant> settled,
      View view, TableState state) {
    List<Commit> sequence = new ArrayList<>();
    Set<String> superseded = new TreeSet<>();
    String maxOrder = "";
    Map<String, Object> streams = new TreeMap<>();
    Map<String, Map<String, Object>> writes = new TreeMap<>();  // job -> identity key -> entry
    Map<String, List<Map<String, Object>>> rolledBack = new TreeMap<>();
    OffsetDateTime now = OffsetDateTime.now(ZoneOffset.UTC);
    if (previous != null) {
      sequence.addAll(Commits.compactedOrder(previous.commits()));
      superseded.addAll(previous.superseded());
      maxOrder = previous.maxOrder();
      previous.streams().fields().forEachRemaining(
          e -> streams.put(e.getKey(), Snapshots.JSON.convertValue(e.getValue(), Map.class)));
      previous.jobs().fields().forEachRemaining(job -> {
        for (JsonNode entry : job.getValue().path("writes")) {
          addWrite(writes, job.getKey(), Snapshots.JSON.convertValue(entry, Map.class));
        }
        for (JsonNode entry : job.getValue().path("rolledBack")) {
          if (recent(entry.path("decided").asText(""), now)) {
            rolledBack.computeIfAbsent(job.getKey(), k -> new ArrayList<>())
                .add(Snapshots.JSON.convertValue(entry, Map.class));
          }
        }
      });
    }
    List<Commit> covered = new ArrayList<>();
    for (Instant instant : settled.values()) {
      JsonNode inflight = instant.inflight() == null
          ? Snapshots.JSON.createObjectNode() : instant.inflight();
      if (instant.committed()) {
        Commit commit = Commits.ofInstant(instant.id(), inflight, instant.outcome());
        if (commit.operation().equals("stream-register")) {
          Map<String, Object> stream = new TreeMap<>();
          stream.put("format", commit.format());
          stream.put("schema", commit.schema());
          stream.put("throughBatch", -1);
          streams.putIfAbsent(commit.jobId(), stream);
          continue;
        }
        covered.add(commit);
        maxOrder = commit.order().compareTo(maxOrder) > 0 ? commit.order() : maxOrder;
        if (!commit.operation().startsWith("stream-")
            && !inflight.path("operation").asText().startsWith("stream-")) {
          Map<String, Object> entry = new TreeMap<>();
          entry.put("write", commit.write());
          entry.put("instant", instant.id());
          JsonNode micro = inflight.path("extra").path(MicroBatch.EXTRA_KEY);
          entry.put(MicroBatch.EXTRA_KEY, micro.isObject()
              ? Snapshots.JSON.convertValue(micro, Map.class) : null);
          addWrite(writes, instant.jobId(), entry);
        }
      } else {
        JsonNode marked = instant.rolledback().path("marked");
        // the end of the last pass, as the Python compactor records it (never before the outcome)
        String decided = instant.rolledback().path("finished")
            .asText(instant.outcome().path("decided").asText(""));
        if (marked.isArray() && marked.size() > 0 && recent(decided, now)) {
          Map<String, Object> entry = new TreeMap<>();
          entry.put("instant", instant.id());
          entry.put("owner", instant.rolledback().path("owner").asText(
              inflight.path("owner").asText("job:" + instant.jobId())));
          entry.put("decided", decided);
          entry.put("marked", Snapshots.JSON.convertValue(marked, List.class));
          rolledBack.computeIfAbsent(instant.jobId(), k -> new ArrayList<>()).add(entry);
        }
      }
    }
    sequence.addAll(Commits.compactedOrder(covered));
    superseded.addAll(Commits.supersededInSequence(sequence));
    List<Commit> kept = Commits.compacted(sequence);
    Set<String> visible = new HashSet<>();
    for (Commit commit : kept) {
      commit.files().forEach(f -> visible.add(f.path()));
    }
    superseded.removeAll(visible);  // a path committed again later is visible again
    List<Object> commits = new ArrayList<>();
    kept.forEach(c -> commits.add(c.toJson()));
    // instants: the newly covered ones, and covered ones still hot (an unfinished archive step).
    TreeSet<String> instants = new TreeSet<>(settled.keySet());
    for (String id : view.hotInstants().keySet()) {
      if (view.covers(id)) {
        instants.add(id);
      }
    }
    Map<String, Object> jobs = new TreeMap<>();
    Set<String> jobIds = new TreeSet<>(writes.keySet());
    jobIds.addAll(rolledBack.keySet());
    for (String job : jobIds) {
      Map<String, Object> entry = new TreeMap<>();
      entry.put("writes", newestBatchOnly(writes.getOrDefault(job, Map.of())));
      entry.put("rolledBack", rolledBack.getOrDefault(job, List.of()));
      jobs.put(job, entry);
    }
    Map<String, Object> body = new TreeMap<>();
    body.put("snapshot", next);
    body.put("previous", previous == null ? null : previous.number());
    body.put("created", OffsetDateTime.now(ZoneOffset.UTC).toString());
    body.put("instants", new ArrayList<>(instants));
    body.put("maxOrder", maxOrder);
    body.put("commits", commits);
    body.put("superseded", new ArrayList<>(superseded));
    body.put("streams", streams);
    body.put("jobs", jobs);
    return body;
  }

  /** Keep the last instant per write identity (write, query, batch). */
  @SuppressWarnings("unchecked")
  private static void addWrite(Map<String, Map<String, Object>> writes, String job,
      Map<String, Object> entry) {
    Object micro = entry.get(MicroBatch.EXTRA_KEY);
    String key = entry.get("write") + "|" + (micro instanceof Map<?, ?> m
        ? ((Map<String, Object>) m).get("queryId") + "|" + ((Map<String, Object>) m).get("batchId")
        : "");
    Map<String, Object> byKey = writes.computeIfAbsent(job, k -> new TreeMap<>());
    Map<String, Object> old = (Map<String, Object>) byKey.get(key);
    if (old == null || String.valueOf(entry.get("instant")).compareTo(String.valueOf(old.get("instant"))) > 0) {
      byKey.put(key, entry);
    }
  }

  /** The write entries, keeping for each micro-batch query only its newest batch. */
  @SuppressWarnings("unchecked")
  private static List<Object> newestBatchOnly(Map<String, Object> byKey) {
    Map<String, Long> newest = new TreeMap<>();
    for (Object value : byKey.values()) {
      Object micro = ((Map<String, Object>) value).get(MicroBatch.EXTRA_KEY);
      if (micro instanceof Map<?, ?> m) {
        String query = String.valueOf(m.get("queryId"));
        long batch = Long.parseLong(String.valueOf(m.get("batchId")));
        newest.merge(query, batch, Math::max);
      }
    }
    List<Object> result = new ArrayList<>();
    for (Object value : byKey.values()) {
      Object micro = ((Map<String, Object>) value).get(MicroBatch.EXTRA_KEY);
      if (micro instanceof Map<?, ?> m
          && Long.parseLong(String.valueOf(m.get("batchId"))) < newest.get(String.valueOf(m.get("queryId")))) {
        continue;
      }
      result.add(value);
    }
    return result;
  }

  private static boolean recent(String decided, OffsetDateTime now) {
    try {
      return OffsetDateTime.parse(decided).isAfter(now.minus(LATE_FILE_RETENTION));
    } catch (RuntimeException e) {
      return true;  // unparseable: keep it (the safe side: its late files stay findable)
    }
  }

  /** C5: the archive of snapshot {@code n}, unless an earlier run wrote it. */
  private void archive(long n, List<String> instants, View view, TableState state)
      throws IOException {
    Path path = new Path(Snapshots.archiveDir(table), Snapshots.archiveName(n));
    if (store.size(path) >= 0) {
      return;
    }
    Timeline timeline = new Timeline(store, table);
    Map<String, Set<String>> hot = view.hotInstants();
    StringBuilder text = new StringBuilder();
    text.append(new String(Timeline.encode(Snapshots.ARCHIVE_KIND, Map.of("snapshot", n)),
        StandardCharsets.UTF_8));
    for (String id : instants) {
      Set<String> suffixes = hot.get(id);
      Instant instant;
      Instant read = state.uncovered.get(id);
      if (read != null && read.outcome() != null) {
        instant = read;  // C2 read its documents (.rolledback included)
      } else if (suffixes != null) {
        JsonNode outcome = Snapshots.json(Snapshots.readIfExists(store, timeline.file(id, ".outcome")));
        if (outcome == null) {
          continue;  // archived and deleted by another compactor meanwhile
        }
        instant = new Instant(id,
            Snapshots.json(Snapshots.readIfExists(store, timeline.file(id, ".inflight"))), outcome,
            Snapshots.json(Snapshots.readIfExists(store, timeline.file(id, ".rolledback"))));
      } else if (view.archivedHot().containsKey(id)) {
        instant = view.archivedHot().get(id);  // from a damaged snapshot's archive
      } else {
        continue;
      }
      text.append(Snapshots.archiveLine(instant)).append('\n');
    }
    store.putIfAbsent(path, text.toString().getBytes(StandardCharsets.UTF_8));
  }

  /** C6: {@code .inflight}s first, then {@code .outcome}s (and void ones), then {@code .rolledback}s. */
  private void delete(List<String> instants, Set<String> voids) throws IOException {
    Timeline timeline = new Timeline(store, table);
    Path dir = timeline.directory();
    Map<String, List<Path>> batches = new LinkedHashMap<>();
    for (String suffix : new String[] {".inflight", ".outcome", ".rolledback"}) {
      List<Path> paths = new ArrayList<>();
      for (String id : instants) {
        paths.add(timeline.file(id, suffix));
      }
      if (!suffix.equals(".inflight")) {
        for (String id : voids) {
          // void: checked once more (every writer writes .inflight first)
          if (store.size(timeline.file(id, ".inflight")) < 0) {
            paths.add(timeline.file(id, suffix));
          }
        }
      }
      batches.put(suffix, paths);
    }
    for (Map.Entry<String, List<Path>> batch : batches.entrySet()) {
      hook.before("C6" + batch.getKey());
      store.deleteAll(dir, batch.getValue());
    }
  }

  /**
   * C7: snapshots older than the newest {@value #KEEP_SNAPSHOTS}; with a retention, the archives
   * of snapshots older than those whose snapshot was created longer ago than it (bounded by the
   * oldest kept snapshot's creation: every older snapshot was created before it).
   */
  private void retire(long newest, int retentionDays) throws IOException {
    TreeSet<Long> numbers = new TreeSet<>();
    Path snapshots = Snapshots.snapshotsDir(table);
    for (String name : store.listFiles(snapshots)) {
      java.util.regex.Matcher m = Snapshots.SNAPSHOT_NAME.matcher(name);
      if (m.matches()) {
        numbers.add(Long.parseLong(m.group(1)));
      }
    }
    numbers.removeIf(n -> n > newest);
    if (numbers.size() <= KEEP_SNAPSHOTS) {
      return;
    }
    long oldestKept = numbers.descendingSet().stream().skip(KEEP_SNAPSHOTS - 1).findFirst().get();
    List<Path> old = new ArrayList<>();
    for (long n : numbers.headSet(oldestKept)) {
      old.add(new Path(snapshots, Snapshots.snapshotName(n)));
    }
    store.deleteAll(snapshots, old);
    if (retentionDays < 0) {
      return;
    }
    byte[] bytes = Snapshots.readIfExists(store, new Path(snapshots, Snapshots.snapshotName(oldestKept)));
    if (bytes == null) {
      return;
    }
    String created = Snapshots.JSON.readTree(bytes).path("created").asText("");
    try {
      if (OffsetDateTime.parse(created).isAfter(
          OffsetDateTime.now(ZoneOffset.UTC).minusDays(retentionDays))) {
        return;
      }
    } catch (RuntimeException e) {
      return;
    }
    Path archives = Snapshots.archiveDir(table);
    List<Path> expired = new ArrayList<>();
    for (String name : store.listFiles(archives)) {
      java.util.regex.Matcher m = Snapshots.ARCHIVE_NAME.matcher(name);
      if (m.matches() && Long.parseLong(m.group(1)) < oldestKept) {
        expired.add(new Path(archives, name));
      }
    }
    store.deleteAll(archives, expired);
  }
}
