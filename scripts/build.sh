#!/usr/bin/env bash
# Configure and build ghtier (Release). CUDA sources build when nvcc is found.
# Usage: scripts/build.sh [--target T ...] [extra cmake -D options...]
#   --target T   build only target T (repeatable; default: everything)
# Environment knobs: BUILD_JOBS (default: nproc). Script knobs stay out of the GHT_* namespace:
# ght rejects every GHT_* variable it does not know.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${BUILD_JOBS:-$(nproc)}
targets=()
cmake_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) [ $# -ge 2 ] || { echo "build.sh: --target needs a name" >&2; exit 2; }
              targets+=(--target "$2"); shift 2 ;;
    *) cmake_args+=("$1"); shift ;;
  esac
done
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
launcher=()
if command -v ccache >/dev/null 2>&1; then
  # ccache only when it is installed: a rebuild in another checkout reuses the objects (paths
  # relative to the checkout, CCACHE_BASEDIR).
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake --preset release "${launcher[@]}" "${cmake_args[@]}" >/dev/null
cmake --build build -j "$jobs" "${targets[@]}"
