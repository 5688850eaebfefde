package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.store.AtomicStore;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import org.apache.hadoop.fs.Path;

/**
 * Step W9b of docs/storage-contract.md: after an {@code overwrite} or {@code
 * overwrite-partitions} instant committed, delete the data files it superseded, so that a plain
 * directory reader ({@code spark.read.parquet(dir)}) sees what the committed-only reader sees.
 *
 * <p>The guarantee: in the instant's scope (the whole table for {@code overwrite}, the replaced
 * partition directories for {@code overwrite-partitions}) every visible data file (no path
 * segment starting with {@code _} or {@code .}) is deleted, with its checksum, unless (1) the
 * instant lists it, (2) a committed instant decided after it lists it, or (3) the marker
 * directory of another instant names it (a concurrent or failed write: its own commit or
 * rollback decides). That is what Spark's own overwrite deletes before the job (including files
 * no instant lists, e.g. written before the table opted into sparkguard), minus what a later or
 * concurrent sparkguard write owns. Idempotent: a crash part-way is finished by running it
 * again (the next rollback does, see {@code sparkguard rollback}: the instant's marker
 * directory, deleted only after this step, says the step may be unfinished).
 *
 * <p>Order matters for (2)/(3): the scope is listed first, then the marker directories, then
 * the timeline. A concurrent write's file that the listing saw was marked before it was
 * published; if its markers are gone when read, they were deleted after its outcome was
 * written, which the timeline listing then sees.
 */
public final class SupersededFiles {
  private static final ObjectMapper JSON = new ObjectMapper();

  private SupersededFiles() {}

  /**
   * Delete what {@code instant} (committed, {@code listed} = its files) superseded in {@code
   * scopes} (relative directories; {@code ""} = the whole table). Returns the deleted paths.
   */
  public static List<String> delete(
      AtomicStore store, Path table, String instant, Collection<String> scopes, Set<String> listed)
      throws IOException {
    Set<String> candidates = new TreeSet<>();
    for (String scope : scopes) {
      Path dir = scope.isEmpty() ? table : new Path(table, scope);
      for (String relative : store.listFiles(dir)) {
        String path = scope.isEmpty() ? relative : scope + "/" + relative;
        if (isDataPath(path) && !listed.contains(path)) {
          candidates.add(path);
        }
      }
    }
    if (candidates.isEmpty()) {
      return List.of();
    }
    Timeline timeline = new Timeline(store, table);
    Set<String> keep = new TreeSet<>();
    Path markersRoot = timeline.markerDirectory(instant).getParent();
    Set<String> markerDirs = new TreeSet<>();
    for (String file : store.listFiles(markersRoot)) {
      markerDirs.add(file.split("/", 2)[0]);
    }
    markerDirs.remove(instant);
    for (String other : markerDirs) {
      keep.addAll(Timeline.markedFiles(store, timeline.markerDirectory(other)));
    }
    String decided = committedAt(store.read(timeline.file(instant, ".outcome")));
    // Hot instants only: a commit decided after this one is not eligible for a snapshot while
    // this instant keeps its marker directory (a snapshot is a prefix of the commit order), so
    // none is archived before W10. An .outcome without .inflight is void; one archived between
    // the listing and the read was decided before this one.
    Set<String> names = new TreeSet<>(store.listFiles(timeline.directory()));
    for (String name : names) {
      if (!name.endsWith(".outcome") || name.equals(instant + ".outcome")
          || !names.contains(name.substring(0, name.length() - ".outcome".length()) + ".inflight")) {
        continue;
      }
      byte[] bytes = Snapshots.readIfExists(store, new Path(timeline.directory(), name));
      if (bytes == null) {
        continue;
      }
      JsonNode outcome = JSON.readTree(bytes);
      if ("committed".equals(outcome.path("outcome").asText())
          && committedAtOf(outcome).compareTo(decided) > 0) {
        for (JsonNode file : outcome.path("files")) {
          keep.add(file.path("path").asText());
        }
      }
    }
    List<String> doomed = new ArrayList<>();
    for (String path : candidates) {
      if (!keep.contains(path)) {
        doomed.add(path);
      }
    }
    deleteByDirectory(store, table, doomed);
    return doomed;
  }

  /**
   * Delete {@code relative} paths of {@code table}, one {@link AtomicStore#deleteAll} per
   * directory: on object stores one bulk request per page of keys instead of a probe and a
   * delete per file. The paths were listed just before, so they are the files deleted (a file
   * deleted meanwhile by someone else, e.g. a rollback finishing this step, counts here too).
   */
  public static void deleteByDirectory(AtomicStore store, Path table, List<String> relative)
      throws IOException {
    java.util.Map<String, List<Path>> byDirectory = new java.util.TreeMap<>();
    for (String path : relative) {
      int slash = path.lastIndexOf('/');
      String directory = slash < 0 ? "" : path.substring(0, slash);
      byDirectory.computeIfAbsent(directory, d -> new ArrayList<>()).add(new Path(table, path));
    }
    for (java.util.Map.Entry<String, List<Path>> entry : byDirectory.entrySet()) {
      Path directory = entry.getKey().isEmpty() ? table : new Path(table, entry.getKey());
      store.deleteAll(directory, entry.getValue());
    }
  }

  /** A path Spark's file listing reads: no segment starts with {@code _} or {@code .}. */
  static boolean isDataPath(String relative) {
    for (String segment : relative.split("/")) {
      if (segment.isEmpty() || segment.startsWith("_") || segment.startsWith(".")) {
        return false;
      }
    }
    return true;
  }

  private static String committedAt(byte[] outcome) throws IOException {
    return committedAtOf(JSON.readTree(outcome));
  }

  /** The commit order key (docs/storage-contract.md: {@code extra.committedAt}). */
  private static String committedAtOf(JsonNode outcome) {
    String at = outcome.path("extra").path("committedAt").asText("");
    return at.isEmpty() ? outcome.path("instant").asText("").substring(0, 17) : at;
  }
}
