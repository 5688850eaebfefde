package io.sparkguard.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.apache.spark.internal.io.FileNameSpec;
import org.junit.jupiter.api.Test;

/** The streaming sink's names are a function of (job, batch, partition, seq) only. */
class StreamingFileNameTest {

  @Test
  void aReExecutedBatchGetsTheSameNameInOneDirectory() {
    FileNameSpec spec = new FileNameSpec("", "-c000.snappy.parquet");
    String first = SparkguardStreamingCommitProtocol.fileName(spec, 3, "job-1", 7);
    assertEquals("part-00003-job-1-b0000000007-c000.snappy.parquet", first);
    assertEquals(first, SparkguardStreamingCommitProtocol.fileName(spec, 3, "job-1", 7));
  }

  @Test
  void partitionDirectoriesGetTheContractsSeparatorBeforeTheSequence() {
    FileNameSpec spec = new FileNameSpec("", ".c012.snappy.parquet");
    assertEquals(
        "part-00000-job-1-b0000000000-c012.snappy.parquet",
        SparkguardStreamingCommitProtocol.fileName(spec, 0, "job-1", 0));
  }

  @Test
  void batchIdsBeyondTenDigitsKeepEveryDigit() {
    FileNameSpec spec = new FileNameSpec("", "-c000.json");
    assertEquals(
        "part-00001-j-b12345678901-c000.json",
        SparkguardStreamingCommitProtocol.fileName(spec, 1, "j", 12345678901L));
  }
}
