#!/usr/bin/env bash
# ght train --trace-kernels outside the CUDA backend: without --profile-steps it is refused naming
# that flag, before a run directory exists; on the cpu backend it prints its note, trains, and
# writes no kernel breakdown. (The traced CUDA step itself is tests/trainer/kernel_trace_test.cu.)
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
args=("${small_args[@]}" --data "$work/data" --backend cpu --steps 2)

if "$ght" train "${args[@]}" --out "$work/bad" --trace-kernels >/dev/null 2>"$work/err.txt"; then
  fail "--trace-kernels without --profile-steps accepted"
fi
grep -q -- "--profile-steps" "$work/err.txt" || { cat "$work/err.txt"; fail "the refusal does not name --profile-steps"; }
[ ! -e "$work/bad" ] || fail "a refused run created its run directory"
echo "--trace-kernels without --profile-steps refused"

"$ght" train "${args[@]}" --out "$work/run" --profile-steps 2 --trace-kernels > "$work/out.txt" 2>&1 \
  || { cat "$work/out.txt"; fail "cpu run with --trace-kernels failed"; }
grep -q "note: --trace-kernels traces CUDA kernels; the cpu backend has none to trace" "$work/out.txt" \
  || { cat "$work/out.txt"; fail "no note about --trace-kernels on the cpu backend"; }
grep -q "^done: steps 0 -> 2" "$work/out.txt" || { cat "$work/out.txt"; fail "the run did not finish"; }
[ ! -e "$work/run/kernel_breakdown.json" ] && [ ! -e "$work/run/kernel_breakdown.md" ] \
  || fail "the cpu backend wrote a kernel breakdown"
echo "cpu backend: note printed, no breakdown written"
