#!/usr/bin/env bash
# Issue 16 at the command line: typo'd subcommands, `ght plan` on run configurations, the
# bench-h200 presets, quick runs and their warmup, rejected numbers (non-finite, wrapping,
# saturating, empty sizes) naming the key, directories given as config files, sample's checks, and
# messages without source locations (kept for GHT_LOG_LEVEL=debug).
#   bash tests/cli/hardening_test.sh <path-to-ght> <project-root>
source "$(dirname "$0")/check_common.sh" "$@"

# ---- typos -------------------------------------------------------------------------------------
must_fail "ght trian" -- "$GHT" trian
expect_in "$TMP/err" "did you mean train?"
must_fail "ght trian --help" -- "$GHT" trian --help
expect_in "$TMP/err" "unknown command 'trian'"
must_fail "ght --set GHT_DEVICE=0 plna" -- "$GHT" --set GHT_DEVICE=0 plna
expect_in "$TMP/err" "did you mean plan?"
"$GHT" train --help >/dev/null 2>&1 || fail "ght train --help failed"
"$GHT" --set GHT_DEVICE=0 GHT_SPILL=on config >"$TMP/out" 2>"$TMP/err" || fail "--set with two items before the command: $(cat "$TMP/err")"
must_fail "--set X=1 then a typo" -- "$GHT" --set GHT_DEVICE=0 confg
expect_in "$TMP/err" "did you mean config?"

# ---- ght plan reads run configurations ----------------------------------------------------------
for f in small bench-h200; do
  "$GHT" plan --model "$ROOT/configs/$f.toml" --profile pcie5 >"$TMP/p.txt" 2>&1 || fail "plan --model configs/$f.toml: $(cat "$TMP/p.txt")"
  "$GHT" plan --config "$ROOT/configs/$f.toml" --profile pcie5 >"$TMP/c.txt" 2>&1 || fail "plan --config configs/$f.toml: $(cat "$TMP/c.txt")"
done
expect_in "$TMP/c.txt" "model: bench-h200"
expect_in "$TMP/c.txt" "10 layers x 48 experts"
"$GHT" plan --model bench-h200 --profile pcie5 >"$TMP/p.txt" 2>&1 || fail "plan --model bench-h200"
expect_in "$TMP/p.txt" "10 layers x 48 experts"
"$GHT" plan --model bench-h200-14l --profile pcie5 >"$TMP/p.txt" 2>&1 || fail "plan --model bench-h200-14l"
expect_in "$TMP/p.txt" "14 layers x 48 experts"
"$GHT" plan --model tiny --config "$ROOT/configs/small.toml" -o model.layers=3 --profile pcie5 >"$TMP/p.txt" 2>&1 ||
  fail "plan --config with -o: $(cat "$TMP/p.txt")"
expect_in "$TMP/p.txt" "3 layers"

# ---- quick runs: the built-in warmup is clamped --------------------------------------------------
"$GHT" train --data "$TMP/none" --out "$TMP/run" --steps 5 --print-config >"$TMP/cfg.json" 2>"$TMP/err" ||
  fail "train --steps 5 --print-config: $(cat "$TMP/err")"
grep -q '"warmup_steps": 5' "$TMP/cfg.json" || fail "--steps 5: warmup not clamped to 5: $(grep warmup "$TMP/cfg.json")"
must_fail "explicit warmup > steps" -- "$GHT" train --steps 5 -o schedule.warmup_steps=20 --print-config
expect_in "$TMP/err" "-o schedule.warmup_steps="

# ---- numbers ------------------------------------------------------------------------------------
for kv in optimizer.max_grad_norm=nan optimizer.max_grad_norm=inf optimizer.weight_decay=inf optimizer.eps=inf \
          model.rope_theta=inf model.rms_eps=inf model.aux_loss_coef=inf model.z_loss_coef=inf; do
  must_fail "-o $kv" -- "$GHT" train -o "$kv" --print-config
  expect_in "$TMP/err" "${kv%%=*}"
  expect_in "$TMP/err" "finite"
done
must_fail "d_model wraps" -- "$GHT" train -o model.d_model=4294967392 --print-config
expect_in "$TMP/err" "model.d_model"
expect_in "$TMP/err" "[1, 65536]"
must_fail "seed -1" -- "$GHT" train -o train.seed=-1 --print-config
expect_in "$TMP/err" "train.seed"
must_fail "steps saturate" -- "$GHT" train -o train.steps=99999999999999999999 --print-config
expect_in "$TMP/err" "train.steps"
must_fail "--steps saturates" -- "$GHT" train --steps 99999999999999999999 --print-config
expect_in "$TMP/err" "--steps"
expect_in "$TMP/err" ">= 1"
must_fail "loss coefficient" -- "$GHT" train -o model.aux_loss_coef=-1 --print-config
expect_in "$TMP/err" "aux_loss_coef"

for kv in GHT_HBM_HEADROOM= GHT_OPT_CHUNK= GHT_STAGING_BYTES= GHT_OPT_CHUNK=0; do
  must_fail "$kv" -- env "$kv" "$GHT" config
  expect_in "$TMP/err" "${kv%%=*}"
done
env GHT_HBM_BUDGET= "$GHT" config >/dev/null 2>"$TMP/err" || fail "GHT_HBM_BUDGET='' must stay 'auto': $(cat "$TMP/err")"
printf '[ght]\nhost_budget = 99999999999999999999\n' >"$TMP/ght.toml"
must_fail "host_budget beyond int64" -- env GHT_CONFIG="$TMP/ght.toml" "$GHT" config
expect_in "$TMP/err" "GHT_HOST_BUDGET"
expect_in "$TMP/err" "out of range"

# ---- directories as config files ----------------------------------------------------------------
mkdir -p "$TMP/dir"
must_fail "--config dir" -- "$GHT" train --config "$TMP/dir" --print-config
expect_in "$TMP/err" "is a directory"
must_fail "GHT_CONFIG=dir" -- env GHT_CONFIG="$TMP/dir" "$GHT" config
expect_in "$TMP/err" "is a directory"

# ---- sample's arguments (checked before the checkpoint is read) ----------------------------------
for t in nan inf -1 11; do
  must_fail "sample --temperature $t" -- "$GHT" sample --ckpt "$TMP/none" --temperature="$t"
  expect_in "$TMP/err" "--temperature"
done
for s in -1 99999999999999999999 x; do
  must_fail "sample --seed $s" -- "$GHT" sample --ckpt "$TMP/none" --seed="$s"
  expect_in "$TMP/err" "--seed"
done

# ---- source locations only at GHT_LOG_LEVEL=debug ------------------------------------------------
must_fail "unknown preset" -- "$GHT" train --model nope --print-config
expect_in "$TMP/err" "unknown model preset 'nope'"
GHT_LOG_LEVEL=debug "$GHT" train --model nope --print-config >/dev/null 2>"$TMP/err"
grep -qE 'model_config\.cpp:[0-9]+' "$TMP/err" || fail "GHT_LOG_LEVEL=debug: no source location: $(cat "$TMP/err")"

if [ "$failures" -ne 0 ]; then
  echo "hardening_test: $failures failure(s)" >&2
  exit 1
fi
echo "hardening_test: ok"
