#!/usr/bin/env bash
# One call on the GPU machine: build, run the GPU tests, run the benchmarks, print a short table.
#
# Usage (on the GPU machine, repo root):
#   source .deps/env.sh && bench/run_gpu.sh [STAGE ...]
# Stages (default: all, in this order):
#   build probe test sanitizer torch interop bench-alloc bench-opt bench-kernels train
# Opt-in stage (not in the default list): trace, the GPU time per op of one bench-h200 training
# step (CUPTI, `ght train --trace-kernels`), everything in HBM (GHT_OPTIMIZER=device), 16
# micro-batches (64k tokens/step), 3 steps of which the third is traced; the tables go to
# $OUT/kernel_breakdown.{md,json}. TRACE_ARGS replaces the run's settings (default
# "-o model.grad_accum=16 --steps 3 --profile-steps 3"); TRACE_NAME=<name> writes
# $OUT/kernel_breakdown_<name>.{md,json} instead, so a second run with other settings (GHT_*
# variables pass through) keeps the first one's files.
# Opt-in stages fp8 (the FP8 paths' GPU tests and bench_fp8_grouped) and noknobs (the plan deciding
# alone, bench/trainer/plan_noknobs.sh, on NOKNOBS_CASES; HAND passes through).
# Output: everything goes to stdout and to $OUT/run.log (or build-gpu/run.log without $OUT);
# JSON results are collected into $OUT/results.tgz. GPU tests run with GHT_TEST_REQUIRE_GPU=1, so
# a missing device fails them instead of skipping.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out" "$root/build-gpu/results"
res=$root/build-gpu/results
log=$out/run.log
exec > >(tee -a "$log") 2>&1
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build probe test sanitizer torch interop bench-alloc bench-opt bench-kernels train)
export GHT_TEST_REQUIRE_GPU=1
export PYTHONUNBUFFERED=1
declare -A status
ght=$root/build-gpu/bin/ght
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
run_stage() {  # run_stage NAME CMD...: time it, record ok/FAIL
  local name=$1; shift
  echo; echo "=== [$name] $(date -u +%FT%TZ) :: $*"
  local t0=$SECONDS
  if "$@"; then status[$name]="ok ($((SECONDS - t0)) s)"; else status[$name]="FAIL rc=$? ($((SECONDS - t0)) s)"; fi
}

echo "ghtier GPU run, $(date -u +%FT%TZ), $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
nvcc --version | tail -1; cmake --version | head -1; nproc; free -g | head -2

if want build; then
  run_stage build bash -c "cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGHT_CUDA_ARCH=90 >build-gpu/configure.log 2>&1 || { cat build-gpu/configure.log; exit 1; }; cmake --build build-gpu -j\$(nproc) -- -k 0 > build-gpu/build.log 2>&1; rc=\$?; grep -E 'error|FAILED' build-gpu/build.log | grep -v '^/usr/local/cuda/bin/nvcc' | head -80; exit \$rc"
fi
if want probe; then
  run_stage probe bash -c "GHT_CACHE_DIR=$res $ght info --probe && $ght info --probe --json > $res/info_probe.json"
fi
if want test; then
  # RUN_GPU_CTEST_ARGS narrows the run, e.g. RUN_GPU_CTEST_ARGS="-R Cuda"
  run_stage test ctest --test-dir build-gpu --output-on-failure -j4 --timeout 600 ${RUN_GPU_CTEST_ARGS:-}
fi
if want sanitizer; then
  # Device tests under compute-sanitizer memcheck with the direct (cudaMalloc) device resource.
  # Left out: tests that provoke an out-of-memory on purpose (memcheck reports the failing API
  # call as an error) and the stream-ordering test, whose 300 ms spin kernel is only meaningful
  # at native speed (memcheck serialises and slows kernels). API errors are not reported: the
  # allocator's error paths call CUDA with bad arguments on purpose in some tests.
  san() {
    local rc=0 b
    for b in build-gpu/bin/alloc_device_pool_test build-gpu/bin/alloc_tiered_test; do
      [ -x "$b" ] || { echo "missing $b"; rc=1; continue; }
      GHT_DEVICE_POOL=direct compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$b" \
        --gtest_filter='-*OutOfMemory*:*NotReusedOnOtherStream*:*Exhaust*' --gtest_brief=1 || rc=1
    done
    return $rc
  }
  run_stage sanitizer san
fi
if want torch; then
  # The allocator library, libghtier_alloc.so: libghtier.so would bring cuBLAS, cuDNN, TBB and
  # libgomp into PyTorch's process (torch_import_order.py --full shows what that does).
  run_stage torch bash -c "GHT_TORCH_TIER=hbm python3 examples/torch_pluggable.py --lib build-gpu/lib/libghtier_alloc.so && GHT_TORCH_TIER=host python3 examples/torch_pluggable.py --lib build-gpu/lib/libghtier_alloc.so"
  run_stage torch-import-order python3 examples/torch_import_order.py --lib build-gpu/lib/libghtier_alloc.so --full build-gpu/lib/libghtier.so
  run_stage torch-train python3 bench/alloc/torch_train_pluggable.py --lib build-gpu/lib/libghtier_alloc.so --json "$res/torch_train_pluggable.json"
fi
if want interop; then
  [ -f tests/interop/check_hf.py ] && run_stage interop python3 tests/interop/check_hf.py --ght "$ght" --work build-gpu/interop
  [ -f tests/interop/check_hf_gpu.py ] && run_stage interop-gpu python3 tests/interop/check_hf_gpu.py --ght "$ght" --work build-gpu/interop-gpu
fi
if want bench-alloc; then
  grep -E '^(MemTotal|MemFree|MemAvailable|Cached|Shmem|Mlocked):' /proc/meminfo
  [ -x build-gpu/bin/alloc_bench ] && run_stage bench-alloc build-gpu/bin/alloc_bench --ght_json="$res/bench_alloc.json"
fi
if want bench-opt; then
  b=$(ls build-gpu/bin/bench_optimizer* 2>/dev/null | head -1)
  [ -n "$b" ] && run_stage bench-opt "$b" --json "$res/bench_optimizer.json"
  # 20 passes of the CPU accumulator next to 20 of the host triad, same pinned team, 1 GiB arrays
  [ -x build-gpu/bin/bench_accumulate_triad ] && run_stage bench-acc-triad build-gpu/bin/bench_accumulate_triad --json "$res/bench_accumulate_triad.json"
  [ -f bench/optimizer/torch_baseline.py ] && run_stage torch-adamw python3 bench/optimizer/torch_baseline.py --json "$res/torch_adamw.json"
fi
if want bench-kernels; then
  for b in build-gpu/bin/bench_expert_gemm build-gpu/bin/bench_lm_head build-gpu/bin/bench_kernels; do
    [ -x "$b" ] && run_stage "$(basename "$b")" "$b" --json "$res/$(basename "$b").json"
  done
fi
if want train; then
  [ -f bench/train_gpu.sh ] && run_stage train bash bench/train_gpu.sh "$ght" "$res"
fi

if want trace; then
  trace() {
    bash bench/make_bench_data.sh "$ght" || return 1
    local sfx=${TRACE_NAME:+_$TRACE_NAME} run=build-gpu/train-runs/trace${TRACE_NAME:+-$TRACE_NAME}
    # shellcheck disable=SC2086  # TRACE_ARGS is a list of arguments
    GHT_SAVE_CHECKPOINTS=off GHT_OPTIMIZER=${GHT_OPTIMIZER:-device} "$ght" train --config configs/bench-h200.toml \
      --out "$run" --overwrite --backend cuda ${TRACE_ARGS:--o model.grad_accum=16 --steps 3 --profile-steps 3} \
      --trace-kernels || return 1
    [ -f "$run/kernel_breakdown.md" ] || { echo "no kernel breakdown (see the warning above)"; return 1; }
    cp "$run/kernel_breakdown.md" "$out/kernel_breakdown$sfx.md"
    cp "$run/kernel_breakdown.json" "$out/kernel_breakdown$sfx.json"
    cp "$run/profile.json" "$res/trace${sfx}_profile.json"
  }
  run_stage trace trace
fi

if want fp8; then
  # The FP8 paths' GPU tests (quantisation bit for bit against the CPU, the fused quantisation in the
  # permutation's scatter and in SwiGLU bit for bit against the unfused kernels, the router without
  # its gather, the grouped GEMM against its dequantised reference, the model's FP8 experts against
  # bf16), then the grouped GEMM against bf16
  # at seed-21b's expert shapes.
  fp8() {
    local rc=0 t
    for t in kernels_cuda_fp8_test kernels_cuda_fp8_fused_test kernels_cuda_fp8_gemm_test kernels_cuda_router_test \
             kernels_cuda_swiglu_test trainer_cuda_model_fp8_test; do
      build-gpu/bin/$t --gtest_brief=1 || rc=1
    done
    build-gpu/bin/bench_fp8_grouped --iters 30 --json "$res/bench_fp8_grouped.json" || rc=1
    return $rc
  }
  run_stage fp8 fp8
fi

if want noknobs; then
  # The plan deciding alone (bench/trainer/plan_noknobs.sh): NOKNOBS_CASES (default bench64k
  # 14l64k), HAND passes through (the hand settings each case is also run with).
  # shellcheck disable=SC2086  # NOKNOBS_CASES is a list of case names
  run_stage noknobs bash bench/trainer/plan_noknobs.sh "$ght" "$res/noknobs" ${NOKNOBS_CASES:-bench64k 14l64k}
  cp "$res/noknobs/summary.md" "$out/noknobs_summary.md" 2>/dev/null
fi

if want sweep; then
  sweep() {
    [ -x "$ght" ] || { echo "no $ght: run the build stage first"; return 1; }
    local dl=${SWEEP_DEADLINE_S:-$((570 - SECONDS))}
    SWEEP_DEADLINE_S=$dl python3 bench/trainer/sweep.py --ght "$ght" --out "$res/sweep"
    local rc=$?
    cp "$res/sweep/sweep.md" "$res/sweep/sweep.json" "$out/" 2>/dev/null
    return $rc
  }
  run_stage sweep sweep
fi

tar -czf "$out/results.tgz" -C build-gpu results 2>/dev/null
echo; echo "=== summary"
printf '| %-16s | %-24s |\n' stage status
printf '|%s|%s|\n' "------------------" "--------------------------"
for s in build probe test sanitizer torch torch-import-order torch-train interop interop-gpu bench-alloc bench-opt torch-adamw bench_expert_gemm bench_lm_head bench_kernels train trace fp8 noknobs sweep; do
  [ -n "${status[$s]:-}" ] && printf '| %-16s | %-24s |\n' "$s" "${status[$s]}"
done
fail=0; for v in "${status[@]}"; do [[ $v == FAIL* ]] && fail=1; done
exit $fail
