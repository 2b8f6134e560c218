#!/usr/bin/env bash
# `scripts/certify-seeds.sh` for one system file, as BENCHMARKS.md's older commands call it.
#
#   scripts/certify-system-seeds.sh OUT FILE "EXTRA ARGS" SEED...
#   scripts/certify-system-seeds.sh /tmp/stale examples/celery-worker/stale-cache.toml "" $(seq 1 10)
set -euo pipefail
out=$1 file=$2 extra=$3
shift 3
# shellcheck disable=SC2086 # EXTRA ARGS are words
exec "$(dirname "$0")/certify-seeds.sh" "$out" "$*" --system "$file" $extra
