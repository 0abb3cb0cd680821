#!/usr/bin/env bash
# SIGTERM mid-run: the process checkpoints and exits 0, and resuming from that checkpoint gives
# the same losses as a run that was never interrupted.
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
steps=400
"$ght" train "${small_args[@]}" -o train.log_every=1 --data "$work/data" --out "$work/run" --steps $steps > "$work/run.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do  # wait (up to 60 s) until a few steps are logged
  n=$(grep -c '"type":"step"' "$work/run/log.jsonl" 2>/dev/null || true)
  [ "${n:-0}" -ge 5 ] && break
  sleep 0.1
done
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ $rc -eq 0 ] || { cat "$work/run.log"; fail "exit code $rc after SIGTERM (expected 0)"; }
grep -q "signal 15 received" "$work/run.log" || { cat "$work/run.log"; fail "no signal message"; }
ck=$(ls -d "$work"/run/ckpt_* | tail -1)
[ -f "$ck/COMMITTED" ] || fail "no committed checkpoint after SIGTERM"
k=$((10#${ck##*ckpt_}))
[ $k -ge 5 ] && [ $k -lt $steps ] || fail "checkpoint step $k out of range"
echo "SIGTERM at step $k: checkpoint $ck, exit 0"

# Resume for 5 more steps and compare with an uninterrupted run of the same schedule.
"$ght" train "${small_args[@]}" --data "$work/data" --out "$work/run" --steps $steps --stop-at $((k + 5)) --resume auto >/dev/null
"$ght" train "${small_args[@]}" --data "$work/data" --out "$work/straight" --steps $steps --stop-at $((k + 5)) >/dev/null
a=$(losses_after "$work/straight/log.jsonl" $k)
b=$(losses_after "$work/run/log.jsonl" $k | tail -5)
[ "$a" = "$b" ] || { diff <(echo "$a") <(echo "$b") || true; fail "losses after SIGTERM resume differ"; }
echo "resume after SIGTERM: 5 losses bit-identical"
