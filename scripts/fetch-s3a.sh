#!/usr/bin/env bash
# Fetch the S3A jars (and, with --magic-committer, spark-hadoop-cloud) into the shared cache:
# scripts/fetch-jars.sh s3a [--magic-committer], which documents both. stdout: only the directory.
set -euo pipefail
case "${1:-}" in
  -h|--help) exec "$(dirname "${BASH_SOURCE[0]}")/fetch-jars.sh" --help ;;
esac
SPARKGUARD_FETCH_NAME=fetch-s3a.sh exec "$(dirname "${BASH_SOURCE[0]}")/fetch-jars.sh" s3a "$@"
