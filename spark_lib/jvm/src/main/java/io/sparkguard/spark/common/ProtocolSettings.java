package io.sparkguard.spark.common;

import io.sparkguard.spark.common.SparkguardException.ConfigException;
import java.io.Serializable;
import java.util.Locale;
import java.util.Optional;
import java.util.function.Function;
import java.util.regex.Pattern;
import org.apache.spark.sql.internal.SQLConf;

/**
 * The {@code spark.sparkguard.*} settings of a write, parsed once (on the driver) into a typed,
 * serializable value that travels to the executors with the protocol. The keys and their rules
 * are the Python writer's ({@code spark_lib/spark/config.py}, docs/writer.md).
 */
public final class ProtocolSettings implements Serializable {
  private static final long serialVersionUID = 1L;

  public static final String JOB_ID_KEY = "spark.sparkguard.jobId";
  public static final String OWNER_KEY = "spark.sparkguard.owner";
  public static final String ATTEMPT_KEY = "spark.sparkguard.attempt";
  public static final String MARKER_TYPE_KEY = "spark.sparkguard.markers.type";
  public static final String JOURNAL_KEY = "spark.sparkguard.journal";
  public static final String RERUN_KEY = "spark.sparkguard.rerun";
  public static final String ENDPOINT_KEY = "spark.sparkguard.markers.endpoint";
  public static final String TOKEN_FILE_KEY = "spark.sparkguard.markers.tokenFile";
  public static final String SNAPSHOT_EVERY_KEY = "spark.sparkguard.timeline.snapshotEvery";
  public static final String ARCHIVE_RETENTION_KEY = "spark.sparkguard.timeline.archiveRetentionDays";
  /** docs/storage-contract.md, "Compaction, step by step": the default of snapshotEvery. */
  public static final int DEFAULT_SNAPSHOT_EVERY = 10;
  static final String DRIVER_HOST_KEY = "spark.driver.host";
  static final String DRIVER_HOST_PLACEHOLDER = "{driverHost}";

  /** docs/storage-contract.md, "Layout": 1-100 of [a-z0-9.-], alphanumeric at both ends. */
  static final Pattern JOB_ID = Pattern.compile("^[a-z0-9]([a-z0-9.-]{0,98}[a-z0-9])?$");

  static final int OWNER_MAX_LENGTH = 256;

  private final String jobId;
  private final String owner;
  private final int attempt;
  private final String journal;
  private final String markerType;
  private final String markerEndpoint;
  private final String tokenFile;
  private final boolean rewriteOnRerun;
  private final int snapshotEvery;
  /** Days an archive file is kept after its snapshot was created; -1: forever. */
  private final int archiveRetentionDays;

  private ProtocolSettings(
      String jobId, String owner, int attempt, String journal, String markerType,
      String markerEndpoint, String tokenFile, boolean rewriteOnRerun, int snapshotEvery,
      int archiveRetentionDays) {
    this.rewriteOnRerun = rewriteOnRerun;
    this.snapshotEvery = snapshotEvery;
    this.archiveRetentionDays = archiveRetentionDays;
    this.jobId = jobId;
    this.owner = owner;
    this.attempt = attempt;
    this.journal = journal;
    this.markerType = markerType;
    this.markerEndpoint = markerEndpoint;
    this.tokenFile = tokenFile;
  }

  /** The settings of the session running on this (driver) thread. */
  public static ProtocolSettings fromSqlConf() {
    SQLConf conf = SQLConf.get();
    return parse(key -> conf.getConfString(key, null));
  }

  /**
   * Parse the settings from a key lookup that answers {@code null} for unset keys.
   *
   * @throws ConfigException naming the key and the fix
   */
  public static ProtocolSettings parse(Function<String, String> lookup) {
    String jobId = lookup.apply(JOB_ID_KEY);
    if (jobId == null || jobId.isEmpty()) {
      throw new ConfigException(
          JOB_ID_KEY + " is not set: sparkguard's commit protocol needs a fixed job id, so that a"
              + " rerun writes the same file names; set it (e.g. --conf "
              + JOB_ID_KEY + "=nightly-sales), or print the whole conf with"
              + " 'sparkguard spark-conf --job-id <id>'");
    }
    if (!JOB_ID.matcher(jobId).matches()) {
      throw new ConfigException(
          JOB_ID_KEY + " '" + jobId + "' is not valid: use 1-100 lower-case letters, digits, '-'"
              + " or '.', starting and ending with a letter or digit (e.g. 'nightly-sales-2026-11-22')");
    }
    String owner = lookup.apply(OWNER_KEY);
    if (owner != null && !isValidOwner(owner)) {
      throw new ConfigException(
          OWNER_KEY + " '" + owner + "' is not valid: use 1-" + OWNER_MAX_LENGTH
              + " printable characters (e.g. 'k8s:spark-jobs/nightly/4f2a9c'), or unset it for"
              + " 'job:<jobId>'");
    }
    int attempt = 0;
    String rawAttempt = lookup.apply(ATTEMPT_KEY);
    if (rawAttempt != null) {
      try {
        attempt = Integer.parseInt(rawAttempt.trim());
      } catch (NumberFormatException e) {
        attempt = -1;
      }
      if (attempt < 0) {
        throw new ConfigException(
            ATTEMPT_KEY + " '" + rawAttempt + "' is not valid: give a non-negative integer");
      }
    }
    String rawMarkerType = Optional.ofNullable(lookup.apply(MARKER_TYPE_KEY)).orElse("direct");
    String markerType = normaliseMarkerType(rawMarkerType);
    if (markerType == null) {
      throw new ConfigException(
          MARKER_TYPE_KEY + " '" + rawMarkerType + "' is not valid: use sidecar (batched by the"
              + " driver's marker sidecar) or direct (markers written to storage by each task)");
    }
    String endpoint = null;
    if (markerType.equals("TIMELINE_SERVER_BASED")) {
      endpoint = lookup.apply(ENDPOINT_KEY);
      if (endpoint == null || endpoint.isEmpty()) {
        throw new ConfigException(
            MARKER_TYPE_KEY + "=TIMELINE_SERVER_BASED needs the sidecar's address: set "
                + ENDPOINT_KEY + " (e.g. http://{driverHost}:8765) or use DIRECT");
      }
      if (endpoint.contains(DRIVER_HOST_PLACEHOLDER)) {
        String host = lookup.apply(DRIVER_HOST_KEY);
        if (host == null || host.isEmpty()) {
          throw new ConfigException(
              ENDPOINT_KEY + "='" + endpoint + "' uses " + DRIVER_HOST_PLACEHOLDER + " but "
                  + DRIVER_HOST_KEY + " is not set; give the sidecar's host instead");
        }
        endpoint = endpoint.replace(DRIVER_HOST_PLACEHOLDER, host);
      }
      if (!endpoint.startsWith("http://") && !endpoint.startsWith("https://")) {
        throw new ConfigException(
            ENDPOINT_KEY + "='" + endpoint + "' is not an http(s) URL; give e.g."
                + " http://{driverHost}:8765");
      }
    }
    String rawRerun = lookup.apply(RERUN_KEY);
    if (FirstWriteRules.refuses("rerun-value", rawRerun)) {  // shared with admission
      throw new ConfigException(FirstWriteRules.message("rerun-value", "", rawRerun));
    }
    String rerun = Optional.ofNullable(rawRerun).orElse("skip").trim().toLowerCase(java.util.Locale.ROOT);
    int snapshotEvery = nonNegativeInt(lookup, SNAPSHOT_EVERY_KEY, DEFAULT_SNAPSHOT_EVERY,
        "(e.g. 10: compact the timeline once 10 settled instants are uncovered; 0 turns automatic"
            + " compaction off)");
    int retention = nonNegativeInt(lookup, ARCHIVE_RETENTION_KEY, -1,
        "(days to keep archived instants after their snapshot, e.g. 30; unset keeps them)");
    return new ProtocolSettings(
        jobId, owner, attempt, lookup.apply(JOURNAL_KEY), markerType, endpoint,
        markerType.equals("TIMELINE_SERVER_BASED") ? lookup.apply(TOKEN_FILE_KEY) : null,
        rerun.equals("rewrite"), snapshotEvery, retention);
  }

  /** A non-negative integer setting, {@code unset} when absent; anything else is refused. */
  private static int nonNegativeInt(
      Function<String, String> lookup, String key, int unset, String example) {
    String raw = lookup.apply(key);
    if (raw == null) {
      return unset;
    }
    int value;
    try {
      value = Integer.parseInt(raw.trim());
    } catch (NumberFormatException e) {
      value = -1;
    }
    if (value < 0) {
      throw new ConfigException(
          key + " '" + raw + "' is not valid: give a non-negative integer " + example);
    }
    return value;
  }

  private static boolean isValidOwner(String owner) {
    if (owner.isBlank() || owner.length() > OWNER_MAX_LENGTH) {
      return false;
    }
    return owner.codePoints().noneMatch(Character::isISOControl);
  }

  /** The job id: embedded in data file names and instant ids. */
  public String jobId() {
    return jobId;
  }

  /** The owner recorded in the instant: the configured one, else {@code job:<jobId>}. */
  public String owner() {
    return owner != null ? owner : "job:" + jobId;
  }

  /** The operator's attempt number (recorded, not used in names). */
  public int attempt() {
    return attempt;
  }

  /** The job journal's location, or {@code null}. */
  public String journal() {
    return journal;
  }

  /**
   * A marker mode as users write it, {@code sidecar} or {@code direct} in any case ({@code
   * timeline-server} and {@code TIMELINE_SERVER_BASED} accepted for {@code sidecar}), as the
   * Python side's {@code markers.parse_marker_type}: {@code TIMELINE_SERVER_BASED}, {@code
   * DIRECT}, or null for anything else.
   */
  static String normaliseMarkerType(String raw) {
    switch (raw.trim().toUpperCase(Locale.ROOT).replace('-', '_')) {
      case "SIDECAR":
      case "TIMELINE_SERVER":
      case "TIMELINE_SERVER_BASED":
      case "BATCHED":
        return "TIMELINE_SERVER_BASED";
      case "DIRECT":
        return "DIRECT";
      default:
        return null;
    }
  }

  /** {@code DIRECT} (markers on storage) or {@code TIMELINE_SERVER_BASED} (the sidecar). */
  public String markerType() {
    return markerType;
  }

  /** True when markers go to the driver's marker sidecar. */
  public boolean sidecarMarkers() {
    return markerType.equals("TIMELINE_SERVER_BASED");
  }

  /** The sidecar's base URL ({@code {driverHost}} resolved), or {@code null} for DIRECT. */
  public String markerEndpoint() {
    return markerEndpoint;
  }

  /** True when a rerun's write that already committed is written again ({@code rerun=rewrite}). */
  public boolean rewriteOnRerun() {
    return rewriteOnRerun;
  }

  /**
   * Compact the timeline after a commit once this many settled instants are uncovered ({@code
   * spark.sparkguard.timeline.snapshotEvery}, default 10); 0: never automatically.
   */
  public int snapshotEvery() {
    return snapshotEvery;
  }

  /**
   * Days archive files are kept after their snapshot was created ({@code
   * spark.sparkguard.timeline.archiveRetentionDays}); -1 (unset): kept forever.
   */
  public int archiveRetentionDays() {
    return archiveRetentionDays;
  }

  /** The sidecar's bearer token file, or {@code null}. */
  public String tokenFile() {
    return tokenFile;
  }
}
