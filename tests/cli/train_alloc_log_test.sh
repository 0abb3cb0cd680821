#!/usr/bin/env bash
# CLI test: a training run places its memory through the tiered allocator, so GHT_ALLOC_LOG
# records it and `ght alloc-replay` replays the run's log (peak per tier, state classes named).
#   bash tests/cli/train_alloc_log_test.sh <path-to-ght> <project-root>
for v in $(compgen -e); do
  case "$v" in GHT_*) unset "$v" ;; esac
done
source "$(dirname "$0")/train_common.sh"

prep_corpus "$work/data"
GHT_ALLOC_LOG="$work/alloc.csv" "$ght" train "${small_args[@]}" --data "$work/data" --out "$work/run" \
  --steps 2 -o schedule.warmup_steps=1 >"$work/train.out" 2>&1 || fail "train failed: $(cat "$work/train.out")"
[ -s "$work/alloc.csv" ] || fail "GHT_ALLOC_LOG wrote nothing"
# The optimizer's fp32 state is in the log, by class, with an allocate and a free for each block.
for cls in master adam_m adam_v; do
  grep -q ",allocate,.*,$cls," "$work/alloc.csv" || fail "no $cls allocation in the log"
  grep -q ",free,.*,$cls," "$work/alloc.csv" || fail "no $cls free in the log"
done
"$ght" alloc-replay --json "$work/alloc.csv" >"$work/replay.json" 2>"$work/err" ||
  fail "alloc-replay of the training log failed: $(cat "$work/err")"
python3 - "$work/replay.json" <<'PY' || fail "replay report wrong: $(cat "$work/replay.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["events"] > 0, j
host = j["tiers"]["host"]
assert host["peak_live"] > 0, host
assert host["live_at_end"] == 0, host  # every block the run took went back
PY
echo "train_alloc_log_test: ok"
