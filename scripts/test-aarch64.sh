#!/usr/bin/env bash
# Grace's CPU side on an x86-64 Debian machine: cross-builds the tier, alloc, optimizer and
# CPU-trainer tests for aarch64 (Neoverse V2, cmake/aarch64-linux-gnu.cmake) and runs them under
# qemu-aarch64 at two SVE vector lengths (128 and 256 bits: Grace's is 128, 256 catches code
# that assumes one length). Installs what is missing (Debian multiarch: arm64 libraries, the
# cross compiler, qemu-user); as root, or through sudo.
#
# Prints "sve<N>: P passed, F failed" per vector length and exits non-zero when a test failed.
# Exits 0 with "test-aarch64: skipped: <reason>" when ARCH_TEST=0 or when the cross toolchain
# cannot be installed (no network, no root).
#
# Knobs: ARCH_TEST=0 skips; BUILD_DIR (build-aarch64); BUILD_JOBS (nproc); TEST_JOBS (test
# programs run at once; nproc); SVE_LENGTHS ("128 256"); TESTS (test programs; default below);
# WIDE_TESTS (the programs run at lengths above 128; default below).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

skip() {
  echo "test-aarch64: skipped: $*"
  exit 0
}
die() {
  echo "test-aarch64: error: $*" >&2
  exit 1
}
[[ "${ARCH_TEST:-1}" == 0 ]] && skip "ARCH_TEST=0"
[[ "$(uname -m)" == x86_64 ]] || skip "runs on x86-64 build machines ($(uname -m) here)"
command -v dpkg-query >/dev/null || skip "needs Debian's dpkg and apt to install the arm64 toolchain"

BUILD_DIR=${BUILD_DIR:-build-aarch64}
BUILD_JOBS=${BUILD_JOBS:-$(nproc)}
TEST_JOBS=${TEST_JOBS:-$(nproc)}
SVE_LENGTHS=${SVE_LENGTHS:-"128 256"}
# Tests whose code paths differ on aarch64 (SIMD loops, atomics, memory ordering, NUMA, page
# sizes) or that carry the CPU training numerics; parsing-only suites are left to the x86 run, and
# trainer_delayed_update_test (the loop's scheduling, on both backends: minutes under qemu) too.
TESTS=${TESTS:-"tier_topology_test tier_topology_gh200_test tier_host_triad_test tier_link_test
  tier_budget_test tier_cost_model_test tier_place_rules_test
  alloc_contract_test alloc_adaptors_test alloc_tiered_test alloc_host_resources_test
  alloc_host_cache_test alloc_default_allocator_test alloc_faults_test alloc_c_abi_test
  optimizer_adamw_test optimizer_adamw_cpu_path_test optimizer_bf16_test
  optimizer_adamw_bf16_state_test optimizer_adamw_q8_state_test optimizer_accumulate_test
  optimizer_cpu_threads_test optimizer_simd_kernels_test
  trainer_model_test trainer_loop_test trainer_checkpoint_test trainer_safetensors_test
  trainer_opt_state_resume_test trainer_zero_test trainer_diloco_test
  trainer_data_test"}
read -r -d '' -a TEST_LIST <<<"$TESTS"
# Above Grace's 128 bits, the programs whose code depends on the vector length: Highway's dispatch
# (optimizer/detail/adamw_simd.cpp, tier/detail/triad_simd.cpp) and the AdamW paths that call it.
# qemu-user runs 256-bit SVE about 9x slower than 128-bit (optimizer_simd_kernels_test: 51 s
# against 5.8 s), so running every program there took 965 s of CI's time for code (the compiler's
# vector-length-agnostic loops) that the 128-bit run already covers. optimizer_adamw_q8_state_test
# stays at 128 bits: its bit-for-bit test against the scalar reference takes 45 s there and over
# 7 minutes at 256, and optimizer_simd_kernels_test checks the same q8 loop against a scalar
# reference, byte for byte, on every Highway target, SVE_256 included.
WIDE_TESTS=${WIDE_TESTS:-"optimizer_simd_kernels_test tier_host_triad_test optimizer_adamw_test
  optimizer_adamw_bf16_state_test"}
read -r -d '' -a WIDE_LIST <<<"$WIDE_TESTS"
# Tests that cannot work under qemu-user: "Suite.Test=reason" (gtest patterns allowed). None so
# far: qemu-user 7.2 answers get_mempolicy/mbind/set_mempolicy with ENOSYS, so libnuma reports
# itself unavailable and the NUMA binding tests skip with that reason (listed in the output).
EXCLUDE=(
)

# ---- toolchain ----------------------------------------------------------------------------
# libc6, libstdc++6 and libgomp1 of arm64 are what the tests run on (see QEMU_LD_PREFIX below).
PKGS=(g++-aarch64-linux-gnu qemu-user cmake ninja-build
      libc6:arm64 libstdc++6:arm64 libgomp1:arm64 libnuma-dev:arm64 libhwloc-dev:arm64 libtbb-dev:arm64 libgtest-dev:arm64 libxxhash-dev:arm64 libhwy-dev:arm64
      nlohmann-json3-dev libtoml11-dev libcli11-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [[ $(id -u) != 0 ]]; then
    sudo -n true 2>/dev/null || skip "needs root (or sudo without a password) to install ${missing[*]}"
    sudo="sudo -n"
  fi
  echo "test-aarch64: installing ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $sudo dpkg --add-architecture arm64 || skip "dpkg --add-architecture arm64 failed"
  fi
  $sudo apt-get update -qq || skip "apt-get update failed (no network?); cannot install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
    skip "apt-get install failed for ${missing[*]} (no network, or no arm64 packages on the mirror)"
fi
QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static) ||
  skip "no qemu-aarch64 after installing qemu-user"
[[ -e /lib/ld-linux-aarch64.so.1 ]] || die "no /lib/ld-linux-aarch64.so.1: libc6:arm64 is missing"

# ---- build --------------------------------------------------------------------------------
start=$SECONDS
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
# Tests are listed at ctest time (PRE_TEST), not by running every binary under qemu while building.
cmake -S . -B "$BUILD_DIR" -G Ninja --no-warn-unused-cli -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DGHT_ENABLE_CUDA=OFF -DGHT_BUILD_BENCH=OFF \
  -DGHT_WITH_MPI=OFF -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST "${launcher[@]}" >/dev/null ||
  die "cmake configure of $BUILD_DIR failed"
mapfile -t BUILD_LIST < <(printf '%s\n' "${TEST_LIST[@]}" "${WIDE_LIST[@]}" | sort -u)
cmake --build "$BUILD_DIR" -j "$BUILD_JOBS" --target "${BUILD_LIST[@]}" || die "aarch64 build failed"
build_s=$((SECONDS - start))
for t in "${BUILD_LIST[@]}"; do
  readelf -h "$BUILD_DIR/bin/$t" 2>/dev/null | grep -q "Machine:.*AArch64" ||
    die "$BUILD_DIR/bin/$t is not an aarch64 executable"
done

# ---- run ----------------------------------------------------------------------------------
# The vector length qemu gives a process, checked by a program that reads it (cntb).
probe=$BUILD_DIR/sve_vector_bits
printf '#include <stdio.h>\nint main(void){unsigned long b;__asm__("cntb %%0":"=r"(b));printf("%%lu\\n",b*8);return 0;}\n' |
  aarch64-linux-gnu-gcc -march=armv8.2-a+sve -x c - -o "$probe" || die "cannot build the SVE probe"

EXCLUDE_FILTER=""
((${#EXCLUDE[@]})) && EXCLUDE_FILTER="-$(IFS=:; echo "${EXCLUDE[*]%%=*}")"
# (Not GTEST_FILTER: GoogleTest reads that variable itself.)
# run_one <vector bits> <program>: its output in test-logs/sve<bits>/<program>.log, exit status
# in .rc beside it.
# shellcheck disable=SC2317  # called through xargs
run_one() {
  local log=$BUILD_DIR/test-logs/sve$1/$2.log
  QEMU_CPU="max,sve$1=on" "$QEMU" "$BUILD_DIR/bin/$2" ${EXCLUDE_FILTER:+"--gtest_filter=$EXCLUDE_FILTER"} >"$log" 2>&1
  echo $? >"$log.rc"
}
export -f run_one
export QEMU BUILD_DIR EXCLUDE_FILTER
for e in "${EXCLUDE[@]}"; do echo "test-aarch64: excluded ${e%%=*}: ${e#*=}"; done
status=0
summary=()
for vl in $SVE_LENGTHS; do
  # No QEMU_LD_PREFIX: the arm64 loader and libraries are at their multiarch places
  # (/lib/ld-linux-aarch64.so.1, /usr/lib/aarch64-linux-gnu). Pointing qemu at the cross
  # runtime (/usr/aarch64-linux-gnu) mixes two glibc builds and hangs the first new thread.
  unset QEMU_LD_PREFIX
  got=$(QEMU_CPU="max,sve${vl}=on" "$QEMU" "$probe") || die "qemu-aarch64 cannot run $probe"
  [[ "$got" == "$vl" ]] || die "QEMU_CPU=max,sve${vl}=on gives $got-bit vectors, not $vl"
  passed=0 failed=0 skipped=0 gpu=0 run_start=$SECONDS
  rm -rf "$BUILD_DIR/test-logs/sve$vl" && mkdir -p "$BUILD_DIR/test-logs/sve$vl"
  programs=("${TEST_LIST[@]}")
  ((vl > 128)) && programs=("${WIDE_LIST[@]}")
  # shellcheck disable=SC2016  # $0 and $1 are the inner shell's
  printf '%s\n' "${programs[@]}" | xargs -P "$TEST_JOBS" -I{} bash -c 'run_one "$0" "$1"' "$vl" {}
  for t in "${programs[@]}"; do
    log=$BUILD_DIR/test-logs/sve$vl/$t.log
    rc=$(cat "$log.rc" 2>/dev/null || echo 127)
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    k=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    p=${p:-0} f=${f:-0} k=${k:-0}
    # A skip says why on the line after "file:line: Skipped"; GPU tests (no CUDA here) are only
    # counted, the others named.
    ((k == 0)) || awk -v p="sve$vl $t: skipped" '/^\[ RUN      \] /{name=$4}
      /: Skipped$/{getline why; if (why !~ /no CUDA device/) print p, name ": " why}' "$log"
    gpu=$((gpu + $(grep -c "no CUDA device" "$log")))
    if ((p + f + k == 0 && rc == 0)); then
      f=1  # a filter or a build that leaves a program without tests is a failure, not a pass
      echo "sve$vl $t: ran no tests (log: $log)"
    elif ((rc != 0 && f == 0)); then
      f=1  # ended without gtest's summary: crashed or killed
      echo "sve$vl $t: exited with $rc before its summary (log: $log)"
      tail -5 "$log"
    elif ((f > 0)); then
      echo "sve$vl $t: $f failed (log: $log)"
      grep -E '^\[  FAILED  \] [A-Za-z_0-9/.]+$' "$log"
    fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + k))
  done
  ((failed == 0)) || status=1
  summary+=("sve$vl: ${#programs[@]} programs, $passed passed, $failed failed, $skipped skipped ($gpu of them GPU tests; $((SECONDS - run_start)) s)")
done
echo "test-aarch64: built ${#BUILD_LIST[@]} test programs in ${build_s} s; $SECONDS s in all"
printf '%s\n' "${summary[@]}"
exit $status
