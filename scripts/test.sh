#!/usr/bin/env bash
# Set up (install missing Debian packages), build, and run every test with ctest.
# GPU tests skip with a message where no CUDA device exists.
# Environment knobs: TEST_JOBS (ctest -j, default: nproc), BUILD_JOBS (see build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "${TEST_JOBS:-$(nproc)}" --timeout 900 "$@"
