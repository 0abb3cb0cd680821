#!/usr/bin/env bash
# ght train's guards against losing work: bad flags and a missing --data are refused before
# anything runs; a run directory in use is refused naming the holder's pid; a previous run needs
# --resume or --overwrite; --resume takes a run directory; a no-op re-run says so; and
# GHT_LOG_LEVEL=warn silences the info messages.
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
args=("${small_args[@]}" -o schedule.warmup_steps=1 --data "$work/data")

# Flags out of range, named with their range; no run directory is created.
for bad in "--steps -3" "--steps 0" "--stop-at -1" "--profile-steps -2" "--lr -1"; do
  flag=${bad%% *}
  if "$ght" train "${args[@]}" --out "$work/bad" $bad >/dev/null 2>"$work/err.txt"; then fail "$bad accepted"; fi
  grep -q -- "$flag" "$work/err.txt" || { cat "$work/err.txt"; fail "error for $bad does not name $flag"; }
  grep -q "[>]=* *[0-9]" "$work/err.txt" || { cat "$work/err.txt"; fail "error for $bad does not give the range"; }
done
[ ! -e "$work/bad" ] || fail "a refused run created its run directory"
if "$ght" train "${small_args[@]}" --out "$work/bad" --steps 30 >/dev/null 2>"$work/err.txt"; then fail "ran without --data"; fi
grep -q -- "--data" "$work/err.txt" || { cat "$work/err.txt"; fail "no mention of --data"; }
[ ! -e "$work/bad" ] || fail "a run without --data created its run directory"
echo "bad flags and a missing --data refused"

# FP8 GEMMs are the cuda backend's: the cpu backend refuses GHT_FP8=experts, naming it.
if GHT_FP8=experts "$ght" train "${args[@]}" --backend cpu --out "$work/fp8" --steps 2 >/dev/null 2>"$work/err.txt"; then
  fail "GHT_FP8=experts ran on the cpu backend"
fi
{ grep -q "GHT_FP8=experts" "$work/err.txt" && grep -q "cuda backend" "$work/err.txt"; } ||
  { cat "$work/err.txt"; fail "the FP8 refusal does not name GHT_FP8 and the cuda backend"; }
echo "GHT_FP8=experts refused on the cpu backend"

# A second run on the same directory while the first holds it.
"$ght" train "${args[@]}" --out "$work/run" --steps 100000 > "$work/first.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  grep -q '"type":"step"' "$work/run/log.jsonl" 2>/dev/null && break
  sleep 0.1
done
rc=0; "$ght" train "${args[@]}" --out "$work/run" --steps 5 --resume auto > "$work/second.log" 2>&1 || rc=$?
kill -TERM $pid; wait $pid || true
[ $rc -ne 0 ] || { cat "$work/second.log"; fail "a second run on a locked directory started"; }
grep -q "pid $pid" "$work/second.log" || { cat "$work/second.log"; fail "the refusal does not name pid $pid"; }
echo "locked run directory refused, naming pid $pid"

# The first run left a checkpoint (SIGTERM) and a log: a fresh start there is refused...
if "$ght" train "${args[@]}" --out "$work/run" --steps 3 >/dev/null 2>"$work/err.txt"; then fail "trained over a previous run"; fi
grep -q -- "--resume auto" "$work/err.txt" && grep -q -- "--overwrite" "$work/err.txt" \
  || { cat "$work/err.txt"; fail "the refusal does not name --resume auto and --overwrite"; }
# ...and --overwrite starts over: one run id in the log, steps 1..3 once each.
"$ght" train "${args[@]}" --out "$work/run" --steps 3 --overwrite >/dev/null
python3 - "$work/run/log.jsonl" <<'PY' || fail "log after --overwrite"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ids = {r.get("run_id") for r in recs}
assert len(ids) == 1 and None not in ids, ids
assert [r["step"] for r in recs if r["type"] == "step"] == [1, 2, 3]
PY
echo "previous run refused; --overwrite started over"

# --resume with a run directory, then a no-op re-run.
"$ght" train "${args[@]}" --out "$work/next" --steps 5 --resume "$work/run" > "$work/next.log"
grep -q "resumed from .*ckpt_00000003 at step 3" "$work/next.log" || { cat "$work/next.log"; fail "--resume <run dir>"; }
"$ght" train "${args[@]}" --out "$work/next" --steps 5 --resume auto > "$work/noop.log"
grep -q "nothing to do" "$work/noop.log" || { cat "$work/noop.log"; fail "no-op re-run"; }
if grep -q "last loss 0" "$work/noop.log"; then fail "no-op re-run printed 'last loss 0'"; fi
echo "--resume <run dir> and a no-op re-run"

# GHT_LOG_LEVEL=warn: the info lines (model summary, resume note) are gone; info shows them.
GHT_LOG_LEVEL=info "$ght" train "${args[@]}" --out "$work/lv" --steps 2 > "$work/info.log"
grep -q "^model tiny" "$work/info.log" || { cat "$work/info.log"; fail "no model line at info"; }
GHT_LOG_LEVEL=warn "$ght" train "${args[@]}" --out "$work/lv" --steps 4 --resume auto > "$work/warn.log"
if grep -q "^model tiny\|resumed from" "$work/warn.log"; then cat "$work/warn.log"; fail "info lines printed at GHT_LOG_LEVEL=warn"; fi
grep -q "^done: steps 2 -> 4" "$work/warn.log" || { cat "$work/warn.log"; fail "the run did not finish"; }
echo "GHT_LOG_LEVEL=warn hides info lines"

# Resuming with another model names the field that differs and both values.
if "$ght" train "${args[@]}" --out "$work/lv" --steps 6 --resume auto -o model.d_model=64 >/dev/null 2>"$work/mm.err"; then
  fail "resumed a checkpoint of another model"
fi
grep -q "model.d_model: checkpoint has 96, this run has 64" "$work/mm.err" ||
  { cat "$work/mm.err"; fail "the resume error does not name model.d_model and both values"; }
echo "a model mismatch on resume names the field"
