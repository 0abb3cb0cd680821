#!/usr/bin/env bash
# Runs examples/torch_pluggable.py (PyTorch allocating through libghtier_alloc.so, both tiers)
# where PyTorch with CUDA and a CUDA build of ghtier are present; otherwise it says so and passes,
# unless GHT_TEST_REQUIRE_GPU=1 (the GPU machine), where a missing piece is a failure.
#   bash tests/cli/alloc_torch_test.sh <path-to-ght> <project-root>
set -u
GHT=${1:?usage: alloc_torch_test.sh <path-to-ght> <project-root>}
ROOT=${2:?usage: alloc_torch_test.sh <path-to-ght> <project-root>}
REQUIRE=${GHT_TEST_REQUIRE_GPU:-0}
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
LIB="$(cd "$(dirname "$GHT")/.." && pwd)/lib/libghtier_alloc.so"

skip() {
  if [ "$REQUIRE" = 1 ]; then
    echo "FAIL: GHT_TEST_REQUIRE_GPU=1 but $*" >&2
    exit 1
  fi
  echo "alloc_torch_test: skipped: $*"
  exit 0
}

[ -f "$LIB" ] || skip "no $LIB"
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  skip "no PyTorch with a usable CUDA device"
# A ghtier built without CUDA (or seeing no GPU) has no hbm tier; PyTorch cannot use it.
python3 - "$LIB" <<'PY' || skip "ghtier at $LIB has no hbm tier (built without CUDA?)"
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.ght_stats_json.restype = ctypes.c_char_p
s = lib.ght_stats_json()
sys.exit(0 if s and json.loads(s)["tiers"]["hbm"]["present"] else 1)
PY

python3 "$ROOT/examples/torch_pluggable.py" --lib "$LIB" --n 1024
