package io.sparkguard.spark.timeline;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.store.AtomicStore;
import java.io.IOException;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.LongSupplier;
import org.apache.hadoop.fs.Path;

/**
 * Owner claims: who may open writes of a job on a table, the atomic half of rule O4
 * (docs/storage-contract.md, "Owner claims"; the same files as {@code spark_lib/storage/owners.py}).
 *
 * <p>{@code <table>/_sparkguard/owners/<jobId>/<epoch:010d>.json}, each written put-if-absent.
 * The highest epoch is the current claim. A writer whose owner holds it writes on; another owner
 * takes the next epoch once it found no undecided instant of the job (O4), and of owners racing
 * for one epoch exactly one gets it. After writing its {@code .inflight} a writer confirms
 * ({@link #confirmSoleWriter}): a later epoch means another owner took over while it was
 * starting, so it backs off; an instant of another owner that appeared meanwhile is waited for
 * until it is decided. Epochs are dense, so "was I superseded" is one existence check.
 */
public final class OwnerClaims {

  static final String KIND = "sparkguard.owner-claim";
  /** How long a writer waits for a racing owner's instant to be decided (seconds, as in Python). */
  public static final long SETTLE_TIMEOUT_MILLIS = 10_000;
  private static final long SETTLE_POLL_MILLIS = 50;
  private static final int MAX_ROUNDS = 100;
  private static final ObjectMapper JSON = new ObjectMapper();

  /** One owner's turn at writing the job on the table. */
  public record Claim(long epoch, String owner) {}

  /** What {@link #guard} found before the instant was opened. */
  public record Guard(Claim claim, Set<String> known) {}

  private final AtomicStore store;
  private final Path directory;
  private final String jobId;

  OwnerClaims(AtomicStore store, Path table, String jobId) {
    this.store = store;
    this.jobId = jobId;
    this.directory = new Path(new Path(new Path(table, "_sparkguard"), "owners"), jobId);
  }

  Path path(long epoch) {
    return new Path(directory, String.format("%010d.json", epoch));
  }

  /** The claim with the highest epoch, or {@code null} when the job was never claimed here. */
  Claim current() throws IOException {
    return current(store.listFiles(directory));
  }

  /** {@link #current()} from {@code listed}, a listing of this job's claims already made. */
  Claim current(List<String> listed) throws IOException {
    long max = highest(listed);
    return max < 0 ? null : read(max);
  }

  /** The highest epoch among {@code listed} (names in the job's claim directory), or -1. */
  private long highest(List<String> listed) {
    long max = -1;
    for (String name : listed) {
      if (name.startsWith(".")) {
        continue;  // a temp file of a put in progress
      }
      if (!name.matches("[0-9]{10}\\.json")) {
        throw new SparkguardException("unexpected file " + new Path(directory, name)
            + " among the owner claims of job " + jobId + "; move it elsewhere");
      }
      max = Math.max(max, Long.parseLong(name.substring(0, 10)));
    }
    return max;
  }

  /** The claim of {@code epoch}, or {@code null} when there is none. */
  Claim read(long epoch) throws IOException {
    Path file = path(epoch);
    byte[] bytes = Snapshots.readIfExists(store, file);  // one GET (no existence probe first)
    if (bytes == null) {
      return null;
    }
    JsonNode doc = JSON.readTree(bytes);
    String owner = doc.path("owner").asText("");
    if (!KIND.equals(doc.path("kind").asText()) || doc.path("epoch").asLong(-1) != epoch
        || owner.isEmpty()) {
      throw new SparkguardException(file + ": an owner claim needs kind " + KIND + ", 'epoch' "
          + epoch + " and a non-empty 'owner'; it was not written by sparkguard: move it elsewhere");
    }
    return new Claim(epoch, owner);
  }

  /**
   * This owner's claim: the current one when it is this owner's, else a new epoch (call it only
   * after finding no undecided instant of another owner). Its first round reads the claims from
   * {@code listed} (a listing of the job's claims made before, or null to list now); a lost
   * put-if-absent lists again.
   */
  Claim acquire(String owner, List<String> listed) throws IOException {
    for (int round = 0; round < MAX_ROUNDS; round++) {
      Claim current = round == 0 && listed != null ? current(listed) : current();
      if (current != null && current.owner().equals(owner)) {
        return current;
      }
      long epoch = current == null ? 0 : current.epoch() + 1;
      Map<String, Object> body = new TreeMap<>();
      body.put("jobId", jobId);
      body.put("owner", owner);
      body.put("epoch", epoch);
      body.put("claimed", OffsetDateTime.now(ZoneOffset.UTC).toString());
      if (store.putIfAbsent(path(epoch), Timeline.encode(KIND, body))) {
        return new Claim(epoch, owner);
      }
    }
    throw new SparkguardException("could not claim job " + jobId + " in " + directory + " after "
        + MAX_ROUNDS + " rounds of racing owners; run the write again");
  }

  /** Instant id of {@code jobId} -> the suffixes of its files, from {@code listed}, a timeline
   * listing. */
  public static Map<String, Set<String>> filesOf(List<String> listed, String jobId) {
    Map<String, Set<String>> files = new TreeMap<>();
    for (String name : listed) {
      int dot = name.lastIndexOf('.');
      String instant = dot < 0 ? name : name.substring(0, dot);
      if (instant.matches("[0-9]{17}-.*") && instant.substring(18).equals(jobId)) {
        files.computeIfAbsent(instant, k -> new TreeSet<>()).add(dot < 0 ? "" : name.substring(dot));
      }
    }
    return files;
  }

  /**
   * After the O4 check (which refused another owner's undecided instant and claimed this
   * owner's), before the instant is opened: the instants that check saw, and this owner's claim;
   * C2's first read of the claims from {@code claims} (null: list them).
   */
  public static Guard guard(AtomicStore store, Timeline timeline, String jobId, String owner,
      Set<String> known, List<String> claims) throws IOException {
    return new Guard(new OwnerClaims(store, timeline.table(), jobId).acquire(owner, claims), known);
  }

  /**
   * W2b: after {@code instant}'s {@code .inflight}, before anything else of the write. Throws
   * {@link SparkguardException.OwnerConflictException}, after deciding {@code instant} rolled
   * back (nothing was written yet), when another owner claimed the job after this writer did,
   * or when an instant of another owner that appeared since the check committed or stays
   * undecided for the settle timeout.
   */
  public static void confirmSoleWriter(AtomicStore store, Timeline timeline, Guard guard,
      String instant, String jobId, String table, long settleTimeoutMillis, LongSupplier clock)
      throws IOException {
    String owner = guard.claim().owner();
    OwnerClaims claims = new OwnerClaims(store, timeline.table(), jobId);
    long deadline = clock.getAsLong() + settleTimeoutMillis;
    boolean first = true;
    while (true) {
      // One fresh listing, taken after the .inflight was written: on the first poll it answers
      // whether claim n+1 exists (C4's first check, read back only to name its owner) and,
      // every poll, which instants of the job the timeline holds. Reads only for instants in
      // flight now or new since the O4 check (a long history of decided instants costs nothing).
      TableListing listing = TableListing.claimsAndTimeline(store, timeline.table(), jobId);
      if (first) {
        first = false;
        String next = String.format("%010d.json", guard.claim().epoch() + 1);
        Claim successor = listing.claims.contains(next)
            ? claims.read(guard.claim().epoch() + 1) : null;
        if (successor != null) {
          backOff(timeline, instant, jobId, owner, table,
              "owner '" + successor.owner() + "' took over the job while this write was starting");
        }
      }
      Map<String, Set<String>> files = filesOf(listing.timeline, jobId);
      List<String> waiting = new ArrayList<>();
      for (Map.Entry<String, Set<String>> entry : files.entrySet()) {
        String other = entry.getKey();
        boolean decided = entry.getValue().contains(".outcome");
        if (other.equals(instant) || !entry.getValue().contains(".inflight")
            || (decided && guard.known().contains(other))) {
          continue;
        }
        String theirs = timeline.ownerOf(other);
        if (theirs.equals(owner) || isStreamRegistration(timeline, other)) {
          continue;
        }
        if (!decided) {
          waiting.add(other);
        } else if (timeline.isCommitted(other)) {
          backOff(timeline, instant, jobId, owner, table,
              "instant " + other + " of owner '" + theirs + "' committed meanwhile");
        }
      }
      if (waiting.isEmpty()) {
        return;
      }
      if (clock.getAsLong() >= deadline) {
        backOff(timeline, instant, jobId, owner, table, "instant " + waiting.get(0)
            + " of another owner is in flight (opened while this write was starting)");
      }
      try {
        Thread.sleep(SETTLE_POLL_MILLIS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while confirming the write of job " + jobId, e);
      }
    }
  }

  private static boolean isStreamRegistration(Timeline timeline, String instant)
      throws IOException {
    return "stream-register".equals(timeline.inflight(instant).path("operation").asText());
  }

  private static void backOff(Timeline timeline, String instant, String jobId, String owner,
      String table, String reason) throws IOException {
    if (timeline.claimRollback(instant)) {
      Map<String, Object> body = new TreeMap<>();
      body.put("owner", owner);
      body.put("marked", List.of());
      body.put("filesDeleted", 0);
      body.put("tempFilesRemoved", 0);
      body.put("filesKept", List.of());
      body.put("deleted", List.of());
      body.put("absent", List.of());
      body.put("passes", 1);
      body.put("complete", true);
      body.put("warnings", List.of());
      timeline.recordRolledBack(instant, body);
    }
    throw new SparkguardException.OwnerConflictException("sparkguard: " + reason + ", so this"
        + " write of job " + jobId + " on " + table + " by owner '" + owner + "' backed off (its"
        + " instant " + instant + " is rolled back; nothing was written): two owners would write"
        + " the same file names. Run it again once that write has finished, or give this job"
        + " another job id");
  }
}
