package io.sparkguard.spark.common;

/** Base of every error sparkguard's JVM layer raises; each message says what was wrong and what to do. */
public class SparkguardException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public SparkguardException(String message) {
    super(message);
  }

  public SparkguardException(String message, Throwable cause) {
    super(message, cause);
  }

  /** A {@code spark.sparkguard.*} setting has a value the protocol cannot use. */
  public static final class ConfigException extends SparkguardException {
    private static final long serialVersionUID = 1L;

    public ConfigException(String message) {
      super(message);
    }
  }

  /** The write asks for something this version of the protocol does not do (yet). */
  public static final class UnsupportedWriteException extends SparkguardException {
    private static final long serialVersionUID = 1L;

    public UnsupportedWriteException(String message) {
      super(message);
    }
  }

  /** An undecided instant of another owner stands in the way (same job id, same table). */
  public static final class OwnerConflictException extends SparkguardException {
    private static final long serialVersionUID = 1L;

    public OwnerConflictException(String message) {
      super(message);
    }
  }

  /** An instant was already decided (committed or rolled back) by someone else. */
  public static final class InstantDecidedException extends SparkguardException {
    private static final long serialVersionUID = 1L;

    public InstantDecidedException(String message) {
      super(message);
    }
  }
}
