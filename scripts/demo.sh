#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build `ght` (only that target), make
# token shards from the bundled corpus (data/austen), train the `tiny` MoE preset, and print a
# sample.
#
# Environment knobs: DEMO_STEPS (default 1500), DEMO_OUT (default runs/tiny-demo), BUILD_JOBS
# (default: nproc). They are not GHT_* names on purpose: ght rejects GHT_* variables it does not
# know, so a script knob there would stop ght itself.
# Re-running resumes from the newest checkpoint in the run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "demo: $*"; }
say "checking build dependencies"
scripts/install-deps.sh
say "building the ght binary (target ght only, ${BUILD_JOBS:-$(nproc)} jobs; tests and benchmarks are not built)"
scripts/build.sh --target ght
ght=build/bin/ght
steps=${DEMO_STEPS:-1500}
out=${DEMO_OUT:-runs/tiny-demo}

if [ ! -f build/data/demo/prep.json ]; then
  say "making token shards from data/austen in build/data/demo"
  "$ght" prep --input data/austen --out build/data/demo --val-fraction 0.05
fi
say "training the tiny preset for $steps steps in $out (resumes from its newest checkpoint)"
"$ght" train --model tiny --data build/data/demo --out "$out" --steps "$steps" \
  -o train.eval_every=250 -o train.ckpt_every=250 --resume auto
echo
echo "=== sample from $out"
"$ght" sample --ckpt "$out" --prompt "It is a truth universally acknowledged" --tokens 300 --seed 7
