#!/usr/bin/env bash
# `ght info`: prints the link kind and the configuration table, --json parses, and a missing
# link profile file fails naming the path.
# Usage: bash info_test.sh <path-to-ght> <project-root>
set -euo pipefail
GHT="$1"
ROOT="$2"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export GHT_CACHE_DIR="$TMP/cache"  # never read or write the user's probe cache
unset GHT_LINK_PROFILE GHT_HOST_NUMA GHT_DEVICE || true

fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Plain text: link kind, tiers, link numbers and the config table.
"$GHT" info >"$TMP/out.txt" 2>"$TMP/err.txt" || { cat "$TMP/err.txt" >&2; fail "ght info exited non-zero"; }
grep -Eq '^link kind +(none|pcie|c2c)$' "$TMP/out.txt" || { cat "$TMP/out.txt" >&2; fail "no link kind line"; }
grep -q '== tiers ==' "$TMP/out.txt" || fail "no tiers section"
grep -Eq "^  host \(node [0-9]+\)" "$TMP/out.txt" || fail "no host tier row"
grep -q '== configuration ==' "$TMP/out.txt" || fail "no configuration section"
for opt in GHT_LINK_PROFILE GHT_HOST_NUMA GHT_HBM_BUDGET GHT_PROBE_SECONDS; do
  grep -q "$opt" "$TMP/out.txt" || fail "config table lacks $opt"
done

# 2. JSON: one object with the topology, tiers, link and config.
"$GHT" info --json >"$TMP/out.json" || fail "ght info --json exited non-zero"
python3 - "$TMP/out.json" <<'PY' || fail "ght info --json is not the expected JSON"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["topology"]["link"] in ("none", "pcie", "c2c"), j["topology"]["link"]
assert j["link"]["kind"] == j["topology"]["link"]
assert [t["tier"] for t in j["tiers"]] == ["hbm", "host"]
host = j["tiers"][1]
assert host["capacity_bytes"] > 0 and 0 < host["available_bytes"] <= host["capacity_bytes"]
assert host["budget_bytes"] is not None and host["budget_bytes"] <= host["available_bytes"]
assert j["probe"] is None
names = {o["name"] for o in j["config"]}
assert "GHT_LINK_PROFILE" in names and "GHT_HOST_NUMA" in names, names
PY

# 3. A built-in profile and a profile file are reported with their source.
GHT_LINK_PROFILE=pcie5 "$GHT" info >"$TMP/pcie5.txt" || fail "GHT_LINK_PROFILE=pcie5 failed"
grep -q '55.4 GB/s' "$TMP/pcie5.txt" || fail "pcie5 numbers not printed"
GHT_LINK_PROFILE="$ROOT/tier/profiles/gh200.json" "$GHT" info >"$TMP/file.txt" \
  || fail "GHT_LINK_PROFILE=<gh200.json> failed"
grep -q "source file:$ROOT/tier/profiles/gh200.json" "$TMP/file.txt" || fail "file source not shown"
grep -q '375.0 GB/s' "$TMP/file.txt" || fail "file numbers not printed"

# 4. A missing profile file fails, naming the path.
if GHT_LINK_PROFILE=/nonexistent.json "$GHT" info >"$TMP/bad.txt" 2>"$TMP/bad.err"; then
  fail "GHT_LINK_PROFILE=/nonexistent.json succeeded"
fi
grep -q '/nonexistent.json' "$TMP/bad.err" || { cat "$TMP/bad.err" >&2; fail "error does not name the path"; }

# 5. A host NUMA node that does not exist fails, naming the option.
if GHT_HOST_NUMA=1000 "$GHT" info >"$TMP/numa.txt" 2>"$TMP/numa.err"; then
  fail "GHT_HOST_NUMA=1000 succeeded"
fi
grep -q 'GHT_HOST_NUMA' "$TMP/numa.err" || { cat "$TMP/numa.err" >&2; fail "error does not name GHT_HOST_NUMA"; }

echo "info_test: ok"
