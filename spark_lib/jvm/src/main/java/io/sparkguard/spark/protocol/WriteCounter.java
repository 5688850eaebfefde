package io.sparkguard.spark.protocol;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import org.apache.spark.SparkEnv;
import org.apache.spark.SparkFiles;

/**
 * The write identity (docs/storage-contract.md, "Write identity"): the n-th write of a job id to
 * a table in this driver run (one SparkContext), counted in the same files as the Python writer
 * ({@code spark_lib/spark/writer.py}, {@code next_write_index}): {@code <SparkFiles root>/.sparkguard-writes/
 * <first 32 hex of sha256(jobId + "\n" + table URL)>}, holding the next index in decimal. The
 * directory lives exactly as long as the SparkContext, so a restarted driver counts from 0.
 *
 * <p>Writes of one driver are serialized here; a Python write running at the same moment on the
 * same (job, table) is not (the contract does not support concurrent writes of one job to one
 * table: their order would not be reproducible).
 */
public final class WriteCounter {
  public static final String DIRECTORY = ".sparkguard-writes";

  private WriteCounter() {}

  /** Take the next write index of {@code jobId} on {@code tableUrl}; 0 outside a SparkContext. */
  public static synchronized int next(String jobId, String tableUrl) throws IOException {
    if (SparkEnv.get() == null) {
      return 0;
    }
    Path dir = Paths.get(SparkFiles.getRootDirectory(), DIRECTORY);
    Files.createDirectories(dir);
    Path file = dir.resolve(key(jobId, tableUrl));
    try (FileChannel channel =
            FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE);
        FileLock lock = channel.lock()) {
      ByteBuffer buffer = ByteBuffer.allocate(32);
      channel.read(buffer, 0);
      String raw = new String(buffer.array(), 0, buffer.position(), StandardCharsets.US_ASCII).strip();
      int index = raw.isEmpty() ? 0 : Integer.parseInt(raw);
      byte[] next = Integer.toString(index + 1).getBytes(StandardCharsets.US_ASCII);
      channel.write(ByteBuffer.wrap(next), 0);
      channel.truncate(next.length);
      return index;
    }
  }

  static String key(String jobId, String tableUrl) {
    try {
      byte[] digest = MessageDigest.getInstance("SHA-256")
          .digest((jobId + "\n" + tableUrl).getBytes(StandardCharsets.UTF_8));
      StringBuilder hex = new StringBuilder();
      for (int i = 0; i < 16; i++) {
        hex.append(String.format("%02x", digest[i]));
      }
      return hex.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("SHA-256 is always available", e);
    }
  }
}
