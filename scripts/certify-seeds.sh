#!/usr/bin/env bash
# One `racecert certify` run per seed, one after another, with the same arguments; one line per
# run with its verdict, cases, wall seconds, the counterexample's case and fault, the invariants
# it broke and landed/applied per fault kind. Each run's output is kept in OUT/SEED.out. It
# prints what it saw and asserts nothing.
#
#   scripts/certify-seeds.sh OUT "SEED..." CERTIFY-ARGS...
#   scripts/certify-seeds.sh /tmp/stale "$(seq 1 10)" --system examples/celery-worker/stale-cache.toml
#   scripts/certify-seeds.sh /tmp/ack "$(seq 1 10)" --worker-cmd "python3 worker.py --ack-on-receive"
#
# RACECERT names the binary (default ./target/debug/racecert).
set -euo pipefail
out=$1 seeds=$2
shift 2
mkdir -p "$out"
racecert=${RACECERT:-./target/debug/racecert}
for seed in $seeds; do
  start=$(date +%s.%N)
  log="$out/$seed.out"
  code=0
  "$racecert" --color never certify "$@" --seed "$seed" --out "$out/$seed" >"$log" 2>&1 || code=$?
  end=$(date +%s.%N)
  # `--system` prints "(N cases", a "fault coverage" table and "counterexample: case N (fault F)";
  # the suite table (`--worker-cmd`, the reference suites) prints a row per suite, its
  # "landed/applied:" line and, for wire schedules, "failure at case N after S s".
  verdict=$(grep -m1 -oE '^(certification|system [^:]+:) [A-Z]+' "$log" | awk '{print $NF}' || true)
  cases=$(grep -m1 -oE '\([0-9]+ case' "$log" | tr -dc '0-9' || true)
  caught=$(grep -m1 -oE 'counterexample: case [0-9]+ \(fault [a-z-]+\)' "$log" | sed 's/counterexample: //' || true)
  broke=$(grep -oE 'violated [a-z-]+' "$log" | awk '{print $2}' | sort -u | paste -sd, - || true)
  coverage=$(sed -n '/^fault coverage/,/^not judged/p' "$log" | grep -vE '^(fault coverage|not judged)' \
    | awk '{printf "%s %s/%s; ", $1, $2, $4}' || true)
  if [ -z "$cases" ]; then
    cases=$(awk '/^suite /{t=1;next} /^certification /{t=0} t && /^[a-z]/{n+=$3} END{if(n)print n}' "$log")
  fi
  if [ -z "$coverage" ]; then
    coverage=$(awk '/^[a-z][a-z0-9-]+ /{suite=$1} /landed\/applied:/{sub(/^ *landed\/applied: /,""); printf "%s: %s; ", suite, $0}' "$log")
  fi
  if [ -z "$caught" ]; then
    caught=$(grep -m1 -oE 'failure at case [0-9]+ after [0-9.]+ s, shrunk from [0-9]+ to [0-9]+ step\(s\)' "$log" \
      | sed 's/failure at //' || true)
  fi
  printf 'seed %s: exit %s %s, %s case(s), %.1f s, caught by: %s, broke: %s, landed/applied: %s\n' \
    "$seed" "$code" "${verdict:-?}" "${cases:-?}" "$(echo "$end - $start" | bc)" "${caught:--}" \
    "${broke:--}" "$coverage"
done
