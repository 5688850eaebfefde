package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.common.SparkguardException.InstantDecidedException;
import io.sparkguard.spark.store.AtomicStore;
import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.hadoop.fs.Path;

/**
 * The timeline of one table, as docs/storage-contract.md defines it ("Layout", "Versioned
 * JSON"): {@code <table>/_sparkguard/timeline/<instant>.inflight} put-if-absent when a write
 * starts, {@code <instant>.outcome} put-if-absent when it is decided (by a commit or by a
 * rollback's claim: exactly one of them wins). The same files, fields and encoding the Python
 * writer produces ({@code spark_lib/storage/timeline.py}), so every Python tool reads them.
 */
public final class Timeline implements Serializable {
  private static final long serialVersionUID = 1L;

  public static final String SPARKGUARD_DIR = "_sparkguard";
  public static final String INFLIGHT_KIND = "sparkguard.instant.inflight";
  static final String OUTCOME_KIND = "sparkguard.instant.outcome";
  static final String ROLLEDBACK_KIND = "sparkguard.instant.rolledback";
  static final int VERSION = 1;
  private static final DateTimeFormatter INSTANT_TIME = DateTimeFormatter.ofPattern("yyyyMMddHHmmssSSS");
  private static final DateTimeFormatter COMMITTED_AT = DateTimeFormatter.ofPattern("yyyyMMddHHmmssSSSSSS");
  private static final ObjectMapper JSON =
      new ObjectMapper().configure(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS, true);

  private final AtomicStore store;
  private final Path table;

  public Timeline(AtomicStore store, Path table) {
    this.store = store;
    this.table = table;
  }

  /** The table this timeline belongs to. */
  public Path table() {
    return table;
  }

  /** {@code <table>/_sparkguard/timeline}. */
  public Path directory() {
    return new Path(new Path(table, SPARKGUARD_DIR), "timeline");
  }

  /** {@code <table>/_sparkguard/markers/<instant>}. */
  public Path markerDirectory(String instant) {
    return new Path(new Path(new Path(table, SPARKGUARD_DIR), "markers"), instant);
  }

  /**
   * The data files (relative paths) the instant's markers name, in either format: direct
   * {@code <file>.marker.<IO>} files, and the lines of the sidecar's {@code MARKERS<i>} batch
   * files (blank lines and a torn last line without its newline are skipped: a torn line is a
   * marker whose file the task never opened), in the marker directory {@code markers} of
   * {@code store}.
   */
  public static java.util.Set<String> markedFiles(AtomicStore store, Path markers)
      throws IOException {
    java.util.Set<String> marked = new java.util.TreeSet<>();
    for (String file : store.listFiles(markers)) {
      if (file.matches("MARKERS(0|[1-9][0-9]{0,5})")) {
        String text = new String(store.read(new Path(markers, file)), StandardCharsets.UTF_8);
        String[] lines = text.split("\n", -1);
        for (int i = 0; i < lines.length - 1; i++) {  // the last element follows the last \n
          addMarker(marked, lines[i].strip());
        }
      } else {
        addMarker(marked, file);
      }
    }
    return marked;
  }

  private static void addMarker(java.util.Set<String> marked, String name) {
    for (String io : new String[] {".marker.CREATE", ".marker.MERGE", ".marker.APPEND"}) {
      if (name.endsWith(io)) {
        marked.add(name.substring(0, name.length() - io.length()));
      }
    }
  }

  public Path file(String instant, String suffix) {
    return new Path(directory(), instant + suffix);
  }

  /**
   * Open a new instant: write {@code <instant>.inflight} put-if-absent and return the instant id
   * ({@code <UTC yyyyMMddHHmmssSSS>-<jobId>}). A name already taken (another writer in the same
   * millisecond) is retried with the next millisecond.
   */
  public String start(ProtocolSettings settings, String operation, Map<String, Object> extra)
      throws IOException {
    return start(settings, operation, extra, null);
  }

  /** {@link #start(ProtocolSettings, String, Map)} recording the write identity {@code write}. */
  public String start(
      ProtocolSettings settings, String operation, Map<String, Object> extra, Integer write)
      throws IOException {
    for (int i = 0; i < 1000; i++) {
      ZonedDateTime now = ZonedDateTime.now(ZoneOffset.UTC);
      String instant = INSTANT_TIME.format(now) + "-" + settings.jobId();
      Map<String, Object> body = new TreeMap<>();
      body.put("instant", instant);
      body.put("jobId", settings.jobId());
      body.put("owner", settings.owner());
      body.put("attempt", settings.attempt());
      body.put("markerType", settings.markerType());
      body.put("operation", operation);
      body.put("started", now.toOffsetDateTime().toString());
      body.put("extra", extra);
      if (write != null) {
        body.put("write", write);
      }
      if (store.putIfAbsent(file(instant, ".inflight"), encode(INFLIGHT_KIND, body))) {
        return instant;
      }
      try {
        Thread.sleep(1);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while allocating an instant", e);
      }
    }
    throw new SparkguardException("could not allocate an instant for job " + settings.jobId());
  }

  /**
   * Decide {@code instant} as committed, listing {@code files} (put-if-absent).
   *
   * @throws InstantDecidedException when it was already decided (e.g. a rollback claimed it
   *     first): then this commit publishes nothing
   */
  public void commit(
      String instant, List<Map<String, Object>> files, Map<String, Object> extra, Integer write)
      throws IOException {
    Map<String, Object> body = new TreeMap<>();
    body.put("instant", instant);
    body.put("outcome", "committed");
    body.put("decided", ZonedDateTime.now(ZoneOffset.UTC).toOffsetDateTime().toString());
    body.put("files", files);
    Map<String, Object> withTime = new TreeMap<>(extra);
    withTime.put("committedAt", COMMITTED_AT.format(ZonedDateTime.now(ZoneOffset.UTC)));
    body.put("extra", withTime);
    if (write != null) {
      body.put("write", write);
    }
    if (!store.putIfAbsent(file(instant, ".outcome"), encode(OUTCOME_KIND, body))) {
      throw new InstantDecidedException(
          "instant " + instant + " of " + table + " was already decided (a rollback or another"
              + " committer won); this commit is refused and publishes nothing");
    }
    // W9, second half (docs/storage-contract.md, "Zombie commits after archiving"): a compactor
    // deletes an .inflight first, and only of a decided, covered instant. Without it this
    // outcome landed after the instant was decided and archived: withdraw it, publish nothing.
    if (store.size(file(instant, ".inflight")) < 0) {
      store.delete(file(instant, ".outcome"));
      throw new InstantDecidedException(
          "instant " + instant + " of " + table + " was decided and archived before this commit"
              + " (its .inflight is gone); the outcome just written was withdrawn and this commit"
              + " publishes nothing");
    }
  }

  /**
   * Decide {@code instant} as rolled back (the claim), put-if-absent: true when this call
   * decided it, false when it was already decided (committed, or claimed by a rollback).
   */
  public boolean claimRollback(String instant) throws IOException {
    Map<String, Object> body = new TreeMap<>();
    body.put("instant", instant);
    body.put("outcome", "rolled_back");
    body.put("decided", ZonedDateTime.now(ZoneOffset.UTC).toOffsetDateTime().toString());
    body.put("files", List.of());
    body.put("extra", Map.of());
    return store.putIfAbsent(file(instant, ".outcome"), encode(OUTCOME_KIND, body));
  }

  /**
   * The undecided instants of {@code jobId} (an {@code .inflight} without an {@code .outcome}),
   * oldest first, from one listing of the timeline.
   */
  public List<String> undecided(String jobId) throws IOException {
    return undecided(jobId, store.listFiles(directory()));
  }

  /** {@link #undecided(String)} from {@code listed}, a listing of the timeline already made. */
  public static List<String> undecided(String jobId, List<String> listed) {
    java.util.Set<String> names = new java.util.HashSet<>(listed);
    List<String> instants = new java.util.ArrayList<>();
    for (String name : new java.util.TreeSet<>(names)) {
      if (!name.endsWith(".inflight")) {
        continue;
      }
      String instant = name.substring(0, name.length() - ".inflight".length());
      if (instant.matches("[0-9]{17}-.*")
          && instant.substring(18).equals(jobId)
          && !names.contains(instant + ".outcome")) {
        instants.add(instant);
      }
    }
    return instants;
  }

  /**
   * The COMMITTED instant of {@code jobId} whose write identity is {@code write} (the last one,
   * if several), or {@code null}: a rerun's write n that already committed. An {@code .inflight}
   * without {@code "write"} is write 0; stream registrations and file-sink batches are not
   * writes.
   */
  public String committedWrite(String jobId, int write) throws IOException {
    return committedWrite(jobId, write, null);
  }

  /**
   * {@link #committedWrite(String, int)} for a write inside micro-batch {@code batch} ({@code
   * null}: a plain write): only instants recording the same {@code extra.microBatch} (query id
   * and batch id) count, and plain writes only match plain writes.
   *
   * <p>Instants are read newest first. For a micro-batch write the scan stops at the first
   * instant of the same query with a smaller batch id: the query ran its batches in order, so
   * every instant of this batch is newer (this assumes the clocks of successive drivers agree
   * to within a restart's time, as the instant ids' ordering does everywhere in the contract).
   * In a running query that is one read per write, however long the timeline.
   */
  String committedWrite(String jobId, int write, MicroBatch batch) throws IOException {
    return committedWrite(jobId, write, batch, store.listFiles(directory()),
        () -> Snapshots.load(store, table));
  }

  /** What reads the snapshots for {@link #committedWrite}: called only when it gets there. */
  public interface ViewSource {
    Snapshots.View load() throws IOException;
  }

  /**
   * {@link #committedWrite(String, int, MicroBatch)} from {@code listed}, a listing of the
   * timeline already made, with the archived part from {@code view}, which must list the
   * snapshots after {@code listed} was taken (docs/storage-contract.md, "Reading with
   * snapshots": the hot listing comes first).
   */
  public String committedWrite(String jobId, int write, MicroBatch batch, List<String> listed,
      ViewSource view) throws IOException {
    java.util.TreeSet<String> names = new java.util.TreeSet<>(listed);
    for (String name : names.descendingSet()) {
      if (!name.endsWith(".outcome")) {
        continue;
      }
      String instant = name.substring(0, name.length() - ".outcome".length());
      if (!instant.matches("[0-9]{17}-.*") || !instant.substring(18).equals(jobId)) {
        continue;
      }
      if (!names.contains(instant + ".inflight")) {
        continue;  // void: a zombie's commit after archiving (or one half-archived by C6)
      }
      byte[] inflightBytes = Snapshots.readIfExists(store, file(instant, ".inflight"));
      byte[] outcomeBytes = Snapshots.readIfExists(store, file(instant, ".outcome"));
      if (inflightBytes == null || outcomeBytes == null) {
        continue;  // archived since the listing: the snapshot read below covers it
      }
      com.fasterxml.jackson.databind.JsonNode inflight = JSON.readTree(inflightBytes);
      String operation = inflight.path("operation").asText();
      if (operation.equals("stream-register") || operation.equals("stream-batch")) {
        continue;
      }
      com.fasterxml.jackson.databind.JsonNode recorded =
          inflight.path("extra").path(MicroBatch.EXTRA_KEY);
      long recordedBatch = batch == null ? -1 : batch.recordedBatch(recorded);
      if (recordedBatch >= 0 && recordedBatch < batch.batchId) {
        return null;  // an earlier batch of the query: nothing older can be this batch
      }
      if (!MicroBatch.matches(batch, recorded) || inflight.path("write").asInt(0) != write) {
        continue;
      }
      com.fasterxml.jackson.databind.JsonNode outcome = JSON.readTree(outcomeBytes);
      if ("committed".equals(outcome.path("outcome").asText())
          && !"stream-register".equals(outcome.path("extra").path("operation").asText())) {
        return instant;
      }
    }
    return archivedWrite(jobId, write, batch, view.load());
  }

  /**
   * The archived part of {@link #committedWrite(String, int, MicroBatch)}: the newest valid
   * snapshot's {@code jobs.<job>.writes}, and the instants of newer damaged snapshots' archives
   * (docs/storage-contract.md, "Reading with snapshots"). One listing of {@code snapshots/}
   * (and one snapshot read when there is one).
   */
  private String archivedWrite(String jobId, int write, MicroBatch batch, Snapshots.View view)
      throws IOException {
    String found = null;
    if (view.snapshot() != null) {
      for (com.fasterxml.jackson.databind.JsonNode entry
          : view.snapshot().jobs().path(jobId).path("writes")) {
        if (entry.path("write").asInt(0) == write
            && MicroBatch.matches(batch, entry.path(MicroBatch.EXTRA_KEY))
            && (found == null || entry.path("instant").asText().compareTo(found) > 0)) {
          found = entry.path("instant").asText();
        }
      }
    }
    for (Snapshots.Instant instant : view.archivedHot().values()) {
      if (!instant.jobId().equals(jobId) || !instant.committed() || instant.inflight() == null
          || view.covers(instant.id())) {
        continue;
      }
      com.fasterxml.jackson.databind.JsonNode inflight = instant.inflight();
      if (inflight.path("operation").asText().startsWith("stream-")
          || instant.outcome().path("extra").path("operation").asText().startsWith("stream-")) {
        continue;
      }
      if (inflight.path("write").asInt(0) == write
          && MicroBatch.matches(batch, inflight.path("extra").path(MicroBatch.EXTRA_KEY))
          && (found == null || instant.id().compareTo(found) > 0)) {
        found = instant.id();
      }
    }
    return found;
  }

  /** Whether {@code instant} is decided (its {@code .outcome} exists). */
  public boolean isDecided(String instant) throws IOException {
    return store.size(file(instant, ".outcome")) >= 0;
  }

  /** Whether {@code instant} is decided as committed. */
  public boolean isCommitted(String instant) throws IOException {
    if (!isDecided(instant)) {
      return false;
    }
    return "committed".equals(JSON.readTree(store.read(file(instant, ".outcome"))).path("outcome").asText());
  }

  /** The {@code .inflight} document of {@code instant}. */
  public com.fasterxml.jackson.databind.JsonNode inflight(String instant) throws IOException {
    return JSON.readTree(store.read(file(instant, ".inflight")));
  }

  /**
   * Write {@code <instant>.rolledback} with {@code body} (the fields of docs/storage-contract.md)
   * put-if-absent: true when this call wrote it, false when a rollback already recorded one (it
   * then owns the rest of the cleanup).
   */
  public boolean recordRolledBack(String instant, Map<String, Object> body) throws IOException {
    Map<String, Object> document = new TreeMap<>(body);
    document.put("instant", instant);
    document.put("finished", ZonedDateTime.now(ZoneOffset.UTC).toOffsetDateTime().toString());
    return store.putIfAbsent(file(instant, ".rolledback"), encode(ROLLEDBACK_KIND, document));
  }

  /** The owner recorded in {@code instant}'s {@code .inflight} ({@code job:<jobId>} if none). */
  public String ownerOf(String instant) throws IOException {
    com.fasterxml.jackson.databind.JsonNode doc = JSON.readTree(store.read(file(instant, ".inflight")));
    com.fasterxml.jackson.databind.JsonNode owner = doc.get("owner");
    if (owner != null && owner.isTextual() && !owner.asText().isEmpty()) {
      return owner.asText();
    }
    return "job:" + instant.substring(18);
  }

  /** {@code {"kind":..,"version":1,...}} + newline: sorted keys, compact, UTF-8. */
  public static byte[] encode(String kind, Map<String, Object> body) {
    Map<String, Object> document = new TreeMap<>(body);
    document.put("kind", kind);
    document.put("version", VERSION);
    try {
      return (JSON.writeValueAsString(document) + "\n").getBytes(StandardCharsets.UTF_8);
    } catch (JsonProcessingException e) {
      throw new SparkguardException("cannot encode " + kind, e);
    }
  }
}
