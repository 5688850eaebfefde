# shellcheck shell=bash
# What the bench's build scripts share (sourced by build.sh, build-spark-operator.sh and
# build-apache-operator.sh).

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

# find_upstream_tarball REPO NAME: the path of a release tarball NAME from the shared folder:
# $SPARKGUARD_UPSTREAM_DIR, beside the checkout REPO (CI), or beside the main checkout of a git
# worktree. Returns 1 when it is in none of them.
find_upstream_tarball() {
  local repo="$1" name="$2" dirs=() common d
  [[ -n "${SPARKGUARD_UPSTREAM_DIR:-}" ]] && dirs+=("$SPARKGUARD_UPSTREAM_DIR")
  dirs+=("$repo/../shared/upstream")
  if common="$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null)"; then
    dirs+=("$(dirname "$common")/../shared/upstream")
  fi
  for d in "${dirs[@]}"; do
    if [[ -f "$d/$name" ]]; then
      echo "$d/$name"
      return 0
    fi
  done
  return 1
}
