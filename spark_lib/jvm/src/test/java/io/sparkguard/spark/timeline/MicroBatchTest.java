package io.sparkguard.spark.timeline;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.store.LocalAtomicStore;
import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The identity of a write inside a micro-batch (docs/storage-contract.md, "Writes inside a
 * micro-batch"): its name tag, and how {@link Timeline#committedWrite} finds the committed write
 * of a re-executed batch (never a plain write's, never another query's or batch's).
 */
class MicroBatchTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String QUERY = "d336d5bf-1c2e-4f00-9a41-0123456789ab";
  private static final ProtocolSettings SETTINGS =
      ProtocolSettings.parse(Map.of("spark.sparkguard.jobId", "fb-1")::get);
  @TempDir Path dir;

  private Timeline timeline() {
    return new Timeline(new LocalAtomicStore(), new org.apache.hadoop.fs.Path(dir.toUri()));
  }

  /** Open (and with {@code commit}, commit) a write of {@code batch} (null: a plain write). */
  private String write(MicroBatch batch, int n, boolean commit) throws IOException {
    Map<String, Object> extra = new TreeMap<>();
    if (batch != null) {
      extra.put(MicroBatch.EXTRA_KEY, batch.toJson());
    }
    String instant = timeline().start(SETTINGS, "append", extra, n);
    if (commit) {
      timeline().commit(instant, List.of(), Map.of("operation", "append"), n);
    } else {
      timeline().claimRollback(instant);
    }
    return instant;
  }

  @Test
  void nameTagHasTheQueryAndTheBatch() {
    assertEquals("qd336d5bf-b0000000042", new MicroBatch(QUERY, 42, "run").nameTag());
  }

  @Test
  void theCounterIsPerRunAndBatch() {
    MicroBatch run1 = new MicroBatch(QUERY, 7, "run-1");
    assertFalse(run1.counterScope().equals(new MicroBatch(QUERY, 7, "run-2").counterScope()));
    assertFalse(run1.counterScope().equals(new MicroBatch(QUERY, 8, "run-1").counterScope()));
  }

  @Test
  void matchesOnlyTheSameQueryAndBatch() throws IOException {
    MicroBatch batch = new MicroBatch(QUERY, 3, "run");
    assertTrue(MicroBatch.matches(batch, JSON.valueToTree(batch.toJson())));
    assertFalse(MicroBatch.matches(new MicroBatch(QUERY, 4, "run"), JSON.valueToTree(batch.toJson())));
    assertFalse(MicroBatch.matches(new MicroBatch("other", 3, "run"), JSON.valueToTree(batch.toJson())));
    assertFalse(MicroBatch.matches(batch, JSON.missingNode()));  // a plain write
    assertFalse(MicroBatch.matches(null, JSON.valueToTree(batch.toJson())));
    assertTrue(MicroBatch.matches(null, JSON.missingNode()));
  }

  @Test
  void aReExecutedBatchFindsItsOwnCommittedWriteNotBatchZeros() throws IOException {
    String plain = write(null, 0, true);
    String batch0 = write(new MicroBatch(QUERY, 0, "run-1"), 0, true);
    write(new MicroBatch(QUERY, 1, "run-1"), 0, true);
    String batch2 = write(new MicroBatch(QUERY, 2, "run-1"), 0, true);
    // The restarted query (run 2) re-executes batch 2 first: its write 0 is batch 2's.
    assertEquals(batch2, timeline().committedWrite("fb-1", 0, new MicroBatch(QUERY, 2, "run-2")));
    assertEquals(batch0, timeline().committedWrite("fb-1", 0, new MicroBatch(QUERY, 0, "run-2")));
    // Batch 3 never ran: nothing, though batch 0 committed a write 0 (the data-loss case).
    assertNull(timeline().committedWrite("fb-1", 0, new MicroBatch(QUERY, 3, "run-2")));
    assertNull(timeline().committedWrite("fb-1", 1, new MicroBatch(QUERY, 2, "run-2")));
    // Plain writes match only plain writes; another query's batch 2 is not this one's.
    assertEquals(plain, timeline().committedWrite("fb-1", 0));
    assertNull(timeline().committedWrite("fb-1", 0, new MicroBatch("other-query", 2, "run")));
  }

  @Test
  void aWriteThatDidNotCommitIsNotFound() throws IOException {
    write(new MicroBatch(QUERY, 0, "run-1"), 0, true);
    write(new MicroBatch(QUERY, 1, "run-1"), 0, false);  // rolled back
    assertNull(timeline().committedWrite("fb-1", 0, new MicroBatch(QUERY, 1, "run-2")));
  }
}
