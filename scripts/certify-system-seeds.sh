#!/usr/bin/env bash
# One `racecert certify --system` run per seed, one after another; one line per run with its
# verdict, cases, wall seconds, the counterexample's case and fault, the invariants it broke and
# landed/applied per fault kind. Each run's output is kept in OUT/SEED.out.
#
#   scripts/certify-system-seeds.sh OUT FILE "EXTRA ARGS" SEED...
#   scripts/certify-system-seeds.sh /tmp/stale examples/celery-worker/stale-cache.toml "" $(seq 1 10)
set -euo pipefail
out=$1 file=$2 extra=$3
shift 3
mkdir -p "$out"
racecert=${RACECERT:-./target/debug/racecert}
for seed in "$@"; do
  start=$(date +%s.%N)
  # shellcheck disable=SC2086 # EXTRA ARGS are words
  code=0; "$racecert" certify --system "$file" $extra --seed "$seed" >"$out/$seed.out" 2>&1 || code=$?
  end=$(date +%s.%N)
  log="$out/$seed.out"
  verdict=$(grep -m1 -oE '^system [^:]+: [A-Z]+' "$log" | awk '{print $3}' || true)
  cases=$(grep -m1 -oE '\([0-9]+ case' "$log" | tr -dc '0-9' || true)
  caught=$(grep -m1 -oE 'counterexample: case [0-9]+ \(fault [a-z-]+\)' "$log" | sed 's/counterexample: //' || true)
  broke=$(grep -oE 'violated [a-z-]+' "$log" | awk '{print $2}' | sort -u | paste -sd, - || true)
  coverage=$(sed -n '/^fault coverage/,/^not judged/p' "$log" | grep -vE '^(fault coverage|not judged)' \
    | awk '{printf "%s %s/%s; ", $1, $2, $4}' || true)
  printf 'seed %s: exit %s %s, %s case(s), %.1f s, caught by: %s, broke: %s, landed/applied: %s\n' \
    "$seed" "$code" "${verdict:-?}" "${cases:-?}" "$(echo "$end - $start" | bc)" "${caught:--}" \
    "${broke:--}" "$coverage"
done
