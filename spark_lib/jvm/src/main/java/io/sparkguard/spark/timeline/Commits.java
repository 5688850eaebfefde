package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.databind.JsonNode;
import io.sparkguard.spark.common.SparkguardException;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * What a table holds after a sequence of commits: the Java port of {@code spark_lib/storage/reader.py}'s
 * {@code commit_of_status} and {@code visible_files} (docs/storage-contract.md, "Operations").
 * Pure functions over values; the snapshot ({@link Snapshots}) and the compactor ({@link
 * Compactor}) use them, and the shared test vectors check them against the Python reader.
 */
final class Commits {
  static final Set<String> OPERATIONS = Set.of(
      "append", "overwrite", "overwrite-partitions", "rewrite", "stream-batch", "stream-register");

  private Commits() {}

  /** One committed data file: {@code {"path","size","rows"}}. */
  record DataFile(String path, long size, long rows) {
    static DataFile of(JsonNode json) {
      return new DataFile(
          json.path("path").asText(), json.path("size").asLong(0), json.path("rows").asLong(-1));
    }

    Map<String, Object> toJson() {
      Map<String, Object> json = new TreeMap<>();
      json.put("path", path);
      json.put("size", size);
      json.put("rows", rows);
      return json;
    }
  }

  /** One commit, as the reader's {@code Commit}. */
  record Commit(
      String order, String source, String jobId, String operation, List<DataFile> files,
      String format, String schema, int write, List<String> partitions) {

    Commit withFiles(List<DataFile> kept) {
      return new Commit(order, source, jobId, operation, kept, format, schema, write, partitions);
    }

    /** The snapshot's encoding (docs/storage-contract.md, {@code commits}). */
    Map<String, Object> toJson() {
      Map<String, Object> json = new TreeMap<>();
      json.put("order", order);
      json.put("source", source);
      json.put("jobId", jobId);
      json.put("operation", operation);
      List<Object> list = new ArrayList<>();
      for (DataFile file : files) {
        list.add(file.toJson());
      }
      json.put("files", list);
      json.put("format", format);
      json.put("schema", schema);
      json.put("write", write);
      json.put("partitions", partitions);
      return json;
    }

    /** A commit of a snapshot's {@code commits}; refused (null-free) when a field is missing. */
    static Commit fromSnapshot(JsonNode json) {
      for (String field : new String[] {"order", "source", "jobId", "operation", "files"}) {
        if (json.path(field).isMissingNode() || json.path(field).isNull()) {
          throw new IllegalArgumentException("a commit lacks '" + field + "'");
        }
      }
      String operation = json.path("operation").asText();
      if (!OPERATIONS.contains(operation)) {
        throw new IllegalArgumentException("unknown operation '" + operation + "'");
      }
      List<DataFile> files = new ArrayList<>();
      for (JsonNode file : json.path("files")) {
        files.add(DataFile.of(file));
      }
      List<String> partitions = new ArrayList<>();
      for (JsonNode partition : json.path("partitions")) {
        partitions.add(partition.asText());
      }
      return new Commit(json.path("order").asText(), json.path("source").asText(),
          json.path("jobId").asText(), operation, files, text(json.path("format")),
          text(json.path("schema")), json.path("write").asInt(0), partitions);
    }
  }

  private static String text(JsonNode node) {
    return node.isTextual() ? node.asText() : null;
  }

  /**
   * The commit of a COMMITTED instant ({@code inflight} may be a missing node for instants
   * written before {@code .inflight} recorded writes; the caller has checked the state). A
   * stream registration is returned too ({@code stream-register}: no files).
   *
   * @throws SparkguardException for an unknown operation ("upgrade sparkguard") or an {@code
   *     overwrite-partitions} without a valid {@code extra.partitions}
   */
  static Commit ofInstant(String instant, JsonNode inflight, JsonNode outcome) {
    JsonNode extra = outcome.path("extra");
    String operation = extra.path("operation").asText("append");
    if (!OPERATIONS.contains(operation)) {
      throw new SparkguardException("instant " + instant + " has unknown operation '" + operation
          + "'; upgrade sparkguard");
    }
    List<String> partitions = new ArrayList<>();
    if (operation.equals("overwrite-partitions")) {
      JsonNode raw = extra.path("partitions");
      boolean valid = raw.isArray();
      for (JsonNode partition : raw) {
        String text = partition.isTextual() ? partition.asText() : "";
        valid &= !text.isEmpty() && SupersededFiles.isDataPath(text);
        partitions.add(text);
      }
      if (!valid) {
        throw new SparkguardException("instant " + instant + " is an overwrite-partitions without a"
            + " valid extra.partitions list (" + raw + "); repair or remove its outcome");
      }
    }
    List<DataFile> files = new ArrayList<>();
    for (JsonNode file : outcome.path("files")) {
      files.add(DataFile.of(file));
    }
    String order = extra.path("committedAt").asText("");
    if (order.isEmpty()) {
      order = instant.substring(0, 17);
    }
    return new Commit(order, instant, instant.substring(18), operation, files,
        text(extra.path("format")), text(extra.path("schema")),
        inflight.path("write").asInt(0), partitions);
  }

  /** Commit order: {@code (order, source)}, as the reader sorts. */
  static final Comparator<Commit> ORDER =
      Comparator.comparing(Commit::order).thenComparing(Commit::source);

  /** Relative path -> (file, source of the commit that made it visible), after {@code commits}. */
  static Map<String, Map.Entry<DataFile, Commit>> visibleWithSource(Collection<Commit> commits) {
    return applyInSequence(compactedOrder(commits));
  }

  /** {@code commits} sorted in commit order. */
  static List<Commit> compactedOrder(Collection<Commit> commits) {
    List<Commit> sorted = new ArrayList<>(commits);
    sorted.sort(ORDER);
    return sorted;
  }

  /**
   * Relative path -> file after applying {@code sequence} in the given order (a snapshot's
   * commits, then the uncovered ones: "Reading with snapshots", step 5).
   */
  static Map<String, DataFile> visibleInSequence(List<Commit> sequence) {
    Map<String, DataFile> visible = new TreeMap<>();
    applyInSequence(sequence).forEach((path, entry) -> visible.put(path, entry.getKey()));
    return visible;
  }

  private static Map<String, Map.Entry<DataFile, Commit>> applyInSequence(List<Commit> sequence) {
    Map<String, Map.Entry<DataFile, Commit>> visible = new LinkedHashMap<>();
    for (Commit commit : sequence) {
      switch (commit.operation()) {
        case "overwrite" -> visible.clear();
        case "overwrite-partitions" -> visible.keySet().removeIf(
            path -> inPartitions(path, commit.partitions()));
        case "rewrite" -> visible.values().removeIf(
            by -> by.getValue().jobId().equals(commit.jobId())
                && by.getValue().write() == commit.write());
        default -> { }
      }
      for (DataFile file : commit.files()) {
        visible.put(file.path(), Map.entry(file, commit));
      }
    }
    return visible;
  }

  /** Relative path -> file a reader sees after {@code commits} ({@code visible_files}). */
  static Map<String, DataFile> visible(Collection<Commit> commits) {
    Map<String, DataFile> visible = new TreeMap<>();
    visibleWithSource(commits).forEach((path, entry) -> visible.put(path, entry.getKey()));
    return visible;
  }

  /**
   * The commits of {@code sequence} (applied in that order) that still contribute a visible file, each with only those
   * files, in commit order: what a snapshot records. Applying them gives the same visible files
   * (an overwrite left out supersedes nothing that is still listed).
   */
  static List<Commit> compacted(List<Commit> sequence) {
    Map<String, Map.Entry<DataFile, Commit>> visible = applyInSequence(sequence);
    Map<String, List<DataFile>> kept = new LinkedHashMap<>();
    for (Map.Entry<DataFile, Commit> entry : visible.values()) {
      kept.computeIfAbsent(entry.getValue().source(), k -> new ArrayList<>()).add(entry.getKey());
    }
    List<Commit> result = new ArrayList<>();
    Set<String> seen = new HashSet<>();
    for (Commit commit : sequence) {
      List<DataFile> files = kept.get(commit.source());
      if (files != null && seen.add(commit.source())) {
        files.sort(Comparator.comparing(DataFile::path));
        result.add(commit.withFiles(files));
      }
    }
    return result;
  }

  /** Paths listed by {@code sequence} that are no longer visible after it. */
  static Set<String> supersededInSequence(List<Commit> sequence) {
    Set<String> listed = new TreeSet<>();
    for (Commit commit : sequence) {
      for (DataFile file : commit.files()) {
        listed.add(file.path());
      }
    }
    listed.removeAll(applyInSequence(sequence).keySet());
    return listed;
  }

  /** Paths some commit listed that are no longer visible ({@code superseded_files}). */
  static Set<String> superseded(Collection<Commit> commits) {
    Set<String> listed = new TreeSet<>();
    for (Commit commit : commits) {
      for (DataFile file : commit.files()) {
        listed.add(file.path());
      }
    }
    listed.removeAll(visible(commits).keySet());
    return listed;
  }

  static boolean inPartitions(String path, Collection<String> partitions) {
    for (String partition : partitions) {
      if (path.startsWith(partition + "/")) {
        return true;
      }
    }
    return false;
  }
}
