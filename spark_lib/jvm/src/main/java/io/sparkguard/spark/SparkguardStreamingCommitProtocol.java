package io.sparkguard.spark;

import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkVersions;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.common.SparkguardException.InstantDecidedException;
import io.sparkguard.spark.common.SparkguardException.UnsupportedWriteException;
import io.sparkguard.spark.protocol.ProtocolSteps;
import io.sparkguard.spark.protocol.SidecarMarkerClient;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.timeline.Compactor;
import io.sparkguard.spark.timeline.Timeline;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.spark.internal.io.FileNameSpec;
import org.apache.spark.sql.execution.streaming.ManifestFileCommitProtocol;
import org.apache.spark.sql.execution.streaming.sinks.FileStreamSinkLog;
import org.apache.spark.sql.execution.streaming.sinks.SinkFileStatus;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * sparkguard's protocol for Spark's streaming file sink ({@code writeStream.format("parquet")
 * .start(dir)}), enabled by {@code
 * spark.sql.streaming.commitProtocolClass=io.sparkguard.spark.SparkguardStreamingCommitProtocol}
 * plus {@code spark.sparkguard.jobId}.
 *
 * <p><b>Guarantees.</b> (1) A re-executed micro-batch (a query restarted from its checkpoint
 * after a crash before {@code _spark_metadata/<batch>} was written) writes the <em>same</em> file
 * names as the dead attempt: {@code part-<partition:05d>-<jobId>-b<batchId:010d>-c<seq:03d>.<ext>}.
 * (2) Every data file is marked before it is opened, in the instant's marker directory, so
 * {@code sparkguard rollback} finds and deletes what a dead attempt left that the manifest does
 * not list. (3) A reader listing the directory never sees a partial file of a running task: on
 * local disk and HDFS ({@code hdfs://}, {@code viewfs://}) tasks write a temp name in the file's
 * directory and rename it; on object stores ({@code s3a://}) they PUT the final name directly,
 * and the object appears only when its upload completes, whole. (4) Spark's manifest {@code
 * _spark_metadata/<batch>} is the commit: sparkguard's {@code <instant>.outcome} is written
 * after it and agrees with it; when a crash falls between the two, the next batch's {@link
 * #setupJob} (or a rollback) finds the batch in the manifest and records the instant as
 * committed, never as rolled back. Rollback never deletes a file the manifest lists.
 *
 * <p><b>Steps</b> (docs/storage-contract.md, "The streaming file sink"): one instant per batch
 * execution (operation {@code stream-batch}, {@code extra.batchId}); {@link #setupJob} settles
 * this job's earlier undecided instants on the sink (committed if the manifest lists their batch,
 * else claimed as rolled back), then writes the {@code .inflight}, journal entry and {@code
 * MARKERS.type}; tasks mark, write a temp file, rename it in {@link #commitTask} (object stores:
 * write the final name, nothing to rename); {@link
 * #commitJob} deletes marked names no task reported, refuses if a rollback claimed the instant,
 * writes the manifest (Spark's put-if-absent {@code _spark_metadata/<batch>}), then the committed
 * outcome, then deletes the markers. {@link #abortJob} (a failed batch, or the query's stop)
 * records the instant as committed if the manifest has the batch; else it claims it and, when
 * its claim won and the markers are plain, finishes the rollback ({@link
 * ProtocolSteps#finishClaimedRollback}: the batch's marked files are deleted, {@code .rolledback}
 * written, the markers deleted), so a stopped query leaves no ROLLING_BACK instant.
 *
 * <p><b>Stores</b> ({@link AtomicStore#forTable}, with the session's Hadoop conf so {@code
 * spark.hadoop.fs.s3a.*} apply): local paths and {@code hdfs://}/{@code viewfs://} are rename
 * stores; {@code s3a://} (and any store with conditional create) is written directly under the
 * final names. There a failed task attempt's writer, closed by Spark, completes an object of
 * partial rows under the final name: {@link #abortTask} deletes the names the attempt opened
 * (none is committed: Spark re-executes only a batch its manifest does not have, and names carry
 * the batch id); {@code spark.speculation=true} is refused (a killed speculative copy would do
 * the same over the winner's file); and {@link #newTaskTempFile} deletes an uncommitted object of
 * the name (a dead execution's) before Spark's writer opens it ({@link
 * AtomicStore#prepareWrite}).
 */
public class SparkguardStreamingCommitProtocol extends ManifestFileCommitProtocol {
  private static final long serialVersionUID = 1L;
  private static final Logger LOG = LoggerFactory.getLogger(SparkguardStreamingCommitProtocol.class);
  static final String PROTOCOL = SparkguardStreamingCommitProtocol.class.getName();
  static final String OPERATION = "stream-batch";
  static final String MANIFEST_DIR = "_spark_metadata";

  private final String sparkJobId;
  private final String path;
  private final ProtocolSettings settings;
  private final AtomicStore store;
  /** The marker sidecar's client, or {@code null} for direct markers. */
  private final SidecarMarkerClient sidecar;
  /** Driver only: the sink's manifest, from {@link #setupManifestOptions}. */
  private transient FileStreamSinkLog manifest;
  private long batchId = -1;
  /** Set by {@link #setupJob} on the driver, before the protocol is shipped to the tasks. */
  private String instant;
  /** Per task attempt (never serialized): the files it opened, by relative path. */
  private transient Map<String, Path> pending;

  /** The constructor the file sink calls ({@code jobId} is the batch id as a string). */
  public SparkguardStreamingCommitProtocol(String jobId, String path) {
    super(jobId, path);
    SparkVersions.requireSupported();
    this.sparkJobId = jobId;
    this.path = path;
    this.settings = ProtocolSettings.fromSqlConf();
    // The session's Hadoop conf: spark.hadoop.fs.s3a.* (endpoint, credentials) apply.
    this.store = AtomicStore.forTable(new Path(path), ProtocolSteps.hadoopConf());
    ProtocolSteps.refuseSpeculation(store, path);
    this.sidecar = ProtocolSteps.sidecar(settings);
  }

  private Timeline timeline() {
    return new Timeline(store, new Path(path));
  }

  /** The instant this batch execution opened ({@code null} before {@link #setupJob}). */
  public String instant() {
    return instant;
  }

  @Override
  public void setupManifestOptions(FileStreamSinkLog fileLog, long batchId) {
    super.setupManifestOptions(fileLog, batchId);
    this.manifest = fileLog;
    this.batchId = batchId;
  }

  /** The highest batch id the manifest committed, or -1. */
  private long manifestLatestBatch() {
    Option<Object> latest = manifest.getLatestBatchId();
    return latest.isDefined() ? (Long) latest.get() : -1L;
  }

  /** Relative path -> size of every file the manifest lists (compacted log included). */
  private Map<String, Long> manifestFiles() {
    Map<String, Long> files = new HashMap<>();
    String base = new Path(path).toUri().getPath();
    for (SinkFileStatus status : manifest.allFiles()) {
      String file = status.toFileStatus().getPath().toUri().getPath();
      if (file.startsWith(base + "/")) {
        files.put(file.substring(base.length() + 1), status.size());
      }
    }
    return files;
  }

  @Override
  public void setupJob(JobContext jobContext) {
    super.setupJob(jobContext);
    if (manifest == null) {
      throw new SparkguardException(
          "sparkguard: the streaming file sink did not call setupManifestOptions; "
              + PROTOCOL + " is for spark.sql.streaming.commitProtocolClass only");
    }
    try {
      settleEarlierAttempts();
      Map<String, Object> extra = new TreeMap<>();
      extra.put("protocol", PROTOCOL);
      extra.put("sparkJobId", sparkJobId);
      extra.put("batchId", batchId);
      extra.put("sink", "spark-file-sink");
      instant = timeline().start(settings, OPERATION, extra);
      SparkguardCommitProtocol.writeJournalEntry(
          settings, SparkguardCommitProtocol.tableUrl(path), instant);
      if (sidecar == null) {
        store.putIfAbsent(
            new Path(timeline().markerDirectory(instant), "MARKERS.type"),
            settings.markerType().getBytes(StandardCharsets.UTF_8));
      }
      LOG.info("sparkguard: batch {} of job {} to {} started as {}", batchId, settings.jobId(),
          path, instant);
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot start batch " + batchId + " of " + path, e);
    }
  }

  /**
   * This job's undecided instants on the sink: another owner's makes the batch refuse (O4); one
   * of this owner is an earlier execution of a batch. If the manifest committed that batch (the
   * crash fell between the manifest and the outcome), it is recorded as committed with the
   * marked files the manifest lists; otherwise it is claimed as rolled back (its files: the next
   * {@code sparkguard rollback}; a re-execution of the same batch rewrites the same names).
   */
  private void settleEarlierAttempts() throws IOException {
    Timeline timeline = timeline();
    List<String> undecided = timeline.undecided(settings.jobId());
    for (String other : undecided) {
      String owner = timeline.ownerOf(other);
      if (!owner.equals(settings.owner())) {
        throw new SparkguardException.OwnerConflictException(
            "sparkguard: refusing to write batch " + batchId + " to " + path + ": instant " + other
                + " of job " + settings.jobId() + " is undecided and belongs to owner '" + owner
                + "', not '" + settings.owner() + "' (both would write the same file names). If"
                + " that owner will never come back, run: sparkguard rollback --job-id "
                + settings.jobId() + " --journal <journal> --owner '" + owner + "' (or --force)");
      }
    }
    if (undecided.isEmpty()) {
      return;  // the common case: no manifest read (a listing of _spark_metadata)
    }
    Map<String, Long> listed = null;
    long latest = manifestLatestBatch();
    for (String own : undecided) {
      long ownBatch = batchOf(timeline, own);
      if (ownBatch >= 0 && ownBatch <= latest) {
        if (listed == null) {
          listed = manifestFiles();
        }
        recordCommitted(timeline, own, ownBatch, listed, "repaired");
        LOG.warn("sparkguard: {} (batch {}) is in {}/{}: recorded it as committed", own, ownBatch,
            path, MANIFEST_DIR);
      } else if (timeline.claimRollback(own)) {
        LOG.warn("sparkguard: claimed earlier undecided instant {} of job {} on {} as rolled"
            + " back; 'sparkguard rollback' deletes its files", own, settings.jobId(), path);
      }
    }
  }

  /** The batch id a stream-batch instant records, or -1 for any other instant. */
  static long batchOf(Timeline timeline, String instant) throws IOException {
    com.fasterxml.jackson.databind.JsonNode doc = timeline.inflight(instant);
    if (!OPERATION.equals(doc.path("operation").asText())
        || !doc.path("extra").path("batchId").canConvertToLong()) {
      return -1;
    }
    return doc.path("extra").path("batchId").asLong();
  }

  /** Commit {@code instant} with its marked files that {@code listed} (the manifest) lists. */
  private void recordCommitted(
      Timeline timeline, String instant, long batch, Map<String, Long> listed, String how)
      throws IOException {
    Path markers = timeline.markerDirectory(instant);
    List<Map<String, Object>> files = new ArrayList<>();
    Set<String> names = new TreeSet<>(Timeline.markedFiles(store, markers));
    for (String relative : names) {
      Long size = listed.get(relative);
      if (size != null) {
        files.add(fileJson(relative, size));
      }
    }
    try {
      timeline.commit(instant, files, commitExtra(batch, names, how), null);
    } catch (InstantDecidedException e) {
      LOG.warn("sparkguard: {} was decided meanwhile: {}", instant, e.getMessage());
      return;
    }
    deleteMarkers(instant);
  }

  private static Map<String, Object> fileJson(String relative, long size) {
    Map<String, Object> json = new TreeMap<>();
    json.put("path", relative);
    json.put("size", size);
    json.put("rows", -1L);  // the task does not read footers here; unknown (contract: -1)
    return json;
  }

  private Map<String, Object> commitExtra(long batch, Iterable<String> names, String how) {
    Map<String, Object> extra = new TreeMap<>();
    extra.put("operation", OPERATION);
    extra.put("attempt", settings.attempt());
    extra.put("protocol", PROTOCOL);
    extra.put("batchId", batch);
    extra.put("recorded", how);
    extra.put("rows", -1L);
    ProtocolSteps.putLayout(extra, names);
    return extra;
  }

  private void deleteMarkers(String of) throws IOException {
    ProtocolSteps.deleteMarkers(store, sidecar, timeline().markerDirectory(of));
  }

  @Override
  public void setupTask(TaskAttemptContext taskContext) {
    super.setupTask(taskContext);
    pending = new LinkedHashMap<>();
  }

  /** {@code part-<partition:05d>-<jobId>-b<batchId:010d>-c<seq:03d>.<ext>} for Spark's spec. */
  static String fileName(FileNameSpec spec, int partition, String jobId, long batchId) {
    // Spark's suffix is "-c000.<ext>" in one directory, ".c000.<ext>" under partition ones.
    String suffix = spec.suffix().matches("^\\.c[0-9]{3}.*") ? "-" + spec.suffix().substring(1)
        : spec.suffix();
    return spec.prefix() + String.format("part-%05d-%s-b%010d", partition, jobId, batchId) + suffix;
  }

  @Override
  public String newTaskTempFile(TaskAttemptContext taskContext, Option<String> dir, FileNameSpec spec) {
    int partition = taskContext.getTaskAttemptID().getTaskID().getId();
    String name = fileName(spec, partition, settings.jobId(), batchId);
    String relative = dir.isDefined() ? dir.get() + "/" + name : name;
    if (pending == null) {
      pending = new LinkedHashMap<>();
    }
    Path target = new Path(path, relative);
    Path work;
    try {
      // The marker, then (object stores) an uncommitted object of the name out of the way of
      // Spark's create(overwrite=false): a re-executed batch rewrites the dead attempt's names,
      // never a committed one (Spark re-executes only a batch the manifest does not have, and
      // every name carries its batch id).
      work = ProtocolSteps.markAndPrepare(
          store, sidecar, timeline().markerDirectory(instant), target, relative);
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot create the marker of " + target, e);
    }
    pending.put(relative, work);
    return work.toString();
  }

  @Override
  public String newTaskTempFileAbsPath(TaskAttemptContext taskContext, String absoluteDir, FileNameSpec spec) {
    throw new UnsupportedWriteException(
        "the streaming file sink writes no files at absolute paths (" + absoluteDir + ")");
  }

  @Override
  public TaskCommitMessage commitTask(TaskAttemptContext taskContext) {
    List<SinkFileStatus> statuses = new ArrayList<>();
    try {
      FileSystem fs = new Path(path).getFileSystem(taskContext.getConfiguration());
      for (Map.Entry<String, Path> entry : pending.entrySet()) {
        Path target = new Path(path, entry.getKey());
        if (!entry.getValue().equals(target)) {
          store.persist(entry.getValue());
          store.publish(entry.getValue(), target);
        }
        // The manifest records the qualified path, size and modification time of the published
        // file (one HEAD on S3A; the object is complete: its writer was closed before this).
        FileStatus status = fs.getFileStatus(target);
        statuses.add(org.apache.spark.sql.execution.streaming.sinks.SinkFileStatus$.MODULE$.apply(status));
      }
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot publish the files of a task of " + path, e);
    }
    pending.clear();
    // ManifestFileCommitProtocol.commitJob reads a Seq[SinkFileStatus] from every message.
    return new TaskCommitMessage(CollectionConverters.asScala(statuses).toSeq());
  }

  @Override
  public void abortTask(TaskAttemptContext taskContext) {
    if (pending == null) {
      return;
    }
    // Rename stores: only this attempt's temp files, never a published name (another attempt
    // may own it). Object stores: the names it opened, which Spark's close of the aborted
    // writer completed with partial rows; never committed ones (the batch is not in the
    // manifest, and its names carry its batch id).
    ProtocolSteps.deleteAttemptFiles(store, path, pending);
    pending.clear();
  }

  @Override
  public void onTaskCommit(TaskCommitMessage taskCommit) {
    // The parent remembers the files to delete them in abortJob; with deterministic names that
    // could delete a concurrent query's committed file of the same name. Rollback cleans up.
  }

  @Override
  public void commitJob(JobContext jobContext, scala.collection.immutable.Seq<TaskCommitMessage> taskCommits) {
    Map<String, Long> reported = new TreeMap<>();
    String base = new Path(path).toUri().getPath();
    for (TaskCommitMessage message : CollectionConverters.asJava(taskCommits)) {
      @SuppressWarnings("unchecked")
      scala.collection.immutable.Seq<SinkFileStatus> statuses =
          (scala.collection.immutable.Seq<SinkFileStatus>) message.obj();
      for (SinkFileStatus status : CollectionConverters.asJava(statuses)) {
        String file = status.toFileStatus().getPath().toUri().getPath();
        reported.put(file.substring(base.length() + 1), status.size());
      }
    }
    Timeline timeline = timeline();
    Path markers = timeline.markerDirectory(instant);
    try {
      // S6: reported sizes; marked names no task reported (a failed attempt's), and leftovers.
      ProtocolSteps.sealMarkers(sidecar, markers);
      ProtocolSteps.verifyAndClean(
          store, path, markers, reported, Map.of(), "batch " + batchId + " is not committed");
      // The fence: a rollback that claimed this instant has deleted (or will delete) its files.
      if (timeline.isDecided(instant)) {
        throw new InstantDecidedException(
            "sparkguard: batch " + batchId + " (" + instant + ") of " + path + " was claimed by a"
                + " rollback; not writing " + MANIFEST_DIR + "/" + batchId + ". Restart the query"
                + " from its checkpoint");
      }
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot commit batch " + batchId + " of " + path, e);
    }
    super.commitJob(jobContext, taskCommits);  // Spark's commit: _spark_metadata/<batchId>
    try {
      List<Map<String, Object>> files = new ArrayList<>();
      for (Map.Entry<String, Long> file : reported.entrySet()) {
        files.add(fileJson(file.getKey(), file.getValue()));
      }
      timeline.commit(instant, files, commitExtra(batchId, reported.keySet(), "commit"), null);
      deleteMarkers(instant);
      LOG.info("sparkguard: batch {} ({}) committed {} files to {}", batchId, instant, files.size(),
          path);
    } catch (IOException e) {
      // The manifest has the batch: the next batch's setupJob (or a rollback) records it.
      LOG.warn("sparkguard: batch {} is in {} but its outcome could not be written; the next"
          + " batch or 'sparkguard rollback' records it as committed", batchId, MANIFEST_DIR, e);
      return;
    }
    // After S10, best effort (never fails the committed batch): compaction C1-C7.
    Compactor.afterCommit(store, new Path(path), settings);
  }

  @Override
  public void abortJob(JobContext jobContext) {
    if (instant == null) {
      return;
    }
    try {
      Timeline timeline = timeline();
      if (manifestLatestBatch() >= batchId) {
        // Spark's commit went through (the failure came after it): the batch is committed.
        recordCommitted(timeline, instant, batchId, manifestFiles(), "abort");
        return;
      }
      if (!timeline.claimRollback(instant)) {
        LOG.warn("sparkguard: batch {} ({}) of {} aborted; it was already decided (a rollback"
            + " deletes its files)", batchId, instant, path);
        return;
      }
      // Claimed by this abort (a failed batch, or the query's stop): finish the rollback now,
      // so a clean stop leaves no ROLLING_BACK instant. The manifest has not committed this
      // batch (checked above), so no committed file carries one of its names (every name holds
      // the batch id).
      Map<String, Object> done = ProtocolSteps.finishClaimedRollback(
          store, sidecar, timeline, path, instant, settings.jobId(), Set.of(), PROTOCOL);
      if (done == null) {
        LOG.warn("sparkguard: batch {} ({}) of {} aborted and claimed as rolled back; its"
            + " markers need 'sparkguard rollback' to delete its files", batchId, instant, path);
      } else {
        LOG.warn("sparkguard: batch {} ({}) of {} aborted and rolled back: {} files deleted; a"
            + " restart from the checkpoint rewrites the same names", batchId, instant, path,
            done.get("filesDeleted"));
      }
    } catch (IOException e) {
      LOG.warn("sparkguard: cannot settle aborted batch {} (a rollback will)", instant, e);
    }
  }
}
