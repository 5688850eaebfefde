package io.sparkguard.spark;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/** Independent storage requests of one step, a bounded number in flight at once. */
final class Concurrently {
  private Concurrently() {}

  /** One request of the step: may fail with an {@link IOException}. */
  @FunctionalInterface
  interface Request<T, R> {
    R apply(T item) throws IOException;
  }

  /**
   * {@code request} of each of {@code items}, at most {@code threads} at once (daemon threads
   * named {@code name}), the answers in the order of {@code items}. Every request ends before
   * this returns or throws; the first failure is thrown, later ones suppressed in it. One item
   * or none: run here, no thread.
   */
  static <T, R> List<R> map(List<T> items, int threads, String name, Request<T, R> request)
      throws IOException {
    List<R> answers = new ArrayList<>(items.size());
    if (items.size() < 2) {
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
      IOException failure = null;
      for (Future<R> future : futures) {
        try {
          answers.add(future.get());
        } catch (ExecutionException e) {
          IOException io = e.getCause() instanceof IOException cause ? cause
              : new IOException("sparkguard: " + name + " failed", e.getCause());
          if (failure == null) {
            failure = io;
          } else {
            failure.addSuppressed(io);
          }
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new InterruptedIOException("sparkguard: interrupted in " + name);
        }
      }
      if (failure != null) {
        throw failure;
      }
      return answers;
    } finally {
      pool.shutdownNow();
    }
  }
}
