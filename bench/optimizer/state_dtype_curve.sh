#!/usr/bin/env bash
# bf16 against fp32 AdamW state (GHT_OPT_STATE) on `small`: two runs of the learning-check
# configuration that differ only in the variable (same seed, data order and schedule; 300 steps,
# eval every 25), then their eval losses side by side and the mean of the last 50 training
# losses. On the GPU machine (bench/README.md); about a minute.
#
#   bash bench/optimizer/state_dtype_curve.sh GHT_BIN RUNS_DIR
set -euo pipefail
GHT=${1:?usage: state_dtype_curve.sh GHT_BIN RUNS_DIR}
RUNS=${2:?usage: state_dtype_curve.sh GHT_BIN RUNS_DIR}
cd "$(dirname "$0")/../.."
[ -f build/data/demo/prep.json ] || "$GHT" prep --input data/austen --out build/data/demo --val-fraction 0.05 --quiet
for st in fp32 bf16; do
  rm -rf "$RUNS/optstate-$st"
  GHT_OPT_STATE=$st "$GHT" train --config configs/small.toml --out "$RUNS/optstate-$st" --backend cuda \
    -o train.eval_every=25 -o train.log_every=1 > "$RUNS/optstate-$st.out" 2>&1 || { tail -5 "$RUNS/optstate-$st.out"; exit 1; }
done
python3 - "$RUNS/optstate-fp32/log.jsonl" "$RUNS/optstate-bf16/log.jsonl" <<'PY'
import json, sys
def curve(path, kind, key):
    return {r["step"]: r[key] for r in map(json.loads, open(path)) if r.get("type") == kind}
a, b = (curve(p, "eval", "eval_loss") for p in sys.argv[1:3])
print("step  eval fp32  eval bf16  bf16-fp32")
for s in sorted(a.keys() & b.keys()):
    print(f"{s:4d}  {a[s]:9.4f}  {b[s]:9.4f}  {b[s] - a[s]:+9.4f}")
ta, tb = (curve(p, "step", "loss") for p in sys.argv[1:3])
last = sorted(ta.keys() & tb.keys())[-50:]
print(f"train loss, mean of the last {len(last)} steps: fp32 {sum(ta[s] for s in last) / len(last):.4f}"
      f"  bf16 {sum(tb[s] for s in last) / len(last):.4f}")
PY
