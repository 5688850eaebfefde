package io.sparkguard.spark.timeline;

import java.io.Serializable;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.SparkSession;
import scala.Option;

/**
 * The Structured Streaming micro-batch a batch write runs in: a write made inside {@code
 * foreachBatch} (docs/storage-contract.md, "Write identity", "Writes inside a micro-batch").
 *
 * <p>Spark runs the {@code foreachBatch} function on the query's stream execution thread, where
 * it has set the thread's local properties {@code sql.streaming.queryId} (the query's id, kept in
 * the checkpoint: the same after a restart), {@code streaming.sql.batchId} and the job group (the
 * run id: new at every start). A batch re-executed after a crash has the same query id and batch
 * id and is given the same data, so (query id, batch id, n-th write of the batch) identifies the
 * write across restarts, where "the n-th write of this driver run" does not: a restarted query
 * begins with the batch that failed, not with batch 0.
 */
public final class MicroBatch implements Serializable {
  private static final long serialVersionUID = 1L;
  static final String QUERY_ID_PROPERTY = "sql.streaming.queryId";
  static final String BATCH_ID_PROPERTY = "streaming.sql.batchId";
  static final String RUN_ID_PROPERTY = "spark.jobGroup.id";
  /** The key of {@code extra} in the {@code .inflight} and committed {@code .outcome}. */
  public static final String EXTRA_KEY = "microBatch";

  final String queryId;
  final long batchId;
  private final String runId;

  MicroBatch(String queryId, long batchId, String runId) {
    this.queryId = queryId;
    this.batchId = batchId;
    this.runId = runId == null ? "" : runId;
  }

  /** The micro-batch running on this (driver) thread, or {@code null} outside one. */
  public static MicroBatch current() {
    Option<SparkSession> session = SparkSession.getActiveSession();
    if (session.isEmpty()) {
      return null;
    }
    SparkContext context = session.get().sparkContext();
    String query = context.getLocalProperty(QUERY_ID_PROPERTY);
    String batch = context.getLocalProperty(BATCH_ID_PROPERTY);
    if (query == null || query.isEmpty() || batch == null || !batch.matches("[0-9]{1,18}")) {
      return null;
    }
    return new MicroBatch(query, Long.parseLong(batch), context.getLocalProperty(RUN_ID_PROPERTY));
  }

  /**
   * The part of the data file names that tells this micro-batch's writes from every other
   * write of the job: {@code q<first 8 hex of the query id>-b<batchId:010d>}.
   */
  public String nameTag() {
    String hex = queryId.replace("-", "").toLowerCase(Locale.ROOT);
    return String.format("q%s-b%010d", hex.substring(0, Math.min(8, hex.length())), batchId);
  }

  /** What the write counter is kept per, after the job id and table: this run's batch. */
  public String counterScope() {
    return "\nquery=" + queryId + "\nrun=" + runId + "\nbatch=" + batchId;
  }

  /** {@code {"queryId": .., "batchId": ..}} for {@code extra.microBatch}. */
  public Map<String, Object> toJson() {
    Map<String, Object> json = new TreeMap<>();
    json.put("queryId", queryId);
    json.put("batchId", batchId);
    return json;
  }

  /**
   * The batch id an instant's {@code extra.microBatch} ({@code recorded}) records for this
   * query, or -1 when it is another query's, or a plain write's (missing node).
   */
  long recordedBatch(com.fasterxml.jackson.databind.JsonNode recorded) {
    return queryId.equals(recorded.path("queryId").asText())
            && recorded.path("batchId").canConvertToLong()
        ? recorded.path("batchId").asLong()
        : -1;
  }

  /** Whether an instant's {@code extra.microBatch} (missing node: a plain write) is this one. */
  static boolean matches(MicroBatch batch, com.fasterxml.jackson.databind.JsonNode recorded) {
    if (recorded == null || recorded.isMissingNode() || recorded.isNull()) {
      return batch == null;
    }
    return batch != null && batch.recordedBatch(recorded) == batch.batchId;
  }
}
