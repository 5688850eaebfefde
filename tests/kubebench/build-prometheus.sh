#!/usr/bin/env bash
# Build Prometheus (`prometheus` and `promtool`) at a pinned release for the sparkguard kube
# test bench: the tests scrape the operator and a sidecar with it and check the chart's
# dashboard queries and alert rules against what it scraped.
#
# The source is the release's Go module, github.com/prometheus/prometheus (its v0.3xx versions
# are Prometheus 3.x), from the Go module proxy into Go's module cache, checked against the
# module's pinned go.sum hash. It is built in place with its own go.mod/go.sum (no copy of
# upstream's code in the checkout), with the tag `remove_all_sd` (only static and file service
# discovery: the tests give static targets) and without `builtinassets` (no web UI; the HTTP
# API the tests query is all there). The binaries go to
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/prometheus/<version>/bin/
#
# A stamp (version, hash, Go version, tags, ldflags) skips a build that is already there; a
# flock serialises concurrent runs.
#
# Progress goes to stderr; on success the only line on stdout is the bin dir.
#
# Options:  --download  only fetch the module and its dependencies (before the network guard)
#           --force     rebuild even if the stamp matches
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/kubebench/build-lib.sh
source "$here/build-lib.sh"  # log, die, go_build

module=github.com/prometheus/prometheus
version=v0.316.0          # Prometheus 3.16.0
release=3.16.0
# go.sum's hash of $module@$version (dirhash h1, what sum.golang.org records).
module_hash="h1:f1GRFerhTMKQma+awCoC9T820ecWeGSdF+xAlMHzZzM="
tags=remove_all_sd

force=0
download_only=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --download) download_only=1 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

command -v go >/dev/null 2>&1 || die "'go' not found in PATH; install Go >= 1.26 (needed to build Prometheus)"
go_version="$(go env GOVERSION)" || die "'go env GOVERSION' failed"

cache_root="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}"
bin_dir="$cache_root/prometheus/$version/bin"
stamp="$bin_dir/.stamp"
binaries=(prometheus promtool)

# What upstream's promu stamps into github.com/prometheus/common/version (`prometheus
# --version`), with a fixed build date so the binaries stay reproducible.
vpkg=github.com/prometheus/common/version
ldflags="-s -w -X $vpkg.Version=$release -X $vpkg.Revision=$module@$version"
ldflags+=" -X $vpkg.Branch=HEAD -X $vpkg.BuildUser=sparkguard -X $vpkg.BuildDate=19700101-00:00:00"

want_stamp="$(
  echo "module=$module@$version hash=$module_hash go=$go_version tags=$tags ldflags=$ldflags" |
    sha256sum | cut -d' ' -f1
)"

up_to_date() {
  [[ $force -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]] || return 1
  local b
  for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
}

if up_to_date; then
  log "up to date: ${binaries[*]} $release in $bin_dir (stamp ${want_stamp:0:12})"
  echo "$bin_dir"
  exit 0
fi

mkdir -p "$bin_dir" || die "cannot create $bin_dir"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin_dir/.lock"
  if ! flock -n 9; then
    if [[ $download_only -eq 1 ]]; then
      log "a build holds $bin_dir/.lock (it downloads what it needs): nothing to do"
      exit 0
    fi
    log "another build holds $bin_dir/.lock; waiting for it"
    flock 9
  fi
  if up_to_date; then
    log "built by a concurrent run: $bin_dir"
    echo "$bin_dir"
    exit 0
  fi
fi

# The module itself, checked against the pinned hash (the proxy's answer must match go.sum's).
# GOWORK=off: the release tree has a go.work naming folders its module zip leaves out.
export GOWORK=off
info="$(cd "$bin_dir" && GOFLAGS=-mod=mod go mod download -json "$module@$version")" ||
  die "could not download $module@$version from the Go module proxy: $info"
src="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")"
sum="$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")"
[[ "$sum" == "$module_hash" ]] || die "$module@$version hashes to $sum, not the pinned $module_hash"
[[ -f "$src/go.mod" ]] || die "no go.mod in $src"

# Its dependencies, at the versions its own go.sum pins.
(cd "$src" && GOFLAGS=-mod=readonly go mod download) || die "go mod download failed in $src"
if [[ $download_only -eq 1 ]]; then
  log "downloaded $module@$version and its modules"
  exit 0
fi

tmp_out="$(mktemp -d "$bin_dir/.build.XXXXXX")"
build_log="$bin_dir/build.log"
trap 'rm -rf "$tmp_out"' EXIT
log "building ${binaries[*]} $release ($module@$version) with $go_version, tags $tags"
log "  log: $build_log (a cold build compiles ~1300 packages: minutes on 2 cores)"
go_build "$src" "$build_log" -tags "$tags" -ldflags="$ldflags" -o "$tmp_out/" \
  ./cmd/prometheus ./cmd/promtool
for b in "${binaries[@]}"; do
  [[ -x "$tmp_out/$b" ]] || die "go build succeeded but $b was not produced (see $build_log)"
  mv -f "$tmp_out/$b" "$bin_dir/$b"
done
printf '%s\n' "$want_stamp" >"$stamp"
log "built in ${elapsed}s: $(du -ch "${binaries[@]/#/$bin_dir/}" | tail -1 | cut -f1)"
echo "$bin_dir"
