#!/usr/bin/env bash
# examples/tiered_alloc.cpp: runs the example with its small default budgets and checks its
# output: blocks spilled past the HBM budget, per-tier statistics printed before and after the
# frees, nothing left allocated. Without a GPU it must say that the tiers are host memory only.
#   bash tests/examples/tiered_alloc_test.sh <path-to-example_tiered_alloc>
set -euo pipefail
EXE=${1:?usage: tiered_alloc_test.sh <path-to-example_tiered_alloc>}
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
export GHT_CACHE_DIR="$(mktemp -d)"
trap 'rm -rf "$GHT_CACHE_DIR"' EXIT
fail() { echo "FAIL: $*" >&2; echo "--- output ---" >&2; cat "$GHT_CACHE_DIR/out.txt" >&2; exit 1; }

"$EXE" >"$GHT_CACHE_DIR/out.txt" 2>&1 || fail "the example exited with status $?"
out="$GHT_CACHE_DIR/out.txt"

if grep -q '^GPU present: tiers hbm and host$' "$out"; then
  echo "tiered_alloc_test: GPU run (hbm and host)"
else
  grep -q '^no GPU (or a CPU-only build): the hbm tier is absent' "$out" ||
    fail "neither the GPU line nor the host-only line"
  grep -q '^host tiers only: a second host resource stands in for hbm' "$out" ||
    fail "the host-only run does not say that a host resource stands in for hbm"
fi
grep -q '^allocating 6 weights of 16.00 MiB' "$out" || fail "not 6 weights of 16 MiB under a 64 MiB HBM budget"
[ "$(grep -c -- '-> hbm *$' "$out")" = 4 ] || fail "expected 4 weights in the hbm tier"
[ "$(grep -c -- '-> host  (spilled' "$out")" = 2 ] || fail "expected 2 weights spilled to host"
grep -q 'm\.0 .*-> host *$' "$out" || fail "the Adam moment is not on host (or counted as spilled)"
grep -q '^larger than the host budget: ght::out_of_memory: ' "$out" || fail "no typed out-of-memory"

# The statistics block with every block live: header, both tiers, spills: 2.
live=$(sed -n '/^per-tier statistics, all blocks live:/,/^spills:/p' "$out")
grep -q '^tier  *resource  *budget  *current  *peak  *allocs  *total  *spills' <<<"$live" ||
  fail "no statistics header"
grep -Eq '^hbm .* 64.00 MiB +64.00 MiB +64.00 MiB +4 +64.00 MiB +0$' <<<"$live" ||
  fail "hbm row: budget, current, peak 64 MiB, 4 allocations, none spilled in expected"
grep -Eq '^host .* 256.00 MiB +64.00 MiB +64.00 MiB +4 +64.00 MiB +2$' <<<"$live" ||
  fail "host row: 64 MiB in 4 allocations, 2 of them spilled in, expected"
grep -q '^spills: 2$' <<<"$live" || fail "spills: 2 expected"

# After the frees: nothing current, peaks kept.
after=$(sed -n '/^after freeing 8 blocks:/,/^spills:/p' "$out")
grep -Eq '^hbm .* 64.00 MiB +0 B +64.00 MiB' <<<"$after" || fail "hbm not empty after the frees"
grep -Eq '^host .* 256.00 MiB +0 B +64.00 MiB' <<<"$after" || fail "host not empty after the frees"
! grep -q '^FAIL' "$out" || fail "the example reported a failure"
echo "tiered_alloc_test: ok"
