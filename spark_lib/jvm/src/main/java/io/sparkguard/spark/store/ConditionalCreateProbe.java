package io.sparkguard.spark.store;

import io.sparkguard.spark.common.SparkguardException.UnsupportedWriteException;
import java.io.IOException;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Whether an S3 store honours {@code If-None-Match: *}, asked once per process, store and
 * bucket, before the first put-if-absent there.
 *
 * <p>Guarantee: no conditional create is trusted on a store that ignores the condition. Such
 * a store (older MinIO and Ceph RGW releases, some appliances) answers a create over an
 * existing key with 200 and replaces it, so put-if-absent, and with it exactly-once, would not
 * hold without a word. Mechanism: a probe key (a hidden name beside the first path) is created
 * twice with the condition; the second must be refused (412). Then it is deleted. The Python
 * writer asks the same way ({@code DirectPutFileManager.require_conditional_create}).
 */
public final class ConditionalCreateProbe {
  /** The create option that makes S3A's PUT conditional (hadoop-common's key). */
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

  /** Per store (endpoint) and bucket: whether the condition is honoured. */
  private static final Map<String, Boolean> HONOURED = new ConcurrentHashMap<>();

  private ConditionalCreateProbe() {}

  /**
   * Return when the store of {@code near} honours {@code If-None-Match: *} (probing it the
   * first time); only {@code s3a} stores are probed.
   *
   * @throws UnsupportedWriteException naming the store, the bucket and the choices when it
   *     ignores the condition
   */
  public static void require(FileSystem fs, Path near) throws IOException {
    if (!"s3a".equals(fs.getUri().getScheme())) {
      return;
    }
    String bucket = fs.getUri().getHost();
    String endpoint = fs.getConf().get("fs.s3a.endpoint", "");
    String store = endpoint + "|" + fs.getUri();
    Boolean honoured = HONOURED.get(store);
    if (honoured == null) {
      honoured = probe(fs, new Path(near, ".sg-create-probe-" + UUID.randomUUID()));
      HONOURED.put(store, honoured);
    }
    if (!honoured) {
      throw new UnsupportedWriteException(
          "sparkguard: the store at " + (endpoint.isEmpty() ? "the default S3 endpoint" : endpoint)
              + " ignores If-None-Match: * on PUT in bucket '" + bucket + "' (a second create"
              + " of a probe key replaced the first), so sparkguard's create-if-absent would"
              + " silently overwrite; use a store release that honours conditional writes, or"
              + " write through the Python writer with spark.sparkguard.createMode=check-then-put"
              + " (a racy check: one writer per path only)");
    }
  }

  private static boolean probe(FileSystem fs, Path probe) throws IOException {
    try {
      for (int i = 0; i < 2; i++) {
        try (FSDataOutputStream out =
            (FSDataOutputStream) fs.createFile(probe).must(CONDITIONAL_CREATE, true).build()) {
          out.write(new byte[0]);
        }
      }
      return false;
    } catch (FileAlreadyExistsException e) {
      return true;
    } catch (IOException e) {
      if (ObjectStoreAtomicStore.isPreconditionFailed(e)) {
        return true;
      }
      throw e;
    } finally {
      try {
        fs.delete(probe, false);
      } catch (IOException e) {
        // a probe key left behind is a hidden, empty object: harmless
      }
    }
  }
}
