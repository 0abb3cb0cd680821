#!/usr/bin/env bash
# Configure and build ghtier (Release). CUDA sources build when nvcc is found.
# Usage: scripts/build.sh [extra cmake -D options...]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${GHT_BUILD_JOBS:-$(nproc)}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
launcher=()
if command -v ccache >/dev/null 2>&1; then
  # ccache only when it is installed: a rebuild in another checkout reuses the objects.
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake --preset release "${launcher[@]}" "$@" >/dev/null
cmake --build build -j "$jobs"
