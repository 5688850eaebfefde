package io.sparkguard.spark.protocol;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.sparkguard.spark.common.SparkguardException;
import java.io.IOException;
import java.io.Serializable;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.Map;
import java.util.Set;

/**
 * Markers batched by the driver pod's marker sidecar (docs/sidecar.md), as the Python executors
 * send them: {@code POST <endpoint>/v1/markers/create} with {@code markerdir} and
 * {@code markername}, a bearer token from the token file. A marker is acknowledged only once the
 * sidecar answered 2xx, i.e. once it is durable on storage; transient answers (408, 429, 502,
 * 503, 504, connection errors) are retried with backoff until the deadline, every other answer
 * fails the task at once with the sidecar's message.
 */
public final class SidecarMarkerClient implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Set<Integer> RETRYABLE = Set.of(408, 429, 502, 503, 504);
  static final Duration DEADLINE = Duration.ofSeconds(120);

  private final String endpoint;
  private final String tokenFile;
  private transient HttpClient http;
  private transient String token;

  SidecarMarkerClient(String endpoint, String tokenFile) {
    this.endpoint = endpoint.endsWith("/") ? endpoint.substring(0, endpoint.length() - 1) : endpoint;
    this.tokenFile = tokenFile;
  }

  /** Create {@code markerName} in {@code markerDir} (a storage URL or absolute local path). */
  void create(String markerDir, String markerName) {
    post("create", Map.of("markerdir", markerDir, "markername", markerName));
  }

  /** Delete the marker directory through the sidecar (it drops its state for it too). */
  void deleteDir(String markerDir) {
    post("dir/delete", Map.of("markerdir", markerDir));
  }

  /**
   * Seal the marker directory before the commit reads its markers (W8): from then on the
   * sidecar acknowledges no marker of it, so a straggler task fails before it writes its data
   * file. Returns whether the sidecar sealed it: one older than the route answers 404, and the
   * commit goes on as before (a straggler's marker is acknowledged until the outcome exists).
   */
  boolean seal(String markerDir) {
    return post("dir/seal", Map.of("markerdir", markerDir), Set.of(404)) < 300;
  }

  private void post(String route, Map<String, String> params) {
    post(route, params, Set.of());
  }

  /** Send until a 2xx or an answer in {@code tolerated} (returned); fail on any other. */
  private int post(String route, Map<String, String> params, Set<Integer> tolerated) {
    byte[] body;
    try {
      body = JSON.writeValueAsBytes(params);
    } catch (IOException e) {
      throw new SparkguardException("cannot encode a marker request", e);
    }
    long deadline = System.nanoTime() + DEADLINE.toNanos();
    boolean tokenReloaded = false;
    String last = "no answer";
    for (int attempt = 1; ; attempt++) {
      try {
        HttpResponse<String> response = client().send(request(route, body), HttpResponse.BodyHandlers.ofString());
        int status = response.statusCode();
        if (status < 300 || tolerated.contains(status)) {
          return status;
        }
        if (status == 401 && tokenFile != null && !tokenReloaded) {
          token = null;  // the secret may have been rotated: read it again, once
          tokenReloaded = true;
          continue;
        }
        last = "HTTP " + status + ": " + response.body().strip();
        if (!RETRYABLE.contains(status)) {
          throw new SparkguardException(
              "sparkguard: the marker sidecar at " + endpoint + " refused " + route + " "
                  + params + ": " + last);
        }
      } catch (IOException e) {
        last = e.toString();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new SparkguardException("interrupted while sending a marker to " + endpoint, e);
      }
      if (System.nanoTime() > deadline) {
        throw new SparkguardException(
            "sparkguard: the marker sidecar at " + endpoint + " did not acknowledge " + route
                + " " + params + " within " + DEADLINE.toSeconds() + " s (" + attempt
                + " attempts, last: " + last + "); the task fails so that no unmarked file is"
                + " written");
      }
      try {
        Thread.sleep(Math.min(2000L, 50L << Math.min(attempt - 1, 6)));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new SparkguardException("interrupted while sending a marker to " + endpoint, e);
      }
    }
  }

  private HttpRequest request(String route, byte[] body) {
    HttpRequest.Builder builder = HttpRequest.newBuilder(URI.create(endpoint + "/v1/markers/" + route))
        .timeout(Duration.ofSeconds(30))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json")
        .POST(HttpRequest.BodyPublishers.ofByteArray(body));
    String bearer = token();
    if (bearer != null) {
      builder.header("Authorization", "Bearer " + bearer);
    }
    return builder.build();
  }

  private synchronized String token() {
    if (token == null && tokenFile != null) {
      try {
        token = Files.readString(Paths.get(tokenFile), StandardCharsets.UTF_8).strip();
      } catch (IOException e) {
        throw new SparkguardException(
            "cannot read the marker sidecar token file " + tokenFile + " (" + e.getMessage()
                + "); mount the token secret there", e);
      }
    }
    return token;
  }

  private synchronized HttpClient client() {
    if (http == null) {
      http = HttpClient.newBuilder()
          .version(HttpClient.Version.HTTP_1_1)
          .connectTimeout(Duration.ofSeconds(10))
          .build();
    }
    return http;
  }
}
