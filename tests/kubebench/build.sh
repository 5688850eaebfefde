#!/usr/bin/env bash
# Build kube-apiserver, etcd, kube-controller-manager, kube-scheduler, the kubelet and the
# bench's container runtime (kubebench-cri) for the sparkguard kube test bench.
#
# The binaries come from the Go module graph pinned in tests/kubebench/go
# (k8s.io/kubernetes + its staging modules, and go.etcd.io/etcd/server/v3 at the
# version k8s.io/kubernetes requires). They are written to
#
#   ${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}/kube/<k8s-version>/bin/
#
# outside the repository, so every checkout on this machine shares them. A stamp
# file records a hash of go.mod, go.sum, tools.go, the etcd main, the runtime's sources, the
# Go version and the ldflags; when it matches and every binary exists, nothing is rebuilt.
#
# Progress goes to stderr; on success the only line on stdout is the bin dir.
# Exit status is non-zero, with a clear message, when anything fails.
#
# Options:  --force   rebuild even if the stamp matches
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/kubebench/build-lib.sh
source "$here/build-lib.sh"  # log, die, go_build

force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

moddir="$here/go"
[[ -f "$moddir/go.mod" && -f "$moddir/go.sum" ]] || die "missing $moddir/go.mod or go.sum"

command -v go >/dev/null 2>&1 || die "'go' not found in PATH; install Go >= 1.26 (needed to build kube-apiserver and etcd)"
# What `go build` makes (named after the last element of each package path).
packages=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet ./cmd/etcd ./cmd/kubebench-cri)
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet etcd kubebench-cri)
go_version="$(go env GOVERSION)" || die "'go env GOVERSION' failed"

modver() {  # version of a module required in go.mod
  awk -v m="$1" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$moddir/go.mod"
}
k8s_version="$(modver k8s.io/kubernetes)"
etcd_version="$(modver go.etcd.io/etcd/server/v3)"
[[ -n "$k8s_version" ]] || die "cannot find the k8s.io/kubernetes version in $moddir/go.mod"
[[ -n "$etcd_version" ]] || die "cannot find the go.etcd.io/etcd/server/v3 version in $moddir/go.mod"

# Without -X flags a module build reports "v0.0.0-master" from /version, which breaks
# clients that check the server version (helm kubeVersion, kopf, kubectl skew warnings).
# Set what hack/lib/version.sh sets for a release build (the build date is fixed so the
# binaries stay reproducible).
k8s_minor="${k8s_version#v1.}"; k8s_minor="${k8s_minor%%.*}"
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=go-module-build"
done
ldflags="-s -w$version_ldflags"

cache_root="${SPARKGUARD_CACHE:-$HOME/.cache/sparkguard}"
bin_dir="$cache_root/kube/$k8s_version/bin"
stamp="$bin_dir/.stamp"

want_stamp="$(
  {
    echo "k8s=$k8s_version etcd=$etcd_version go=$go_version ldflags=$ldflags"
    cat "$moddir/go.mod" "$moddir/go.sum" "$moddir/tools.go" "$moddir/cmd/etcd/main.go" \
      "$moddir"/cmd/kubebench-cri/*.go
  } | sha256sum | cut -d' ' -f1
)"

up_to_date() {
  [[ $force -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]] || return 1
  local b
  for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
}

if up_to_date; then
  log "up to date: ${binaries[*]} ($k8s_version, etcd $etcd_version) in $bin_dir (stamp ${want_stamp:0:12})"
  echo "$bin_dir"
  exit 0
fi

mkdir -p "$bin_dir" || die "cannot create $bin_dir"

# Serialise concurrent builds (two test sessions starting at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin_dir/.lock"
  if ! flock -n 9; then
    log "another build holds $bin_dir/.lock; waiting for it"
    flock 9
  fi
  if up_to_date; then
    log "built by a concurrent run: $bin_dir"
    echo "$bin_dir"
    exit 0
  fi
fi

tmp_out="$(mktemp -d "$bin_dir/.build.XXXXXX")"
build_log="$bin_dir/build.log"
trap 'rm -rf "$tmp_out"' EXIT

log "building ${binaries[*]} ($k8s_version, etcd $etcd_version) with $go_version"
log "  module:  $moddir"
log "  output:  $bin_dir"
log "  log:     $build_log"
log "  (a cold build compiles ~2k packages: several minutes on 2 cores)"

go_build "$moddir" "$build_log" -ldflags="$ldflags" -o "$tmp_out/" "${packages[@]}"
sizes=()
for b in "${binaries[@]}"; do
  [[ -x "$tmp_out/$b" ]] || die "go build succeeded but $b was not produced (see $build_log)"
done
for b in "${binaries[@]}"; do
  mv -f "$tmp_out/$b" "$bin_dir/$b"
  sizes+=("$(du -h "$bin_dir/$b" | cut -f1) $b")
done
printf '%s\n' "$want_stamp" >"$stamp"
log "built in ${elapsed}s: $(IFS=,; echo "${sizes[*]}" | sed 's/,/, /g')"
echo "$bin_dir"
