#!/usr/bin/env bash
# One model at several micro-batches, the same tokens per step, each run's last step traced
# (CUPTI, `ght train --trace-kernels`): where a larger micro-batch gains or loses time, per op.
#
#   bash bench/trainer/micro_batch_trace.sh GHT_BIN OUT_DIR ROWS MB [MB ...] -- [ght train args]
#
# ROWS: micro-batch rows per step at micro-batch 1 (grad_accum at MB is ROWS / MB, which must
# divide). The micro-batch and grad_accum are set with -o, so they are pinned: the plan chooses
# everything else. Each run: 3 steps (STEPS), all profiled, no checkpoint written, random tokens
# (bench/make_bench_data.sh: throughput only). TRACE=0 traces nothing: the log's predicted against
# measured line then reads an untraced step (with TRACE=1, the default, the traced step runs
# without CUDA graphs and with the trace's flush in its optimizer gap).
# Output, per MB: OUT_DIR/mb<MB>.log, mb<MB>.kernel_breakdown.{md,json}, mb<MB>.profile.json;
# OUT_DIR/compare.md: each later micro-batch's ops against the first's (compare_breakdowns.py).
set -uo pipefail
if [ $# -lt 4 ]; then
  echo "usage: micro_batch_trace.sh GHT_BIN OUT_DIR ROWS MB [MB ...] -- [ght train args]" >&2
  exit 2
fi
GHT=$1 OUT_DIR=$2 ROWS=$3
shift 3
mbs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mbs+=("$1"); shift; done
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/../.."
mkdir -p "$OUT_DIR"
bash bench/make_bench_data.sh "$GHT" || exit 1
fail=0
trace=(--trace-kernels)
[ "${TRACE:-1}" = 0 ] && trace=()
for mb in "${mbs[@]}"; do
  if [ $((ROWS % mb)) -ne 0 ]; then
    echo "micro_batch_trace: micro-batch $mb does not divide $ROWS rows"; fail=1; continue
  fi
  run=build-gpu/train-runs/mbtrace-$mb
  echo "=== micro-batch $mb x $((ROWS / mb)) $(date -u +%T): ght train $*"
  GHT_SAVE_CHECKPOINTS=off timeout "${TRACE_LIMIT_S:-300}" "$GHT" train --config configs/bench-h200.toml "$@" \
    -o model.micro_batch="$mb" -o model.grad_accum=$((ROWS / mb)) --out "$run" --overwrite \
    --steps "${STEPS:-3}" --profile-steps "${STEPS:-3}" "${trace[@]}" 2>&1 | tee "$OUT_DIR/mb$mb.log" |
    grep -E "^(plan|predicted|step [0-9]+/|  fwd)"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL: micro-batch $mb"; fail=1; }
  for f in kernel_breakdown.md kernel_breakdown.json profile.json; do cp "$run/$f" "$OUT_DIR/mb$mb.$f" 2>/dev/null; done
  rm -rf "$run"
done
first=${mbs[0]:-}
for mb in "${mbs[@]:1}"; do
  [ -f "$OUT_DIR/mb$first.kernel_breakdown.json" ] && [ -f "$OUT_DIR/mb$mb.kernel_breakdown.json" ] || continue
  echo "## micro-batch $mb against $first"
  python3 bench/trainer/compare_breakdowns.py "$OUT_DIR/mb$first.kernel_breakdown.json" \
    "$OUT_DIR/mb$mb.kernel_breakdown.json" --names "micro-batch $first" "micro-batch $mb"
done | tee "$OUT_DIR/compare.md"
exit $fail
