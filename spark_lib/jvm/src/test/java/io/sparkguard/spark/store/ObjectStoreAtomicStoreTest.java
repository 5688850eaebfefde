package io.sparkguard.spark.store;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.sparkguard.spark.TestSpark;
import io.sparkguard.spark.common.SparkVersions;
import io.sparkguard.spark.common.SparkVersions.UnsupportedSparkException;
import io.sparkguard.spark.common.SparkguardException.UnsupportedWriteException;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The object-store store's guarantees that need no S3 server (the racing put-if-absent on a real
 * S3 endpoint is tests/jvm/test_commit_protocol_s3.py): it refuses a filesystem without
 * conditional create instead of racing, it reads a 412 as "exists" and nothing else as that,
 * and its Hadoop configuration travels with it to the executors.
 */
public class ObjectStoreAtomicStoreTest {

  /** The local filesystem under another scheme, with or without the conditional capability. */
  public static class FakeStoreFileSystem extends RawLocalFileSystem {
    private URI uri;

    @Override
    public void initialize(URI name, Configuration conf) throws IOException {
      super.initialize(name, conf);
      uri = URI.create(name.getScheme() + ":///");
    }

    @Override
    public URI getUri() {
      return uri == null ? URI.create("file:///") : uri;  // null while the super constructor runs
    }

    @Override
    public boolean hasPathCapability(Path path, String capability) throws IOException {
      if (capability.equals(ObjectStoreAtomicStore.CONDITIONAL_CREATE)) {
        return getConf().getBoolean("sgtest.conditional", false);
      }
      return super.hasPathCapability(path, capability);
    }
  }

  private static Configuration fakeStore(String scheme, boolean conditional) {
    Configuration conf = new Configuration(false);
    conf.set("fs." + scheme + ".impl", FakeStoreFileSystem.class.getName());
    conf.setBoolean("fs." + scheme + ".impl.disable.cache", true);
    conf.set("sgtest.scheme", scheme);
    conf.setBoolean("sgtest.conditional", conditional);
    return conf;
  }

  @Test
  void aStoreWithoutConditionalCreateIsRefusedNamingTheS3aSetting() {
    Configuration conf = fakeStore("s3a", false);
    if (SparkVersions.running().startsWith("4.0.")) {
      // Spark 4.0's Hadoop (3.4.1) has no S3A conditional create to turn on: the refusal names
      // Spark 4.1+ instead (the compatibility tier runs this test on each supported line).
      UnsupportedSparkException e = assertThrows(UnsupportedSparkException.class,
          () -> AtomicStore.forTable(new Path("s3a:///bucket/table"), conf));
      assertTrue(e.getMessage().startsWith("sparkguard: s3a:// tables need Spark 4.1 or newer"
          + " (S3A's conditional create, Hadoop 3.4.2+); this is Spark 4.0."), e.getMessage());
      return;
    }
    UnsupportedWriteException e = assertThrows(UnsupportedWriteException.class,
        () -> AtomicStore.forTable(new Path("s3a:///bucket/table"), conf));
    assertTrue(e.getMessage().contains("fs.s3a.create.conditional.enabled=true"), e.getMessage());
    assertTrue(e.getMessage().contains("check-then-create"), e.getMessage());
  }

  @Test
  void anotherStoreWithoutConditionalCreateIsRefusedNamingTheCapability() {
    Configuration conf = fakeStore("sgtest", false);
    UnsupportedWriteException e = assertThrows(UnsupportedWriteException.class,
        () -> AtomicStore.forTable(new Path("sgtest:///table"), conf));
    assertTrue(e.getMessage().contains(ObjectStoreAtomicStore.CONDITIONAL_CREATE), e.getMessage());
    assertTrue(e.getMessage().contains("spark.sql.sources.commitProtocolClass"), e.getMessage());
  }

  @Test
  void hdfsIsNoLongerRefusedTheRenameStoreOpensItsFilesystem() {
    // No NameNode here: opening the filesystem fails, but not with sparkguard's refusal
    // (HadoopRenameAtomicStoreTest runs the store itself on Hadoop's local filesystem).
    RuntimeException e = assertThrows(RuntimeException.class,
        () -> AtomicStore.forTable(new Path("hdfs://namenode:8020/table"), new Configuration(false)));
    assertFalse(e instanceof UnsupportedWriteException, e.toString());
  }

  /** S3A's class for the 412 of a conditional PUT (the test only needs its name). */
  static final class RemoteFileChangedException extends IOException {
    RemoteFileChangedException(String message) {
      super(message);
    }
  }

  /** An SDK-style service exception carrying its HTTP status. */
  static final class ServiceException extends RuntimeException {
    private final int status;

    ServiceException(int status) {
      super("status " + status);
      this.status = status;
    }

    public int statusCode() {
      return status;
    }
  }

  @Test
  void onlyAPreconditionFailureMeansTheObjectExists() {
    assertTrue(ObjectStoreAtomicStore.isPreconditionFailed(
        new IOException("close", new RemoteFileChangedException("PUT precondition failed"))));
    assertTrue(ObjectStoreAtomicStore.isPreconditionFailed(new IOException(new ServiceException(412))));
    assertTrue(ObjectStoreAtomicStore.isPreconditionFailed(
        new org.apache.hadoop.fs.FileAlreadyExistsException("exists")));
    // A failure is a failure, even when its message happens to contain "412" (an instant id).
    assertFalse(ObjectStoreAtomicStore.isPreconditionFailed(
        new IOException("timeout writing 20260101000000412-job.outcome")));
    assertFalse(ObjectStoreAtomicStore.isPreconditionFailed(new IOException(new ServiceException(503))));
  }

  @Test
  void theConfigurationTravelsWithTheStore(@TempDir java.nio.file.Path dir) throws Exception {
    Files.write(dir.resolve("data"), new byte[] {1, 2, 3});
    Path file = new Path("sgtest://" + dir.resolve("data").toUri().getPath());
    AtomicStore store = AtomicStore.forTable(file.getParent(), fakeStore("sgtest", true));
    assertInstanceOf(ObjectStoreAtomicStore.class, store);
    assertEquals(file, store.workPath(file), "data files are written under their final names");

    AtomicStore copy = TestSpark.shipped(store);
    // Only the travelling conf knows fs.sgtest.impl: the copy reopens the store from it.
    assertEquals(3, copy.size(file));
    assertEquals(-1, copy.size(new Path(file.getParent(), "missing")));
  }
}
