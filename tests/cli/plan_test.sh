#!/usr/bin/env bash
# `ght plan`: the issue's done-when commands, the JSON round trip, TOML models and regions files,
# and the errors users see (malformed GHT_PLACE rule, infeasible budget, unknown model).
# Usage: bash plan_test.sh <path-to-ght> <project-root>
set -u
GHT="$1"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
expect_in() {  # expect_in FILE TEXT
  grep -qF -- "$2" "$1" || { fail "expected '$2' in $1:"; sed 's/^/    /' "$1" >&2; }
}

# 1. The plan of the issue, with reasons: the seed's own design is the exact plan (the search's
# inexact choices are tested in tests/trainer/plan_decide_test.cpp).
export GHT_PLAN_TOLERANCE=exact
if "$GHT" plan --model seed-21b --profile gh200 --hbm 96G --explain >"$TMP/explain.txt" 2>"$TMP/err.txt"; then
  expect_in "$TMP/explain.txt" "model: seed-21b"
  expect_in "$TMP/explain.txt" "GHT_HBM_BUDGET=96G (flag)"
  expect_in "$TMP/explain.txt" "why: HBM only"
  expect_in "$TMP/explain.txt" "stream"
  expect_in "$TMP/explain.txt" "predicted step"
  expect_in "$TMP/explain.txt" "notes:"
  # bf16 weights in HBM, master/m/v on the host: no weight row on the host, no state row in HBM.
  if grep -E '^[a-z_]+ +weight +host' "$TMP/explain.txt" >/dev/null; then fail "a weight row on the host"; fi
  if grep -E '^[a-z_]+ +(master|adam_m|adam_v) +hbm' "$TMP/explain.txt" >/dev/null; then
    fail "optimizer state in HBM at 96G"
  fi
else
  fail "ght plan --explain exited non-zero: $(cat "$TMP/err.txt")"
fi

# 2. The same plan as JSON; it parses and round-trips byte for byte through --from-json.
if "$GHT" plan --model seed-21b --profile gh200 --hbm 96G --json >"$TMP/plan.json" 2>"$TMP/err.txt"; then
  if command -v python3 >/dev/null; then
    python3 - "$TMP/plan.json" <<'EOF' || fail "plan JSON does not parse or lacks fields"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["format"] == "ghtier-plan" and p["version"] == 1
assert p["budgets"]["hbm"] == 96 << 30
assert p["summary"]["grad_mode"] in ("stream", "mixed")
tiers = {(r["class"], r["tier"]) for r in p["regions"]}
assert ("weight", "host") not in tiers and ("master", "hbm") not in tiers
EOF
  fi
  "$GHT" plan --from-json "$TMP/plan.json" --json >"$TMP/again.json" || fail "--from-json --json failed"
  cmp -s "$TMP/plan.json" "$TMP/again.json" || fail "plan JSON does not round-trip"
  # The saved plan prints the same table as planning it again (from its "plan:" line on: planning
  # prints the search's table before it).
  "$GHT" plan --from-json "$TMP/plan.json" --explain | sed -n '/^plan: /,$p' >"$TMP/saved.txt"
  sed -n '/^plan: /,$p' "$TMP/explain.txt" | cmp -s - "$TMP/saved.txt" || fail "saved plan prints a different table"
  # --out writes the same JSON.
  "$GHT" plan --model seed-21b --profile gh200 --hbm 96G --out "$TMP/out.json" >/dev/null || fail "--out failed"
  cmp -s "$TMP/plan.json" "$TMP/out.json" || fail "--out differs from --json"
else
  fail "ght plan --json exited non-zero: $(cat "$TMP/err.txt")"
fi

# 3. A malformed GHT_PLACE names the rule (exit 2: configuration error), from env and from --place.
GHT_PLACE='master=host,adam_*=hostt' "$GHT" plan --model tiny --profile gh200 >/dev/null 2>"$TMP/err.txt"
rc=$?
[ "$rc" -eq 2 ] || fail "malformed GHT_PLACE: exit $rc, expected 2"
expect_in "$TMP/err.txt" "GHT_PLACE rule 2 'adam_*=hostt'"
"$GHT" plan --model tiny --profile gh200 --place 'experts[hot:x].weight=hbm' >/dev/null 2>"$TMP/err.txt"
[ $? -eq 2 ] || fail "malformed --place: expected exit 2"
expect_in "$TMP/err.txt" "rule 1 'experts[hot:x].weight=hbm'"
# A well-formed static plan honours the rules.
"$GHT" plan --model tiny --profile gh200 --policy static --place 'master=host,adam_*=host,grad=stream' \
  >"$TMP/static.txt" 2>&1 || fail "static plan failed: $(cat "$TMP/static.txt")"
expect_in "$TMP/static.txt" "policy static"
if grep -E '^[a-z_]+ +(master|adam_m|adam_v) +hbm' "$TMP/static.txt" >/dev/null; then fail "static rule not honoured"; fi

# 4. An infeasible budget names the budget to raise (exit 3: out of memory).
"$GHT" plan --model seed-21b --profile gh200 --hbm 40G >/dev/null 2>"$TMP/err.txt"
rc=$?
[ "$rc" -eq 3 ] || fail "infeasible plan: exit $rc, expected 3"
expect_in "$TMP/err.txt" "raise GHT_HBM_BUDGET (ght plan --hbm)"
# At the configured micro-batch (a larger one would lack 0.5 GiB of HBM instead: the nearest).
"$GHT" plan --model seed-21b -o model.micro_batch=1 --profile gh200 --host 100G >/dev/null 2>"$TMP/err.txt"
[ $? -eq 3 ] || fail "infeasible host budget: expected exit 3"
expect_in "$TMP/err.txt" "raise GHT_HOST_BUDGET (ght plan --host)"

# Without a GPU (link none) every region lives in host memory: nothing counts against HBM, not
# even the HBM buffer a streamed gradient keeps on a GPU machine.
GHT_LINK_PROFILE=none "$GHT" plan --model small >"$TMP/none.txt" 2>"$TMP/err.txt" || fail "link-none plan failed: $(cat "$TMP/err.txt")"
grep -q "^totals: HBM 0 B" "$TMP/none.txt" || fail "link-none plan holds HBM: $(grep totals "$TMP/none.txt")"

# 5. The other scenarios: tiny everywhere in HBM; bench-h200 on pcie5 with GHT_HBM_BUDGET=40G.
"$GHT" plan --model tiny --profile pcie5 >"$TMP/tiny.txt" || fail "tiny plan failed"
if grep -E '^[a-z_]+ +[a-z_]+ +host' "$TMP/tiny.txt" >/dev/null; then fail "tiny: a region on the host"; fi
GHT_HBM_BUDGET=40G "$GHT" plan --model bench-h200 --profile pcie5 >"$TMP/bench.txt" || fail "bench-h200 plan failed"
expect_in "$TMP/bench.txt" "HBM 40.00 GiB"
grep -qE '^[a-z_]+ +[a-z_]+ +host' "$TMP/bench.txt" || fail "bench-h200 at 40G: nothing on the host"

# 6. A TOML model and a regions file.
cat >"$TMP/model.toml" <<'EOF'
preset = "tiny"
name = "tiny-3"
layers = 3
EOF
"$GHT" plan --model "$TMP/model.toml" --profile gh200 >"$TMP/toml.txt" 2>&1 || fail "TOML model: $(cat "$TMP/toml.txt")"
expect_in "$TMP/toml.txt" "model: tiny-3"
expect_in "$TMP/toml.txt" "3 layers"
printf 'layers = "three"\n' >"$TMP/bad.toml"
"$GHT" plan --model "$TMP/bad.toml" --profile gh200 >/dev/null 2>"$TMP/err.txt" && fail "bad TOML accepted"
expect_in "$TMP/err.txt" "key 'layers': expected an integer"
cat >"$TMP/regions.json" <<'EOF'
{"step_flops": 1e12, "regions": [
  {"name": "w", "class": "weight", "bytes": 1000000, "host_allowed": false},
  {"name": "m", "class": "master", "bytes": 2000000,
   "access": [{"what": "optimizer", "gpu_read_bytes": 2e6, "gpu_write_bytes": 2e6, "gpu_path": "kernel"}]}]}
EOF
"$GHT" plan --regions "$TMP/regions.json" --profile gh200 --hbm 2M --json >"$TMP/r.json" 2>"$TMP/err.txt" \
  || fail "regions file: $(cat "$TMP/err.txt")"
grep -q '"name":"m".*"tier":"host"' "$TMP/r.json" || fail "regions file: m should not fit in 2M of HBM"
printf '{"regions": [{"name": "w", "class": "wieght", "bytes": 1}]}' >"$TMP/bad.json"
"$GHT" plan --regions "$TMP/bad.json" --profile gh200 >/dev/null 2>"$TMP/err.txt" && fail "bad regions accepted"
expect_in "$TMP/err.txt" "regions[0].class: unknown class 'wieght'"

# 7. Unknown model.
"$GHT" plan --model seed-22b --profile gh200 >/dev/null 2>"$TMP/err.txt" && fail "unknown model accepted"
expect_in "$TMP/err.txt" "neither a preset"

# 8. --ranks N: the plan of one of N ZeRO-1 ranks. Hand-checked on tiny (d_model 96, vocab 256,
#    tied): the embedding has 256 x 96 = 24576 params: weight 2 x 24576 = 49152 B and fp32
#    gradient 4 x 24576 = 98304 B stay whole; master, m and v are 4 x ceil(24576 / 3) = 32768 B
#    each. A layer's attention group has 28272 params (its weight: 56544 B): 4 x 9424 = 37696 B.
#    The final norm's 96 params: 4 x 32 = 128 B. With N > 1 gradients cannot stream to the host.
"$GHT" plan --model tiny --profile gh200 --ranks 3 >"$TMP/ranks.txt" 2>&1 || fail "--ranks 3: $(cat "$TMP/ranks.txt")"
expect_in "$TMP/ranks.txt" "ranks: 3 data-parallel ranks with sharded optimizer state (ZeRO-1)"
if "$GHT" plan --model tiny --profile gh200 --ranks 3 --json >"$TMP/ranks.json" 2>"$TMP/err.txt"; then
  python3 - "$TMP/ranks.json" <<'EOF' || fail "--ranks 3: region sizes are not the hand-checked ones"
import json, sys
got = {r["name"]: r["bytes"] for r in json.load(open(sys.argv[1]))["regions"]}
want = {"embed.weight": 49152, "embed.grad": 98304, "embed.master": 32768, "embed.adam_m": 32768,
        "embed.adam_v": 32768, "layer0.attn.weight": 56544, "layer0.attn.master": 37696,
        "layer1.attn.adam_v": 37696, "final_norm.master": 128, "final_norm.grad": 384}
bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
assert not bad, bad
EOF
else
  fail "--ranks 3 --json: $(cat "$TMP/err.txt")"
fi
"$GHT" plan --model tiny --profile gh200 --ranks 2 --policy static --place grad=stream >/dev/null 2>"$TMP/err.txt" \
  && fail "--ranks 2 with streamed gradients accepted"
expect_in "$TMP/err.txt" "region 'embed.grad' (class grad) does not allow the host tier"
"$GHT" plan --model tiny --profile gh200 --ranks 0 >/dev/null 2>"$TMP/err.txt" && fail "--ranks 0 accepted"
expect_in "$TMP/err.txt" "--ranks: Value 0 not in range 1 to 65536"
"$GHT" plan --regions "$TMP/regions.json" --ranks 2 >/dev/null 2>"$TMP/err.txt" && fail "--ranks with --regions accepted"
expect_in "$TMP/err.txt" "--ranks applies to a model"

# An explicit GHT_OPTIMIZER path places the state in the plan as ght train's AdamW does (the
# greedy plan would keep tiny's state in HBM on pcie5); GHT_PLACE, when given, wins.
if GHT_OPTIMIZER=gpu_link "$GHT" plan --model tiny --profile pcie5 >"$TMP/opt.txt" 2>"$TMP/err.txt"; then
  expect_in "$TMP/opt.txt" "rules: master=host,adam_*=host (from GHT_OPTIMIZER=gpu_link)"
  if grep -E '^[a-z_]+ +(master|adam_m|adam_v) +hbm' "$TMP/opt.txt" >/dev/null; then fail "GHT_OPTIMIZER=gpu_link: state in HBM"; fi
else
  fail "GHT_OPTIMIZER=gpu_link ght plan: $(cat "$TMP/err.txt")"
fi
"$GHT" plan --model tiny --profile pcie5 >"$TMP/auto.txt" 2>&1 || fail "ght plan --profile pcie5"
if grep -E '^[a-z_]+ +(master|adam_m|adam_v) +host' "$TMP/auto.txt" >/dev/null; then fail "auto: tiny's state on the host"; fi
GHT_OPTIMIZER=gpu_link GHT_PLACE="master=hbm" "$GHT" plan --model tiny --profile pcie5 >"$TMP/opt2.txt" 2>&1 ||
  fail "GHT_OPTIMIZER with GHT_PLACE"
expect_in "$TMP/opt2.txt" "rules: GHT_PLACE=master=hbm"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "plan_test: all checks passed"
