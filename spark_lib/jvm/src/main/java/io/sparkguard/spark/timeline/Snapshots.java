package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.timeline.Commits.Commit;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reading a timeline with snapshots (docs/storage-contract.md, "Snapshots and the archive",
 * "Reading with snapshots"): the newest valid {@code snapshots/<n:012d>.snapshot}, the archives
 * of newer damaged ones, and the hot {@code timeline/} instants no snapshot covers.
 */
public final class Snapshots {
  private static final Logger LOG = LoggerFactory.getLogger(Snapshots.class);
  static final String SNAPSHOT_KIND = "sparkguard.timeline.snapshot";
  static final String ARCHIVE_KIND = "sparkguard.timeline.archive";
  static final Pattern SNAPSHOT_NAME = Pattern.compile("^([0-9]{12})\\.snapshot$");
  static final Pattern ARCHIVE_NAME = Pattern.compile("^([0-9]{12})\\.archive$");
  static final Pattern INSTANT = Pattern.compile("^([0-9]{17}-[a-z0-9.-]+)\\.(inflight|outcome|rolledback)$");
  /** "Reading with snapshots", step 4: restarts when an outcome vanished (archived meanwhile). */
  static final int MAX_RESTARTS = 5;
  static final ObjectMapper JSON = new ObjectMapper();

  private Snapshots() {}

  static Path snapshotsDir(Path table) {
    return new Path(new Path(table, Timeline.SPARKGUARD_DIR), "snapshots");
  }

  static Path archiveDir(Path table) {
    return new Path(new Path(table, Timeline.SPARKGUARD_DIR), "archive");
  }

  static String snapshotName(long n) {
    return String.format("%012d.snapshot", n);
  }

  static String archiveName(long n) {
    return String.format("%012d.archive", n);
  }

  /** One instant's documents (any may be null: absent). */
  record Instant(String id, JsonNode inflight, JsonNode outcome, JsonNode rolledback) {
    boolean committed() {
      return outcome != null && "committed".equals(outcome.path("outcome").asText());
    }

    boolean rolledBack() {
      return outcome != null && "rolled_back".equals(outcome.path("outcome").asText());
    }

    String jobId() {
      return id.substring(18);
    }
  }

  /** A parsed, valid snapshot document. */
  record Snapshot(long number, JsonNode document, Set<String> instants, String maxOrder,
      List<Commit> commits, Set<String> superseded) {

    JsonNode jobs() {
      return document.path("jobs");
    }

    JsonNode streams() {
      return document.path("streams");
    }

    String created() {
      return document.path("created").asText("");
    }
  }

  /**
   * What "Reading with snapshots" steps 1-2 found: the newest valid snapshot (or null), the
   * instants of newer damaged snapshots' archives (or of every archive when no snapshot is
   * valid), the snapshot numbers present, and the names of one listing of {@code timeline/}.
   */
  public record View(Snapshot snapshot, Map<String, Instant> archivedHot, TreeSet<Long> numbers,
      TreeSet<String> hotNames) {

    boolean covers(String instant) {
      return snapshot != null && snapshot.instants().contains(instant);
    }

    /** Instant id -> the suffixes present in the hot listing (temp names skipped). */
    Map<String, Set<String>> hotInstants() {
      Map<String, Set<String>> instants = new TreeMap<>();
      for (String name : hotNames) {
        Matcher m = INSTANT.matcher(name);
        if (m.matches()) {
          instants.computeIfAbsent(m.group(1), k -> new TreeSet<>()).add(m.group(2));
        }
      }
      return instants;
    }
  }

  /** Parse {@code bytes} as snapshot {@code n}; throws on anything invalid. */
  static Snapshot parse(long n, byte[] bytes) throws IOException {
    String text = new String(bytes, StandardCharsets.UTF_8);
    if (!text.endsWith("\n")) {
      throw new IOException("torn (no final newline)");
    }
    JsonNode doc = JSON.readTree(text);
    if (doc == null || !doc.isObject()) {
      throw new IOException("not a JSON object");
    }
    if (!SNAPSHOT_KIND.equals(doc.path("kind").asText()) || doc.path("version").asInt(-1) != 1) {
      throw new IOException("kind/version " + doc.path("kind") + "/" + doc.path("version")
          + " is not " + SNAPSHOT_KIND + "/1");
    }
    if (doc.path("snapshot").asLong(-1) != n) {
      throw new IOException("field snapshot " + doc.path("snapshot") + " is not " + n);
    }
    for (String field : new String[] {"instants", "commits", "superseded"}) {
      if (!doc.path(field).isArray()) {
        throw new IOException("field '" + field + "' is not a list");
      }
    }
    for (String field : new String[] {"streams", "jobs"}) {
      if (!doc.path(field).isObject()) {
        throw new IOException("field '" + field + "' is not an object");
      }
    }
    if (!doc.path("maxOrder").isTextual()) {
      throw new IOException("field 'maxOrder' is not a string");
    }
    Set<String> instants = new TreeSet<>();
    doc.path("instants").forEach(i -> instants.add(i.asText()));
    List<Commit> commits = new ArrayList<>();
    try {
      for (JsonNode commit : doc.path("commits")) {
        commits.add(Commit.fromSnapshot(commit));
      }
    } catch (IllegalArgumentException e) {
      throw new IOException(e.getMessage(), e);
    }
    Set<String> superseded = new TreeSet<>();
    doc.path("superseded").forEach(p -> superseded.add(p.asText()));
    return new Snapshot(n, doc, Collections.unmodifiableSet(instants),
        doc.path("maxOrder").asText(), commits, superseded);
  }

  /** Read a file, or null when it does not exist (anymore). */
  static byte[] readIfExists(AtomicStore store, Path path) throws IOException {
    try {
      return store.read(path);
    } catch (java.io.FileNotFoundException | java.nio.file.NoSuchFileException e) {
      return null;
    } catch (IOException e) {
      if (store.size(path) < 0) {
        return null;
      }
      throw e;
    }
  }

  /** Parse a JSON document, or null for null bytes. */
  static JsonNode json(byte[] bytes) throws IOException {
    return bytes == null ? null : JSON.readTree(bytes);
  }

  /** Steps 1-2: one hot listing, then the newest valid snapshot and the damaged ones' archives. */
  static View load(AtomicStore store, Path table) throws IOException {
    // The hot listing comes first: an instant a compactor deleted before it was covered by a
    // snapshot published before it (C3 precedes C6), which the snapshot listing below sees.
    // (Listing snapshots first could miss an instant covered and wholly archived in between.)
    List<String> hot = store.listFiles(new Timeline(store, table).directory());
    return load(store, table, hot, store.listFiles(snapshotsDir(table)), null);
  }

  /**
   * {@link #load(AtomicStore, Path)} from listings already made: {@code hotListing} of the
   * timeline, and {@code snapshotListing} of {@code snapshots/} taken AFTER it (see above);
   * {@code archiveListing} of {@code archive/} taken with or after the snapshots' listing, or
   * null to list it here when it is needed.
   */
  public static View load(AtomicStore store, Path table, List<String> hotListing,
      List<String> snapshotListing, List<String> archiveListing) throws IOException {
    TreeSet<String> hot = new TreeSet<>();
    for (String name : hotListing) {
      if (!name.startsWith(".") && !name.contains("/")) {
        hot.add(name);
      }
    }
    TreeSet<Long> numbers = new TreeSet<>();
    for (String name : snapshotListing) {
      Matcher m = SNAPSHOT_NAME.matcher(name);
      if (m.matches()) {
        numbers.add(Long.parseLong(m.group(1)));
      }
    }
    Snapshot valid = null;
    List<Long> damaged = new ArrayList<>();
    for (long n : numbers.descendingSet()) {
      byte[] bytes = readIfExists(store, new Path(snapshotsDir(table), snapshotName(n)));
      if (bytes == null) {
        continue;  // deleted meanwhile by retention (C7): older than a newer valid one
      }
      try {
        valid = parse(n, bytes);
        break;
      } catch (IOException | RuntimeException e) {
        LOG.warn("sparkguard: snapshot {} of {} is damaged ({}); using an older one",
            snapshotName(n), table, e.getMessage());
        damaged.add(n);
      }
    }
    Map<String, Instant> archivedHot = new HashMap<>();
    if (valid == null && !damaged.isEmpty() && numbers.first() > 1
        && store.size(new Path(archiveDir(table), archiveName(1))) < 0) {
      // Only damaged snapshots, and the history before the oldest is gone (C7 retired it).
      throw new SparkguardException("sparkguard: every snapshot of " + table + " is damaged ("
          + new Path(snapshotsDir(table), snapshotName(damaged.get(0))) + " is the newest) and"
          + " the archives before snapshot " + numbers.first() + " were deleted: the committed"
          + " state cannot be rebuilt; restore that snapshot file from a backup");
    }
    if (valid == null) {
      // No valid snapshot: every archive's instants are hot (a table without snapshots).
      for (String name : archiveListing != null ? archiveListing
          : store.listFiles(archiveDir(table))) {
        Matcher m = ARCHIVE_NAME.matcher(name);
        if (m.matches()) {
          readArchive(store, table, Long.parseLong(m.group(1)), archivedHot);
        }
      }
    } else {
      for (long n : damaged) {
        readArchive(store, table, n, archivedHot);
      }
    }
    return new View(valid, archivedHot, numbers, hot);
  }

  /** Add the instants of {@code archive/<n>.archive} (if present) to {@code into}. */
  static void readArchive(AtomicStore store, Path table, long n, Map<String, Instant> into)
      throws IOException {
    byte[] bytes = readIfExists(store, new Path(archiveDir(table), archiveName(n)));
    if (bytes == null) {
      return;
    }
    String[] lines = new String(bytes, StandardCharsets.UTF_8).split("\n");
    for (int i = 1; i < lines.length; i++) {
      if (lines[i].isBlank()) {
        continue;
      }
      JsonNode line = JSON.readTree(lines[i]);
      String id = line.path("instant").asText();
      into.putIfAbsent(id, new Instant(id, nullable(line.path("inflight")),
          nullable(line.path("outcome")), nullable(line.path("rolledback"))));
    }
  }

  private static JsonNode nullable(JsonNode node) {
    return node == null || node.isNull() || node.isMissingNode() ? null : node;
  }

  /** The archive line of {@code instant}. */
  static String archiveLine(Instant instant) throws IOException {
    ObjectNode line = JSON.createObjectNode();
    line.put("instant", instant.id());
    line.set("inflight", instant.inflight());
    line.set("outcome", instant.outcome());
    line.set("rolledback", instant.rolledback());
    return JSON.writeValueAsString(line);
  }
}
