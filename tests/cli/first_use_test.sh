#!/usr/bin/env bash
# Mistakes and machines met on first use, each answered naming the input and the way out:
# `--set NAME` without "=VALUE" (before or after the subcommand), --data through a symbolic link
# loop, GHT_HOST_MEMORY=pinned without a CUDA device, and `ght train` on a machine without one
# (it says so, and how to plan for a GPU machine).
#   bash tests/cli/first_use_test.sh <path-to-ght> <project-root>
source "$(dirname "$0")/check_common.sh" "$@"

# ---- --set NAME without =VALUE ---------------------------------------------------------------
must_fail "ght --set GHT_SPILL config" -- "$GHT" --set GHT_SPILL config
expect_in "$TMP/err" "--set expects NAME=VALUE, e.g. --set GHT_SPILL=off; got 'GHT_SPILL'"
must_fail "ght train --set GHT_LOG_LEVEL" -- "$GHT" train --set GHT_LOG_LEVEL
expect_in "$TMP/err" "--set expects NAME=VALUE, e.g. --set GHT_SPILL=off; got 'GHT_LOG_LEVEL'"
must_fail "ght --set=GHT_SPILL config" -- "$GHT" --set=GHT_SPILL config
expect_in "$TMP/err" "got 'GHT_SPILL'"
"$GHT" --set GHT_SPILL=off config >"$TMP/out" 2>"$TMP/err" || fail "--set GHT_SPILL=off config: $(cat "$TMP/err")"

# ---- --data through a symbolic link loop ---------------------------------------------------------
ln -s "$TMP/loop_b" "$TMP/loop_a"
ln -s "$TMP/loop_a" "$TMP/loop_b"
must_fail "--data on a link loop" -- "$GHT" train --model tiny --data "$TMP/loop_a" --out "$TMP/run_loop" --steps 1
expect_in "$TMP/err" "--data $TMP/loop_a: symbolic link loop ($TMP/loop_a -> $TMP/loop_b -> $TMP/loop_a)"
if grep -q "no such shard" "$TMP/err"; then fail "a link loop reported as a missing file"; fi

# ---- training where there is no GPU -----------------------------------------------------------------
"$GHT" prep --input "$ROOT/data/austen" --out "$TMP/data" --val-fraction 0.05 >/dev/null || fail "ght prep"
small=(--model tiny -o model.micro_batch=2 -o model.seq_len=32 -o train.eval_every=0 --data "$TMP/data" --steps 1)
"$GHT" train "${small[@]}" --out "$TMP/run_auto" >"$TMP/out" 2>&1 || fail "ght train: $(cat "$TMP/out")"
if grep -q "backend cpu" "$TMP/out"; then
  expect_in "$TMP/out" "no CUDA device found ("
  expect_in "$TMP/out" "): training on the CPU backend; \`ght plan --profile gh200|pcie5\` plans for a GPU machine"
  [ "$(grep -c "no CUDA device found" "$TMP/out")" = 1 ] || fail "the no-GPU line is not printed once"
fi
"$GHT" train "${small[@]}" --backend cpu --out "$TMP/run_cpu" >"$TMP/out" 2>&1 || fail "ght train --backend cpu: $(cat "$TMP/out")"
if grep -q "no CUDA device found" "$TMP/out"; then fail "--backend cpu (chosen, not fallen back to) says no CUDA device"; fi

# GHT_HOST_MEMORY=pinned: fine with a GPU, and in a build without CUDA (nothing to register with);
# a CUDA build without a GPU refuses it, saying what to use instead.
if ! GHT_HOST_MEMORY=pinned "$GHT" train "${small[@]}" --backend cpu --out "$TMP/run_pinned" >"$TMP/out" 2>"$TMP/err"; then
  expect_in "$TMP/err" "GHT_HOST_MEMORY=pinned needs a CUDA device (none found: "
  expect_in "$TMP/err" "); use GHT_HOST_MEMORY=system or auto"
  if grep -qE '\.(cpp|hpp|cu):[0-9]+' "$TMP/err"; then fail "pinned without a GPU: source location: $(cat "$TMP/err")"; fi
fi

[ "$failures" -eq 0 ] || { echo "first_use_test: $failures failure(s)" >&2; exit 1; }
echo "first_use_test: ok"
