#!/usr/bin/env bash
# The host q8 AdamW with its nearest-code search by index (main) against the closed-form search
# (bench/results/raw/2026-12-07-cpu-q8-closed-form-search.diff, exact but not kept: slower on a
# Zen 4 core), on the machine this runs on: builds the variant in a copy of the tree (CPU preset,
# target bench_optimizer), then runs main, variant, variant, main.
#
#   bash bench/optimizer/q8_search_ab.sh MAIN_BENCH_OPTIMIZER OUT_DIR [bench_optimizer args]
# Default args: --skip-gpu --sizes 268435456 --runs 5. Output: OUT_DIR/q8ab-<i>-<main|variant>.json
# and the machine's CPU, its gather mitigation state and each run's q8 row on stdout.
set -uo pipefail
MAIN=${1:?usage: q8_search_ab.sh MAIN_BENCH_OPTIMIZER OUT_DIR [args]}
OUT_DIR=${2:?usage: q8_search_ab.sh MAIN_BENCH_OPTIMIZER OUT_DIR [args]}
shift 2
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--skip-gpu --sizes 268435456 --runs 5)
cd "$(dirname "$0")/../.."
root=$(pwd)
mkdir -p "$OUT_DIR"
lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|L3)"
echo "gather_data_sampling: $(cat /sys/devices/system/cpu/vulnerabilities/gather_data_sampling 2>/dev/null || echo unknown)"
alt=/tmp/ght-q8-variant
rm -rf "$alt" && mkdir -p "$alt"
tar --exclude=./build-gpu --exclude=./build --exclude=./build-cpu --exclude=./.git -cf - . | (cd "$alt" && tar xf -)
diff=$root/bench/results/raw/2026-12-07-cpu-q8-closed-form-search.diff
(cd "$alt" && { git apply "$diff" 2>/dev/null || patch -p1 -s <"$diff"; }) || exit 1
(cd "$alt" && cmake --preset cpu >configure.log 2>&1 && timeout 300 cmake --build build-cpu -j"$(nproc)" --target bench_optimizer >build.log 2>&1) ||
  { tail -30 "$alt/configure.log" "$alt/build.log"; exit 1; }
i=0
for which in main variant variant main; do
  i=$((i + 1))
  bin=$MAIN
  [ "$which" = variant ] && bin=$alt/build-cpu/bin/bench_optimizer
  echo "=== $i $which $(date -u +%T)"
  "$bin" "${args[@]}" --json "$OUT_DIR/q8ab-$i-$which.json" 2>&1 | grep -iE "q8|triad" | head -6
done
