package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.store.AtomicStore;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.NoSuchFileException;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Pattern;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Step R8a of docs/storage-contract.md ("Rollback, step by step"; "Publication after the
 * outcome"), as the next write of a job runs it: a COMMITTED instant of the job whose marker
 * directory survived (its driver died after W9, maybe inside W9a) is rolled <b>forward</b>
 * before the write decides on a rerun, so that neither {@code rerun=skip} (which writes nothing)
 * nor {@code rerun=rewrite} (whose tasks and W8 replace or delete temp files of the same names)
 * leaves the committed data unpublished or deletes it. The Python rollback's {@code
 * roll_forward} ({@code spark_lib/storage/rollback.py}) is the same rule: for every file the
 * outcome lists with a {@code temp}, rename the temp file onto the name if it still exists; a
 * file already renamed has no temp file left (nothing to do); neither temp nor name: a warning.
 * Never deletes anything. R8b (unlisted marked files, W9b of an overwrite, the markers) stays
 * with {@code sparkguard rollback}: the state this leaves is the one a driver that died right
 * after W9a leaves.
 */
public final class RollForward {
  private static final Logger LOG = LoggerFactory.getLogger(RollForward.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  /** The contract's temp name {@code .<name>.sg-tmp-<12 hex>}. */
  private static final Pattern TEMP = Pattern.compile("^\\.(.+)\\.sg-tmp-[0-9a-f]{12}$");

  private RollForward() {}

  /**
   * R8a for every COMMITTED instant of {@code jobId} in {@code listedTimeline} (names in {@code
   * timeline/}, listed by the caller) that still has a marker directory: one listing of {@code
   * markers/}, then one outcome read per such instant and one probe per file it lists under a
   * temp name. Returns how many files were published.
   */
  public static int publishCommitted(
      AtomicStore store, Path table, String jobId, List<String> listedTimeline) throws IOException {
    Timeline timeline = new Timeline(store, table);
    Set<String> names = new TreeSet<>(listedTimeline);
    Set<String> candidates = new TreeSet<>();
    for (String name : names) {
      if (!name.endsWith(".outcome")) {
        continue;
      }
      String instant = name.substring(0, name.length() - ".outcome".length());
      if (instant.matches("[0-9]{17}-.*") && instant.substring(18).equals(jobId)
          && names.contains(instant + ".inflight")) {
        candidates.add(instant);
      }
    }
    if (candidates.isEmpty()) {
      return 0;
    }
    Set<String> withMarkers = new TreeSet<>();
    for (String file : store.listFiles(new Path(new Path(table, Timeline.SPARKGUARD_DIR), "markers"))) {
      withMarkers.add(file.split("/", 2)[0]);
    }
    candidates.retainAll(withMarkers);
    int published = 0;
    for (String instant : candidates) {
      byte[] bytes = Snapshots.readIfExists(store, timeline.file(instant, ".outcome"));
      if (bytes == null) {
        continue;  // archived since the listing: C6 archives no instant with markers
      }
      JsonNode outcome = JSON.readTree(bytes);
      if ("committed".equals(outcome.path("outcome").asText())) {
        published += publishInstant(store, table, instant, outcome);
      }
    }
    return published;
  }

  /** R8a of one committed {@code outcome}: returns how many of its files it renamed. */
  static int publishInstant(AtomicStore store, Path table, String instant, JsonNode outcome)
      throws IOException {
    int published = 0;
    for (JsonNode file : outcome.path("files")) {
      if (file.path("upload").isTextual()) {
        published += completeUpload(store, table, instant, file) ? 1 : 0;
        continue;
      }
      if (!file.path("temp").isTextual()) {
        continue;  // written under its name (object stores, the Python writer)
      }
      String path = file.path("path").asText();
      String temp = file.path("temp").asText();
      if (!isTempOf(temp, path)) {
        throw new SparkguardException("instant " + instant + " lists temp '" + temp + "' for "
            + path + ", which is not a temp name in its directory; repair its outcome");
      }
      Path target = new Path(table, path);
      Path work = new Path(table, temp);
      if (store.size(work) >= 0) {
        try {
          store.publish(work, target);
          published++;
          continue;
        } catch (FileNotFoundException | NoSuchFileException e) {
          // Renamed meanwhile (a zombie driver finishing its W9a, a rollback): checked below.
        }
      }
      if (store.size(target) < 0) {
        LOG.warn("sparkguard: committed file {} of {} ({}) is neither published nor under its"
            + " temp name (deleted by hand?): a reader of the table fails on it", path, table,
            instant);
      }
    }
    if (published > 0) {
      LOG.warn("sparkguard: published {} committed files of {} on {} from their temp names (its"
          + " driver died after the outcome; roll forward, R8a)", published, instant, table);
    }
    return published;
  }

  /**
   * R8a of one file the outcome lists with a pending {@code upload} (object stores): complete
   * it with the outcome's part handles unless the object is there already with its size (the
   * driver completed it). True when this call completed it; an upload gone with no object is a
   * warning, as a temp file gone is.
   */
  private static boolean completeUpload(AtomicStore store, Path table, String instant, JsonNode file)
      throws IOException {
    String path = file.path("path").asText();
    Path target = new Path(table, path);
    long size = file.path("size").asLong();
    if (store.size(target) == size) {
      return false;
    }
    java.util.List<byte[]> parts = new java.util.ArrayList<>();
    for (JsonNode part : file.path("parts")) {
      parts.add(java.util.Base64.getDecoder().decode(part.asText()));
    }
    if (parts.isEmpty()) {
      throw new SparkguardException("instant " + instant + " lists upload '"
          + file.path("upload").asText() + "' for " + path + " without its parts; repair its"
          + " outcome, or run 'sparkguard rollback' of the job (it lists the upload's parts)");
    }
    byte[] upload = file.path("upload").asText().getBytes(java.nio.charset.StandardCharsets.UTF_8);
    try {
      store.completeUpload(target, upload, parts, size);
      return true;
    } catch (FileNotFoundException e) {
      LOG.warn("sparkguard: committed file {} of {} ({}) is neither published nor a pending"
          + " upload (aborted by hand, or by a lifecycle rule?): a reader of the table fails on"
          + " it", path, table, instant);
      return false;
    }
  }

  /** Whether {@code temp} is the contract's temp name of {@code path} in its directory. */
  static boolean isTempOf(String temp, String path) {
    int slash = path.lastIndexOf('/');
    int tempSlash = temp.lastIndexOf('/');
    if (!temp.substring(0, tempSlash + 1).equals(path.substring(0, slash + 1))) {
      return false;
    }
    java.util.regex.Matcher match = TEMP.matcher(temp.substring(tempSlash + 1));
    return match.matches() && match.group(1).equals(path.substring(slash + 1));
  }
}
