#!/usr/bin/env bash
# Exact resume: 20 steps straight against 10 steps, checkpoint, a new process with --resume auto,
# and 10 more. Losses must be bit-identical and master, m and v byte-equal. Then a corrupted
# newest checkpoint must make --resume auto fall back to the previous good one.
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
"$ght" train "${small_args[@]}" --data "$work/data" --out "$work/straight" --steps 20 -o train.ckpt_every=10 >/dev/null
"$ght" train "${small_args[@]}" --data "$work/data" --out "$work/resumed" --steps 20 --stop-at 10 >/dev/null
[ -f "$work/resumed/ckpt_00000010/COMMITTED" ] || fail "no committed checkpoint at step 10"
"$ght" train "${small_args[@]}" --data "$work/data" --out "$work/resumed" --steps 20 --resume auto > "$work/resume.log"
grep -q "resumed from .*ckpt_00000010 at step 10" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume from step 10"; }

a=$(losses_after "$work/straight/log.jsonl" 10)
b=$(losses_after "$work/resumed/log.jsonl" 10)
[ "$(echo "$a" | wc -l)" -eq 10 ] || fail "straight run logged $(echo "$a" | wc -l) steps after 10"
if [ "$a" != "$b" ]; then
  diff <(echo "$a") <(echo "$b") || true
  fail "losses after resume are not bit-identical"
fi
for f in optimizer.master optimizer.m optimizer.v model; do
  cmp "$work/straight/ckpt_00000020/$f.safetensors" "$work/resumed/ckpt_00000020/$f.safetensors" \
    || fail "$f differs between the straight and the resumed run at step 20"
done
echo "exact resume: 10 losses bit-identical, master/m/v/weights byte-equal"

# Corrupt the newest checkpoint (flip a byte): --resume auto must skip it, warn, and use step 10.
python3 - "$work/straight/ckpt_00000020/optimizer.m.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-5] ^= 0xFF; open(p, "wb").write(bytes(b))
PY
"$ght" train "${small_args[@]}" --data "$work/data" --out "$work/straight" --steps 20 --stop-at 12 --resume auto > "$work/fallback.log" 2>&1 \
  || { cat "$work/fallback.log"; fail "resume with a corrupt newest checkpoint failed"; }
grep -q "resumed from .*ckpt_00000010 at step 10" "$work/fallback.log" || { cat "$work/fallback.log"; fail "did not fall back to step 10"; }
grep -qi "ckpt_00000020" "$work/fallback.log" || { cat "$work/fallback.log"; fail "no warning naming the corrupt checkpoint"; }
echo "corrupt newest checkpoint skipped with a warning; resumed from step 10"

# A negative --profile-steps is refused before anything runs, naming the option.
if "$ght" train "${small_args[@]}" --data "$work/data" --out "$work/bad" --profile-steps -3 >/dev/null 2>"$work/err.txt"; then
  fail "--profile-steps -3 accepted"
fi
grep -q -- "--profile-steps" "$work/err.txt" || { cat "$work/err.txt"; fail "error does not name --profile-steps"; }
[ ! -e "$work/bad" ] || fail "a refused run created its run directory"
echo "negative --profile-steps refused"
