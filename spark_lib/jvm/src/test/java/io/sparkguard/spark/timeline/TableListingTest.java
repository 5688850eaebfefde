package io.sparkguard.spark.timeline;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.common.ProtocolSettings;
import io.sparkguard.spark.store.LocalAtomicStore;
import io.sparkguard.spark.store.ObjectStoreAtomicStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The one listing of a table's state ({@link TableListing}) and the raw object-store listings
 * it is made of on S3 ({@link ObjectStoreAtomicStore#listSkipping}, {@link
 * ObjectStoreAtomicStore#listedSizes}), against an in-memory bucket that pages like S3 (sorted
 * keys, start-after, continuation tokens), with small pages so that paging and the jumps over
 * unread ranges are exercised.
 */
class TableListingTest {
  @TempDir java.nio.file.Path dir;

  /** A sorted key -> size map served in pages of {@code pageKeys}, counting the requests. */
  static final class Bucket implements ObjectStoreAtomicStore.PageSource {
    final TreeMap<String, Long> keys = new TreeMap<>();
    final int pageKeys;
    final List<String> requests = new ArrayList<>();

    Bucket(int pageKeys) {
      this.pageKeys = pageKeys;
    }

    @Override
    public ObjectStoreAtomicStore.Page page(String prefix, String startAfter, String token,
        int maxKeys) {
      String after = token != null ? token : startAfter;
      requests.add(prefix + " after=" + after);
      List<ObjectStoreAtomicStore.Listed> objects = new ArrayList<>();
      String last = null;
      for (Map.Entry<String, Long> e
          : (after == null ? keys : keys.tailMap(after, false)).entrySet()) {
        if (!e.getKey().startsWith(prefix)) {
          if (e.getKey().compareTo(prefix) > 0) {
            break;
          }
          continue;
        }
        if (objects.size() == Math.min(pageKeys, maxKeys)) {
          return new ObjectStoreAtomicStore.Page(objects, last);  // truncated: token = last key
        }
        objects.add(new ObjectStoreAtomicStore.Listed(e.getKey(), e.getValue()));
        last = e.getKey();
      }
      return new ObjectStoreAtomicStore.Page(objects, null);
    }
  }

  private static List<String> names(List<ObjectStoreAtomicStore.Listed> listed) {
    List<String> names = new ArrayList<>();
    listed.forEach(l -> names.add(l.name()));
    return names;
  }

  @Test
  void theStateListingJumpsOverMarkersStreamsAndOtherJobsClaims() throws IOException {
    Bucket bucket = new Bucket(3);
    String p = "t/_sparkguard/";
    bucket.keys.put(p + "archive/000000000001.archive", 5L);
    for (int i = 0; i < 50; i++) {  // a big write in flight: its markers are not read here
      bucket.keys.put(p + String.format("markers/20260101000000000-other/f%03d.marker.CREATE", i), 0L);
    }
    for (String job : new String[] {"a-job", "job", "job-b", "zz"}) {
      for (int e = 0; e < 5; e++) {
        bucket.keys.put(p + "owners/" + job + String.format("/%010d.json", e), 9L);
      }
    }
    bucket.keys.put(p + "snapshots/000000000001.snapshot", 7L);
    for (int i = 0; i < 40; i++) {
      bucket.keys.put(p + "streams/s/commits/" + i, 1L);
    }
    bucket.keys.put(p + "timeline/20260101000000000-job.inflight", 3L);
    bucket.keys.put(p + "timeline/20260101000000000-job.outcome", 3L);
    bucket.keys.put("t/part-0.parquet", 100L);

    boolean[] seen = new boolean[2];
    List<ObjectStoreAtomicStore.Listed> listed = ObjectStoreAtomicStore.listSkipping(
        bucket, p, name -> TableListing.skip("job", name, seen));
    assertEquals(List.of("archive/000000000001.archive",
        "owners/job/0000000000.json", "owners/job/0000000001.json", "owners/job/0000000002.json",
        "owners/job/0000000003.json", "owners/job/0000000004.json",
        "snapshots/000000000001.snapshot",
        "timeline/20260101000000000-job.inflight", "timeline/20260101000000000-job.outcome"),
        names(listed));
    assertTrue(seen[0], "markers seen");
    assertTrue(seen[1], "streams seen");
    // 9 names read in pages of 3, plus the jumps: far fewer than the 124 keys' 42 pages.
    assertTrue(bucket.requests.size() <= 8, bucket.requests.toString());
  }

  @Test
  void aSmallTreeIsOneRequestAndAnEmptyOneToo() throws IOException {
    Bucket bucket = new Bucket(1000);
    String p = "t/_sparkguard/";
    boolean[] seen = new boolean[2];
    assertEquals(List.of(), names(ObjectStoreAtomicStore.listSkipping(
        bucket, p, name -> TableListing.skip("job", name, seen))));
    assertEquals(1, bucket.requests.size());
    bucket.keys.put(p + "markers/i/x.marker.CREATE", 0L);
    bucket.keys.put(p + "owners/job/0000000000.json", 1L);
    bucket.keys.put(p + "timeline/i.inflight", 1L);
    assertEquals(List.of("owners/job/0000000000.json", "timeline/i.inflight"),
        names(ObjectStoreAtomicStore.listSkipping(
            bucket, p, name -> TableListing.skip("job", name, seen))));
    assertEquals(2, bucket.requests.size());
    assertTrue(seen[0]);
    assertFalse(seen[1]);
  }

  @Test
  void sizesFromOnePageAndAbsentNamesWithinItsRange() throws IOException {
    Bucket bucket = new Bucket(4);
    bucket.keys.put("t/_sparkguard/timeline/x.inflight", 1L);
    bucket.keys.put("t/part-00000-j-w000-c000.parquet", 10L);
    bucket.keys.put("t/part-00000-old-w000-c000.parquet", 99L);
    bucket.keys.put("t/part-00002-j-w000-c000.parquet", 12L);
    bucket.keys.put("t/part-00003-j-w000-c000.parquet", 13L);
    bucket.keys.put("t/part-00004-j-w000-c000.parquet", 14L);
    TreeSet<String> names = new TreeSet<>(List.of("part-00000-j-w000-c000.parquet",
        "part-00001-j-w000-c000.parquet", "part-00002-j-w000-c000.parquet",
        "part-00004-j-w000-c000.parquet"));
    Map<String, Long> sizes = ObjectStoreAtomicStore.listedSizes(bucket, "t/", names);
    // One request, from just before the first name (the _sparkguard/ keys are not listed).
    assertEquals(1, bucket.requests.size());
    assertEquals(10L, sizes.get("part-00000-j-w000-c000.parquet"));
    assertEquals(-1L, sizes.get("part-00001-j-w000-c000.parquet"), "absent within the page");
    assertEquals(12L, sizes.get("part-00002-j-w000-c000.parquet"));
    // Beyond the page of 4 keys (00000-j, 00000-old, 00002, 00003): not decided here.
    assertNull(sizes.get("part-00004-j-w000-c000.parquet"));
    assertEquals(3, sizes.size());
    // The last page: a name past every key is absent.
    Bucket whole = new Bucket(1000);
    whole.keys.putAll(bucket.keys);
    names.add("part-00009-j-w000-c000.parquet");
    Map<String, Long> all = ObjectStoreAtomicStore.listedSizes(whole, "t/", names);
    assertEquals(14L, all.get("part-00004-j-w000-c000.parquet"));
    assertEquals(-1L, all.get("part-00009-j-w000-c000.parquet"));
  }

  @Test
  void onLocalDiskEachDirectoryIsListedAsTheChecksDid() throws IOException {
    LocalAtomicStore store = new LocalAtomicStore();
    Path table = new Path(dir.resolve("t").toUri());
    Path state = new Path(table, "_sparkguard");
    byte[] one = "x".getBytes(StandardCharsets.UTF_8);
    TableListing empty = TableListing.list(store, table, "job");
    assertFalse(empty.any);
    store.putIfAbsent(new Path(state, "timeline/20260101000000000-job.inflight"), one);
    store.putIfAbsent(new Path(state, "timeline/20260101000000000-job.outcome"), one);
    store.putIfAbsent(new Path(state, "timeline/20260101000000001-job.inflight"), one);
    store.putIfAbsent(new Path(state, "owners/job/0000000000.json"), one);
    store.putIfAbsent(new Path(state, "owners/other/0000000000.json"), one);
    store.putIfAbsent(new Path(state, "snapshots/000000000001.snapshot"), one);
    store.putIfAbsent(new Path(state, "streams/s/registration"), one);
    TableListing listed = TableListing.list(store, table, "job");
    assertTrue(listed.any);
    assertEquals(List.of("0000000000.json"), listed.claims);
    assertEquals(3, listed.timeline.size());
    assertEquals(List.of("000000000001.snapshot"), listed.snapshots);
    assertTrue(listed.streams);
    assertEquals(2, listed.hotInstants());  // one decided, one undecided
    assertEquals(List.of("20260101000000001-job"), Timeline.undecided("job", listed.timeline));
  }

  @Test
  void compactionIsNotListedForWhenTheSetupsCountIsBelowTheThreshold() throws IOException {
    TimelineHistory h = new TimelineHistory(new LocalAtomicStore(),
        new Path(dir.resolve("c").toUri()));
    for (int i = 0; i < 3; i++) {
      h.append("etl", i, "f" + i + ".parquet:10:1");
    }
    ProtocolSettings settings = ProtocolSettings.parse(key -> Map.of(
        ProtocolSettings.JOB_ID_KEY, "etl", ProtocolSettings.SNAPSHOT_EVERY_KEY, "3").get(key));
    Path snapshots = new Path(new Path(h.table, "_sparkguard"), "snapshots");
    // Below: the write's own listing counted 1 instant before it (+1, its own) = 2 < 3.
    Compactor.afterCommit(h.store, h.table, settings, 2);
    assertTrue(h.store.listFiles(snapshots).isEmpty());
    // Unknown (-1) or at the threshold: the run lists and compacts.
    Compactor.afterCommit(h.store, h.table, settings, 3);
    assertFalse(h.store.listFiles(snapshots).isEmpty());
  }
}
