#!/usr/bin/env bash
# The offload tax, step by step: one model run with everything in HBM and with the optimizer
# state on the host (gpu_link over dma, and cpu AdamW), same shape, same call. Each run trains
# 4 steps with --profile-steps 4 --trace-kernels: steps 2 and 3 are plain steps (the update of
# step k overlaps step k+1's forward), step 4 is traced (the tracer waits for the previous update
# first, so its kernels run without that overlap). Comparing the two tells a slowdown from the
# overlap (plain steps only) from one of the placement itself (traced step too).
#
# Usage: bench/trainer/offload_profile.sh GHT_BIN OUT_DIR NAME MODES [ght train -o overrides...]
#   MODES: comma list of hbm, dma, zero_copy, cpu, delay (dma with GHT_OPT_DELAY=1),
#          split (GHT_OPTIMIZER=split over dma at the cost model's CPU share), split@F (at CPU
#          share F, GHT_OPT_CPU_SHARE=F); suffixes: +spec: cpu-path updates start during the
#          last backward (GHT_OPT_SPECULATE_HOST=$OFFLOAD_SPEC_HOST, default 16GiB; pass
#          -o optimizer.max_grad_norm=0 so that no clipped step turns it off); +delay:
#          GHT_OPT_DELAY=1 (split+delay)
#   e.g.   bench/trainer/offload_profile.sh build-gpu/bin/ght $OUT bench64 hbm,dma -o model.grad_accum=64
#          bench/trainer/offload_profile.sh build-gpu/bin/ght $OUT q24b dma,split,split@0.15,split+spec $Q
# Writes OUT_DIR/offload_NAME_MODE.{log,profile.json,kernel_breakdown.md,kernel_breakdown.json}
# (MODE with @ and + written as _) and prints one table row per step: wall, fwd, bwd, stall,
# gap, host, update (ms), MFU, parameters updated during the last backward. GHT_* variables set
# by the caller pass through.
# OFFLOAD_TRACE=0: 3 plain steps, no traced step (shorter, for large step times).
# OFFLOAD_PROBE=1 (default): first `ght info --probe` where this machine has no probe cache yet,
# so that every run's plan (and its printed "link both" time, the update's link roofline) uses the
# link measured on this machine in this call rather than the built-in profile; 0: skip.
set -uo pipefail
GHT=${1:?usage: offload_profile.sh GHT_BIN OUT_DIR NAME MODES [overrides...]}
OUT_DIR=${2:?out dir}
NAME=${3:?name}
MODES=${4:?modes}
shift 4
cd "$(dirname "$0")/../.."
bash bench/make_bench_data.sh "$GHT" || exit 1
mkdir -p "$OUT_DIR"
rc=0
if [ "${OFFLOAD_PROBE:-1}" = 1 ] && "$GHT" plan --config configs/bench-h200.toml 2>&1 | grep -q "no probe cache"; then
  "$GHT" info --probe 2>&1 | grep -i -E "memcpy|triad|error" | head -6
fi
for mode in ${MODES//,/ }; do
  kind=${mode%%+*}
  case $kind in
    hbm) env=(GHT_OPTIMIZER=device) ;;
    dma) env=(GHT_OPTIMIZER=gpu_link GHT_OPT_LINK_MODE=dma) ;;
    zero_copy) env=(GHT_OPTIMIZER=gpu_link GHT_OPT_LINK_MODE=zero_copy) ;;
    cpu) env=(GHT_OPTIMIZER=cpu) ;;
    delay) env=(GHT_OPTIMIZER=gpu_link GHT_OPT_LINK_MODE=dma GHT_OPT_DELAY=1 GHT_OPT_DELAY_WARMUP=0) ;;
    # split follows the plan's placement (like auto): the rules put all the state on the host.
    split) env=(GHT_OPTIMIZER=split GHT_OPT_LINK_MODE=dma "GHT_PLACE=master=host,adam_*=host") ;;
    split@*) env=(GHT_OPTIMIZER=split GHT_OPT_LINK_MODE=dma "GHT_PLACE=master=host,adam_*=host"
                  "GHT_OPT_CPU_SHARE=${kind#split@}") ;;
    *) echo "offload_profile: unknown mode '$mode' (hbm, dma, zero_copy, cpu, delay, split, split@F; +spec)"; rc=1; continue ;;
  esac
  bad=0
  for suffix in $(echo "${mode#"$kind"}" | tr '+' ' '); do
    case $suffix in
      spec) env+=("GHT_OPT_SPECULATE_HOST=${OFFLOAD_SPEC_HOST:-16GiB}") ;;
      delay) env+=(GHT_OPT_DELAY=1 GHT_OPT_DELAY_WARMUP=0) ;;
      *) echo "offload_profile: unknown suffix '+$suffix' in '$mode' (+spec, +delay)"; bad=1 ;;
    esac
  done
  [ $bad = 0 ] || { rc=1; continue; }
  tag=${mode//@/_}
  tag=${tag//+/_}
  run=build-gpu/train-runs/offload-$NAME-$tag
  base=$OUT_DIR/offload_${NAME}_$tag
  echo "=== offload_profile $NAME $mode: ${env[*]} $*"
  steps=(--steps 4 --profile-steps 4 --trace-kernels)
  [ "${OFFLOAD_TRACE:-1}" = 0 ] && steps=(--steps 3 --profile-steps 3)
  if ! env "${env[@]}" GHT_SAVE_CHECKPOINTS=off timeout "${OFFLOAD_TIMEOUT:-150}" "$GHT" train \
      --config configs/bench-h200.toml --out "$run" --overwrite --backend cuda "${steps[@]}" "$@" >"$base.log" 2>&1; then
    echo "offload_profile: $NAME $mode failed:"; tail -20 "$base.log"; rc=1; continue
  fi
  grep -E "^(plan|activations|memory|optimizer)|recomputed|link per step|^ +link both" "$base.log" | head -13
  cp "$run/profile.json" "$base.profile.json"
  for f in kernel_breakdown.md kernel_breakdown.json; do [ -f "$run/$f" ] && cp "$run/$f" "$base.$f"; done
  python3 - "$base.profile.json" "$NAME" "$mode" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
steps = p["steps"] if isinstance(p, dict) and "steps" in p else p
for s in steps:
    keys = ("wall_ms", "forward_ms", "backward_ms", "opt_stall_ms", "step_gap_ms", "opt_host_ms", "prev_opt_update_ms", "mfu")
    vals = " | ".join(f"{s.get(k, float('nan')):.1f}" if k != "mfu" else f"{100 * s.get(k, 0):.1f}%" for k in keys)
    spec = f"{s.get('speculated_params', 0) / 1e6:.0f}M{' (undone)' if s.get('speculation_undone') else ''}"
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['step']}{' (traced)' if s.get('traced') else ''} | {vals} | {spec} |")
PY
done
exit $rc
