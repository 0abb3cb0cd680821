#!/usr/bin/env bash
# tests/common/skip_reasons.py (ctest's post-test hook): reads a ctest log and prints why tests
# were skipped, grouped by reason; passing tests are not listed; a missing log prints nothing.
set -euo pipefail
root=${2:?project root}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$work/Testing/Temporary"
block() {  # block N NAME OUTPUT PASS_REASON
  printf '%s/9 Testing: %s\n%s/9 Test: %s\nCommand: "x"\nOutput:\n----------------------------------------------------------\n%s\n<end of output>\nTest time =   0.00 sec\n----------------------------------------------------------\n%s\n"%s" end time: Dec 01 00:00 UTC\n----------------------------------------------------------\n\n' \
    "$1" "$2" "$1" "$2" "$3" "$4" "$2"
}
skip_re='Test Pass Reason:
Skip regular expression found in output. Regex=[\[  SKIPPED \]]'
{
  echo "Start testing: Dec 01 00:00 UTC"
  block 1 "Gpu.One" $'[ RUN      ] Gpu.One\n../tests/x_test.cu:10: Skipped\nno CUDA device (built without CUDA); GPU test skipped\n[  SKIPPED ] Gpu.One (0 ms)' "$skip_re"
  block 2 "Contract.Basic<Contract/pinned_host.  # TypeParam = (anonymous namespace)::PinnedHost>" $'../tests/y_test.cpp:5: Skipped\nno CUDA device (built without CUDA); GPU test skipped\n[  SKIPPED ] Contract/pinned_host.Basic (0 ms)' "$skip_re"
  block 3 "Host.Passes" $'[       OK ] Host.Passes (1 ms)' "Test Passed."
  block 4 "cli_torch_test" $'torch_test: skipped: no PyTorch with a usable CUDA device' 'Test Pass Reason:
Skip regular expression found in output. Regex=[_test: skipped: ]'
  echo "End testing: Dec 01 00:00 UTC"
} > "$work/Testing/Temporary/LastTest.log"
out=$(python3 "$root/tests/common/skip_reasons.py" "$work")
echo "$out"
echo "$out" | grep -q "Why 3 tests were skipped:" || fail "wrong count"
echo "$out" | grep -q "2 x no CUDA device (built without CUDA); GPU test skipped" || fail "GPU reason not grouped"
echo "$out" | grep -q "(Gpu.One, Contract.Basic<Contract/pinned_host.)" || fail "names of the GPU group"
echo "$out" | grep -q "1 x no PyTorch with a usable CUDA device" || fail "shell test reason missing"
if echo "$out" | grep -q "Host.Passes"; then fail "a passing test is listed"; fi
# ctest's own log while the hook runs is LastTest.log.tmp: the newer file wins.
sleep 1
sed 's/no PyTorch with a usable CUDA device/a newer reason/' "$work/Testing/Temporary/LastTest.log" > "$work/Testing/Temporary/LastTest.log.tmp"
out=$(python3 "$root/tests/common/skip_reasons.py" "$work")
echo "$out" | grep -q "a newer reason" || fail "LastTest.log.tmp not preferred"
rm -rf "$work/Testing"
[ -z "$(python3 "$root/tests/common/skip_reasons.py" "$work")" ] || fail "output without a log"
echo "skip_reasons: ok"
