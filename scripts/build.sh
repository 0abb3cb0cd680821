#!/usr/bin/env bash
# Configure and build ghtier (Release). CUDA sources build when nvcc is found.
# Usage: scripts/build.sh [extra cmake -D options...]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${GHT_BUILD_JOBS:-$(nproc)}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake --preset release "$@" >/dev/null
cmake --build build -j "$jobs"
