#!/usr/bin/env bash
# CLI test for `ght alloc-replay FILE`: peak usage and fragmentation from a log, JSON output,
# and malformed logs rejected with FILE:LINE and a non-zero exit.
#   bash tests/cli/alloc_replay_test.sh <path-to-ght> <project-root>
source "$(dirname "$0")/check_common.sh" "$@"

# Three 256 B blocks, the middle one freed, then 512 B that cannot use its hole: peak live
# 1024 B in a 1280 B best-fit heap, fragmentation 20%; A, C and D are never freed.
cat >"$TMP/log.csv" <<'CSV'
thread,time_ns,action,pointer,size,tier,class,stream
1,10,allocate,0xa000,256,hbm,weight,0x0
1,20,allocate,0xb000,256,hbm,weight,0x0
2,30,allocate,0xc000,256,hbm,grad,0x0
2,40,free,0xb000,256,hbm,weight,0x0
1,50,allocate,0xd000,512,hbm,grad,0x0
1,60,allocate,0xe000,4096,host,master,0x0
1,70,free,0xe000,4096,host,master,0x0
CSV

if ! "$GHT" alloc-replay "$TMP/log.csv" >"$TMP/out" 2>"$TMP/err"; then
  fail "alloc-replay exited non-zero: $(cat "$TMP/err")"
fi
grep -Eq '^hbm +4 +1 +1\.00 KiB +1\.25 KiB +20\.0% +1\.00 KiB +3$' "$TMP/out" || fail "hbm row wrong: $(cat "$TMP/out")"
grep -Eq '^host +1 +1 +4\.00 KiB' "$TMP/out" || fail "host row wrong: $(cat "$TMP/out")"
grep -q 'peak usage, all tiers: 5.00 KiB (5120 bytes)' "$TMP/out" || fail "total peak wrong: $(cat "$TMP/out")"

if ! "$GHT" alloc-replay --json "$TMP/log.csv" >"$TMP/json" 2>"$TMP/err"; then
  fail "alloc-replay --json exited non-zero: $(cat "$TMP/err")"
fi
python3 - "$TMP/json" <<'PY' || fail "JSON report wrong: $(cat "$TMP/json")"
import json, sys
j = json.load(open(sys.argv[1]))
h = j["tiers"]["hbm"]
assert h["peak_live"] == 1024 and h["peak_extent"] == 1280, h
assert abs(h["fragmentation"] - 0.2) < 1e-12, h
assert h["live_at_end"] == 1024 and h["blocks_at_end"] == 3, h
assert j["peak_live_all"] == 5120 and j["events"] == 7, j
PY

# A malformed line: exit non-zero, message with FILE:LINE.
{ head -n 3 "$TMP/log.csv"; echo "1,80,allocate,0xf000,many,hbm,weight,0x0"; } >"$TMP/bad.csv"
if "$GHT" alloc-replay "$TMP/bad.csv" >"$TMP/out" 2>"$TMP/err"; then
  fail "a malformed log was accepted"
fi
grep -q "$TMP/bad.csv:4: bad size 'many'" "$TMP/err" || fail "no FILE:LINE in: $(cat "$TMP/err")"

# A free of a block that is not live.
{ head -n 2 "$TMP/log.csv"; echo "1,80,free,0x1234,256,hbm,weight,0x0"; } >"$TMP/bad2.csv"
"$GHT" alloc-replay "$TMP/bad2.csv" >/dev/null 2>"$TMP/err" && fail "a free of a dead block was accepted"
grep -q "$TMP/bad2.csv:3: free of 0x1234, which is not live" "$TMP/err" || fail "wrong message: $(cat "$TMP/err")"

# A missing file.
"$GHT" alloc-replay "$TMP/none.csv" >/dev/null 2>"$TMP/err" && fail "a missing file was accepted"
grep -q "none.csv" "$TMP/err" || fail "missing-file message does not name it: $(cat "$TMP/err")"

if [ "$failures" -ne 0 ]; then
  echo "alloc_replay_test: $failures failure(s)" >&2
  exit 1
fi
echo "alloc_replay_test: ok"
