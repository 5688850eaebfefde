package io.sparkguard.spark;

import io.sparkguard.spark.common.Concurrently;
import io.sparkguard.spark.common.FirstWriteRules;
import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.common.SparkVersions;
import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.common.SparkguardException.UnsupportedWriteException;
import io.sparkguard.spark.protocol.ProtocolSteps;
import io.sparkguard.spark.protocol.SidecarMarkerClient;
import io.sparkguard.spark.protocol.WriteCounter;
import io.sparkguard.spark.store.AtomicStore;
import io.sparkguard.spark.store.CountingAtomicStore;
import io.sparkguard.spark.store.HadoopRenameAtomicStore;
import io.sparkguard.spark.store.LocalAtomicStore;
import io.sparkguard.spark.store.ObjectStoreAtomicStore;
import io.sparkguard.spark.timeline.Compactor;
import io.sparkguard.spark.timeline.MicroBatch;
import io.sparkguard.spark.timeline.OwnerClaims;
import io.sparkguard.spark.timeline.RollForward;
import io.sparkguard.spark.timeline.Snapshots;
import io.sparkguard.spark.timeline.SupersededFiles;
import io.sparkguard.spark.timeline.TableListing;
import io.sparkguard.spark.timeline.Timeline;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.parquet.HadoopReadOptions;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.spark.internal.io.FileCommitProtocol;
import org.apache.spark.internal.io.FileNameSpec;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * sparkguard's {@code FileCommitProtocol}: every file write of Spark SQL ({@code
 * df.write.parquet}, {@code insertInto}, ...) becomes an instant of docs/storage-contract.md,
 * with no change to the job. Enabled by {@code
 * spark.sql.sources.commitProtocolClass=io.sparkguard.spark.SparkguardCommitProtocol} plus
 * {@code spark.sparkguard.jobId} (print the conf with {@code sparkguard spark-conf}).
 *
 * <p>The contract's write steps, and who runs them here:
 *
 * <table>
 *   <caption>steps</caption>
 *   <tr><th>step</th><th>where</th><th>what</th></tr>
 *   <tr><td>W2</td><td>driver, {@link #setupJob}</td><td>put-if-absent {@code <instant>.inflight} with the owner</td></tr>
 *   <tr><td>W3</td><td>driver, {@link #setupJob}</td><td>put-if-absent the journal entry (when {@code spark.sparkguard.journal} is set) and {@code MARKERS.type}</td></tr>
 *   <tr><td>W4</td><td>task, {@link #newTaskTempFile}</td><td>the direct marker {@code <file>.marker.CREATE}, before the file is opened</td></tr>
 *   <tr><td>W5</td><td>task</td><td>Spark's writer writes the file under a temp name in its final directory (rename stores: hidden from directory readers until W6)</td></tr>
 *   <tr><td>W5b</td><td>driver, {@link #onTaskCommit} (all done in {@link #commitJob} before W7)</td><td>rename stores: make each accepted attempt's temp file durable ({@link AtomicStore#persist})</td></tr>
 *   <tr><td>W7/W8</td><td>driver, {@link #commitJob}</td><td>verify every reported file (its temp file on rename stores); delete marked files no task reported and leftovers of marked names but the accepted temp files</td></tr>
 *   <tr><td>W9</td><td>driver, {@link #commitJob}</td><td>put-if-absent {@code <instant>.outcome} = committed with files, sizes, rows and, on rename stores, each file's temp name</td></tr>
 *   <tr><td>W6</td><td>driver, {@link #commitJob}</td><td>rename stores: publish, after the outcome: rename every temp file onto its deterministic name {@code part-<partition:05d>-<jobId>-w<n:03d>-c<seq:03d>.<ext>}, concurrently</td></tr>
 *   <tr><td>W9b</td><td>driver, {@link #commitJob}</td><td>{@code overwrite}/{@code overwrite-partitions}: delete the files the commit superseded ({@link SupersededFiles})</td></tr>
 *   <tr><td>W10</td><td>driver, {@link #commitJob}</td><td>delete the marker directory</td></tr>
 *   <tr><td>W11</td><td>driver, {@link #abortJob}</td><td>claim the instant as rolled back; its files are removed by the next {@code sparkguard rollback}</td></tr>
 * </table>
 *
 * <p>W5/W6 per store ({@link AtomicStore}): on local disk ({@link LocalAtomicStore}) and on
 * HDFS ({@code hdfs://}, {@code viewfs://}: {@link HadoopRenameAtomicStore}, {@code
 * FileContext.rename}) the task writes a temp name, which no directory reader lists, and
 * reports it; the driver makes it durable as each task's commit reaches it (local disk: an
 * fsync, in the background, overlapping the tasks still running), writes the outcome listing
 * the temp names, then publishes by rename ({@link AtomicStore#publishesOnDriver}): a plain
 * {@code spark.read.parquet} of the directory sees no file of a running or failed write, and a
 * driver that dies after the outcome leaves the renames to {@code sparkguard rollback}, which
 * finishes them from the outcome (roll forward); on object stores ({@code s3a://}, {@link ObjectStoreAtomicStore}) it writes the
 * final name directly (the object appears whole when its upload completes) and there is nothing
 * to publish.
 *
 * <p>A failed task attempt on a rename store leaves only temp files (deleted in {@link
 * #abortTask}, or by the commit); it never deletes a published name, so a previous run's committed file
 * survives a rerun's failed attempt. On object stores Spark's closing of the failed writer
 * completes a file of partial rows under the final name, so {@link #abortTask} deletes the names
 * the attempt opened; none is committed there, because {@code rerun=rewrite} (and speculation,
 * whose killed copies would do the same over the winner) are refused on object stores. This
 * version writes local paths, HDFS and object stores with conditional create, with direct
 * markers or markers batched by the driver's sidecar, in append mode, static overwrite (deferred: {@link
 * #deleteWithJob} deletes nothing, the commit supersedes, W9b deletes) and dynamic partition
 * overwrite; anything else is refused at once with a message naming the setting.
 */
public class SparkguardCommitProtocol extends FileCommitProtocol implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final Logger LOG = LoggerFactory.getLogger(SparkguardCommitProtocol.class);
  static final String PROTOCOL = SparkguardCommitProtocol.class.getName();
  /**
   * The {@code .inflight} {@code extra} key recording that the output path did not exist at
   * {@link #setupJob}: a rollback that leaves the table with nothing else removes it.
   */
  static final String CREATED_LOCATION = "createdLocation";

  private final String sparkJobId;
  private final String path;
  private final ProtocolSettings settings;
  private final AtomicStore store;
  /** The marker sidecar's client, or {@code null} for direct markers. */
  private final SidecarMarkerClient sidecar;
  /** Set by {@link #setupJob} on the driver, before the protocol is shipped to the tasks. */
  private String instant;
  /** The write identity (see {@link WriteCounter}), set with {@link #instant}. */
  private int write;
  /** The micro-batch this write runs in ({@code foreachBatch}), or {@code null}; set with
   * {@link #write}. */
  private MicroBatch microBatch;
  /** {@code append}, {@code rewrite} for a rerun's committed write written again, {@code
   * overwrite} or {@code overwrite-partitions}. */
  private String operation = "append";
  /** The committed instant this write repeats when it is skipped ({@code rerun=skip}), else null. */
  private String skippedFor;
  /**
   * Instants in the timeline at {@link #setupJob}'s listing, decided or not: with this write's
   * own, an upper bound of the decided hot instants compaction counts at the commit, but for
   * writes opened after that listing (the next commit counts those).
   */
  private int hotAtSetup = -1;

  /** Dynamic partition overwrite: the commit replaces exactly the partitions it wrote. */
  private final boolean dynamicPartitionOverwrite;
  /**
   * What Spark asked {@link #deleteWithJob} to delete before the job (static overwrite), relative
   * to the table ({@code ""}: the whole table); deleted only after the commit (W9b).
   */
  private final java.util.TreeSet<String> overwriteScopes = new java.util.TreeSet<>();

  /** Per task attempt (never serialized): the files it opened, by relative path. */
  private transient Map<String, Path> pending;
  /** Driver only: the fsyncs of temp files (W5b) {@link #onTaskCommit} started, by temp file. */
  private transient Map<String, Future<?>> persisting;
  /**
   * Tasks open data files through {@link OwnedFileSystem} ({@code sg-s3a://}, {@code
   * sg-file://}), which records their length and rows (and on S3A creates them without the
   * probes); decided on the driver ({@link OwnedFileSystem#available}: false when a setting of
   * the user's names another class for the owned scheme, or the jar has none for the table's
   * scheme: plain paths, and the task reads each file's size and footer back).
   */
  private final boolean ownedCreate;
  /**
   * Tasks leave each data file as a multipart upload for the driver to complete after the
   * outcome ({@link AtomicStore#pendingUploads}: S3A, with owned creates); decided on the driver.
   */
  private final boolean pendingUploads;
  /**
   * Hadoop setting (tests only): milliseconds W9a waits after each rename, publishing one file
   * at a time, so that a test can kill the driver inside the publication window. 0 (the
   * default): no wait, renames concurrent.
   */
  static final String PUBLISH_PAUSE_KEY = "sparkguard.test.publishPauseMs";
  private final long publishPauseMs;
  /**
   * Hadoop setting (tests only): milliseconds {@link #setupJob} waits after the write's
   * inflight instant and journal entry, before any task runs, so that a test can kill the
   * driver of an opened write that has no file yet. 0 (the default): no wait.
   */
  static final String SETUP_PAUSE_KEY = "sparkguard.test.setupPauseMs";
  private final long setupPauseMs;
  /**
   * This JVM's last publication (W9a, driver): {@code "<files> <milliseconds>"} from the outcome
   * written to the last file published; empty before the first. Read by {@code
   * benchmarks/commit_protocol.py} (the publication window, beside the magic committer's).
   */
  private static final java.util.concurrent.atomic.AtomicReference<String> LAST_PUBLICATION =
      new java.util.concurrent.atomic.AtomicReference<>("");

  /** See {@link #LAST_PUBLICATION}. */
  public static String lastPublication() {
    return LAST_PUBLICATION.get();
  }

  /** The constructor {@code FileCommitProtocol.instantiate} calls (on the driver). */
  public SparkguardCommitProtocol(String jobId, String path, boolean dynamicPartitionOverwrite) {
    SparkVersions.requireSupported();
    this.sparkJobId = jobId;
    this.path = path;
    this.settings = ProtocolSettings.fromSqlConf();
    this.dynamicPartitionOverwrite = dynamicPartitionOverwrite;
    Configuration hadoopConf = ProtocolSteps.hadoopConf();
    this.store = AtomicStore.forTable(new Path(path), hadoopConf);
    ProtocolSteps.refuseSpeculation(store, path);
    this.sidecar = ProtocolSteps.sidecar(settings);
    this.ownedCreate = OwnedFileSystem.available(new Path(path), hadoopConf);
    this.pendingUploads = ownedCreate && writesDirectly() && store.pendingUploads();
    this.publishPauseMs = hadoopConf.getLong(PUBLISH_PAUSE_KEY, 0);
    this.setupPauseMs = hadoopConf.getLong(SETUP_PAUSE_KEY, 0);
  }

  /** True when tasks write data files under their final names (object stores: no publish). */
  private boolean writesDirectly() {
    return ProtocolSteps.writesDirectly(store, path);
  }

  private Timeline timeline() {
    return new Timeline(store, new Path(path));
  }

  /** The instant this write opened ({@code null} before {@link #setupJob}). */
  public String instant() {
    return instant;
  }

  @Override
  public void setupJob(JobContext jobContext) {
    try {
      Map<String, Object> extra = new TreeMap<>();
      extra.put("protocol", PROTOCOL);
      extra.put("sparkJobId", sparkJobId);
      // Before anything below creates _sparkguard/ (the owner claim, the inflight): a rollback
      // of a write that created the location removes it again (docs/storage-contract.md, "The
      // life of a table"). Spark creates no directory before setupJob for saveAsTable, CTAS or
      // df.write to a new path (InsertIntoHadoopFsRelationCommand only checks it exists).
      //
      // One listing of the table's state serves every check made before the .inflight is
      // written (TableListing says which read serves which check): the location's existence,
      // C0's known instants, O4's fence (W1), C2's current claim, W1's rerun check over the hot
      // timeline and whether compaction will be due. Nothing is written before it.
      Path table = new Path(path);
      if (ownedCreate) {
        // The tasks open their files with the job's configuration (OwnedFileSystem#available).
        OwnedFileSystem.configure(jobContext.getConfiguration(), table);
      }
      final TableListing listed0 = TableListing.list(store, table, settings.jobId());
      TableListing listed = listed0;
      boolean exists = locationExists(listed);
      if (!exists) {
        extra.put(CREATED_LOCATION, true);
      }
      hotAtSetup = listed.hotInstants();
      // What the O4 check decides on: an instant of another owner not in here appeared after it.
      java.util.Set<String> known = OwnerClaims.filesOf(listed.timeline, settings.jobId()).keySet();
      if (!fenceEarlierAttempts(listed.timeline)) {
        // An earlier attempt of this owner was decided between the listing and its claim (its
        // driver, still alive, committed it): the rerun check below must see that outcome, as
        // it did when it listed the timeline after the fence. List again.
        listed = TableListing.list(store, table, settings.jobId());
      }
      TableListing state = listed;
      if (store.publishesOnDriver()) {
        // R8a before the rerun check: a committed write of this job whose driver died after
        // its outcome (inside the publication, W9a) is published first, so that rerun=skip
        // does not leave it unpublished and rerun=rewrite (whose tasks and W8 replace or
        // delete temp files of the same names) cannot lose it (RollForward).
        RollForward.publishCommitted(store, table, settings.jobId(), state.timeline);
      }
      OwnerClaims.Guard guard = OwnerClaims.guard(
          store, timeline(), settings.jobId(), settings.owner(), known, listed.claims);
      extra.put("ownerClaim", guard.claim().epoch());
      // Inside foreachBatch the identity is (query, batch, n-th write of the batch): a
      // restarted query begins with the batch that failed, not with the run's first write.
      microBatch = MicroBatch.current();
      if (microBatch != null) {
        extra.put(MicroBatch.EXTRA_KEY, microBatch.toJson());
      }
      String scope = microBatch == null ? "" : microBatch.counterScope();
      write = WriteCounter.next(settings.jobId(), tableUrl() + scope);
      // W1's rerun check: the hot part from the first listing; the archived part (only reached
      // when the hot timeline has no such commit) needs the snapshots listed AFTER that hot
      // listing ("Reading with snapshots"): a second listing, unless the location was empty
      // after the first (the existence check came after it, so no snapshot can be missed).
      String committed = timeline().committedWrite(settings.jobId(), write, microBatch,
          state.timeline, () -> {
            if (!exists && state == listed0) {
              return Snapshots.load(store, table, state.timeline, List.of(), List.of());
            }
            if (state.snapshotsAfterTimeline) {
              return Snapshots.load(store, table, state.timeline, state.snapshots, state.archive);
            }
            TableListing after = TableListing.list(store, table, settings.jobId());
            return Snapshots.load(store, table, state.timeline, after.snapshots, after.archive);
          });
      if (committed != null && !settings.rewriteOnRerun()) {
        // W1: write n of this job already committed (a rerun): the tasks write to local scratch
        // space, nothing reaches the table and no instant is opened (rerun=skip).
        skippedFor = committed;
        LOG.warn("sparkguard: job {} already committed write {} on {} as {}: skipping it"
            + " (spark.sparkguard.rerun=skip; set it to rewrite to write again)",
            settings.jobId(), write, path, committed);
        return;
      }
      if (committed != null && writesDirectly()) {
        // A failed attempt's writer completes its file on close (partial rows): over a
        // committed name that would replace committed data. Object stores only write new names.
        throw new UnsupportedWriteException(
            "sparkguard: write " + write + " of job " + settings.jobId() + " already committed on "
                + path + " as " + committed + ", and "
                + FirstWriteRules.message("rerun-rewrite", path, "rewrite"));
      }
      operation = committed != null ? "rewrite" : "append";
      operation = overwriteOperation(operation, extra);
      instant = timeline().start(settings, operation, extra, write);
      writeJournalEntry();
      // W2b (O4a): no other owner opened a write of this job here at the same moment.
      OwnerClaims.confirmSoleWriter(store, timeline(), guard, instant, settings.jobId(), path,
          OwnerClaims.SETTLE_TIMEOUT_MILLIS, System::currentTimeMillis);
      if (sidecar == null) {  // the sidecar writes MARKERS.type itself, before its first batch
        store.putIfAbsent(
            new Path(timeline().markerDirectory(instant), "MARKERS.type"),
            settings.markerType().getBytes(StandardCharsets.UTF_8));
      }
      LOG.info("sparkguard: write {} of job {} to {} started", instant, settings.jobId(), path);
      if (setupPauseMs > 0) {
        Thread.sleep(setupPauseMs);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new UncheckedIOException(new java.io.InterruptedIOException(
          "sparkguard: interrupted after starting the write to " + path));
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot start the write to " + path, e);
    }
  }

  /**
   * Whether the table's location exists (a directory, or on object stores any key under it):
   * true when {@code listed} found a file under {@code _sparkguard/}; else on an object store one
   * LIST of one key under it, elsewhere the filesystem's {@code exists}. Taken after {@code
   * listed}: when it says no, nothing at all was under the location after that listing.
   */
  private boolean locationExists(TableListing listed) throws IOException {
    if (listed.any) {
      return true;
    }
    Path location = new Path(path);
    AtomicStore inner = store instanceof CountingAtomicStore counting ? counting.inner() : store;
    if (inner instanceof ObjectStoreAtomicStore objects) {
      Boolean any = objects.anyUnder(location);
      if (any != null) {
        return any;
      }
    }
    return location.getFileSystem(ProtocolSteps.hadoopConf()).exists(location);
  }

  /**
   * W1, in part (docs/storage-contract.md, O4): an undecided instant of this job on the table
   * that belongs to another owner makes the write refuse at once (both would write the same
   * names); one of this owner (an earlier attempt) is claimed as rolled back, so it can never
   * commit. Deleting its files is left to {@code sparkguard rollback} (the operator's rollback
   * initContainer runs it before every driver start); the rerun rewrites the same names anyway.
   * False when one of them was decided by someone else since {@code listedTimeline} was taken.
   */
  private boolean fenceEarlierAttempts(List<String> listedTimeline) throws IOException {
    Timeline timeline = timeline();
    boolean allClaimed = true;
    List<String> undecided = Timeline.undecided(settings.jobId(), listedTimeline);
    for (String other : undecided) {
      String owner = timeline.ownerOf(other);
      if (!owner.equals(settings.owner())) {
        throw new SparkguardException.OwnerConflictException(
            "sparkguard: refusing to write " + path + ": instant " + other + " of job "
                + settings.jobId() + " is undecided and belongs to owner '" + owner + "', not '"
                + settings.owner() + "' (both would write the same file names). If that owner"
                + " will never come back, run: sparkguard rollback --job-id " + settings.jobId()
                + " --journal <journal> --owner '" + owner + "' (or --force), then rerun");
      }
    }
    for (String own : undecided) {
      if (timeline.claimRollback(own)) {
        LOG.warn("sparkguard: claimed earlier undecided write {} of job {} on {} as rolled back;"
            + " 'sparkguard rollback' deletes its files", own, settings.jobId(), path);
      } else {
        allClaimed = false;  // decided since the listing
      }
    }
    return allClaimed;
  }

  private String tableUrl() {
    return tableUrl(path);
  }

  /** The table as the Python writer records it: local paths absolute, no scheme, no trailing /. */
  static String tableUrl(String path) {
    Path table = new Path(path);
    String scheme = table.toUri().getScheme();
    String url = scheme == null || scheme.equals("file") ? table.toUri().getPath() : table.toString();
    return url.endsWith("/") ? url.substring(0, url.length() - 1) : url;
  }

  private void writeJournalEntry() throws IOException {
    writeJournalEntry(settings, tableUrl(), instant);
  }

  /** W3: the journal entry of {@code instant} (when {@code spark.sparkguard.journal} is set). */
  static void writeJournalEntry(ProtocolSettings settings, String tableUrl, String instant)
      throws IOException {
    if (settings.journal() == null) {
      return;
    }
    Path journal = new Path(settings.journal());
    Map<String, Object> body = new TreeMap<>();
    body.put("jobId", settings.jobId());
    body.put("table", tableUrl);
    body.put("instant", instant);
    body.put("attempt", settings.attempt());
    body.put("opened", java.time.OffsetDateTime.now(java.time.ZoneOffset.UTC).toString());
    Path entry = new Path(new Path(journal, settings.jobId()), instant + "~" + sha256Prefix(tableUrl) + ".json");
    AtomicStore.forTable(journal, ProtocolSteps.hadoopConf()).putIfAbsent(entry, Timeline.encode("sparkguard.journal-entry", body));
  }

  private static String sha256Prefix(String text) {
    try {
      byte[] digest = MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8));
      StringBuilder hex = new StringBuilder();
      for (int i = 0; i < 8; i++) {
        hex.append(String.format("%02x", digest[i]));
      }
      return hex.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("SHA-256 is always available", e);
    }
  }

  @Override
  public void setupTask(TaskAttemptContext taskContext) {
    pending = new LinkedHashMap<>();
  }

  @Override
  public String newTaskTempFile(TaskAttemptContext taskContext, Option<String> dir, FileNameSpec spec) {
    int partition = taskContext.getTaskAttemptID().getTaskID().getId();
    // Spark's suffix is "-c000.<ext>" for one directory but ".c000.<ext>" under partition
    // directories; the contract's name is part-<partition:05d>-<jobId>-w<n:03d>-c<seq:03d>.<ext>
    // in both (n: the write identity), with -q<query>-b<batchId:010d> before -w inside a
    // micro-batch (MicroBatch#nameTag).
    String suffix = spec.suffix().matches("^\\.c[0-9]{3}.*") ? "-" + spec.suffix().substring(1) : spec.suffix();
    String batchTag = microBatch == null ? "" : "-" + microBatch.nameTag();
    String name = spec.prefix()
        + String.format("part-%05d-%s%s-w%03d", partition, settings.jobId(), batchTag, write) + suffix;
    String relative = dir.isDefined() ? dir.get() + "/" + name : name;
    if (pending == null) {
      pending = new LinkedHashMap<>();
    }
    if (skippedFor != null) {
      Path scratch = new Path(scratchDirectory(taskContext), relative);
      pending.put(relative, scratch);
      return scratch.toString();
    }
    Path target = new Path(path, relative);
    Path work;
    try {
      if (ownedCreate && writesDirectly()) {
        // W4, then the writer opens the owned name: its create replaces a leftover of it.
        ProtocolSteps.mark(store, sidecar, timeline().markerDirectory(instant), relative);
        work = target;
        if (pendingUploads) {
          OwnedFileSystem.expectPendingUpload(target);
        }
      } else {
        work = ProtocolSteps.markAndPrepare(
            store, sidecar, timeline().markerDirectory(instant), target, relative);
      }
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot create the marker of " + target, e);
    }
    pending.put(relative, work);
    return (ownedCreate ? OwnedFileSystem.owned(work) : work).toString();
  }

  /**
   * Spark 4.0's form of {@link #newTaskTempFile(TaskAttemptContext, Option, FileNameSpec)}: there
   * it is abstract and its writers call it; 4.1 removed it (no {@code @Override}, so the one jar
   * compiles against 4.1+ and still implements it on 4.0).
   */
  public String newTaskTempFile(TaskAttemptContext taskContext, Option<String> dir, String ext) {
    return newTaskTempFile(taskContext, dir, new FileNameSpec("", ext));
  }

  /** Spark 4.0's form of {@link #newTaskTempFileAbsPath(TaskAttemptContext, String, FileNameSpec)}. */
  public String newTaskTempFileAbsPath(TaskAttemptContext taskContext, String absoluteDir, String ext) {
    return newTaskTempFileAbsPath(taskContext, absoluteDir, new FileNameSpec("", ext));
  }

  @Override
  public String newTaskTempFileAbsPath(TaskAttemptContext taskContext, String absoluteDir, FileNameSpec spec) {
    throw new UnsupportedWriteException(
        "sparkguard's commit protocol does not support partitions with custom locations yet ("
            + absoluteDir + "): write the table without custom partition locations");
  }

  /** A skipped write's task writes here (executor-local, never the table), and deletes it. */
  private Path scratchDirectory(TaskAttemptContext taskContext) {
    java.io.File dir = new java.io.File(System.getProperty("java.io.tmpdir"),
        "sparkguard-skip-" + settings.jobId() + "-" + taskContext.getTaskAttemptID());
    return new Path(dir.toURI());
  }

  private void deleteScratch(TaskAttemptContext taskContext) {
    try {
      new LocalAtomicStore().deleteDirectory(scratchDirectory(taskContext));
    } catch (IOException e) {
      LOG.warn("sparkguard: cannot delete scratch space of a skipped write", e);
    }
  }

  @Override
  public TaskCommitMessage commitTask(TaskAttemptContext taskContext) {
    ArrayList<CommittedFile> files = new ArrayList<>();
    if (skippedFor != null) {
      deleteScratch(taskContext);
      return new TaskCommitMessage(files);
    }
    Configuration conf = taskContext.getConfiguration();
    boolean driverPublishes = store.publishesOnDriver();
    try {
      for (Map.Entry<String, Path> entry : pending.entrySet()) {
        Path target = new Path(path, entry.getKey());
        Path work = entry.getValue();
        // W6 here, or by the driver after the outcome (AtomicStore#publishesOnDriver).
        boolean byDriver = driverPublishes && !work.equals(target);
        if (!work.equals(target) && !byDriver) {
          store.publish(work, target);
        }
        Path file = byDriver ? work : target;
        // The owned stream's record (no request, no file open); else the store's size and the
        // footer.
        OwnedFileSystem.Written written = OwnedFileSystem.take(work);
        long size = written != null ? written.length() : store.size(file);
        long rows = written != null && (written.rows() >= 0 || !isParquet(target))
            ? written.rows() : isParquet(target) ? countRows(file, conf) : -1;
        PendingUpload.Upload upload = written != null ? written.upload() : null;
        if (pendingUploads && upload == null) {
          // The writer did not open the name through the owned create (another filesystem
          // class, a writer of its own): it is in the store already, as before.
          LOG.warn("sparkguard: {} of {} was not written as a pending upload: visible before"
              + " the commit", entry.getKey(), path);
        }
        files.add(new CommittedFile(
            entry.getKey(), size, rows, byDriver ? work.toString() : null, upload));
      }
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot publish the files of a task of " + path, e);
    }
    pending.clear();
    return new TaskCommitMessage(files);
  }

  private static boolean isParquet(Path file) {
    return file.getName().endsWith(".parquet");
  }

  /** Rows of the Parquet file {@code file}, from its footer. */
  static long countRows(Path file, Configuration conf) throws IOException {
    // Read options from the task's conf: ParquetFileReader.open(file) alone builds them from a
    // new Configuration, which parses Hadoop's default XML resources again for every file.
    try (ParquetFileReader reader = ParquetFileReader.open(
        HadoopInputFile.fromPath(file, conf), HadoopReadOptions.builder(conf, file).build())) {
      return reader.getRecordCount();
    }
  }

  @Override
  public void abortTask(TaskAttemptContext taskContext) {
    if (skippedFor != null) {
      deleteScratch(taskContext);
      return;
    }
    if (pending == null) {
      return;
    }
    // Only this attempt's own files (no committed instant lists a name of this write on an
    // object store: rerun=rewrite is refused there).
    ProtocolSteps.deleteAttemptFiles(store, path, pending);
    pending.values().forEach(OwnedFileSystem::forget);
    pending.clear();
  }

  /**
   * Spark's static overwrite asks for the table (or the static partition's directory) to be
   * deleted before the job runs. Deleting now would destroy {@code _sparkguard/} and leave the
   * table empty if the job then failed; the deletion is deferred instead: the commit becomes an
   * {@code overwrite} (or {@code overwrite-partitions}) instant, which supersedes the older files
   * from the moment of its outcome, and they are deleted right after it (W9b). Nothing is deleted
   * here; a failed or skipped write leaves the old data untouched.
   */
  @Override
  public boolean deleteWithJob(FileSystem fs, Path toDelete, boolean recursive) {
    String table = tableUrl();
    String target = tableUrl(toDelete.toString());
    if (target.equals(table)) {
      overwriteScopes.add("");
    } else if (target.startsWith(table + "/")) {
      overwriteScopes.add(target.substring(table.length() + 1));
    } else {
      throw new UnsupportedWriteException(
          "sparkguard's commit protocol does not support overwriting partitions with custom"
              + " locations (" + toDelete + " is outside " + path + "): write the table without"
              + " custom partition locations");
    }
    LOG.info("sparkguard: overwrite of {} deferred until the write commits", toDelete);
    return true;
  }

  /**
   * The operation of this write when it overwrites: {@code overwrite} when Spark asked to
   * delete the whole table, {@code overwrite-partitions} for a static partition's directory or a
   * dynamic partition overwrite (the partitions go to {@code extra.partitions}); else {@code
   * operation} unchanged. An overwrite takes precedence over {@code rewrite}: it replaces the
   * rerun's earlier files too.
   */
  private String overwriteOperation(String operation, Map<String, Object> extra) {
    if (overwriteScopes.contains("")) {
      return "overwrite";
    }
    if (!overwriteScopes.isEmpty()) {
      extra.put("partitions", new ArrayList<>(overwriteScopes));
      return "overwrite-partitions";
    }
    return dynamicPartitionOverwrite ? "overwrite-partitions" : operation;
  }

  /**
   * The partition directories an {@code overwrite-partitions} commit replaces: the static ones
   * Spark asked to delete, plus (dynamic) every directory a reported file is in.
   */
  private List<String> replacedPartitions(Iterable<String> reported) {
    java.util.TreeSet<String> partitions = new java.util.TreeSet<>(overwriteScopes);
    if (dynamicPartitionOverwrite) {
      for (String relative : reported) {
        int slash = relative.lastIndexOf('/');
        if (slash > 0) {
          partitions.add(relative.substring(0, slash));
        }
      }
    }
    return new ArrayList<>(partitions);
  }

  /** W9b: delete what an overwrite commit superseded (see {@link SupersededFiles}). */
  private void deleteSuperseded(java.util.Set<String> listed, List<String> partitions) throws IOException {
    List<String> scopes = operation.equals("overwrite") ? List.of("") : partitions;
    List<String> deleted = SupersededFiles.delete(store, new Path(path), instant, scopes, listed);
    LOG.info("sparkguard: overwrite {} of {} deleted {} superseded files", instant, path, deleted.size());
  }

  @Override
  public void commitJob(JobContext jobContext, scala.collection.immutable.Seq<TaskCommitMessage> taskCommits) {
    if (skippedFor != null) {
      return;  // nothing was written to the table; write n stays the one skippedFor committed
    }
    Map<String, CommittedFile> reported = new TreeMap<>();
    for (TaskCommitMessage message : CollectionConverters.asJava(taskCommits)) {
      @SuppressWarnings("unchecked")
      List<CommittedFile> files = (List<CommittedFile>) message.obj();
      for (CommittedFile file : files) {
        reported.put(file.path, file);
      }
    }
    Timeline timeline = timeline();
    Path markers = timeline.markerDirectory(instant);
    try {
      persistReported(reported.values());  // W5b: the temp files the driver publishes, durable
      // W7: every reported file is there, with the size its task saw. W8: marked names no
      // task reported (a failed attempt's names), and leftovers of all but the temp files the
      // accepted attempts reported.
      Map<String, Long> sizes = new TreeMap<>();
      Map<String, Path> unpublished = new TreeMap<>();
      Map<String, String> uploads = new TreeMap<>();
      reported.forEach((relative, file) -> {
        sizes.put(relative, file.size);
        if (file.work != null) {
          unpublished.put(relative, new Path(file.work));
        }
        if (file.upload != null) {
          uploads.put(relative, file.upload.id());
        }
      });
      ProtocolSteps.sealMarkers(sidecar, markers);
      ProtocolSteps.verifyAndClean(store, path, markers, sizes, unpublished, uploads,
          "the write is not committed (rerun it)");
      // W9: decide.
      List<Map<String, Object>> files = new ArrayList<>();
      long rows = 0;
      for (CommittedFile file : reported.values()) {
        files.add(file.toJson());
        rows += Math.max(file.rows, 0);
      }
      Map<String, Object> extra = commitExtra(reported.keySet(), rows);
      if (microBatch != null) {
        extra.put(MicroBatch.EXTRA_KEY, microBatch.toJson());
      }
      List<String> partitions = replacedPartitions(reported.keySet());
      if (operation.equals("overwrite-partitions")) {
        extra.put("partitions", partitions);
      }
      timeline.commit(instant, files, extra, write);
      long decided = System.nanoTime();
      // W6 after the outcome: from here a crash leaves a committed instant whose markers
      // survive, which the next rollback rolls forward from the outcome's temp names and
      // uploads.
      publishAfterOutcome(unpublished, reported);
      LAST_PUBLICATION.set(files.size() + " " + (System.nanoTime() - decided) / 1_000_000.0);
      if (operation.startsWith("overwrite")) {
        deleteSuperseded(reported.keySet(), partitions);  // W9b, before W10: see SupersededFiles
      }
      // W10
      ProtocolSteps.deleteMarkers(store, sidecar, markers);
      LOG.info("sparkguard: write {} committed {} files to {}", instant, files.size(), path);
    } catch (IOException e) {
      throw new UncheckedIOException("sparkguard: cannot commit the write to " + path, e);
    }
    // After W10, best effort (never fails the committed write): compaction C1-C7.
    Compactor.afterCommit(store, new Path(path), settings, hotAtSetup + 1);
  }

  private Map<String, Object> commitExtra(Iterable<String> relativePaths, long rows) {
    Map<String, Object> extra = new TreeMap<>();
    extra.put("operation", operation);
    extra.put("attempt", settings.attempt());
    extra.put("rows", rows);
    extra.put("protocol", PROTOCOL);
    ProtocolSteps.putLayout(extra, relativePaths);
    return extra;
  }

  /**
   * Driver, as each task's commit reaches it (Spark's writer calls this once per partition, for
   * the commit that {@link #commitJob} then gets): W5b of the task's temp files where the driver
   * publishes them ({@link AtomicStore#publishesOnDriver}), started in the background so that
   * the fsyncs overlap the tasks still running. Nothing becomes visible here.
   */
  @Override
  public void onTaskCommit(TaskCommitMessage message) {
    @SuppressWarnings("unchecked")
    List<CommittedFile> files = (List<CommittedFile>) message.obj();
    for (CommittedFile file : files) {
      if (file.work != null) {
        startPersisting(file);
      }
    }
  }

  private synchronized Future<?> startPersisting(CommittedFile file) {
    if (persisting == null) {
      persisting = new HashMap<>();
    }
    return persisting.computeIfAbsent(file.work, work -> Publisher.POOL.submit(() -> {
      store.persist(new Path(work));
      return null;
    }));
  }

  /**
   * W5b of every reported temp file: waits for those {@link #onTaskCommit} started and makes
   * the rest durable (the same pool, concurrently); throws the first failure.
   */
  private void persistReported(java.util.Collection<CommittedFile> files) throws IOException {
    List<CommittedFile> byDriver = new ArrayList<>();
    List<Future<?>> started = new ArrayList<>();
    for (CommittedFile file : files) {
      if (file.work != null) {
        byDriver.add(file);
        started.add(startPersisting(file));
      }
    }
    Concurrently.awaitAll(started, "persisting the files of " + path, (i, cause) ->
        new IOException("sparkguard: cannot make " + byDriver.get(i).path + " of " + path
            + " durable (the write is not committed; rerun it)", cause));
  }

  /**
   * W6 after W9: rename every temp file of {@code unpublished} onto its name, and complete every
   * pending upload of {@code reported}, concurrently. A failure leaves the write committed with
   * files still under their temp names or uploads still open; the next {@code sparkguard
   * rollback} of the job publishes them from the outcome.
   */
  private void publishAfterOutcome(Map<String, Path> unpublished, Map<String, CommittedFile> reported)
      throws IOException {
    Map<String, Publication> steps = new TreeMap<>();
    unpublished.forEach((relative, work) ->
        steps.put(relative, () -> store.publish(work, new Path(path, relative))));
    reported.forEach((relative, file) -> {
      if (file.upload != null) {
        steps.put(relative, () -> store.completeUpload(
            new Path(path, relative), file.upload.handle(), file.upload.parts(), file.size));
      }
    });
    if (publishPauseMs > 0) {
      for (Publication step : steps.values()) {
        step.run();
        try {
          Thread.sleep(publishPauseMs);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new java.io.InterruptedIOException("interrupted publishing " + path);
        }
      }
      return;
    }
    List<String> names = new ArrayList<>(steps.keySet());
    List<Future<?>> renames = new ArrayList<>();
    for (String relative : names) {
      Publication step = steps.get(relative);
      renames.add(Publisher.POOL.submit(() -> {
        step.run();
        return null;
      }));
    }
    Concurrently.awaitAll(renames, "publishing the files of " + path, (i, cause) ->
        new IOException("sparkguard: write " + instant + " of " + path + " is committed but "
            + names.get(i) + " is not published yet; run 'sparkguard rollback' of the job (the"
            + " operator's rollback initContainer does) to finish publishing it", cause));
  }

  /** Publishing one file after the outcome: a rename, or an upload's completion. */
  private interface Publication {
    void run() throws IOException;
  }

  /** Before an abort's claim: no fsync of this job's temp files still runs. */
  private void stopPersisting() {
    List<Future<?>> started;
    synchronized (this) {
      if (persisting == null) {
        return;
      }
      started = new ArrayList<>(persisting.values());
    }
    for (Future<?> publication : started) {
      publication.cancel(false);  // not begun: never begins; running: ends on its own
      try {
        publication.get();
      } catch (ExecutionException | java.util.concurrent.CancellationException e) {
        // An abort: the rollback removes the temp files of the marked names.
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }

  @Override
  public void abortJob(JobContext jobContext) {
    if (instant == null) {
      return;
    }
    stopPersisting();
    try {
      boolean claimed = timeline().claimRollback(instant);
      LOG.warn(
          "sparkguard: write {} to {} aborted{}; run 'sparkguard rollback' (or let the operator)"
              + " to delete its files",
          instant, path, claimed ? " and claimed as rolled back" : " (it was already decided)");
    } catch (IOException e) {
      LOG.warn("sparkguard: cannot claim aborted write {} (a rollback will)", instant, e);
    }
  }

  /** The driver's fsyncs (W5b) and renames (W6, {@link AtomicStore#publishesOnDriver}): up to
   * 16 at once (a rename on HDFS is a NameNode round trip: the latencies overlap), daemon
   * threads; built on first use, so only where the driver publishes. */
  private static final class Publisher {
    static final ExecutorService POOL = Executors.newFixedThreadPool(16, runnable -> {
      Thread thread = new Thread(runnable, "sparkguard-publish");
      thread.setDaemon(true);
      return thread;
    });
  }

  /** What a task reports for one file it wrote. */
  static final class CommittedFile implements Serializable {
    private static final long serialVersionUID = 3L;
    final String path;
    final long size;
    final long rows;
    /** The temp file the driver publishes as {@code path} after the outcome (W6), or null:
     * written under its final name (object stores). */
    final String work;
    /** The pending upload the driver completes as {@code path} after the outcome (W6), or
     * null: in the store already. */
    final PendingUpload.Upload upload;

    CommittedFile(String path, long size, long rows, String work, PendingUpload.Upload upload) {
      this.path = path;
      this.size = size;
      this.rows = rows;
      this.work = work;
      this.upload = upload;
    }

    Map<String, Object> toJson() {
      Map<String, Object> json = new HashMap<>();
      json.put("path", path);
      json.put("size", size);
      json.put("rows", rows);
      if (work != null) {
        // The temp name W6 renames after the outcome (relative to the table, in the file's
        // directory): what a rollback publishes if the driver died before it did.
        int slash = path.lastIndexOf('/');
        json.put("temp", path.substring(0, slash + 1) + new Path(work).getName());
      }
      if (upload != null) {
        // The upload W6 completes after the outcome: what a rollback completes if the driver
        // died before it did. "parts": Hadoop's part handles (the JVM's roll forward completes
        // with them; the Python rollback lists the upload's parts instead).
        json.put("upload", upload.id());
        List<String> parts = new ArrayList<>();
        for (byte[] part : upload.parts()) {
          parts.add(java.util.Base64.getEncoder().encodeToString(part));
        }
        json.put("parts", parts);
      }
      return json;
    }
  }
}
