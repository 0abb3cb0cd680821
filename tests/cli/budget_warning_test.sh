#!/usr/bin/env bash
# Issue 16: a budget above the tier's capacity is warned about (once, on stderr) by `ght plan` and
# `ght info`, which resolve budgets with the same rule (tier/budget.hpp); one within it is not.
#   bash tests/cli/budget_warning_test.sh <path-to-ght> <project-root>
set -euo pipefail
GHT=${1:?usage: budget_warning_test.sh <path-to-ght> <project-root>}
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export GHT_CACHE_DIR="$TMP/cache"
fail() { echo "FAIL: $*" >&2; exit 1; }

# --hbm 96G is 96 GiB, more than the gh200 profile's 95.58 GiB of HBM.
"$GHT" plan --model tiny --profile gh200 --hbm 96G >"$TMP/plan.txt" 2>"$TMP/plan.err" ||
  fail "ght plan --hbm 96G exited non-zero: $(cat "$TMP/plan.err")"
grep -q '^ght: warning: GHT_HBM_BUDGET=96G (flag) is 96.00 GiB (103079215104 bytes), more than the HBM capacity of 95.58 GiB (gh200 nominal)' "$TMP/plan.err" ||
  fail "no capacity warning for --hbm 96G: $(cat "$TMP/plan.err")"
[ "$(grep -c 'warning' "$TMP/plan.err")" = 1 ] || fail "the warning is not printed exactly once"
grep -q '^budgets: HBM 96.00 GiB' "$TMP/plan.txt" || fail "the budget is not kept as given"

# 96GB is 96e9 bytes (89.41 GiB): within the capacity, no warning.
"$GHT" plan --model tiny --profile gh200 --hbm 96GB >/dev/null 2>"$TMP/plan_gb.err" ||
  fail "ght plan --hbm 96GB exited non-zero"
! grep -q 'warning' "$TMP/plan_gb.err" || fail "a warning for 96GB: $(cat "$TMP/plan_gb.err")"

# ght info: the host row's budget, its warning in the text and in the JSON.
GHT_HOST_BUDGET=1000T "$GHT" info >"$TMP/info.txt" 2>"$TMP/info.err" || fail "ght info exited non-zero"
grep -q '^ght: warning: GHT_HOST_BUDGET=1000T (env) is 1000.00 TiB' "$TMP/info.err" ||
  fail "no warning on stderr from ght info"
grep -q '^  warning: GHT_HOST_BUDGET=1000T (env)' "$TMP/info.txt" || fail "no warning under the host row"
GHT_HOST_BUDGET=1000T "$GHT" info --json 2>/dev/null | python3 -c '
import json, sys
host = json.load(sys.stdin)["tiers"][1]
assert host["budget_bytes"] == 1000 * 2**40, host
assert "more than the host memory capacity" in host["warning"], host
assert host["budget_rule"] == "GHT_HOST_BUDGET=1000T (env)", host
' || fail "ght info --json lacks the host budget warning"
"$GHT" info --json 2>"$TMP/quiet.err" | python3 -c '
import json, sys
assert all("warning" not in t for t in json.load(sys.stdin)["tiers"])
' || fail "a warning without an oversized budget"
! grep -q warning "$TMP/quiet.err" || fail "ght info warns with default budgets"
echo "budget_warning_test: ok"
