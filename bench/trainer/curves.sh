#!/usr/bin/env bash
# Several runs of `small`'s learning-check configuration (configs/small.toml: 300 steps, same
# seed, data order and schedule; eval every 25) that differ only in GHT_* variables, then their
# eval losses side by side, each one's relative gap to the first at the last eval, and the mean
# of the last 50 training losses. On the GPU machine (bench/README.md); about 30 s per run.
# CURVES_BACKEND (default cuda) picks the backend (cpu: for trying the script on this machine).
#
#   bash bench/trainer/curves.sh GHT_BIN RUNS_DIR SPEC [SPEC ...] [-- ght train args...]
#   SPEC = NAME[:VAR=VALUE[,VAR=VALUE...]][@WARM]
#     NAME     the column's name (letters, digits, '-', '_', '.')
#     VAR      a GHT_* variable set for that run
#     @WARM    train the first WARM steps without the variables (exact mode, the plain
#              environment), stop with a checkpoint, and resume from it with them
#   e.g.  bash bench/trainer/curves.sh build-gpu/bin/ght build-gpu/runs exact \
#           plain:GHT_OPT_DELAY=1,GHT_OPT_DELAY_PREDICT=0 x2:GHT_OPT_DELAY=1,GHT_OPT_DELAY_PREDICT=2 \
#           x2warm:GHT_OPT_DELAY=1,GHT_OPT_DELAY_PREDICT=2@50
set -euo pipefail
usage="usage: curves.sh GHT_BIN RUNS_DIR SPEC [SPEC ...] [-- ght train args...]"
GHT=${1:?$usage}
RUNS=${2:?$usage}
shift 2
specs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do specs+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the "--"
[ ${#specs[@]} -ge 1 ] || { echo "$usage" >&2; exit 2; }
cd "$(dirname "$0")/../.."
[ -f build/data/demo/prep.json ] || "$GHT" prep --input data/austen --out build/data/demo --val-fraction 0.05 --quiet
mkdir -p "$RUNS"
logs=()
for spec in "${specs[@]}"; do
  name=${spec%%[:@]*}
  rest=${spec#"$name"}
  warm=0
  case "$rest" in *@*) warm=${rest##*@}; rest=${rest%@*} ;; esac
  vars=${rest#:}
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "curves.sh: bad name in spec '$spec'" >&2; exit 2; }
  [[ $warm =~ ^[0-9]+$ ]] || { echo "curves.sh: @WARM must be a step count, got '$warm' in '$spec'" >&2; exit 2; }
  envs=()
  if [ -n "$vars" ]; then
    IFS=, read -r -a envs <<< "$vars"
    for e in "${envs[@]}"; do
      case "$e" in GHT_*=*) ;; *) echo "curves.sh: '$e' in '$spec' is not GHT_*=VALUE" >&2; exit 2 ;; esac
    done
  fi
  run=$RUNS/curve-$name
  rm -rf "$run"
  common=(train --config configs/small.toml --out "$run" --backend "${CURVES_BACKEND:-cuda}" -o train.eval_every=25 -o train.log_every=1 "$@")
  if [ "$warm" -gt 0 ]; then
    "$GHT" "${common[@]}" --stop-at "$warm" > "$run.warm.out" 2>&1 || { tail -5 "$run.warm.out"; exit 1; }
    env "${envs[@]}" "$GHT" "${common[@]}" --resume auto > "$run.out" 2>&1 || { tail -5 "$run.out"; exit 1; }
  else
    env "${envs[@]}" "$GHT" "${common[@]}" > "$run.out" 2>&1 || { tail -5 "$run.out"; exit 1; }
  fi
  logs+=("$name=$run/log.jsonl")
  echo "curves.sh: $spec done"
done
python3 - "${logs[@]}" <<'PY'
import json, sys
runs = [a.split("=", 1) for a in sys.argv[1:]]
def curve(path, kind, key):
    return {r["step"]: r[key] for r in map(json.loads, open(path)) if r.get("type") == kind}
evals = [(n, curve(p, "eval", "eval_loss")) for n, p in runs]
steps = sorted(set.intersection(*(set(e) for _, e in evals)))
print("| step | " + " | ".join(f"eval {n}" for n, _ in evals) + " |")
print("|---|" + "---|" * len(evals))
for s in steps:
    print(f"| {s} | " + " | ".join(f"{e[s]:.4f}" for _, e in evals) + " |")
last = steps[-1]
base_name, base = evals[0]
for n, e in evals[1:]:
    print(f"last eval (step {last}): {n} is {100 * (e[last] - base[last]) / base[last]:+.2f}% of {base_name}")
trains = [(n, curve(p, "step", "loss")) for n, p in runs]
common = sorted(set.intersection(*(set(t) for _, t in trains)))[-50:]
print(f"train loss, mean of the last {len(common)} steps: " +
      ", ".join(f"{n} {sum(t[s] for s in common) / len(common):.4f}" for n, t in trains))
PY
