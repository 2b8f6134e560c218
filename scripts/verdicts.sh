#!/usr/bin/env bash
# Verdicts of one racecert tree on its own examples, one line per run: the Python example's
# flags under `certify --worker-cmd` and both frameworks' naive and fenced systems under
# `certify --system`. Run it on two trees (a worktree of an older commit and this one) to put
# their verdicts side by side (BENCHMARKS.md, "One runner: verdicts before and after"). It prints
# what it saw and asserts nothing; each run's output is kept in OUT/NAME.out.
#
#   scripts/verdicts.sh TREE OUT PYTHON [SEED]
#
# TREE: a racecert checkout with its debug binary built (`cargo build --bins`); OUT: a directory
# for the outputs; PYTHON: an interpreter with the Python example's requirements installed;
# SEED: the seed of every run (default 1). Python flags the tree's worker does not have are
# skipped, so that both trees run the same command lines where they can.
set -euo pipefail
tree=$(cd "$1" && pwd)
out=$2 python=$3 seed=${4:-1}
mkdir -p "$out"
racecert="$tree/target/debug/racecert"
[ -x "$racecert" ] || { echo "$racecert: not built (cargo build --bins in $tree)" >&2; exit 2; }
worker="$tree/examples/python-worker/worker.py"

line() { # NAME EXIT SECONDS LOG
  local verdict broke
  verdict=$(grep -m1 -oE '(certification|system [^:]+:) [A-Z]+' "$4" | awk '{print $NF}' || true)
  broke=$(grep -oE 'violated [a-z-]+' "$4" | awk '{print $2}' | sort -u | paste -sd, - || true)
  printf '%-34s exit %s  %-12s %6.1f s  broke: %s\n' "$1" "$2" "${verdict:-?}" "$3" "${broke:--}"
}

run() { # NAME ARGS...
  local name=$1 start end code=0
  shift
  start=$(date +%s.%N)
  (cd "$tree" && "$racecert" --color never "$@") >"$out/$name.out" 2>&1 || code=$?
  end=$(date +%s.%N)
  line "$name" "$code" "$(echo "$end - $start" | bc)" "$out/$name.out"
}

for flag in "" unfenced release-without-check lease-without-nx cache-active-namespace \
    read-then-write ack-on-receive renew-without-check fence-on-status late-write-without-token \
    lease-ttl-in-seconds no-ack-when-completed long-lease; do
  if [ -n "$flag" ] && ! grep -q "\"--$flag\"" "$worker"; then
    printf '%-34s (no such flag in this tree)\n' "python --$flag"
    continue
  fi
  run "python${flag:+--$flag}" certify --worker-cmd "$python $worker${flag:+ --$flag}" \
    --seed "$seed" --wire-budget 20 --rounds 2 --out "$out/python${flag:+--$flag}"
done

for file in examples/celery-worker/naive.toml examples/celery-worker/fenced.toml \
    examples/apalis-worker/naive.toml examples/apalis-worker/fenced.toml; do
  name=$(echo "$file" | cut -d/ -f2 | sed 's/-worker//')-$(basename "$file" .toml)
  run "$name" certify --system "$file" --seed "$seed" --out "$out/$name"
done
