#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, make token shards from the
# bundled corpus (data/austen), train the `tiny` MoE preset, and print a sample.
#
# Environment knobs: GHT_DEMO_STEPS (default 1500), GHT_DEMO_OUT (default runs/tiny-demo).
# Re-running resumes from the newest checkpoint in the run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ght=build/bin/ght
steps=${GHT_DEMO_STEPS:-1500}
out=${GHT_DEMO_OUT:-runs/tiny-demo}

if [ ! -f build/data/demo/prep.json ]; then
  "$ght" prep --input data/austen --out build/data/demo --val-fraction 0.05
fi
"$ght" train --model tiny --data build/data/demo --out "$out" --steps "$steps" \
  -o train.eval_every=250 -o train.ckpt_every=250 --resume auto
echo
echo "=== sample from $out"
"$ght" sample --ckpt "$out" --prompt "It is a truth universally acknowledged" --tokens 300 --seed 7
