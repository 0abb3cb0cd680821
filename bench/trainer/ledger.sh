#!/usr/bin/env bash
# The accuracy ledger's measurement (tier/accuracy_ledger.hpp): a learning-check configuration
# (LEDGER_CONFIG, default configs/small.toml) for LEDGER_STEPS steps (default 2000), the exact fp32
# run at LEDGER_SEEDS seeds (default 3: the noise band) and each inexact choice at the first seed,
# LEDGER_PARALLEL runs at a time on one GPU (default: all at once; a `small` run leaves most of an
# H100/H200 idle; a 1B model wants 2 or 3, with GHT_HBM_BUDGET in LEDGER_ENV). Then, per choice: the
# relative eval-loss difference at the end against the exact runs' mean, the exact runs' spread,
# and the extra tokens the choice needs to reach its own final eval loss against the exact runs'
# mean curve (interpolated between eval points; negative where it is ahead). Writes the
# ledger JSON (tier/accuracy_ledger.json's format) and a markdown table of the curves.
#
#   bash bench/trainer/ledger.sh GHT_BIN RUNS_DIR OUT_JSON OUT_MD [CHOICE ...]
#   CHOICE = GHT_NAME=VALUE[,GHT_NAME=VALUE...] (default: GHT_OPT_STATE=q8 GHT_OPT_STATE=bf16
#            GHT_GRAD_ACCUM=bf16). A choice of one option becomes a verdict in OUT_JSON; a choice
#            of several (a partial delay: GHT_OPT_DELAY=on,GHT_OPT_DELAY_MICRO=1) is a variant: its
#            curve and figures go to OUT_MD only, since the plan looks verdicts up by one option.
# Knobs: LEDGER_STEPS, LEDGER_SEEDS, LEDGER_EVAL_EVERY (default 100), LEDGER_TIMEOUT (seconds per
# run, default 1500), LEDGER_ARGS (more `ght train` arguments for every run), LEDGER_BACKEND
# (default cuda; cpu tries the script on a machine without a GPU), LEDGER_CPU_THREADS (GHT_CPU_THREADS
# of each run, default 2: the runs share the host), LEDGER_ENV (more VAR=VALUE for every run, e.g.
# GHT_HBM_BUDGET=24G when runs share the GPU), LEDGER_PIN (default GHT_PLAN_TOLERANCE=exact:
# every run pins exactness, so the plan changes nothing but the choice under test; empty for a
# ght that predates the option).
set -euo pipefail
usage="usage: ledger.sh GHT_BIN RUNS_DIR OUT_JSON OUT_MD [GHT_NAME=VALUE ...]"
GHT=${1:?$usage}
RUNS=${2:?$usage}
OUT_JSON=${3:?$usage}
OUT_MD=${4:?$usage}
shift 4
choices=("$@")
[ ${#choices[@]} -gt 0 ] || choices=(GHT_OPT_STATE=q8 GHT_OPT_STATE=bf16 GHT_GRAD_ACCUM=bf16)
for c in "${choices[@]}"; do
  [[ $c =~ ^GHT_[A-Z0-9_]+=[A-Za-z0-9._]+(,GHT_[A-Z0-9_]+=[A-Za-z0-9._]+)*$ ]] ||
    { echo "ledger.sh: '$c' is not GHT_NAME=VALUE[,GHT_NAME=VALUE...]" >&2; exit 2; }
done
config=${LEDGER_CONFIG:-configs/small.toml}
[ -f "$config" ] || { echo "ledger.sh: LEDGER_CONFIG '$config' is not a file" >&2; exit 2; }
steps=${LEDGER_STEPS:-2000}
seeds=${LEDGER_SEEDS:-3}
every=${LEDGER_EVAL_EVERY:-100}
cd "$(dirname "$0")/../.."
[ -f build/data/demo/prep.json ] || "$GHT" prep --input data/austen --out build/data/demo --val-fraction 0.05 --quiet
mkdir -p "$RUNS"
# The model's name and parameters, from the plan's header ("model: small: 7.63M params (...)").
header=$("$GHT" plan --config "$config" --profile pcie5 ${LEDGER_ARGS:-} | sed -n 's/^model: \([^:]*\): \([0-9.]*[MB]\) params.*/\1 \2/p')
read -r model params <<<"$header"
[ -n "${model:-}" ] || { echo "ledger.sh: 'ght plan --config $config' printed no model header" >&2; exit 1; }
pin=${LEDGER_PIN-GHT_PLAN_TOLERANCE=exact}
common=(train --config "$config" --backend "${LEDGER_BACKEND:-cuda}" -o train.steps="$steps" -o train.eval_every="$every"
        -o train.log_every=10 ${LEDGER_ARGS:-})
parallel=${LEDGER_PARALLEL:-0}
# shellcheck disable=SC2206  # LEDGER_ENV is a list of VAR=VALUE words
extra_env=(${LEDGER_ENV:-})
pids=()
names=()
fail=0
finish() {  # wait for the oldest run still going
  local pid=${pids[0]} name=${names[0]}
  pids=("${pids[@]:1}")
  names=("${names[@]:1}")
  if wait "$pid"; then echo "ledger.sh: $name done $(date -u +%T)"; else
    echo "ledger.sh: $name FAILED"; tail -5 "$RUNS/$name.out"; fail=1; fi
}
start() {  # start NAME SEED [VAR=VALUE[,VAR=VALUE...]]
  local name=$1 seed=$2 vars=()
  [ -n "${3:-}" ] && IFS=, read -r -a vars <<<"$3"
  while ((parallel > 0 && ${#pids[@]} >= parallel)); do finish; done
  rm -rf "${RUNS:?}/$name"
  # No checkpoints: the ledger reads only the logs (a 1B run's final checkpoint is 16 GB).
  env ${pin:+"$pin"} GHT_SAVE_CHECKPOINTS=off GHT_CPU_THREADS="${LEDGER_CPU_THREADS:-2}" "${extra_env[@]}" "${vars[@]}" \
    timeout "${LEDGER_TIMEOUT:-1500}" "$GHT" "${common[@]}" \
    --out "$RUNS/$name" -o train.seed="$seed" > "$RUNS/$name.out" 2>&1 &
  pids+=($!)
  names+=("$name")
  echo "ledger.sh: $name started $(date -u +%T)"
}
run_name() { local n=${1//=/-}; echo "${n//,/_}"; }
for s in $(seq 1 "$seeds"); do start "exact-s$s" $((1336 + s)); done
for c in "${choices[@]}"; do start "$(run_name "$c")" 1337 "$c"; done
while ((${#pids[@]} > 0)); do finish; done
[ $fail -eq 0 ] || exit 1
python3 - "$RUNS" "$OUT_JSON" "$OUT_MD" "$seeds" "$steps" "$model" "$params" "${choices[@]}" <<'PY'
import datetime, json, sys
runs, out_json, out_md, seeds, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
model, params = sys.argv[6], sys.argv[7]
params = float(params[:-1]) * {"M": 1e6, "B": 1e9}[params[-1]]
choices = sys.argv[8:]

def run_name(choice):
    return choice.replace("=", "-").replace(",", "_")

def peak_lr(name):
    with open(f"{runs}/{name}/log.jsonl") as f:
        return max((float(r["lr"]) for r in map(json.loads, f) if "lr" in r), default=0.0)

def evals(name):
    out = {}
    with open(f"{runs}/{name}/log.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "eval" or "eval_loss" in r:
                out[int(r["step"])] = float(r.get("eval_loss", r.get("loss")))
    if not out:
        sys.exit(f"ledger.sh: no eval records in {runs}/{name}/log.jsonl")
    return out

exact = [evals(f"exact-s{s}") for s in range(1, seeds + 1)]
last = max(exact[0])
finals = [e[last] for e in exact]
mean = sum(finals) / len(finals)
band = (max(finals) - min(finals)) / mean
mean_curve = {s: sum(e[s] for e in exact) / len(exact) for s in exact[0] if all(s in e for e in exact)}


def first_reach(curve, target):
    """The first step at which `curve` is at or below `target`, linear between eval points."""
    prev = None
    for s in sorted(curve):
        if curve[s] <= target:
            if prev is None or curve[prev] == curve[s]:
                return float(s)
            return prev + (curve[prev] - target) / (curve[prev] - curve[s]) * (s - prev)
        prev = s
    return None


def extra_tokens(e, exact_mean, last):
    """The choice's price in tokens, relative to the run's: a choice that ends worse than the exact
    runs' mean needs last / s - 1 more, where s is the step at which the exact mean curve reached
    the choice's final loss; one that ends better gets (its first step at the exact final) / last
    - 1, at most 0."""
    final = exact_mean[last]
    if e[last] > final:
        s = first_reach(exact_mean, e[last])
        return None if not s else round(last / s - 1, 4)
    s = first_reach(e, final)
    return None if s is None else round(min(0.0, s / last - 1), 4)


lr = peak_lr("exact-s1")  # the schedule's peak, as the run logged it
verdicts, variants, rows = [], [], []
for c in choices:
    option, value = c.split(",")[0].split("=", 1)
    e = evals(run_name(c))
    delta = (e[last] - mean) / mean
    extra = extra_tokens(e, mean_curve, last)
    v = {"option": option, "value": value.lower() if value.lower() in ("on", "off") else value,
         "model": model, "params": float(params), "steps": steps, "lr": float(lr), "exact_seeds": seeds,
         "eval_loss_delta": round(delta, 5), "noise_band": round(band, 5), "extra_tokens": extra,
         "within_noise": round(delta, 5) <= round(band, 5),
         "measured": datetime.date.today().isoformat(), "source": out_md}
    if "," in c:
        v["settings"] = c
        variants.append(v)
    else:
        verdicts.append(v)
    rows.append((c, e))
json.dump({"format": 1, "about": "Measured by bench/trainer/ledger.sh (see tier/accuracy_ledger.hpp).",
           "verdicts": verdicts}, open(out_json, "w"), indent=2)
with open(out_md, "w") as f:
    names = [f"exact-s{s}" for s in range(1, seeds + 1)] + [c for c, _ in rows]
    curves = exact + [e for _, e in rows]
    f.write("| step | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1) + "\n")
    for s in sorted(exact[0]):
        f.write(f"| {s} | " + " | ".join(f"{c.get(s, float('nan')):.4f}" for c in curves) + " |\n")
    f.write(f"\nexact final eval loss: mean {mean:.4f} over {seeds} seeds, spread {100*band:.2f}%\n\n")
    f.write(f"model {model} ({params/1e6:.1f}M params), {steps} steps, peak lr {lr:g}\n\n")
    for v in verdicts + variants:
        ex = "never" if v["extra_tokens"] is None else f"{100*v['extra_tokens']:+.1f}%"
        name = v.get("settings", f"{v['option']}={v['value']}")
        f.write(f"- {name}: {100*v['eval_loss_delta']:+.2f}% eval loss, extra tokens {ex}, "
                f"within noise: {v['within_noise']}\n")
print(open(out_md).read())
PY
