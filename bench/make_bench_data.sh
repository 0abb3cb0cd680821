#!/usr/bin/env bash
# Random uint32 token shards for the bench-h200 shape (vocab 151,936), in build/data/bench-rand.
# Throughput only: the tokens carry no signal. Usage: bench/make_bench_data.sh GHT_BIN
set -uo pipefail
GHT=${1:?usage: make_bench_data.sh GHT_BIN}
cd "$(dirname "$0")/.."
[ -f build/data/bench-rand/prep.json ] && exit 0
python3 - <<'PY' || exit 1
import array, os, random
os.makedirs("build/data", exist_ok=True)
try:
    import numpy as np
    np.random.default_rng(0).integers(0, 151936, size=1 << 20, dtype=np.uint32).tofile("build/data/bench-rand.u32")
except ImportError:
    r = random.Random(0)
    array.array("I", (r.randrange(151936) for _ in range(1 << 20))).tofile(open("build/data/bench-rand.u32", "wb"))
PY
"$GHT" prep --from-tokens build/data/bench-rand.u32 --dtype uint32 --vocab 151936 --out build/data/bench-rand \
  --val-fraction 0.1 --overwrite --quiet
