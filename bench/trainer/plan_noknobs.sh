#!/usr/bin/env bash
# The plan deciding alone, on the GPU machine: each run sets no tuning option (no GHT_* other than
# GHT_SAVE_CHECKPOINTS=off, which skips the final checkpoint write), so precision, accumulation,
# delay and placement are what `ght plan` chose. For each case: `ght plan` on the probed machine
# (the decision table), then `ght train` with every step profiled; the run's log prints predicted
# against measured forward, backward, exposed update and step, and names any phase off by >10%.
#
#   bash bench/trainer/plan_noknobs.sh GHT_BIN OUT_DIR [CASE ...]
# Cases (default: seed262k bench64k 14l64k):
#   seed262k  seed-21b, 64 micro-batches of 4,096 tokens (262k tokens/step), 4 steps
#   seed1m    seed-21b, 256 micro-batches (1M tokens/step), 3 steps
#   seed10l   seed-21b's layer shapes with 10 of its 30 layers (7.4B), 262k tokens/step, 4 steps:
#             fits one 80 GB card, for the per-op forward and backward at the seed's shapes
#   bench64k  bench-h200 (10 layers, 5.85B), 16 micro-batches (64k tokens/step), 4 steps
#   14l64k    bench-h200-14l (7.94B), 16 micro-batches (64k tokens/step), 4 steps
# HAND="GHT_A=x,GHT_B=y GHT_C=z ..." also runs each case with each of these hand settings (a
# setting is a comma-separated list of options; settings are separated by spaces), HAND_STEPS
# steps each (default 3): the sweep of hand settings that the plan's choice is held against. A
# setting the plan refuses is recorded as refused. The summary table (bench/trainer/noknobs_table.py)
# goes to OUT_DIR/summary.md.
# TRACE=1 also traces the last profiled step's kernels (CUPTI, --trace-kernels): the per-op
# forward and backward GPU time goes to OUT_DIR/<case>.kernel_breakdown.{md,json}.
# Output: OUT_DIR/<case>.plan.txt, <case>.log, <case>.profile.json; per hand setting i,
# <case>.hand<i>.{setting,log,profile.json}. Data: random tokens
# (bench/make_bench_data.sh): throughput only.
set -uo pipefail
GHT=${1:?usage: plan_noknobs.sh GHT_BIN OUT_DIR [CASE ...]}
OUT_DIR=${2:?usage: plan_noknobs.sh GHT_BIN OUT_DIR [CASE ...]}
shift 2
cd "$(dirname "$0")/../.."
mkdir -p "$OUT_DIR"
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(seed262k bench64k 14l64k)
bash bench/make_bench_data.sh "$GHT" || exit 1
# The plans below predict from this machine's probed link and HBM numbers; without a probe cache a
# fresh machine would plan with the builtin profile of its link kind (the H200's, on an H100).
timeout 300 "$GHT" info --probe >"$OUT_DIR/probe.txt" 2>&1 ||
  echo "plan_noknobs: ght info --probe failed ($OUT_DIR/probe.txt): the plans use the builtin profile"
# train_run RUN STEPS LOG [GHT_X=v ...]: `ght train` of the current case (args, limit, trace) with
# those options set and every step profiled, its output shown and kept in LOG; ght's exit code.
train_run() {
  local run=$1 steps=$2 log=$3
  shift 3
  env GHT_SAVE_CHECKPOINTS=off "$@" timeout "$limit" "$GHT" train --config configs/bench-h200.toml "${args[@]}" \
    --out "$run" --overwrite --steps "$steps" --profile-steps "$steps" "${trace[@]}" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}
fail=0
for c in "${cases[@]}"; do
  case $c in
    seed262k) args=(--model seed-21b -o model.grad_accum=64); steps=4; limit=420 ;;
    seed1m) args=(--model seed-21b -o model.grad_accum=256); steps=3; limit=540 ;;
    seed10l) args=(--model seed-21b -o model.layers=10 -o model.grad_accum=64); steps=4; limit=300 ;;
    bench64k) args=(--model bench-h200 -o model.grad_accum=16); steps=4; limit=240 ;;
    14l64k) args=(--model bench-h200-14l -o model.grad_accum=16); steps=4; limit=300 ;;
    *) echo "unknown case '$c' (seed262k, seed1m, seed10l, bench64k, 14l64k)"; fail=1; continue ;;
  esac
  echo "=== $c $(date -u +%T): ght plan ${args[*]}"
  timeout 120 "$GHT" plan "${args[@]}" 2>&1 | tee "$OUT_DIR/$c.plan.txt"
  run=build-gpu/train-runs/noknobs-$c
  trace=()
  [ "${TRACE:-0}" = 1 ] && trace=(--trace-kernels)
  echo "=== $c $(date -u +%T): ght train --config configs/bench-h200.toml ${args[*]} --steps $steps --profile-steps $steps"
  train_run "$run" "$steps" "$OUT_DIR/$c.log"
  rc=$?
  [ "$rc" -eq 0 ] || { echo "FAIL: $c exited $rc"; fail=1; }
  cp "$run/profile.json" "$OUT_DIR/$c.profile.json" 2>/dev/null
  for f in kernel_breakdown.md kernel_breakdown.json measurements.json; do
    cp "$run/$f" "$OUT_DIR/$c.$f" 2>/dev/null
  done
  echo "=== $c done $(date -u +%T) rc=$rc"
  i=0
  for setting in ${HAND:-}; do
    i=$((i + 1))
    echo "$setting" >"$OUT_DIR/$c.hand$i.setting"
    envs=()
    IFS=, read -ra envs <<<"$setting"
    echo "=== $c hand $i $(date -u +%T): $setting"
    trace=()
    train_run "$run-hand$i" "${HAND_STEPS:-3}" "$OUT_DIR/$c.hand$i.log" "${envs[@]}" >/dev/null
    rc=$?
    grep -E "^(plan|predicted against|memory after|step [0-9]+/)" "$OUT_DIR/$c.hand$i.log" | tail -4
    cp "$run-hand$i/profile.json" "$OUT_DIR/$c.hand$i.profile.json" 2>/dev/null
    rm -rf "$run-hand$i"
    echo "=== $c hand $i done $(date -u +%T) rc=$rc"
  done
done
python3 bench/trainer/noknobs_table.py "$OUT_DIR" | tee "$OUT_DIR/summary.md"
exit $fail
