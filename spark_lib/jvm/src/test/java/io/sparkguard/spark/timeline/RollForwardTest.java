package io.sparkguard.spark.timeline;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.SparkguardException;
import io.sparkguard.spark.store.ForwardingStore;
import io.sparkguard.spark.store.LocalAtomicStore;
import java.io.FileNotFoundException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** R8a as the next write's setup runs it (docs/storage-contract.md, "Publication after the outcome"). */
class RollForwardTest {
  private static final String JOB = "job-a";
  private static final String INSTANT = "20261206120000000-" + JOB;
  private static final String OTHER = "20261206120000001-job-b";
  @TempDir java.nio.file.Path dir;
  private final LocalAtomicStore store = new LocalAtomicStore();

  private void write(String relative, String text) throws Exception {
    java.nio.file.Path file = dir.resolve(relative);
    Files.createDirectories(file.getParent());
    Files.writeString(file, text);
  }

  private void commit(String instant) throws Exception {
    write("_sparkguard/timeline/" + instant + ".inflight", "{}");
    write("_sparkguard/timeline/" + instant + ".outcome", "{\"outcome\": \"committed\", \"files\": ["
        + "{\"path\": \"part-0.parquet\", \"size\": 1, \"rows\": 1,"
        + " \"temp\": \".part-0.parquet.sg-tmp-0123456789ab\"},"
        + "{\"path\": \"k=1/part-1.parquet\", \"size\": 1, \"rows\": 1,"
        + " \"temp\": \"k=1/.part-1.parquet.sg-tmp-ba9876543210\"},"
        + "{\"path\": \"part-2.parquet\", \"size\": 1, \"rows\": 1}]}");
    write("_sparkguard/markers/" + instant + "/MARKERS.type", "direct");
  }

  private List<String> timeline() throws Exception {
    return store.listFiles(new Path(dir.resolve("_sparkguard/timeline").toUri()));
  }

  private int publish() throws Exception {
    return RollForward.publishCommitted(store, new Path(dir.toUri()), JOB, timeline());
  }

  @Test
  void aCommittedInstantWithMarkersIsPublishedOnceAndNothingIsDeleted() throws Exception {
    commit(INSTANT);
    write("part-0.parquet", "published already");  // the dead driver renamed this one
    write("k=1/.part-1.parquet.sg-tmp-ba9876543210", "one");
    write("part-2.parquet", "two");  // written under its name
    assertEquals(1, publish());
    assertEquals("published already", Files.readString(dir.resolve("part-0.parquet")));
    assertEquals("one", Files.readString(dir.resolve("k=1/part-1.parquet")));
    assertFalse(Files.exists(dir.resolve("k=1/.part-1.parquet.sg-tmp-ba9876543210")));
    assertEquals(0, publish(), "idempotent");
    assertEquals("two", Files.readString(dir.resolve("part-2.parquet")));
    assertTrue(Files.exists(dir.resolve("_sparkguard/markers/" + INSTANT + "/MARKERS.type")),
        "R8b (the markers) is the rollback's");
  }

  @Test
  void onlyThisJobsCommittedInstantsWithMarkersAreRolledForward() throws Exception {
    commit(OTHER);  // another job's
    write(".part-0.parquet.sg-tmp-0123456789ab", "other job");
    assertEquals(0, publish());
    commit(INSTANT);
    Files.delete(dir.resolve("_sparkguard/markers/" + INSTANT + "/MARKERS.type"));
    assertEquals(0, publish(), "no marker directory: published and cleaned (W10 ran)");
    write("_sparkguard/timeline/" + INSTANT + ".outcome", "{\"outcome\": \"rolled_back\"}");
    write("_sparkguard/markers/" + INSTANT + "/MARKERS.type", "direct");
    assertEquals(0, publish(), "a rolled-back instant's temp files are never published");
    assertFalse(Files.exists(dir.resolve("part-0.parquet")));
  }

  @Test
  void aTempThatIsNotATempNameOfItsFileIsRefused() throws Exception {
    assertTrue(RollForward.isTempOf("a/.x.parquet.sg-tmp-0123456789ab", "a/x.parquet"));
    assertFalse(RollForward.isTempOf(".x.parquet.sg-tmp-0123456789ab", "a/x.parquet"));
    assertFalse(RollForward.isTempOf("a/.y.parquet.sg-tmp-0123456789ab", "a/x.parquet"));
    assertFalse(RollForward.isTempOf("a/x.parquet", "a/x.parquet"));
    write("_sparkguard/timeline/" + INSTANT + ".inflight", "{}");
    write("_sparkguard/timeline/" + INSTANT + ".outcome", "{\"outcome\": \"committed\", \"files\":"
        + " [{\"path\": \"x.parquet\", \"temp\": \"../.x.parquet.sg-tmp-0123456789ab\"}]}");
    write("_sparkguard/markers/" + INSTANT + "/MARKERS.type", "direct");
    assertThrows(SparkguardException.class, this::publish);
  }

  /** An object store's R8a: the uploads its outcome lists, completed with the listed parts. */
  @Test
  void aCommittedInstantsPendingUploadsAreCompletedOnceWithTheirParts() throws Exception {
    List<String> completed = new ArrayList<>();
    ForwardingStore uploads = new ForwardingStore(store) {
      private static final long serialVersionUID = 1L;

      @Override
      protected void before(String op, Path path) {}

      @Override
      public void completeUpload(Path target, byte[] upload, List<byte[]> parts, long size)
          throws java.io.IOException {
        String id = new String(upload, StandardCharsets.UTF_8);
        if (id.equals("gone")) {
          throw new FileNotFoundException("no such upload " + id);
        }
        StringBuilder text = new StringBuilder();
        parts.forEach(part -> text.append(new String(part, StandardCharsets.UTF_8)));
        completed.add(target.getName() + ":" + id + ":" + text);
        Files.writeString(java.nio.file.Paths.get(target.toUri()), text.toString());
      }
    };
    String part = Base64.getEncoder().encodeToString("ab".getBytes(StandardCharsets.UTF_8));
    String more = Base64.getEncoder().encodeToString("c".getBytes(StandardCharsets.UTF_8));
    write("_sparkguard/timeline/" + INSTANT + ".inflight", "{}");
    write("_sparkguard/timeline/" + INSTANT + ".outcome", "{\"outcome\": \"committed\", \"files\": ["
        + "{\"path\": \"part-0.parquet\", \"size\": 3, \"rows\": 1, \"upload\": \"u0\","
        + " \"parts\": [\"" + part + "\", \"" + more + "\"]},"
        + "{\"path\": \"part-1.parquet\", \"size\": 3, \"rows\": 1, \"upload\": \"u1\","
        + " \"parts\": [\"" + part + "\", \"" + more + "\"]},"
        + "{\"path\": \"part-2.parquet\", \"size\": 3, \"rows\": 1, \"upload\": \"gone\","
        + " \"parts\": [\"" + part + "\"]}]}");
    write("_sparkguard/markers/" + INSTANT + "/MARKERS.type", "direct");
    write("part-1.parquet", "xyz");  // the dead driver completed this one (its size: 3)
    Path table = new Path(dir.toUri());
    assertEquals(1, RollForward.publishCommitted(uploads, table, JOB, timeline()));
    assertEquals(List.of("part-0.parquet:u0:abc"), completed);
    assertEquals("abc", Files.readString(dir.resolve("part-0.parquet")));
    assertFalse(Files.exists(dir.resolve("part-2.parquet")), "gone: a warning, nothing made up");
    assertEquals(0, RollForward.publishCommitted(uploads, table, JOB, timeline()), "idempotent");
    assertEquals(1, completed.size());
  }
}
