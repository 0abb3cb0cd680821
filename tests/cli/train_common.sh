# Shared by the train_*_test.sh scripts (sourced, not run): a temp dir, shards from the bundled
# corpus, and small helpers. $1 = path to ght, $2 = project root.
set -euo pipefail
ght=${1:?path to ght}
root=${2:?project root}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
prep_corpus() {  # prep_corpus DIR [files...]: shards from the bundled Austen corpus
  "$ght" prep --input "$root/data/austen" --out "$1" --val-fraction 0.05 >/dev/null
}
# The losses of steps > FROM in a run's log.jsonl, one "step loss" line each, exactly as logged.
losses_after() {
  python3 - "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "step" and r["step"] > int(sys.argv[2]):
        print(r["step"], repr(r["loss"]))
PY
}
# Small, fast shape for the resume and signal tests.
small_args=(--model tiny -o model.micro_batch=2 -o model.seq_len=32 -o train.eval_every=0 -o train.log_every=5)
