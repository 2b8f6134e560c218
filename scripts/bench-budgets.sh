#!/usr/bin/env bash
# Before/after measurement of time budgets and coverage-guided exploration, in one sitting, on
# one machine (BENCHMARKS.md, "Time budgets"). Prints numbers; asserts nothing.
#
#   scripts/bench-budgets.sh BEFORE_TREE AFTER_TREE OUT_DIR [RUNS]
#
# BEFORE_TREE is a worktree of the commit before budgets (b64dc10:
# `git -C /work/main worktree add /work/before b64dc10`); this script copies benches/budgets.rs
# into it (the bench uses only API both sides have) and registers it in its Cargo.toml. Per side:
#   1. `cargo bench --bench budgets`: round-trip floor, cases/s per suite and ratio to the floor,
#      cases to the first failure per defect (10 seeds), default certification per defect;
#   2. RUNS (default 20) `racecert certify --seed S` of the reference worker (release build),
#      summarised by scripts/certify-summary.py: verdicts, cases, time, and for every fault kind
#      of every suite on how many runs it landed on its target path.
set -euo pipefail
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
out=$3
runs=${4:-20}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)

cp "$after/benches/budgets.rs" "$before/benches/budgets.rs"
if ! grep -q '^mimalloc' "$before/Cargo.toml"; then
    # A side without mimalloc benches on the allocator its racecert binary has (glibc's).
    sed -i '/^\/\/\/ The racecert binary.s allocator/,/^static ALLOCATOR/d' "$before/benches/budgets.rs"
fi
if ! grep -q 'name = "budgets"' "$before/Cargo.toml"; then
    printf '\n[[bench]]\nname = "budgets"\npath = "benches/budgets.rs"\nharness = false\n' >>"$before/Cargo.toml"
fi

for side in before after; do
    tree=$before
    default=cases:64
    if [ "$side" = after ]; then
        tree=$after
        default=budget:7.5
    fi
    (cd "$tree" && cargo build --release --bin racecert && cargo bench --bench budgets --no-run)
done

for side in before after; do
    tree=$before
    default=cases:64
    if [ "$side" = after ]; then
        tree=$after
        default=budget:7.5
    fi
    echo "=== $side ($(git -C "$tree" rev-parse --short HEAD)) bench $(date -u +%H:%M:%S)"
    (cd "$tree" && RACECERT_BENCH_DEFAULT=$default cargo bench --bench budgets) 2>&1 |
        grep -v '^\s*\(Compiling\|Finished\|Running\)' | tee "$out/$side-bench.txt"
done

for side in before after; do
    tree=$before
    [ "$side" = after ] && tree=$after
    echo "=== $side certify x$runs $(date -u +%H:%M:%S)"
    for seed in $(seq 1 "$runs"); do
        (cd "$tree" && ./target/release/racecert --color never certify --seed "$seed" \
            --out "$out/$side-certify-$seed" >"$out/$side-certify-$seed.txt" 2>&1) || true
    done
    python3 "$here/certify-summary.py" "$out"/"$side"-certify-*/report.json | tee "$out/$side-certify-summary.txt"
done
