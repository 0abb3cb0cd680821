#!/usr/bin/env bash
# Set up (install missing Debian packages), build, and run every test with ctest; then the Python
# package's tests (scripts/test-python.sh: a venv with PyTorch from PyPI, `pip install .`, pytest)
# and the aarch64 (Grace) build and tests under qemu (scripts/test-aarch64.sh).
# GPU tests skip with a message where no CUDA device exists.
# Environment knobs: TEST_JOBS (ctest -j, default: nproc), BUILD_JOBS (see build.sh),
# TEST_PYTHON=0 and TEST_AARCH64=0 skip those two parts (each says so).
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiler-cache entries keyed by paths relative to the checkout: a fresh clone in another folder
# reuses what an earlier build compiled (ccache, where installed; every build below uses it).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "${TEST_JOBS:-$(nproc)}" --timeout 900 "$@"
if [ "${TEST_PYTHON:-1}" = 0 ]; then
  echo "test.sh: Python package tests skipped (TEST_PYTHON=0)"
else
  # Without a GPU the package's tests are its CPU ones: build the extension without CUDA (faster).
  if ! command -v nvidia-smi >/dev/null 2>&1; then export GHTIER_PY_CUDA=${GHTIER_PY_CUDA:-off}; fi
  scripts/test-python.sh
fi
if [ "${TEST_AARCH64:-1}" = 0 ]; then
  echo "test.sh: aarch64 build and tests skipped (TEST_AARCH64=0)"
elif [ -x scripts/test-aarch64.sh ]; then
  scripts/test-aarch64.sh
fi
