#!/usr/bin/env bash
# Set up (install missing Debian packages), build, and run every test with ctest.
# GPU tests skip with a message where no CUDA device exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "${GHT_TEST_JOBS:-$(nproc)}" --timeout 900 "$@"
