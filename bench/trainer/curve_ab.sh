#!/usr/bin/env bash
# Two runs of `small`'s learning-check configuration (configs/small.toml: 300 steps, same seed,
# data order and schedule; eval every 25) that differ only in one GHT_* variable, then their
# eval losses side by side, the relative gap at the last eval, and the mean of the last 50
# training losses. On the GPU machine (bench/README.md); about a minute.
#
#   bash bench/trainer/curve_ab.sh GHT_BIN RUNS_DIR VAR VALUE_A VALUE_B [ght train args...]
#   e.g.  bash bench/trainer/curve_ab.sh build-gpu/bin/ght build-gpu/train-runs GHT_OPT_DELAY 0 1
set -euo pipefail
usage="usage: curve_ab.sh GHT_BIN RUNS_DIR VAR VALUE_A VALUE_B [ght train args...]"
GHT=${1:?$usage}
RUNS=${2:?$usage}
VAR=${3:?$usage}
A=${4:?$usage}
B=${5:?$usage}
shift 5
case "$VAR" in GHT_*) ;; *) echo "curve_ab.sh: VAR must be a GHT_* variable, got '$VAR'" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
[ -f build/data/demo/prep.json ] || "$GHT" prep --input data/austen --out build/data/demo --val-fraction 0.05 --quiet
mkdir -p "$RUNS"
for v in "$A" "$B"; do
  run=$RUNS/curve-$VAR-$v
  rm -rf "$run"
  env "$VAR=$v" "$GHT" train --config configs/small.toml --out "$run" --backend cuda \
    -o train.eval_every=25 -o train.log_every=1 "$@" > "$run.out" 2>&1 || { tail -5 "$run.out"; exit 1; }
done
python3 - "$RUNS/curve-$VAR-$A/log.jsonl" "$RUNS/curve-$VAR-$B/log.jsonl" "$VAR" "$A" "$B" <<'PY'
import json, sys
def curve(path, kind, key):
    return {r["step"]: r[key] for r in map(json.loads, open(path)) if r.get("type") == kind}
var, a_name, b_name = sys.argv[3:6]
a, b = (curve(p, "eval", "eval_loss") for p in sys.argv[1:3])
print(f"| step | eval {var}={a_name} | eval {var}={b_name} | difference |")
print("|---|---|---|---|")
for s in sorted(a.keys() & b.keys()):
    print(f"| {s} | {a[s]:.4f} | {b[s]:.4f} | {b[s] - a[s]:+.4f} |")
last_eval = max(a.keys() & b.keys())
print(f"\nlast eval (step {last_eval}): {var}={b_name} is {100 * (b[last_eval] - a[last_eval]) / a[last_eval]:+.2f}% "
      f"of {var}={a_name}")
ta, tb = (curve(p, "step", "loss") for p in sys.argv[1:3])
last = sorted(ta.keys() & tb.keys())[-50:]
print(f"train loss, mean of the last {len(last)} steps: {var}={a_name} {sum(ta[s] for s in last) / len(last):.4f}"
      f", {var}={b_name} {sum(tb[s] for s in last) / len(last):.4f}")
PY
