#!/usr/bin/env bash
# Learning: `tiny` on the bundled corpus for 2400 steps (about 80 s on an idle 2-core machine) must
# reach an eval loss <= 3.0 nats per byte (uniform over 256 bytes is ln 256 = 5.55).
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
steps=${LEARNING_STEPS:-2400}
"$ght" train --model tiny --data "$work/data" --out "$work/run" --steps $steps \
  -o train.eval_every=0 -o train.eval_batches=16 -o train.log_every=50 > "$work/run.log" 2>&1 \
  || { cat "$work/run.log"; fail "training failed"; }
tail -3 "$work/run.log"
eval=$(python3 -c "
import json,sys
ev=[json.loads(l) for l in open('$work/run/log.jsonl') if '\"eval\"' in l]
print(ev[-1]['eval_loss'])")
python3 -c "import sys; sys.exit(0 if $eval <= 3.0 else 1)" || fail "eval loss $eval > 3.0 nats/byte after $steps steps"
echo "eval loss $eval nats/byte after $steps steps (<= 3.0)"
