# shellcheck shell=bash
# What the bench's build scripts share (sourced by build.sh and build-spark-operator.sh).

kubebench_script="kubebench/$(basename "$0")"
log() { printf '%s: %s\n' "$kubebench_script" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$kubebench_script" "$*" >&2; exit 1; }

# go_build DIR LOG ARGS...: `go build -trimpath ARGS` in DIR (cgo off, -mod=readonly), its
# output in LOG. On failure: the last 40 lines of LOG on stderr, and exit 1. Sets `elapsed`
# (seconds). The caller's environment (GOPROXY, GOFLAGS) applies.
go_build() {
  local dir="$1" build_log="$2" rc start
  shift 2
  start=$(date +%s)
  set +e
  (
    cd "$dir" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly" go build -trimpath "$@"
  ) >"$build_log" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  if [[ $rc -ne 0 ]]; then
    {
      echo "$kubebench_script: ERROR: go build failed (exit $rc after ${elapsed}s). Last lines of $build_log:"
      tail -n 40 "$build_log" | sed 's/^/    /'
    } >&2
    exit 1
  fi
}
