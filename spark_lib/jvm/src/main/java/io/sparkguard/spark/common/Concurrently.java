package io.sparkguard.spark.common;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/** Independent storage requests of one step, a bounded number in flight at once. */
public final class Concurrently {
  private Concurrently() {}

  /** One request of the step: may fail with an {@link IOException}. */
  @FunctionalInterface
  public interface Request<T, R> {
    R apply(T item) throws IOException;
  }

  /**
   * {@code request} of each of {@code items}, at most {@code threads} at once (daemon threads
   * named {@code name}), the answers in the order of {@code items}. Every request ends before
   * this returns or throws; the first failure is thrown, later ones suppressed in it. One item
   * or none: run here, no thread.
   */
  public static <T, R> List<R> map(List<T> items, int threads, String name, Request<T, R> request)
      throws IOException {
    if (items.size() < 2) {
      List<R> answers = new ArrayList<>(items.size());
      for (T item : items) {
        answers.add(request.apply(item));
      }
      return answers;
    }
    ExecutorService pool = Executors.newFixedThreadPool(
        Math.min(threads, items.size()), runnable -> {
          Thread thread = new Thread(runnable, name);
          thread.setDaemon(true);
          return thread;
        });
    try {
      List<Future<R>> futures = new ArrayList<>();
      for (T item : items) {
        futures.add(pool.submit(() -> request.apply(item)));
      }
      return awaitAll(futures, name, (i, cause) -> cause instanceof IOException io ? io
          : new IOException("sparkguard: " + name + " failed", cause));
    } finally {
      pool.shutdownNow();
    }
  }

  /** What the failure of the {@code index}-th of several futures is reported as. */
  @FunctionalInterface
  public interface Failure {
    IOException of(int index, Throwable cause);
  }

  /**
   * Waits for every one of {@code futures} (begun elsewhere, as {@code name}); their answers in
   * order. The first failure (as {@code failure} words it) is thrown once all have ended, later
   * ones suppressed in it.
   */
  public static <R> List<R> awaitAll(
      List<? extends Future<? extends R>> futures, String name, Failure failure)
      throws IOException {
    List<R> answers = new ArrayList<>(futures.size());
    IOException first = null;
    for (int i = 0; i < futures.size(); i++) {
      try {
        answers.add(futures.get(i).get());
      } catch (ExecutionException e) {
        IOException io = failure.of(i, e.getCause());
        if (first == null) {
          first = io;
        } else {
          first.addSuppressed(io);
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException("sparkguard: interrupted in " + name);
      }
    }
    if (first != null) {
      throw first;
    }
    return answers;
  }
}
