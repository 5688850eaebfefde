#!/usr/bin/env bash
# Run the benchmarks one after the other and keep each one's output with its command, start
# time and the machine's load average before and after (docs/benchmarks.md quotes these logs).
#
#   benchmarks/run_all.sh OUT_DIR [NAME...]     (no NAME: every benchmark below, in this order)
#
# Names: writer-quick writer writer-fsync writer-arrow-batch writer-row-groups checkpoint-quick
# checkpoint checkpoint-jvm-quick checkpoint-jvm rollback-quick rollback-quick-s3 rollback
# rollback-s3 markers-quick markers sidecar-load-quick recovery-quick recovery
# commit-protocol-quick commit-protocol-phases-quick commit-protocol-tmpfs-quick commit-protocol
# timeline-quick
# (the commit-protocol and checkpoint-jvm ones need scripts/build-jvm.sh first; they fetch the
# S3A jars (+ spark-hadoop-cloud) themselves with scripts/fetch-s3a.sh)
set -euo pipefail
export PYTHONSAFEPATH=1
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/run_all.sh OUT_DIR [NAME...]}
shift
mkdir -p "$out"
py=.venv/bin/python

declare -A commands=(
  [writer-quick]="$py benchmarks/writer.py --quick"
  [writer]="$py benchmarks/writer.py"
  [writer-fsync]="$py benchmarks/writer.py --quick --fsspec --fsync-bare"
  [writer-arrow-batch]="$py benchmarks/writer.py --quick --fsspec --arrow-batch 100000"
  [writer-row-groups]="$py benchmarks/writer.py --row-groups --rows 2000000"
  [checkpoint-quick]="$py benchmarks/checkpoint.py --quick"
  [checkpoint]="$py benchmarks/checkpoint.py"
  [checkpoint-jvm-quick]="$py benchmarks/checkpoint.py --jvm --quick"
  [checkpoint-jvm]="$py benchmarks/checkpoint.py --jvm"
  [rollback-quick]="$py benchmarks/rollback.py --quick"
  [rollback-quick-s3]="$py benchmarks/rollback.py --quick --s3"
  [rollback]="$py benchmarks/rollback.py"
  [rollback-s3]="$py benchmarks/rollback.py --s3"
  [timeline-quick]="$py benchmarks/timeline.py --quick"
  [markers-quick]="$py benchmarks/markers.py --quick"
  [markers]="$py benchmarks/markers.py"
  [sidecar-load-quick]="$py benchmarks/sidecar_load.py --quick"
  [recovery-quick]="$py benchmarks/recovery.py --quick"
  [recovery]="$py benchmarks/recovery.py"
  [commit-protocol-quick]="$py benchmarks/commit_protocol.py --quick"
  [commit-protocol-phases-quick]="$py benchmarks/commit_protocol.py --quick --phases"
  [commit-protocol-tmpfs-quick]="$py benchmarks/commit_protocol.py --quick --storage local --local-dir /dev/shm"
  [commit-protocol]="$py benchmarks/commit_protocol.py"
)
order=(writer-quick checkpoint-quick rollback-quick timeline-quick markers-quick sidecar-load-quick
       recovery-quick commit-protocol-quick commit-protocol-phases-quick
       commit-protocol-tmpfs-quick checkpoint-jvm-quick writer-row-groups rollback-quick-s3
       writer-fsync writer-arrow-batch writer checkpoint rollback markers rollback-s3 recovery
       commit-protocol checkpoint-jvm)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=("${order[@]}")

for name in "${names[@]}"; do
  command=${commands[$name]:?unknown benchmark $name}
  log="$out/$name.log"
  {
    echo "# command: ${command#"$py "}"
    echo "# started: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  } >"$log"
  echo "== $name: $command"
  if ! $command >>"$log" 2>&1; then
    echo "# FAILED" >>"$log"
  fi
  {
    echo "# finished: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  } >>"$log"
  tail -n 4 "$log"
done
