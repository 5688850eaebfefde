package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.Arrays;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.example.data.Group;
import org.apache.parquet.example.data.simple.SimpleGroupFactory;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.example.ExampleParquetWriter;
import org.apache.parquet.hadoop.util.HadoopOutputFile;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The filesystem the protocol's tasks write data files through on object stores ({@code
 * sg-<scheme>://}), here over the local filesystem ({@code sg-file://}): Spark's {@code
 * create(overwrite=false)} replaces a leftover of the name instead of failing, and the stream
 * records the written length and the Parquet footer's rows, which a task's commit takes instead
 * of a size request and a footer read. S3A's side (no HEAD or LIST before the PUT) is counted on
 * the S3 server in tests/jvm/test_commit_protocol_s3.py.
 */
class OwnedFileSystemTest {
  @TempDir java.nio.file.Path dir;

  private static final MessageType SCHEMA =
      MessageTypeParser.parseMessageType("message t { required int64 n; required binary s; }");

  private static Configuration conf() {
    Configuration conf = new Configuration();
    conf.set("fs.sg-file.impl", OwnedFileSystem.class.getName());
    conf.setBoolean("fs.sg-file.impl.disable.cache", true);
    return conf;
  }

  private Path real(String name) {
    return new Path(dir.resolve(name).toUri());
  }

  private static void writeParquet(Path path, Configuration conf, int rows) throws IOException {
    SimpleGroupFactory groups = new SimpleGroupFactory(SCHEMA);
    try (ParquetWriter<Group> writer =
        ExampleParquetWriter.builder(HadoopOutputFile.fromPath(path, conf))
            .withType(SCHEMA).withRowGroupSize(64 * 1024L).build()) {
      for (int i = 0; i < rows; i++) {
        writer.write(groups.newGroup().append("n", (long) i).append("s", "row-" + i));
      }
    }
  }

  @Test
  void aParquetFileWrittenThroughItRecordsItsLengthAndRowsForTheCommit() throws Exception {
    Configuration conf = conf();
    Path target = real("part-00000-j-w000-c000.parquet");
    // A leftover of the name (an earlier attempt's): Parquet opens with create(overwrite=false),
    // which the owned filesystem turns into a replacing create.
    Files.write(dir.resolve("part-00000-j-w000-c000.parquet"), "leftover".getBytes(StandardCharsets.UTF_8));
    Path owned = OwnedFileSystem.owned(target);
    assertEquals("sg-file", owned.toUri().getScheme());
    writeParquet(owned, conf, 50_000);  // several row groups

    long length = Files.size(dir.resolve("part-00000-j-w000-c000.parquet"));
    assertFalse(Files.exists(dir.resolve(".part-00000-j-w000-c000.parquet.crc")),
        "no checksum sidecar beside a local data file");
    FileSystem fs = owned.getFileSystem(conf);
    assertEquals(length, fs.getFileStatus(owned).getLen(), "the written length, before the commit");
    OwnedFileSystem.Written written = OwnedFileSystem.take(target);
    assertNotNull(written);
    assertEquals(length, written.length());
    assertEquals(50_000, written.rows());
    assertEquals(50_000, SparkguardCommitProtocol.countRows(target, new Configuration()),
        "the same count as the footer read it replaces");
    assertNull(OwnedFileSystem.take(target), "taken once");
    assertEquals(length, fs.getFileStatus(owned).getLen(), "then the store's answer");
  }

  @Test
  void aFileThatIsNotParquetRecordsItsLengthAndNoRows() throws Exception {
    Configuration conf = conf();
    Path target = real("part-00001-j-w000-c000.csv");
    FileSystem fs = OwnedFileSystem.owned(target).getFileSystem(conf);
    try (FSDataOutputStream out = fs.create(OwnedFileSystem.owned(target), false)) {
      out.write("a,b\n1,2\n".getBytes(StandardCharsets.UTF_8));
    }
    OwnedFileSystem.Written written = OwnedFileSystem.take(target);
    assertEquals(8, written.length());
    assertEquals(-1, written.rows());
  }

  @Test
  void onlyAClosedStreamIsRecordedAndForgetDropsARecord() throws Exception {
    Configuration conf = conf();
    Path target = real("part-00002-j-w000-c000.parquet");
    FileSystem fs = OwnedFileSystem.owned(target).getFileSystem(conf);
    FSDataOutputStream out = fs.create(OwnedFileSystem.owned(target), false);
    out.write(1);
    assertNull(OwnedFileSystem.take(target), "not closed: nothing recorded");
    out.close();
    assertEquals(1, OwnedFileSystem.take(target).length());
    try (FSDataOutputStream again = fs.create(OwnedFileSystem.owned(target), false)) {
      again.write(2);
    }
    OwnedFileSystem.forget(target);  // an aborted task attempt
    assertNull(OwnedFileSystem.take(target));
  }

  @Test
  void aLocalFileStartsItsWritebackAsItIsWrittenAndAGoneFileIsNoError() throws Exception {
    Configuration conf = conf();
    Path target = real("part-00003-j-w000-c000.bin");
    FileSystem fs = OwnedFileSystem.owned(target).getFileSystem(conf);
    long flushed = OwnedFileSystem.LocalFile.FLUSHED.get();
    byte[] chunk = new byte[1 << 20];
    long length = 3 * OwnedFileSystem.WRITEBACK_BYTES + 5;
    try (FSDataOutputStream out = fs.create(OwnedFileSystem.owned(target), false)) {
      for (long done = 0; done < length; ) {
        int n = (int) Math.min(chunk.length, length - done);
        Arrays.fill(chunk, 0, n, (byte) (done >>> 20));
        out.write(chunk, 0, n);
        done += n;
      }
      OwnedFileSystem.LocalFile.drain();
      assertTrue(OwnedFileSystem.LocalFile.FLUSHED.get() > flushed,
          "a flush started while the file was still being written");
    }
    byte[] back = Files.readAllBytes(dir.resolve("part-00003-j-w000-c000.bin"));
    assertEquals(length, back.length, "the flushes do not touch the bytes");
    assertEquals(2, back[2 << 20]);
    assertEquals(length, OwnedFileSystem.take(target).length());

    long ignored = OwnedFileSystem.LocalFile.IGNORED.get();
    new OwnedFileSystem.LocalFile(dir.resolve("renamed-or-deleted-meanwhile")).startWriteback();
    OwnedFileSystem.LocalFile.drain();
    assertEquals(ignored + 1, OwnedFileSystem.LocalFile.IGNORED.get(), "ignored, not thrown");
  }

  @Test
  void aLocalFileReachesTheKernelInLargeWritesWhateverBufferSparkAsksFor() throws Exception {
    Configuration conf = conf();
    Path target = real("part-00004-j-w000-c000.bin");
    java.nio.file.Path file = dir.resolve("part-00004-j-w000-c000.bin");
    FileSystem fs = OwnedFileSystem.owned(target).getFileSystem(conf);
    byte[] piece = new byte[100];  // a Parquet page header's size
    int pieces = (OwnedFileSystem.LOCAL_BUFFER_BYTES - 1) / piece.length;
    // Spark passes io.file.buffer.size (4 KiB): the stream buffers LOCAL_BUFFER_BYTES anyway.
    try (FSDataOutputStream out = fs.create(OwnedFileSystem.owned(target), true, 4096)) {
      for (int i = 0; i < pieces; i++) {
        Arrays.fill(piece, (byte) i);
        out.write(piece);
      }
      assertEquals(0, Files.size(file), "nothing reached the file before the buffer filled");
      out.write(new byte[piece.length]);
      assertTrue(Files.size(file) > 0, "a full buffer reaches the file in one write");
    }
    assertEquals((pieces + 1L) * piece.length, Files.size(file));
    assertEquals((pieces + 1L) * piece.length, OwnedFileSystem.take(target).length());
  }

  @Test
  void footerRowsNeedTheWholeFooterInTheTail() throws Exception {
    Configuration conf = new Configuration();
    Path file = real("whole.parquet");
    writeParquet(file, conf, 1_000);
    byte[] bytes = Files.readAllBytes(dir.resolve("whole.parquet"));
    assertEquals(1_000, OwnedFileSystem.parquetRows(bytes, bytes.length));
    int footer = (bytes[bytes.length - 8] & 0xff) | (bytes[bytes.length - 7] & 0xff) << 8;
    byte[] cut = Arrays.copyOfRange(bytes, bytes.length - footer - 4, bytes.length);
    assertEquals(-1, OwnedFileSystem.parquetRows(cut, cut.length), "a tail without the footer's start");
    byte[] notParquet = "PAR0PAR0PAR0PAR0".getBytes(StandardCharsets.US_ASCII);
    assertEquals(-1, OwnedFileSystem.parquetRows(notParquet, notParquet.length));
  }

  @Test
  void availableOnlyWhereHadoopResolvesTheSchemeToIt() {
    assertTrue(OwnedFileSystem.available(new Path("file:///t"), conf()));
    Configuration other = new Configuration();
    other.set("fs.sg-file.impl", org.apache.hadoop.fs.RawLocalFileSystem.class.getName());
    assertFalse(OwnedFileSystem.available(new Path("file:///t"), other));
    assertFalse(OwnedFileSystem.available(new Path("nothing:///t"), new Configuration()));
    // The jar's service entry registers sg-s3a without any setting.
    assertTrue(OwnedFileSystem.available(new Path("s3a://bucket/t"), new Configuration()));
    // A scheme the jar has no class for: only a setting makes it available.
    assertFalse(OwnedFileSystem.available(new Path("abfs://c@a/t"), new Configuration()));
  }

  @Test
  void aJobsConfigurationGetsTheOwnedClassOnlyWhereNothingNamesOne() {
    // A session with the jar in spark.jars only: Hadoop's service entries are read from another
    // class loader, so the protocol names the class in the job's configuration for its tasks.
    Configuration job = new Configuration(false);
    OwnedFileSystem.configure(job, new Path("file:///t"));
    assertEquals(OwnedLocalFileSystem.class.getName(), job.get("fs.sg-file.impl"));
    OwnedFileSystem.configure(job, new Path("hdfs://nn:8020/t"));
    assertEquals(OwnedHdfsFileSystem.class.getName(), job.get("fs.sg-hdfs.impl"));
    Configuration users = new Configuration(false);
    users.set("fs.sg-s3a.impl", "com.example.TheirOwn");
    OwnedFileSystem.configure(users, new Path("s3a://bucket/t"));
    assertEquals("com.example.TheirOwn", users.get("fs.sg-s3a.impl"), "the user's setting stays");
    Configuration other = new Configuration(false);
    OwnedFileSystem.configure(other, new Path("abfs://c@a/t"));
    assertNull(other.get("fs.sg-abfs.impl"));
  }

  @Test
  void theJarRegistersAnOwnedSchemePerStoreWithoutAnySetting() throws IOException {
    // Hadoop's service loader asks a fresh instance for its scheme: one class per scheme.
    Configuration plain = new Configuration();
    assertEquals(OwnedFileSystem.class, FileSystem.getFileSystemClass("sg-s3a", plain));
    assertEquals(OwnedLocalFileSystem.class, FileSystem.getFileSystemClass("sg-file", plain));
    assertEquals(OwnedHdfsFileSystem.class, FileSystem.getFileSystemClass("sg-hdfs", plain));
    assertEquals("sg-hdfs", new OwnedHdfsFileSystem().getScheme());
    assertTrue(OwnedFileSystem.available(new Path("hdfs://namenode:8020/t"), plain));
    Path temp = new Path("hdfs://namenode:8020/t/p=1/.part-00000.parquet.sg-tmp-0123456789ab");
    assertEquals("sg-hdfs://namenode:8020/t/p=1/.part-00000.parquet.sg-tmp-0123456789ab",
        OwnedFileSystem.owned(temp).toString());
    assertEquals(OwnedFileSystem.key(temp), OwnedFileSystem.key(OwnedFileSystem.owned(temp)));
  }

  @Test
  void pathsMapBothWays() {
    Path real = new Path(URI.create("s3a://bucket/table/p=1/part-00000.parquet"));
    assertEquals("sg-s3a://bucket/table/p=1/part-00000.parquet", OwnedFileSystem.owned(real).toString());
    assertEquals(OwnedFileSystem.key(real), OwnedFileSystem.key(OwnedFileSystem.owned(real)));
  }
}
