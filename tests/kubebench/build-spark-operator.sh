#!/usr/bin/env bash
# Build upstream's Kubeflow spark-operator (its `cmd/operator`: `controller start` and
# `webhook start`) at a pinned release for the sparkguard kube test bench.
#
# The source is the release's Go module, from the Go module proxy where it serves
# github.com/kubeflow/spark-operator/v2, else the shared release tarball
# (<repo>/../shared/upstream/kubeflow-spark-operator-<version>.tar.gz, or
# $SPARKGUARD_UPSTREAM_DIR). Either is checked against the module's pinned go.sum hash, so
# both give the same tree. It is unpacked, with the binary built from it, under
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/spark-operator/<version>/{src,bin}/
#
# outside the repository: upstream's code is never copied into the checkout. Its dependencies
# come from the Go module proxy. A stamp (version, source hash, Go version, ldflags) skips
# a build that is already there; a flock serialises concurrent runs.
#
# Progress goes to stderr; on success the only line on stdout is the bin dir.
#
# Options:  --download  only fetch the source and its modules (before the network guard)
#           --force     rebuild even if the stamp matches
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/kubebench/build-lib.sh
source "$here/build-lib.sh"  # log, die, go_build, find_upstream_tarball

version=v2.5.2
module=github.com/kubeflow/spark-operator/v2
commit=43afb8bbd32463037d8fb6e414e252c69081882b
# go.sum's hash of $module@$version (dirhash h1, what sum.golang.org records).
module_hash="h1:6nX2UhwSfnYi1mtwczgFfJTMeLSL/1ajTvkFe8R7Vdc="
tarball_name="kubeflow-spark-operator-$version.tar.gz"

force=0
download_only=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --download) download_only=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

repo="$(cd "$here/../.." && pwd)"

command -v go >/dev/null 2>&1 || die "'go' not found in PATH; install Go >= 1.26 (needed to build the spark-operator)"
go_version="$(go env GOVERSION)" || die "'go env GOVERSION' failed"

cache_root="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}"
base="$cache_root/spark-operator/$version"
src="$base/src"
bin_dir="$base/bin"
stamp="$bin_dir/.stamp"

# What upstream's Makefile stamps into k8s.io/component-base/version (`spark-operator
# version`), with a fixed build date so the binary stays reproducible.
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$version -X $vpkg.gitCommit=$commit"
ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"

want_stamp="$(
  echo "module=$module@$version hash=$module_hash go=$go_version ldflags=$ldflags" |
    sha256sum | cut -d' ' -f1
)"

# dirhash.Hash1 of a module tree, as go.sum records it: the sha256 of the sorted lines
# "<sha256 of file>  <module>@<version>/<path>", base64.
tree_hash() {
  local hex
  hex="$(
    cd "$1" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs -r -d '\n' sha256sum |
      sed "s|  |  $module@$version/|" | sha256sum | cut -d' ' -f1
  )"
  # shellcheck disable=SC2059  # the format is the bytes of the hash, as \x escapes
  printf "h1:%s\n" "$(printf "$(sed 's/../\\x&/g' <<<"$hex")" | base64 -w0)"
}

source_ok() { [[ -f "$base/src.hash" && "$(cat "$base/src.hash")" == "$module_hash" && -f "$src/go.mod" ]]; }
binary_ok() {
  [[ $force -eq 0 && -x "$bin_dir/spark-operator" && -f "$stamp" ]] &&
    [[ "$(cat "$stamp")" == "$want_stamp" ]]
}

# The module proxies of $GOPROXY without `direct`: a module the proxy refuses must not be
# fetched from its VCS host instead.
proxies_only() {
  local list
  list="$(go env GOPROXY | tr ',|' '\n\n' | grep -v -x -e direct -e off | paste -sd, -)"
  echo "${list:-off}"
}
proxies="$(proxies_only)"

fetch_source() {
  local tmp="$1" out="" dir="" tarball
  if [[ "$proxies" != off ]]; then
    out="$(cd "$tmp" && GOPROXY="$proxies" go mod download -json "$module@$version" 2>&1)" || true
    dir="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$out")"
  fi
  if [[ -n "$dir" && -f "$dir/go.mod" ]]; then
    log "source: the module $module@$version from the Go module proxy ($dir)"
    cp -r "$dir" "$tmp/tree"
    chmod -R u+w "$tmp/tree"
    return 0
  fi
  if [[ "$proxies" == off ]]; then
    log "GOPROXY=off: the module $module@$version is not fetched"
  else
    log "the Go module proxy ($proxies) does not serve $module@$version: $(grep -m1 '"Error"' <<<"$out" || echo "${out:0:300}")"
  fi
  tarball="$(find_upstream_tarball "$repo" "$tarball_name")" || die "the Go module proxy does not serve $module@$version and $tarball_name was found neither in \$SPARKGUARD_UPSTREAM_DIR nor in <repo>/../shared/upstream/"
  log "source: $tarball"
  tar -xzf "$tarball" -C "$tmp" || die "cannot extract $tarball"
  local top
  top="$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'spark-operator-*' | head -n1)"
  [[ -n "$top" ]] || die "$tarball has no spark-operator-*/ folder"
  mv "$top" "$tmp/tree"
}

mkdir -p "$base" || die "cannot create $base"
# Built already: nothing to fetch either (the modules serve only the build).
if source_ok && binary_ok; then
  log "up to date: spark-operator $version in $bin_dir (stamp ${want_stamp:0:12})"
  [[ $download_only -eq 1 ]] || echo "$bin_dir"
  exit 0
fi

# Serialise concurrent runs (the background build of scripts/test.sh and the bench fixture).
exec 9>"$base/.lock"
if ! flock -n 9; then
  if [[ $download_only -eq 1 ]]; then
    # A build under way (scripts/test.sh's, in the background, outside the network guard)
    # fetches what it needs itself: no need to wait for it here.
    log "a build holds $base/.lock: it fetches its own source and modules"
    exit 0
  fi
  log "another run holds $base/.lock; waiting for it"
  flock 9
fi

if ! source_ok; then
  tmp="$(mktemp -d "$base/.src.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  fetch_source "$tmp"
  got="$(tree_hash "$tmp/tree")"
  [[ "$got" == "$module_hash" ]] || die "the source of $module@$version hashes to $got, not $module_hash (go.sum's); refusing to build it"
  rm -rf "$src" "$base/src.hash"
  mv "$tmp/tree" "$src"
  printf '%s\n' "$module_hash" >"$base/src.hash"
  rm -rf "$tmp"
  trap - EXIT
  log "source ready in $src ($module_hash)"
fi

if [[ $download_only -eq 1 ]]; then
  start=$(date +%s)
  (cd "$src" && GOPROXY="$proxies" GOFLAGS="${GOFLAGS:-} -mod=readonly" go mod download) ||
    die "go mod download failed for $module@$version's dependencies"
  log "modules of $module@$version downloaded ($(( $(date +%s) - start ))s)"
  exit 0
fi

if binary_ok; then
  log "built by a concurrent run: $bin_dir"
  echo "$bin_dir"
  exit 0
fi

mkdir -p "$bin_dir"
tmp_out="$(mktemp -d "$bin_dir/.build.XXXXXX")"
build_log="$bin_dir/build.log"
trap 'rm -rf "$tmp_out"' EXIT
log "building spark-operator $version ($src/cmd/operator) with $go_version; log: $build_log"
log "  (a cold build compiles ~1k packages: a few minutes on 2 cores)"
GOPROXY="$proxies" go_build "$src" "$build_log" -ldflags="$ldflags" \
  -o "$tmp_out/spark-operator" ./cmd/operator
[[ -x "$tmp_out/spark-operator" ]] || die "go build succeeded but produced no spark-operator (see $build_log)"
mv -f "$tmp_out/spark-operator" "$bin_dir/spark-operator"
printf '%s\n' "$want_stamp" >"$stamp"
log "built in ${elapsed}s: $(du -h "$bin_dir/spark-operator" | cut -f1) spark-operator"
echo "$bin_dir"
