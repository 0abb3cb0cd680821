#!/usr/bin/env bash
# The accuracy ledger's measurement (tier/accuracy_ledger.hpp): `small`'s learning-check
# configuration (configs/small.toml) for LEDGER_STEPS steps (default 2000), the exact fp32 run at
# LEDGER_SEEDS seeds (default 3: the noise band) and each inexact choice at the first seed, all
# at once on one GPU (a `small` run leaves most of an H100/H200 idle). Then, per choice: the
# relative eval-loss difference at the end against the exact runs' mean, the exact runs' spread,
# and the extra tokens the choice needs to reach the exact runs' final eval loss. Writes the
# ledger JSON (tier/accuracy_ledger.json's format) and a markdown table of the curves.
#
#   bash bench/trainer/ledger.sh GHT_BIN RUNS_DIR OUT_JSON OUT_MD [CHOICE ...]
#   CHOICE = GHT_NAME=VALUE (default: GHT_OPT_STATE=q8 GHT_OPT_STATE=bf16 GHT_GRAD_ACCUM=bf16)
# Knobs: LEDGER_STEPS, LEDGER_SEEDS, LEDGER_EVAL_EVERY (default 100), LEDGER_TIMEOUT (seconds per
# run, default 1500), LEDGER_ARGS (more `ght train` arguments for every run), LEDGER_BACKEND
# (default cuda; cpu tries the script on a machine without a GPU), LEDGER_CPU_THREADS (GHT_CPU_THREADS
# of each run, default 2: the runs share the host), LEDGER_PIN (default GHT_PLAN_TOLERANCE=exact:
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
  [[ $c =~ ^GHT_[A-Z0-9_]+=[A-Za-z0-9._]+$ ]] || { echo "ledger.sh: '$c' is not GHT_NAME=VALUE" >&2; exit 2; }
done
steps=${LEDGER_STEPS:-2000}
seeds=${LEDGER_SEEDS:-3}
every=${LEDGER_EVAL_EVERY:-100}
cd "$(dirname "$0")/../.."
[ -f build/data/demo/prep.json ] || "$GHT" prep --input data/austen --out build/data/demo --val-fraction 0.05 --quiet
mkdir -p "$RUNS"
# The model's parameters, from the plan's header ("model: small: 7.63M params (...)").
params=$("$GHT" plan --config configs/small.toml --profile pcie5 | sed -n 's/^model: [^:]*: \([0-9.]*\)\([MB]\) params.*/\1\2/p')
case "$params" in *M) params=$(python3 -c "print(${params%M}*1e6)") ;; *B) params=$(python3 -c "print(${params%B}*1e9)") ;; *) params=0 ;; esac
pin=${LEDGER_PIN-GHT_PLAN_TOLERANCE=exact}
common=(train --config configs/small.toml --backend "${LEDGER_BACKEND:-cuda}" -o train.steps="$steps" -o train.eval_every="$every"
        -o train.log_every=10 ${LEDGER_ARGS:-})
pids=()
names=()
start() {  # start NAME SEED [VAR=VALUE]
  local name=$1 seed=$2 var=${3:-}
  rm -rf "$RUNS/$name"
  env ${pin:+"$pin"} GHT_CPU_THREADS="${LEDGER_CPU_THREADS:-2}" ${var:+"$var"} timeout "${LEDGER_TIMEOUT:-1500}" "$GHT" "${common[@]}" \
    --out "$RUNS/$name" -o train.seed="$seed" > "$RUNS/$name.out" 2>&1 &
  pids+=($!)
  names+=("$name")
}
for s in $(seq 1 "$seeds"); do start "exact-s$s" $((1336 + s)); done
for c in "${choices[@]}"; do start "${c//[=]/-}" 1337 "$c"; done
fail=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then echo "ledger.sh: ${names[$i]} done"; else
    echo "ledger.sh: ${names[$i]} FAILED"; tail -5 "$RUNS/${names[$i]}.out"; fail=1; fi
done
[ $fail -eq 0 ] || exit 1
python3 - "$RUNS" "$OUT_JSON" "$OUT_MD" "$seeds" "$steps" "$params" "${choices[@]}" <<'PY'
import datetime, json, sys
runs, out_json, out_md, seeds, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
params = float(sys.argv[6])
choices = sys.argv[7:]

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
lr = 2e-3  # configs/small.toml's peak learning rate (LEDGER_ARGS must not change it)
verdicts, rows = [], []
for c in choices:
    option, value = c.split("=", 1)
    e = evals(c.replace("=", "-"))
    delta = (e[last] - mean) / mean
    reach = next((s for s in sorted(e) if e[s] <= mean), None)
    extra = None if reach is None else max(0.0, (reach - last) / last)
    v = {"option": option, "value": value.lower() if value.lower() in ("on", "off") else value,
         "model": "small", "params": float(params), "steps": steps, "lr": float(lr), "exact_seeds": seeds,
         "eval_loss_delta": round(delta, 5), "noise_band": round(band, 5), "extra_tokens": extra,
         "within_noise": round(delta, 5) <= round(band, 5),
         "measured": datetime.date.today().isoformat(), "source": out_md}
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
    for v in verdicts:
        ex = "never" if v["extra_tokens"] is None else f"{100*v['extra_tokens']:+.1f}%"
        f.write(f"- {v['option']}={v['value']}: {100*v['eval_loss_delta']:+.2f}% eval loss, extra tokens {ex}, "
                f"within noise: {v['within_noise']}\n")
print(open(out_md).read())
PY
