#!/usr/bin/env bash
# GHT_OPT_STATE=bf16 end to end on the CPU backend: `ght plan` sizes m and v at 2 bytes per
# parameter; `ght train` runs with bf16 m and v (its losses differ from an fp32-state run after
# the first update), its checkpoints record the type and hold bf16 values, and 10 steps + resume
# + 10 steps equal 20 straight steps bit for bit (losses) and byte for byte (checkpoint tensors).
# Resuming that checkpoint with fp32 state converts with a note; a bad value names the variable.
source "$(dirname "$0")/train_common.sh"
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done

# The plan: m and v of the embedding (tiny: 96 KiB each in fp32) halve, master does not.
plan_bytes() {  # plan_bytes CLASS: the embedding row's bytes for that class
  "$ght" plan --model tiny --profile pcie5 | awk -v c="$1" '$1 == "embedding" && $2 == c { print $(NF-1), $NF }'
}
# Pinned: unset, the plan may take q8 or bf16 m/v where the ledger admits them and they are faster.
[ "$(GHT_OPT_STATE=fp32 plan_bytes adam_m)" = "96.00 KiB" ] ||
  fail "fp32 plan: embedding adam_m is '$(GHT_OPT_STATE=fp32 plan_bytes adam_m)', expected 96.00 KiB"
export GHT_OPT_STATE=bf16
[ "$(plan_bytes adam_m)" = "48.00 KiB" ] || fail "bf16 plan: embedding adam_m is '$(plan_bytes adam_m)', expected 48.00 KiB"
[ "$(plan_bytes adam_v)" = "48.00 KiB" ] || fail "bf16 plan: embedding adam_v is '$(plan_bytes adam_v)', expected 48.00 KiB"
[ "$(plan_bytes master)" = "96.00 KiB" ] || fail "bf16 plan: embedding master is '$(plan_bytes master)', expected 96.00 KiB"
echo "plan: bf16 m and v at half the bytes, master unchanged"
# q8: 96 blocks of 256 parameters, 260 bytes each (256 codes + an fp32 scale).
[ "$(GHT_OPT_STATE=q8 plan_bytes adam_m)" = "24.38 KiB" ] || fail "q8 plan: embedding adam_m is '$(GHT_OPT_STATE=q8 plan_bytes adam_m)', expected 24.38 KiB"
[ "$(GHT_OPT_STATE=q8 plan_bytes master)" = "96.00 KiB" ] || fail "q8 plan: embedding master changed"
echo "plan: q8 m and v at 260 bytes per 256 parameters"

prep_corpus "$work/data"
args=("${small_args[@]}" --backend cpu --data "$work/data")
"$ght" train "${args[@]}" --out "$work/straight" --steps 20 -o train.ckpt_every=10 >/dev/null
"$ght" train "${args[@]}" --out "$work/resumed" --steps 20 --stop-at 10 >/dev/null
[ -f "$work/resumed/ckpt_00000010/COMMITTED" ] || fail "no committed checkpoint at step 10"
"$ght" train "${args[@]}" --out "$work/resumed" --steps 20 --resume auto > "$work/resume.log"
grep -q "resumed from .*ckpt_00000010 at step 10" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume from step 10"; }
if grep -q "converted on load" "$work/resume.log"; then cat "$work/resume.log"; fail "a bf16 checkpoint was converted for a bf16 run"; fi

a=$(losses_after "$work/straight/log.jsonl" 10)
b=$(losses_after "$work/resumed/log.jsonl" 10)
[ "$(echo "$a" | wc -l)" -eq 10 ] || fail "straight run logged $(echo "$a" | wc -l) steps after 10"
[ "$a" = "$b" ] || { diff <(echo "$a") <(echo "$b") || true; fail "bf16 state: losses after resume are not bit-identical"; }
for f in optimizer.master optimizer.m optimizer.v model; do
  cmp "$work/straight/ckpt_00000020/$f.safetensors" "$work/resumed/ckpt_00000020/$f.safetensors" \
    || fail "bf16 state: $f differs between the straight and the resumed run at step 20"
done
echo "bf16 state: exact resume, 10 losses bit-identical, master/m/v/weights byte-equal"

# The checkpoint records the type; its m and v are F32 tensors of bf16 values (low 16 bits zero).
python3 - "$work/straight/ckpt_00000020" <<'PY' || fail "bf16 checkpoint contents"
import json, struct, sys
d = sys.argv[1]
assert json.load(open(d + "/optimizer.json"))["state_dtype"] == "bf16", "optimizer.json state_dtype"
for f in ("optimizer.m", "optimizer.v"):
    b = open(f"{d}/{f}.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n]); data = b[8 + n:]
    words = [w for k, t in head.items() if k != "__metadata__"
             for w in struct.unpack(f"<{(t['data_offsets'][1] - t['data_offsets'][0]) // 4}I",
                                    data[t["data_offsets"][0]:t["data_offsets"][1]])]
    assert words and all(w & 0xFFFF == 0 for w in words), f + ": a value that is not bf16"
    assert sum(w != 0 for w in words) > len(words) // 2, f + ": mostly zero"
PY
echo "bf16 checkpoint: state_dtype recorded, m and v hold bf16 values"

# The knob takes effect: an fp32-state run has the same first loss (no update yet), then differs.
GHT_OPT_STATE=fp32 "$ght" train "${args[@]}" --out "$work/fp32" --steps 20 >/dev/null
f32=$(losses_after "$work/fp32/log.jsonl" 0)
b16=$(losses_after "$work/straight/log.jsonl" 0)
[ "$(echo "$f32" | head -1)" = "$(echo "$b16" | head -1)" ] || fail "step 1 losses differ (the state type cannot matter before an update)"
[ "$f32" != "$b16" ] || fail "fp32 and bf16 state gave identical losses: GHT_OPT_STATE had no effect"

# Resuming the bf16 checkpoint with fp32 state widens m and v, with a note naming both types.
GHT_OPT_STATE=fp32 "$ght" train "${args[@]}" --out "$work/widened" --steps 12 \
  --resume "$work/resumed/ckpt_00000010" > "$work/widen.log"
grep -q "holds bf16 AdamW m and v, this run keeps fp32 (GHT_OPT_STATE): converted on load, exactly" "$work/widen.log" \
  || { cat "$work/widen.log"; fail "no conversion note on a bf16 -> fp32 resume"; }
echo "bf16 checkpoint resumed with fp32 state: converted with a note"

# A bad value is refused, naming the variable and the text.
if GHT_OPT_STATE=fp16 "$ght" train "${args[@]}" --out "$work/bad" --steps 2 >/dev/null 2>"$work/err.txt"; then
  fail "GHT_OPT_STATE=fp16 accepted"
fi
grep -q "GHT_OPT_STATE=fp16" "$work/err.txt" || { cat "$work/err.txt"; fail "error does not name GHT_OPT_STATE=fp16"; }
echo "GHT_OPT_STATE=fp16 refused"
